#include "schedule/stage_costs.h"

#include <limits>

#include "common/errors.h"
#include "costmodel/stage_ops.h"

namespace packpipe::schedule {

namespace part = ::packpipe::partition;

StageCostTable empty_stage_cost_table(const cm::CostModel& cost, std::int64_t microbatches, std::int64_t vstages,
                                      std::int64_t ranks) {
  StageCostTable t;
  t.microbatches = microbatches;
  t.vstages = vstages;
  const auto n = static_cast<std::size_t>(microbatches * vstages);
  t.forward_ms.resize(n);
  t.backward_ms.resize(n);
  t.backward_weight_ms.resize(n);
  if (cost.calibration() != nullptr) t.backward_input_ms.resize(n);
  t.stored_bytes.resize(n);
  t.peak_bytes.resize(n);
  t.send_bytes.resize(n);
  t.static_bytes.assign(static_cast<std::size_t>(ranks), 0.0);
  return t;
}

void set_stage_cost(StageCostTable& t, std::size_t i, const cm::CostModel& cost, const cm::StageLayout& layout,
                    std::int64_t tp, const cm::MicroShape& shape, cm::Recompute rc) {
  const cm::LayerCost c = cm::stage_cost(cost, layout, tp, shape, rc);
  const cm::StageOpTimes ops = cm::stage_op_times(cost, c, layout, shape);
  t.forward_ms[i] = ops.forward_ms;
  t.backward_ms[i] = ops.backward_ms;
  t.backward_weight_ms[i] = ops.backward_weight_ms;
  if (!t.backward_input_ms.empty()) t.backward_input_ms[i] = ops.backward_input_ms;
  t.stored_bytes[i] = c.stored_bytes;
  t.peak_bytes[i] = c.peak_bytes;
  t.send_bytes[i] = c.boundary_bytes;
}

namespace {

// `f` on every per-entry column of `t` (backward_input_ms with a calibrated model).
template <typename F>
void each_column(StageCostTable& t, bool calibrated, F&& f) {
  for (std::vector<double>* c : {&t.forward_ms, &t.backward_ms, &t.backward_weight_ms, &t.stored_bytes, &t.peak_bytes,
                                 &t.send_bytes}) {
    f(*c);
  }
  if (calibrated) f(t.backward_input_ms);
}

// The table, stopping (false) once a rank's summed forward and backward work reaches stop_at_ms.
bool fill_table(StageCostTable& t, const cm::CostModel& cost, const part::PipelineShape& shape,
                const std::vector<part::VirtualStage>& vstages, const std::vector<part::MicroBatch>& mbs,
                double stop_at_ms) {
  const cm::ModelSpec& model = cost.model();
  for (const auto& vs : vstages) {
    t.static_bytes[static_cast<std::size_t>(vs.rank)] +=
        cm::stage_static_memory(model, vs.layout, shape.tp, shape.dp, shape.zero_stage).total();
  }
  const bool watch = stop_at_ms < std::numeric_limits<double>::infinity();
  std::vector<double> work(watch ? static_cast<std::size_t>(shape.stages) : 0, 0.0);
  // An entry depends on the stage's layout only (set_stage_cost): a virtual stage laid out as an
  // earlier one (the middle stages: no embedding, no head, as many layers) copies its entry.
  std::vector<std::size_t> same(vstages.size());
  for (std::size_t k = 0; k < vstages.size(); ++k) {
    same[k] = k;
    for (std::size_t e = 0; e < k && same[k] == k; ++e) {
      if (vstages[e].layout == vstages[k].layout) same[k] = e;
    }
  }
  const bool calibrated = cost.calibration() != nullptr;  // (a table that may stop grows its columns below)
  for (std::size_t m = 0; m < mbs.size(); ++m) {
    if (watch) {  // (a table that may stop grows entry by entry)
      const std::size_t n = (m + 1) * static_cast<std::size_t>(t.vstages);
      each_column(t, calibrated, [n](std::vector<double>& c) { c.resize(n); });
    }
    const part::MicroBatch& mb = mbs[m];
    PACKPIPE_CHECK_ARG(mb.rows() > 0 && mb.padded_len > 0, "micro-batch {} is empty (rows {}, padded length {})", m,
                       mb.rows(), mb.padded_len);
    const cm::MicroShape ms = mb.shape();
    for (std::size_t k = 0; k < vstages.size(); ++k) {
      const std::size_t i = t.at(static_cast<std::int64_t>(m), vstages[k].index);
      if (same[k] == k) {
        set_stage_cost(t, i, cost, vstages[k].layout, shape.tp, ms, mb.recompute);
        continue;
      }
      const std::size_t j = t.at(static_cast<std::int64_t>(m), vstages[same[k]].index);
      each_column(t, calibrated, [i, j](std::vector<double>& c) { c[i] = c[j]; });
    }
    if (!watch) continue;
    // (makespan_lower_bounds' sum: virtual stages in index order, stage v on rank v mod S)
    for (std::int64_t v = 0; v < t.vstages; ++v) {
      const std::size_t i = t.at(static_cast<std::int64_t>(m), v);
      double& w = work[static_cast<std::size_t>(v % shape.stages)];
      w += t.op_ms(pl::OpKind::Forward, i) + t.least_backward_ms(i);
      if (w >= stop_at_ms) return false;
    }
  }
  return true;
}

}  // namespace

std::optional<StageCostTable> stage_cost_table_below(const cm::CostModel& cost, const part::PipelineShape& shape,
                                                     const std::vector<part::VirtualStage>& vstages,
                                                     const std::vector<part::MicroBatch>& mbs, double stop_at_ms) {
  const bool watch = stop_at_ms < std::numeric_limits<double>::infinity();
  // (a table that may stop early has its columns reserved, not zeroed: they grow as entries are built)
  StageCostTable t = empty_stage_cost_table(cost, watch ? 0 : static_cast<std::int64_t>(mbs.size()),
                                            static_cast<std::int64_t>(vstages.size()), shape.stages);
  t.microbatches = static_cast<std::int64_t>(mbs.size());
  if (watch) {
    const std::size_t n = mbs.size() * vstages.size();
    each_column(t, cost.calibration() != nullptr, [n](std::vector<double>& c) { c.reserve(n); });
  }
  if (!fill_table(t, cost, shape, vstages, mbs, stop_at_ms)) return std::nullopt;
  return t;
}

StageCostTable stage_cost_table(const cm::CostModel& cost, const part::PipelineShape& shape,
                                const std::vector<part::VirtualStage>& vstages, const std::vector<part::MicroBatch>& mbs) {
  return *stage_cost_table_below(cost, shape, vstages, mbs, std::numeric_limits<double>::infinity());
}

}  // namespace packpipe::schedule
