#include "common/json.h"

#include <algorithm>
#include <unordered_set>
#include <vector>

#include "common/errors.h"

namespace packpipe {

namespace {

struct Frame {
  bool object = false;
  std::string key;  // the key under which this container sits in its parent ("" for the root / arrays)
  std::unordered_set<std::string> keys;
};

std::string json_path(const std::vector<Frame>& stack) {
  std::string p;
  for (std::size_t i = 1; i < stack.size(); ++i) p += "/" + (stack[i].key.empty() ? "[]" : stack[i].key);
  return p.empty() ? "/" : p;
}

}  // namespace

std::size_t line_of(std::string_view text, std::size_t offset) {
  offset = std::min(offset, text.size());
  return 1 + static_cast<std::size_t>(std::count(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(offset), '\n'));
}

nlohmann::json parse_json(std::string_view text, std::string_view source, int max_depth) {
  using Json = nlohmann::json;
  std::vector<Frame> stack;
  std::string pending_key;  // last key seen in the innermost object
  auto cb = [&](int depth, Json::parse_event_t ev, Json& parsed) -> bool {
    switch (ev) {
      case Json::parse_event_t::object_start:
      case Json::parse_event_t::array_start: {
        if (depth >= max_depth) {
          PACKPIPE_THROW(Error, "{}: JSON nested deeper than {} levels at {}; packpipe files are never this deep",
                         source, max_depth, json_path(stack));
        }
        Frame f;
        f.object = ev == Json::parse_event_t::object_start;
        if (!stack.empty() && stack.back().object) f.key = pending_key;
        stack.push_back(std::move(f));
        break;
      }
      case Json::parse_event_t::object_end:
      case Json::parse_event_t::array_end:
        if (!stack.empty()) stack.pop_back();
        break;
      case Json::parse_event_t::key: {
        const std::string& k = parsed.get_ref<const std::string&>();
        if (!stack.empty() && !stack.back().keys.insert(k).second) {
          PACKPIPE_THROW(Error, "{}: duplicate key \"{}\" in the object at {}; each key may appear once",
                         source, k, json_path(stack));
        }
        pending_key = k;
        break;
      }
      case Json::parse_event_t::value:
        break;
    }
    return true;
  };
  try {
    return Json::parse(text.begin(), text.end(), cb, /*allow_exceptions=*/true, /*ignore_comments=*/false);
  } catch (const nlohmann::json::parse_error& e) {
    PACKPIPE_THROW(Error, "{}: invalid JSON at byte {} (line {}): {}", source, e.byte,
                   line_of(text, e.byte == 0 ? 0 : e.byte - 1), e.what());
  } catch (const nlohmann::json::exception& e) {
    PACKPIPE_THROW(Error, "{}: invalid JSON: {}", source, e.what());
  }
}

}  // namespace packpipe
