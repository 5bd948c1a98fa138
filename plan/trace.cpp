#include "plan/trace.h"

#include <nlohmann/json.hpp>

#include "common/errors.h"

namespace packpipe::plan {

namespace {

using Json = nlohmann::ordered_json;

void add_process(Json& events, std::size_t pid, const std::string& name, const std::vector<std::string>& rank_names,
                 std::size_t ranks, bool sort_process) {
  events.push_back(Json{{"name", "process_name"}, {"ph", "M"}, {"pid", pid}, {"tid", 0}, {"args", Json{{"name", name}}}});
  if (sort_process) {
    events.push_back(
        Json{{"name", "process_sort_index"}, {"ph", "M"}, {"pid", pid}, {"tid", 0}, {"args", Json{{"sort_index", pid}}}});
  }
  for (std::size_t r = 0; r < ranks; ++r) {
    const std::string tname = rank_names.empty() ? fmt::format("rank {}", r) : rank_names[r];
    events.push_back(Json{{"name", "thread_name"}, {"ph", "M"}, {"pid", pid}, {"tid", r}, {"args", Json{{"name", tname}}}});
    events.push_back(
        Json{{"name", "thread_sort_index"}, {"ph", "M"}, {"pid", pid}, {"tid", r}, {"args", Json{{"sort_index", r}}}});
  }
}

void add_ops(Json& events, std::size_t pid, const std::vector<std::vector<ScheduledOp>>& ops) {
  for (std::size_t r = 0; r < ops.size(); ++r) {
    for (const ScheduledOp& op : ops[r]) {
      const char* tok = op_kind_token(op.kind);
      events.push_back(Json{{"name", fmt::format("{}{}", tok, op.mb)},
                            {"cat", tok},
                            {"ph", "X"},
                            {"pid", pid},
                            {"tid", r},
                            {"ts", op.start_ms * 1000.0},
                            {"dur", (op.end_ms - op.start_ms) * 1000.0},
                            {"args", Json{{"mb", op.mb}, {"vstage", op.vstage}, {"kind", tok}}}});
    }
  }
}

}  // namespace

std::string chrome_trace_json(const std::vector<TraceProcess>& processes, const std::string& other_json) {
  Json events = Json::array();
  for (std::size_t k = 0; k < processes.size(); ++k) {
    const TraceProcess& p = processes[k];
    std::size_t ranks = p.ops.size();
    for (const auto& e : p.events) ranks = std::max<std::size_t>(ranks, e.rank + 1);
    add_process(events, k, p.name, {}, ranks, true);
    add_ops(events, k, p.ops);
    for (const auto& e : p.events) {
      events.push_back(Json{{"name", e.name}, {"cat", e.category}, {"ph", "X"}, {"pid", k}, {"tid", e.rank},
                            {"ts", e.start_ms * 1000.0}, {"dur", (e.end_ms - e.start_ms) * 1000.0}});
    }
  }
  Json j;
  j["traceEvents"] = std::move(events);
  j["displayTimeUnit"] = "ms";
  j["otherData"] = Json::parse(other_json);
  return j.dump();
}

std::string chrome_trace_json(const Schedule& s, const TraceOptions& o) {
  PACKPIPE_CHECK_ARG(o.rank_names.empty() || o.rank_names.size() == s.ops.size(),
                     "rank_names must name {} ranks, found {}", s.ops.size(), o.rank_names.size());
  Json events = Json::array();
  add_process(events, 0, o.process_name, o.rank_names, s.ops.size(), false);
  add_ops(events, 0, s.ops);
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
