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

template <typename Json>
Json parse_strict(std::string_view text, std::string_view source, int max_depth) {
  std::vector<Frame> stack;
  std::string pending_key;  // last key seen in the innermost object
  using Event = typename Json::parse_event_t;
  auto cb = [&](int depth, Event ev, Json& parsed) -> bool {
    switch (ev) {
      case Event::object_start:
      case Event::array_start: {
        if (depth >= max_depth) {
          PACKPIPE_THROW(Error, "{}: JSON nested deeper than {} levels at {}; packpipe files are never this deep",
                         source, max_depth, json_path(stack));
        }
        Frame f;
        f.object = ev == Event::object_start;
        if (!stack.empty() && stack.back().object) f.key = pending_key;
        stack.push_back(std::move(f));
        break;
      }
      case Event::object_end:
      case Event::array_end:
        if (!stack.empty()) stack.pop_back();
        break;
      case Event::key: {
        const std::string& k = parsed.template get_ref<const std::string&>();
        if (!stack.empty() && !stack.back().keys.insert(k).second) {
          PACKPIPE_THROW(Error, "{}: duplicate key \"{}\" in the object at {}; each key may appear once",
                         source, k, json_path(stack));
        }
        pending_key = k;
        break;
      }
      case Event::value:
        break;
    }
    return true;
  };
  try {
    return Json::parse(text.begin(), text.end(), cb, /*allow_exceptions=*/true, /*ignore_comments=*/false);
  } catch (const nlohmann::json::parse_error& e) {
    PACKPIPE_THROW(Error, "{}: malformed JSON at byte {} (line {}): {}", source, e.byte,
                   line_of(text, e.byte == 0 ? 0 : e.byte - 1), e.what());
  } catch (const nlohmann::json::exception& e) {
    PACKPIPE_THROW(Error, "{}: malformed JSON: {}", source, e.what());
  }
}

nlohmann::json parse_json(std::string_view text, std::string_view source, int max_depth) {
  return parse_strict<nlohmann::json>(text, source, max_depth);
}

nlohmann::ordered_json parse_ordered_json(std::string_view text, std::string_view source, int max_depth) {
  return parse_strict<nlohmann::ordered_json>(text, source, max_depth);
}

}  // namespace packpipe
