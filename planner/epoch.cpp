#include "planner/epoch.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <limits>
#include <thread>

#include <fmt/format.h>
#include <oneapi/tbb/enumerable_thread_specific.h>
#include <oneapi/tbb/parallel_pipeline.h>
#include <oneapi/tbb/task_arena.h>

#include "common/background_queue.h"
#include "common/errors.h"
#include "planner/detail/rethrow.h"
#include "planner/loader.h"

namespace packpipe::planner {

part::BatchLengths batch_lengths(const dl::MultiTaskDataset& data, const dl::GlobalBatch& batch, bool encoder_decoder,
                                 std::uint64_t iteration, std::vector<SampleRef>* refs, pl::LossMode loss,
                                 const ContextLength& context, ContextReport* report) {
  check_context_length(context, encoder_decoder);
  part::BatchLengths b;
  b.input.reserve(batch.samples.size());
  if (encoder_decoder) b.target.reserve(batch.samples.size());
  if (refs != nullptr) refs->reserve(refs->size() + batch.samples.size());
  b.loss.reserve(batch.samples.size());
  ContextReport local;
  ContextReport& r = report != nullptr ? *report : local;
  r = ContextReport{};
  for (std::size_t k = 0; k < batch.samples.size(); ++k) {
    const SampleRef& ref = batch.samples[k];
    const std::uint32_t in = data.input_length(ref), tg = data.target_length(ref);
    if (!encoder_decoder) {
      const std::uint64_t sum = std::uint64_t{in} + tg;  // decoder-only: the whole sample is one sequence
      PACKPIPE_CHECK_ARG(sum <= std::numeric_limits<std::uint32_t>::max(),
                         "iteration {}: sample {} of task '{}' has {} tokens, more than 2^32 - 1", iteration, ref.index,
                         ref.task < data.manifest().tasks.size() ? data.manifest().tasks[ref.task].name : "?", sum);
    }
    append_sample(b, refs, ref, in, tg, encoder_decoder, loss, context, static_cast<std::uint32_t>(k), r);
  }
  return b;
}

part::BatchLengths sample_lengths(const dl::MultiTaskDataset& data, const std::vector<SampleRef>& refs,
                                  bool encoder_decoder) {
  part::BatchLengths b;
  b.input.reserve(refs.size());
  if (encoder_decoder) b.target.reserve(refs.size());
  for (const SampleRef& ref : refs) {
    const std::uint32_t in = data.input_length(ref), tg = data.target_length(ref);
    if (encoder_decoder) {
      b.input.push_back(std::max<std::uint32_t>(in, 1));
      b.target.push_back(std::max<std::uint32_t>(tg, 1));
    } else {
      b.input.push_back(in + tg);  // batch_lengths checked that it fits when it named the sample
    }
  }
  return b;
}

SampledBatch sample_batch(const dl::MultiTaskDataset& data, const EpochSpec& spec, std::uint64_t index,
                          bool encoder_decoder, pl::LossMode loss, const ContextLength& context) {
  dl::Sampler s(data, budget_of_trained_tokens(spec.sampler, context, encoder_decoder));
  s.set_epoch(spec.epoch);
  dl::GlobalBatch g;
  for (std::uint64_t k = 0; k <= index; ++k) {
    PACKPIPE_CHECK_ARG(s.next_batch(g), "batch {} is past the end of epoch {} ({} batches)", index, spec.epoch, k);
  }
  SampledBatch out;
  out.iteration = index;
  out.lengths = batch_lengths(data, g, encoder_decoder, index, &out.refs, loss, context, &out.context);
  out.sample_lengths = sample_lengths(data, out.refs, encoder_decoder);
  return out;
}

// The background planning of next(): a thread running the pipeline into a bounded queue.
struct EpochPlanner::Impl {
  bool ran = false;  // run() used this planner
  std::unique_ptr<BackgroundQueue<PlannedIteration>> queue;  // next(): the pipeline on its own thread
};

namespace {
// One iteration in flight: planned, or the error planning it raised (delivered in order, so every
// iteration before the first failing one is delivered and none after).
struct Work {
  PlannedIteration it;
  std::exception_ptr error;
};
}  // namespace

EpochPlanner::EpochPlanner(const dl::MultiTaskDataset& data, const cm::CostModel& cost, PlannerOptions options,
                           EpochSpec spec, EpochOptions epoch_options)
    : data_(data), cost_(cost), options_(std::move(options)), spec_(std::move(spec)), eo_(epoch_options) {
  check_planner_options(options_);
  PACKPIPE_CHECK_ARG(eo_.threads >= 0 && eo_.threads <= 4096, "threads must be in [0, 4096] (0: every core), found {}",
                     eo_.threads);
  PACKPIPE_CHECK_ARG((spec_.sampler.global_batch_tokens > 0) != (spec_.sampler.global_batch_samples > 0),
                     "give exactly one of a global batch token budget (global_batch_tokens / --global-batch-tokens) "
                     "and a global batch sample count (global_batch_samples / --global-batch-samples)");
  encdec_ = cost_.model().arch == cm::Architecture::EncoderDecoder;
  check_context_length(options_.context, encdec_);
  spec_.sampler = budget_of_trained_tokens(spec_.sampler, options_.context, encdec_);
  vstages_ = part::virtual_stages(cost_.model(), options_.shape);
  if (options_.baselines_sized_by_data()) {
    // The baselines' rows hold the dataset's longest sample (a run's user fixes one capacity), as
    // batch_lengths counts it: within the context length.
    for (std::size_t t = 0; t < data_.num_tasks(); ++t) {
      if (!encdec_) {  // one sequence a sample: the dataset's sizes read directly (sample_tokens)
        for (std::uint64_t i = 0; i < data_.task_size(t); ++i) {
          options_.baseline_longest = std::max(options_.baseline_longest, data_.sample_tokens(t, i));
        }
        continue;
      }
      for (std::uint64_t i = 0; i < data_.task_size(t); ++i) {
        const SampleRef ref{static_cast<std::uint32_t>(t), i};
        const std::uint64_t in = data_.input_length(ref), tg = data_.target_length(ref);
        if (encdec_) {
          options_.baseline_longest = std::max(options_.baseline_longest, std::max<std::uint64_t>(in, 1));
          options_.baseline_longest_target = std::max(options_.baseline_longest_target, std::max<std::uint64_t>(tg, 1));
        } else {
          options_.baseline_longest = std::max(options_.baseline_longest, in + tg);
        }
      }
    }
    const ContextLength& c = options_.context;
    if (c.max_seq_len > 0) options_.baseline_longest = std::min<std::uint64_t>(options_.baseline_longest, c.max_seq_len);
    if (encdec_ && c.target_limit() > 0) {
      options_.baseline_longest_target = std::min<std::uint64_t>(options_.baseline_longest_target, c.target_limit());
    }
  }
  if (options_.task_names.empty()) {
    for (const auto& t : data_.manifest().tasks) options_.task_names.push_back(t.name);
  }
  options_.dataset = dataset_identity(data_);  // the plans' refs index this dataset
  // The exact iteration count: arithmetic for sample-count batches, a dry run of a sampler for
  // token budgets (batch boundaries only, no assembly: millions of samples a second). Plan files
  // record it, so a file that holds fewer iterations than its run was to plan is marked incomplete.
  // The same pass records the sampler's state where first_iteration starts, so planning resumes
  // there in O(tasks) (Sampler::restore with the state's check), not by a second replay.
  dl::Sampler probe(data_, spec_.sampler);
  probe.set_epoch(spec_.epoch);
  const std::uint64_t first = spec_.first_iteration;
  if (spec_.sampler.global_batch_samples > 0) {
    const std::uint64_t g = spec_.sampler.global_batch_samples;
    epoch_count_ = (probe.epoch_size() + g - 1) / g;
    first_state_ = probe.state();
    first_state_.batch_index = std::min(first, epoch_count_);
    first_state_.position = std::min(probe.epoch_size(), first_state_.batch_index * g);
    first_state_.check = 0;  // arithmetic: restore() checks it in O(1) without one
  } else {
    const std::uint64_t cap = spec_.iterations > 0 ? first + spec_.iterations : std::numeric_limits<std::uint64_t>::max();
    dl::GlobalBatch g;
    for (;;) {
      if (epoch_count_ == first) first_state_ = probe.state();
      if (epoch_count_ >= cap) {
        epoch_counted_ = false;  // epoch_iterations() counts the rest when asked
        break;
      }
      if (!probe.next_batch(g)) break;
      ++epoch_count_;
    }
  }
  PACKPIPE_CHECK_ARG(spec_.first_iteration <= epoch_count_,
                     "first iteration {} is past the end of epoch {} ({} iterations)", spec_.first_iteration,
                     spec_.epoch, epoch_count_);
  count_ = epoch_count_ - spec_.first_iteration;
  if (spec_.iterations > 0) count_ = std::min(count_, spec_.iterations);
}

std::uint64_t EpochPlanner::epoch_iterations() const {
  if (epoch_counted_) return epoch_count_;
  std::call_once(whole_epoch_once_, [&] {
    dl::Sampler probe(data_, spec_.sampler);
    probe.set_epoch(spec_.epoch);
    dl::GlobalBatch g;
    std::uint64_t n = 0;
    while (probe.next_batch(g)) ++n;
    whole_epoch_count_ = n;
  });
  return whole_epoch_count_;
}

EpochPlanner::~EpochPlanner() = default;  // the queue stops the pipeline and joins its thread

void EpochPlanner::pipeline(const std::function<bool(PlannedIteration&)>& sink, const std::function<bool()>& stopped) {
  if (count_ == 0) return;
  dl::Sampler sampler(data_, spec_.sampler);
  sampler.restore(first_state_);  // where first_iteration starts, recorded by the constructor's count
  const int threads = eo_.threads > 0 ? eo_.threads
                                      : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const std::size_t tokens = std::max<std::size_t>(1, 2 * static_cast<std::size_t>(threads));
  std::uint64_t next_iteration = spec_.first_iteration;
  const std::uint64_t end = spec_.first_iteration + count_;
  oneapi::tbb::enumerable_thread_specific<part::PartitionCache> caches;  // shape costs, per planning thread
  // The first failing iteration's error, raised once the pipeline has drained: throwing from a
  // filter cancels the pipeline and oneTBB then leaks the items in flight.
  std::exception_ptr failure;
  std::uint64_t failed_iteration = 0;
  std::atomic<bool> failed{false};
  oneapi::tbb::task_arena arena(threads);
  arena.execute([&] {
    oneapi::tbb::parallel_pipeline(
        tokens,
        oneapi::tbb::make_filter<void, std::shared_ptr<Work>>(
            oneapi::tbb::filter_mode::serial_in_order,
            [&](oneapi::tbb::flow_control& fc) -> std::shared_ptr<Work> {
              dl::GlobalBatch b;
              if (next_iteration >= end || failed.load(std::memory_order_relaxed) || stopped() ||
                  !sampler.next_batch(b)) {
                fc.stop();
                return nullptr;
              }
              auto w = std::make_shared<Work>();
              w->it.iteration = next_iteration++;
              try {
                w->it.lengths = batch_lengths(data_, b, encdec_, w->it.iteration, &w->it.refs, options_.loss_mode,
                                              options_.context, &w->it.context);
                w->it.sample_lengths = sample_lengths(data_, w->it.refs, encdec_);
              } catch (...) {
                w->error = std::current_exception();
              }
              return w;
            }) &
            oneapi::tbb::make_filter<std::shared_ptr<Work>, std::shared_ptr<Work>>(
                oneapi::tbb::filter_mode::parallel,
                [&](std::shared_ptr<Work> w) {
                  if (w->error || failed.load(std::memory_order_relaxed) || stopped()) return w;
                  try {
                    PlannedIteration& it = w->it;
                    it.result = plan_iteration(it.lengths, &it.refs, it.iteration, cost_, vstages_, options_,
                                               &caches.local());
                    it.result.context = it.context;  // applied sampling it (the lengths are within it)
                    if (eo_.encode) {
                      for (const auto& p : it.result.plans) it.blobs.push_back(pl::encode_plan(p, eo_.encoding));
                    }
                  } catch (...) {
                    w->error = std::current_exception();
                  }
                  return w;
                }) &
            oneapi::tbb::make_filter<std::shared_ptr<Work>, void>(
                oneapi::tbb::filter_mode::serial_in_order, [&](std::shared_ptr<Work> w) {
                  if (failed.load(std::memory_order_relaxed)) return;  // after a failure: drained, not delivered
                  if (w->error) {
                    failure = w->error;
                    failed_iteration = w->it.iteration;
                    failed.store(true, std::memory_order_relaxed);
                    return;
                  }
                  if (!stopped()) sink(w->it);
                }));
  });
  if (failure) detail::rethrow_naming(failure, failed_iteration);
}

void EpochPlanner::run(const std::function<void(PlannedIteration&)>& sink) {
  PACKPIPE_CHECK_ARG(impl_ == nullptr, "EpochPlanner: run() after next(); use one of them, once");
  impl_ = std::make_unique<Impl>();
  impl_->ran = true;
  pipeline([&](PlannedIteration& it) { sink(it); return true; }, [] { return false; });
}

bool EpochPlanner::next(PlannedIteration& out) {
  if (impl_ == nullptr) {
    impl_ = std::make_unique<Impl>();
    const std::size_t capacity =
        eo_.depth > 0 ? eo_.depth
                      : 2 * static_cast<std::size_t>(eo_.threads > 0 ? eo_.threads
                                                                     : std::max(1u, std::thread::hardware_concurrency()));
    impl_->queue = std::make_unique<BackgroundQueue<PlannedIteration>>(
        capacity,
        [this](BackgroundQueue<PlannedIteration>& q) {
          pipeline([&q](PlannedIteration& it) { return q.push(std::move(it)); }, [&q] { return q.stopped(); });
        },
        "EpochPlanner");
  }
  PACKPIPE_CHECK_ARG(!impl_->ran, "EpochPlanner: next() after run(); use one of them, once");
  if (!impl_->queue->next(out)) return false;
  ++delivered_;
  return true;
}

}  // namespace packpipe::planner
