// Cost models from real profiles (DynaPipe grids and per-point files, Aceso, Metis, AIOB):
// readers, interpolation of efficiency between grid points, and leave-one-out validation.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "costmodel/cost_model.h"

namespace packpipe::costmodel {

/// Loads the profiles at `paths` (files or folders; the format is detected from names and
/// headers) for `model` on `device`; queries outside the profiled discrete axes fall back to the
/// analytic model and say so in the provenance. Throws Error naming the file and row of a bad profile.
std::unique_ptr<CostModel> make_profiled_cost_model(const std::vector<std::string>& paths, const ModelSpec& model,
                                                    const DeviceSpec& device);

}  // namespace packpipe::costmodel
