// The Python-side holders of the planner's results (bind_planner.cpp), shared with the loader's
// bindings (bind_loader.cpp), which take over the EpochPlanner of a Python EpochPlanner.
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include <pybind11/pybind11.h>

#include "common/errors.h"
#include "costmodel/cost_model.h"
#include "plan/plan.h"
#include "planner/epoch.h"
#include "planner/planner.h"

namespace packpipe::bindings {

/// An IterationResult whose plans are shared with Python (packpipe.Plan objects, never copied).
struct PyIterationResult {
  planner::IterationResult result;  ///< plans moved out into `plans`
  std::vector<std::shared_ptr<plan::Plan>> plans;
  explicit PyIterationResult(planner::IterationResult&& r) : result(std::move(r)) {
    for (auto& p : result.plans) plans.push_back(std::make_shared<plan::Plan>(std::move(p)));
    result.plans.clear();
  }
};

/// One iteration of plan_epoch().
struct PyPlannedIteration {
  std::uint64_t iteration = 0;
  partition::BatchLengths lengths;  ///< after the context length (SampledBatch::lengths)
  std::vector<SampleRef> refs;
  partition::BatchLengths samples;  ///< before it (SampledBatch::sample_lengths)
  std::shared_ptr<PyIterationResult> result;
  std::vector<std::vector<std::uint8_t>> blobs;
  explicit PyPlannedIteration(planner::PlannedIteration&& it)
      : iteration(it.iteration),
        lengths(std::move(it.lengths)),
        refs(std::move(it.refs)),
        samples(std::move(it.sample_lengths)),
        result(std::make_shared<PyIterationResult>(std::move(it.result))),
        blobs(std::move(it.blobs)) {}
};

/// The EpochPlanner a Python EpochPlanner owns until a RankLoader takes it over; reaching it
/// afterwards throws Error (RuntimeError) saying so.
class OwnedPlanner {
 public:
  OwnedPlanner& operator=(std::unique_ptr<planner::EpochPlanner> p) {
    planner_ = std::move(p);
    return *this;
  }
  /// The planner; throws Error once taken over.
  planner::EpochPlanner& get() const {
    if (planner_ == nullptr) {
      PACKPIPE_THROW(Error, "this EpochPlanner was handed to a RankLoader, which delivers its iterations now; "
                            "iterate the RankLoader (or call plan_epoch again)");
    }
    return *planner_;
  }
  planner::EpochPlanner* operator->() const { return &get(); }
  /// Hands the planner over (throws Error when it was handed over already).
  std::unique_ptr<planner::EpochPlanner> take() {
    get();
    return std::move(planner_);
  }
  void reset() { planner_.reset(); }

 private:
  std::unique_ptr<planner::EpochPlanner> planner_;
};

/// The object plan_epoch() returns; the dataset is kept alive by keep_alive, the cost model here.
struct PyEpochPlanner {
  std::shared_ptr<costmodel::CostModel> cost;
  OwnedPlanner planner;
  ~PyEpochPlanner() {
    // Stops the background planning and joins it (an iteration in flight finishes first) without
    // holding the GIL.
    pybind11::gil_scoped_release release;
    planner.reset();
  }
};

}  // namespace packpipe::bindings
