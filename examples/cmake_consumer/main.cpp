// Plans one small global batch through an installed packpipe: an analytic cost model preset, the
// partition of the batch into micro-batches, and the validated plan of the iteration.
#include <cstdint>
#include <cstdio>
#include <exception>

#include "common/config.h"
#include "costmodel/analytic.h"
#include "costmodel/model.h"
#include "partition/partition.h"
#include "partition/pipeline.h"
#include "plan/validator.h"
#include "planner/planner.h"

int main() {
  namespace cm = packpipe::costmodel;
  namespace part = packpipe::partition;
  try {
    const cm::AnalyticCostModel cost(cm::load_model("gpt-1.3b"), cm::load_device("A100-80GB"));
    packpipe::planner::PlannerOptions options;
    options.shape.stages = 2;
    options.baseline_mbs = {1, 4};
    part::BatchLengths batch;
    for (std::uint32_t i = 0; i < 32; ++i) batch.input.push_back(128 + 61 * i % 1900);

    const auto vstages = part::virtual_stages(cost.model(), options.shape);
    const part::Partition p = part::partition(batch, cost, options.shape, vstages, options.partition);
    const auto result = packpipe::planner::plan_iteration(batch, nullptr, 0, cost, vstages, options);
    const auto report = packpipe::plan::validate(result.plans.at(0));
    if (!report.ok()) {
      std::fprintf(stderr, "plan invalid: %s\n", packpipe::plan::to_string(report.violations[0]).c_str());
      return 1;
    }
    std::printf("packpipe %s: %zu samples in %zu micro-batches, plan valid (%zu instructions)\n",
                PACKPIPE_VERSION, batch.size(), p.microbatches.size(), result.plans[0].instruction_count());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
