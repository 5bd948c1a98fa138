// Chrome trace / Perfetto JSON of a simulated schedule: one process, one thread (track) per
// pipeline rank, one complete ("X") event per compute op with its simulated start and duration.
#pragma once

#include <string>
#include <vector>

#include "plan/timeline.h"

namespace packpipe::plan {

struct TraceOptions {
  std::string process_name = "packpipe";  ///< name of the single process (pid 0)
  std::vector<std::string> rank_names;    ///< track names; empty: "rank 0", "rank 1", ...
};

/// The schedule's timeline as Chrome trace JSON (object form, "traceEvents", displayTimeUnit
/// "ms"): per op an "X" event named "F3" / "B3" / "I3" / "W3" (kind token + micro-batch) with
/// ts/dur in microseconds, tid = rank, args {mb, vstage, kind}; metadata events name the process
/// and the tracks. Throws InvalidArgument when rank_names is given with the wrong length.
std::string chrome_trace_json(const Schedule& schedule, const TraceOptions& options = {});

}  // namespace packpipe::plan
