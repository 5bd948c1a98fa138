// One name table per enum: the spelling of each value in files, on the command line, in Python
// and in messages comes from a single table, and parsing a name lists the valid ones.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "common/errors.h"

namespace packpipe {

/// One value of an enum and its name.
template <class E>
struct EnumName {
  E value;
  const char* name;
};

/// The name of `e` in `table`, or "?" for a value outside it.
template <class E, std::size_t N>
constexpr const char* enum_name(const EnumName<E> (&table)[N], E e) {
  for (const auto& x : table) {
    if (x.value == e) return x.name;
  }
  return "?";
}

/// "a, b, c": the names of `table` in order (for help texts and messages).
template <class E, std::size_t N>
std::string enum_name_list(const EnumName<E> (&table)[N]) {
  std::string s;
  for (const auto& x : table) s += (s.empty() ? "" : ", ") + std::string(x.name);
  return s;
}

/// The names of `table` in order (for CLI choices and Python).
template <class E, std::size_t N>
std::vector<std::string> enum_names(const EnumName<E> (&table)[N]) {
  std::vector<std::string> v;
  for (const auto& x : table) v.emplace_back(x.name);
  return v;
}

/// The entry named `name`, or null (for parsers that word their own message, e.g. naming a file).
template <class E, std::size_t N>
constexpr const EnumName<E>* enum_find(const EnumName<E> (&table)[N], std::string_view name) {
  for (const auto& x : table) {
    if (name == x.name) return &x;
  }
  return nullptr;
}

/// The value named `name`; throws InvalidArgument "unknown <what> '<name>' (expected a, b, c)".
template <class E, std::size_t N>
E enum_from_name(const EnumName<E> (&table)[N], std::string_view name, const char* what) {
  for (const auto& x : table) {
    if (name == x.name) return x.value;
  }
  throw InvalidArgument(fmt::format("unknown {} '{}' (expected {})", what, name, enum_name_list(table)));
}

}  // namespace packpipe
