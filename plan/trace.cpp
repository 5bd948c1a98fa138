#include "plan/trace.h"

#include <nlohmann/json.hpp>

#include "common/errors.h"

namespace packpipe::plan {

std::string chrome_trace_json(const Schedule& s, const TraceOptions& o) {
  PACKPIPE_CHECK_ARG(o.rank_names.empty() || o.rank_names.size() == s.ops.size(),
                     "rank_names must name {} ranks, found {}", s.ops.size(), o.rank_names.size());
  using Json = nlohmann::ordered_json;
  Json events = Json::array();
  events.push_back(Json{{"name", "process_name"}, {"ph", "M"}, {"pid", 0}, {"tid", 0},
                        {"args", Json{{"name", o.process_name}}}});
  for (std::size_t r = 0; r < s.ops.size(); ++r) {
    const std::string name = o.rank_names.empty() ? fmt::format("rank {}", r) : o.rank_names[r];
    events.push_back(Json{{"name", "thread_name"}, {"ph", "M"}, {"pid", 0}, {"tid", r}, {"args", Json{{"name", name}}}});
    events.push_back(
        Json{{"name", "thread_sort_index"}, {"ph", "M"}, {"pid", 0}, {"tid", r}, {"args", Json{{"sort_index", r}}}});
  }
  for (std::size_t r = 0; r < s.ops.size(); ++r) {
    for (const ScheduledOp& op : s.ops[r]) {
      const char* tok = op_kind_token(op.kind);
      events.push_back(Json{{"name", fmt::format("{}{}", tok, op.mb)},
                            {"cat", tok},
                            {"ph", "X"},
                            {"pid", 0},
                            {"tid", r},
                            {"ts", op.start_ms * 1000.0},
                            {"dur", (op.end_ms - op.start_ms) * 1000.0},
                            {"args", Json{{"mb", op.mb}, {"vstage", op.vstage}, {"kind", tok}}}});
    }
  }
  Json j;
  j["traceEvents"] = std::move(events);
  j["displayTimeUnit"] = "ms";
  j["otherData"] = Json{{"schedule", s.name},
                        {"makespan_ms", s.makespan_ms},
                        {"bubble_fraction", s.bubble_fraction},
                        {"ranks", s.ranks},
                        {"vstages", s.vstages},
                        {"microbatches", s.microbatches}};
  return j.dump();
}

}  // namespace packpipe::plan
