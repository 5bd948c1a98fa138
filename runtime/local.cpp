#include "runtime/local.h"

#include <exception>
#include <string>
#include <thread>

#include "common/errors.h"

namespace packpipe::runtime {

namespace {

// One pipeline's ranks on threads, errors kept per rank.
struct Pipeline {
  const plan::Plan& plan;
  InProcessGroup group;
  std::vector<RankRecord> records;
  std::vector<std::string> errors;
  std::vector<std::thread> threads;
  TransportFactory transports;  // kept here: the threads use it after start() returns

  explicit Pipeline(const plan::Plan& p, const CopyFn& copy = {})
      : plan(p),
        group(copy ? InProcessGroup(std::max<std::uint32_t>(p.ranks, 1), copy)
                   : InProcessGroup(std::max<std::uint32_t>(p.ranks, 1))) {
    records.resize(group.ranks());
    errors.resize(group.ranks());
  }

  // `handlers` and `options` must outlive join().
  void start(const HandlerFactory& handlers, const ExecutorOptions& options, TransportFactory make_transport,
             Clock::time_point epoch) {
    transports = std::move(make_transport);
    for (std::uint32_t r = 0; r < group.ranks(); ++r) {
      threads.emplace_back([this, r, &handlers, &options, epoch] {
        try {
          std::unique_ptr<Transport> t = transports ? transports(group, r) : group.transport(r);
          std::unique_ptr<StageHandler> h = handlers(r);
          Executor ex(*h, *t, options);
          RankRecord rec = ex.run(plan);
          const auto shift = std::chrono::duration_cast<std::chrono::nanoseconds>(ex.epoch() - epoch).count();
          rec.start_ns += shift;
          rec.end_ns += shift;
          for (auto& t2 : rec.times) {
            t2.start_ns += shift;
            t2.end_ns += shift;
          }
          records[r] = std::move(rec);
        } catch (const std::exception& e) {
          errors[r] = e.what();
          group.abort(e.what());
        }
      });
    }
  }
  void join() {
    for (auto& t : threads) t.join();
    threads.clear();
  }
  // Every rank's error, the rank that failed first (the abort's reason) first.
  std::string failure() const {
    std::string first = group.abort_reason(), msg;
    std::size_t failed = 0;
    for (const auto& e : errors) failed += !e.empty();
    if (failed == 0) return {};
    msg = fmt::format("iteration {}, replica {}: {} of {} ranks failed", plan.iteration, plan.replica, failed,
                      errors.size());
    if (!first.empty()) msg += "; first: " + first;
    for (std::size_t r = 0; r < errors.size(); ++r) {
      if (!errors[r].empty() && errors[r] != first) msg += fmt::format("\n  rank {}: {}", r, errors[r]);
    }
    return msg;
  }
};

}  // namespace

LocalRun run_local(const plan::Plan& plan, const HandlerFactory& handlers, const ExecutorOptions& options,
                   const TransportFactory& transports, const CopyFn& copy) {
  Pipeline p(plan, copy);
  p.start(handlers, options, transports, Clock::now());
  p.join();
  const std::string f = p.failure();
  if (!f.empty()) throw Error(f);
  return LocalRun{std::move(p.records), p.group.messages()};
}

std::vector<LocalRun> run_local_replicas(const std::vector<plan::Plan>& plans, const HandlerFactory& handlers,
                                         const ExecutorOptions& options) {
  std::vector<std::unique_ptr<Pipeline>> ps;
  const auto epoch = Clock::now();
  for (const auto& p : plans) ps.push_back(std::make_unique<Pipeline>(p));
  for (auto& p : ps) p->start(handlers, options, {}, epoch);
  for (auto& p : ps) p->join();
  std::string failures;
  for (const auto& p : ps) {
    const std::string f = p->failure();
    if (!f.empty()) failures += (failures.empty() ? "" : "\n") + f;
  }
  if (!failures.empty()) throw Error(failures);
  std::vector<LocalRun> out;
  for (auto& p : ps) out.push_back(LocalRun{std::move(p->records), p->group.messages()});
  return out;
}

}  // namespace packpipe::runtime
