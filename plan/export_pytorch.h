// Export of a plan's compute order to PyTorch torch.distributed.pipelining.
#pragma once

#include <string>

#include "plan/plan.h"

namespace packpipe::plan {

/// PyTorch "compute_only" CSV: row r = rank r's compute ops in order, cells "<stage>F<mb>",
/// "<stage>I<mb>", "<stage>W<mb>", "<stage>B<mb>" separated by commas (load it with
/// `_PipelineScheduleRuntime._load_csv(path, format="compute_only")`, PyTorch >= 2.6; PyTorch
/// inserts its own sends, receives and gradient reduction). Throws Unsupported, naming the first
/// micro-batch that differs, when the micro-batches do not share one shape (rows, padded lengths):
/// PyTorch sizes its buffers once and cannot vary shapes.
std::string pytorch_compute_csv(const Plan& plan);
/// True if every micro-batch has micro-batch 0's rows and padded lengths (pytorch_compute_csv accepts it).
bool pytorch_exportable(const Plan& plan, std::string* why = nullptr);

}  // namespace packpipe::plan
