// Chrome trace / Perfetto JSON of a simulated schedule: one process, one thread (track) per
// pipeline rank, one complete ("X") event per compute op with its simulated start and duration.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "plan/timeline.h"

namespace packpipe::plan {

struct TraceOptions {
  std::string process_name = "packpipe";  ///< name of the single process (pid 0)
  std::vector<std::string> rank_names;    ///< track names; empty: "rank 0", "rank 1", ...
};

/// One process of a multi-timeline trace: a named timeline (per-rank ops, times in ms) and events
/// of its own (e.g. waits), drawn as one track per rank.
struct TraceEvent {
  std::uint32_t rank = 0;
  std::string name, category;
  double start_ms = 0, end_ms = 0;
};
struct TraceProcess {
  std::string name;
  std::vector<std::vector<ScheduledOp>> ops;  ///< [rank] compute ops
  std::vector<TraceEvent> events;             ///< other events (waits, communication)
};

/// Several timelines side by side (e.g. measured and planned) as one Chrome trace: process k is
/// processes[k], ranks are its tracks, compute ops are named as chrome_trace_json names them.
/// `other` is stored under "otherData".
std::string chrome_trace_json(const std::vector<TraceProcess>& processes, const std::string& other_json = "{}");

/// The schedule's timeline as Chrome trace JSON (object form, "traceEvents", displayTimeUnit
/// "ms"): per op an "X" event named "F3" / "B3" / "I3" / "W3" (kind token + micro-batch) with
/// ts/dur in microseconds, tid = rank, args {mb, vstage, kind}; metadata events name the process
/// and the tracks. Throws InvalidArgument when rank_names is given with the wrong length.
std::string chrome_trace_json(const Schedule& schedule, const TraceOptions& options = {});

}  // namespace packpipe::plan
