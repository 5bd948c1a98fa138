#include "runtime/report.h"

#include <algorithm>
#include <limits>
#include <map>
#include <tuple>

#include <fmt/format.h>

#include "common/errors.h"
#include "common/stats.h"
#include "plan/trace.h"

namespace packpipe::runtime {

namespace pl = ::packpipe::plan;

namespace {

std::int64_t first_start(const ExecutedPlan& e) {
  std::int64_t t = std::numeric_limits<std::int64_t>::max();
  for (const auto& r : e.records) t = std::min(t, r.start_ns);
  return t;
}
std::int64_t last_end(const ExecutedPlan& e) {
  std::int64_t t = std::numeric_limits<std::int64_t>::min();
  for (const auto& r : e.records) t = std::max(t, r.end_ns);
  return t;
}

}  // namespace

RunSummary summarize(const std::vector<ExecutedPlan>& runs, double time_scale) {
  RunSummary s;
  std::map<pl::OpKind, std::vector<double>> ratios;
  std::vector<double> plan_ratios;
  std::int64_t overhead = 0, wait = 0, rank_time = 0;
  for (const ExecutedPlan& e : runs) {
    PACKPIPE_CHECK_ARG(e.plan != nullptr && e.records.size() == e.plan->ranks,
                       "summarize: an executed plan needs one record per rank");
    const pl::Plan& p = *e.plan;
    PlanFigures f;
    f.iteration = p.iteration;
    f.replica = p.replica;
    f.measured_ms = static_cast<double>(last_end(e) - first_start(e)) / 1e6;
    f.simulated_ms = p.makespan_ms * time_scale;
    s.measured_ms += f.measured_ms;
    s.simulated_ms += f.simulated_ms;
    if (f.simulated_ms > 0) plan_ratios.push_back(f.ratio());
    s.plans.push_back(f);
    for (std::size_t r = 0; r < e.records.size(); ++r) {
      const RankRecord& rec = e.records[r];
      s.instructions += rec.instructions;
      overhead += rec.overhead_ns();
      wait += rec.wait_ns;
      rank_time += rec.end_ns - rec.start_ns;
      if (rec.times.size() != p.streams[r].size() || r >= p.timeline.size() || time_scale <= 0) continue;
      std::map<std::tuple<int, std::uint32_t, std::uint32_t>, double> planned;
      for (const auto& op : p.timeline[r]) planned[{static_cast<int>(op.kind), op.mb, op.vstage}] = op.end_ms - op.start_ms;
      for (std::size_t i = 0; i < rec.times.size(); ++i) {
        const pl::Instruction& ins = p.streams[r][i];
        if (!pl::is_compute(ins.op)) continue;
        const pl::OpKind k = pl::compute_kind(ins.op);
        auto it = planned.find({static_cast<int>(k), ins.mb, ins.stage});
        if (it == planned.end() || it->second <= 0) continue;
        const double measured = static_cast<double>(rec.times[i].end_ns - rec.times[i].start_ns) / 1e6;
        ratios[k].push_back(measured / (it->second * time_scale));
      }
    }
  }
  s.median_ratio = median(plan_ratios);
  for (auto& [k, v] : ratios) s.op_ratios.emplace_back(pl::op_kind_token(k), median(v), v.size());
  s.overhead_ns_per_instruction = s.instructions > 0 ? static_cast<double>(overhead) / static_cast<double>(s.instructions) : 0;
  s.wait_fraction = rank_time > 0 ? static_cast<double>(wait) / static_cast<double>(rank_time) : 0;
  return s;
}

std::string trace_json(const std::vector<ExecutedPlan>& runs, double time_scale) {
  std::int64_t t0 = std::numeric_limits<std::int64_t>::max();
  std::uint32_t ranks = 0;
  for (const auto& e : runs) {
    t0 = std::min(t0, first_start(e));
    ranks = std::max<std::uint32_t>(ranks, e.plan->ranks);
  }
  if (runs.empty()) t0 = 0;
  auto ms = [&](std::int64_t ns) { return static_cast<double>(ns - t0) / 1e6; };
  pl::TraceProcess measured{"measured", std::vector<std::vector<pl::ScheduledOp>>(ranks), {}};
  pl::TraceProcess planned{"planned (simulated)", std::vector<std::vector<pl::ScheduledOp>>(ranks), {}};
  for (const ExecutedPlan& e : runs) {
    const pl::Plan& p = *e.plan;
    const double at = ms(first_start(e));
    for (std::size_t r = 0; r < e.records.size(); ++r) {
      const RankRecord& rec = e.records[r];
      for (std::size_t i = 0; i < rec.times.size() && i < p.streams[r].size(); ++i) {
        const pl::Instruction& ins = p.streams[r][i];
        const double a = ms(rec.times[i].start_ns), b = ms(rec.times[i].end_ns);
        if (pl::is_compute(ins.op)) {
          measured.ops[r].push_back(pl::ScheduledOp{pl::compute_kind(ins.op), ins.mb, ins.stage, a, b});
        } else if ((ins.op == pl::Opcode::RecvActWait || ins.op == pl::Opcode::RecvGradWait ||
                    ins.op == pl::Opcode::SendActWait || ins.op == pl::Opcode::SendGradWait) && b - a > 0.001) {
          measured.events.push_back(pl::TraceEvent{static_cast<std::uint32_t>(r),
                                                   fmt::format("{} mb {}", pl::opcode_name(ins.op), ins.mb), "wait", a, b});
        }
      }
      if (r < p.timeline.size()) {
        for (pl::ScheduledOp op : p.timeline[r]) {
          op.start_ms = at + op.start_ms * time_scale;
          op.end_ms = at + op.end_ms * time_scale;
          planned.ops[r].push_back(op);
        }
      }
    }
  }
  const RunSummary s = summarize(runs, time_scale);
  const std::string other = fmt::format(R"({{"measured_ms": {}, "simulated_ms": {}, "time_scale": {}, "plans": {}}})",
                                        s.measured_ms, s.simulated_ms, time_scale, runs.size());
  return pl::chrome_trace_json({measured, planned}, other);
}

}  // namespace packpipe::runtime
