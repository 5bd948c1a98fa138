// The one JSON reader of packpipe: strict (no duplicate keys) and bounded in depth.
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace packpipe {

/// Deepest nesting of arrays and objects any packpipe JSON file may have.
inline constexpr int kMaxJsonDepth = 64;

/// Parses `text` read from `source` (a file name, or e.g. "sampler state"). Throws Error naming
/// the source and, where the parser knows them, the byte offset, line and what was expected: for
/// malformed JSON, for a key repeated in one object (named with its path), and for nesting deeper
/// than `max_depth`.
nlohmann::json parse_json(std::string_view text, std::string_view source, int max_depth = kMaxJsonDepth);

/// parse_json for the insertion-ordered JSON type (files whose key order is kept when written).
nlohmann::ordered_json parse_ordered_json(std::string_view text, std::string_view source,
                                          int max_depth = kMaxJsonDepth);

/// 1-based line number of byte `offset` in `text` (for error messages).
std::size_t line_of(std::string_view text, std::size_t offset);

}  // namespace packpipe
