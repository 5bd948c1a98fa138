// `packpipe costmodel validate --measured`: a cost model against executed iterations (the
// validate subcommand of cli/costmodel_profile.cpp hands over to it when traces are given).
#pragma once

#include <string>
#include <vector>

#include "cli/util.h"

namespace packpipe::cli {

struct MeasuredValidateArgs {
  std::vector<std::string> measured;  ///< measurement files (packpipe-measurements)
  CostModelArgs costs;                ///< model and device empty: the first file's header names them
  std::string plot_data;              ///< validation_plot_json written here (atomically); empty: none
  std::string plot;                   ///< PNG drawn from it by packpipe.plots (matplotlib); empty: none
  bool json = false;
};

/// Reads the measurements, compares the cost model with them (planner::validate_measurements) and
/// prints the per-op and per-iteration errors; throws Error naming the file, line and field of a
/// bad measurement, InvalidArgument for a shape the model refuses.
void run_measured_validate(const MeasuredValidateArgs& a);

}  // namespace packpipe::cli
