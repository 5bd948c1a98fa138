// How a micro-batch lays its samples out, and so how attention sees them: chosen per micro-batch
// by the partitioner, costed by the cost model (costmodel::AttentionWork), recorded in plans and
// turned into tensors by the loader (docs/design/014-layouts.md).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "common/enum_names.h"
#include "common/errors.h"

namespace packpipe {

/// Values are part of the plan format: append only.
enum class Layout : std::uint8_t {
  Padded = 0,      ///< one sample a row, every row padded to the longest (DynaPipe, Megatron)
  Packed = 1,      ///< every sample back to back in one row, attended apart by varlen attention
                   ///< (cu_seqlens: flash-attn, Megatron THD, HF flattening); no padding
  PackedMask = 2,  ///< samples packed into rows of a capacity, attended apart by a dense block mask
                   ///< (for an executor without a varlen kernel): every row costs dense attention
};
/// The one name table: "padded", "packed", "packed-mask".
inline constexpr EnumName<Layout> kLayoutNames[] = {
    {Layout::Padded, "padded"}, {Layout::Packed, "packed"}, {Layout::PackedMask, "packed-mask"}};
/// "padded", "packed" or "packed-mask".
constexpr const char* layout_name(Layout l) { return enum_name(kLayoutNames, l); }
/// The layout named `name`; throws InvalidArgument listing the names.
inline Layout layout_from_name(std::string_view name) { return enum_from_name(kLayoutNames, name, "layout"); }

/// A set of layouts (a bit per Layout), e.g. what an executor can run.
using LayoutSet = std::uint8_t;
/// The set holding `l` alone.
constexpr LayoutSet layout_bit(Layout l) { return static_cast<LayoutSet>(1u << static_cast<unsigned>(l)); }
/// Whether `set` holds `l`.
constexpr bool has_layout(LayoutSet set, Layout l) { return (set & layout_bit(l)) != 0; }
/// Every layout.
inline constexpr LayoutSet kAllLayouts = layout_bit(Layout::Padded) | layout_bit(Layout::Packed) |
                                         layout_bit(Layout::PackedMask);

/// The names of the layouts in `set`, comma-separated ("padded,packed"); "none" for the empty set.
inline std::string layout_set_names(LayoutSet set) {
  std::string out;
  for (const auto& e : kLayoutNames) {
    if (!has_layout(set, e.value)) continue;
    if (!out.empty()) out += ',';
    out += e.name;
  }
  const unsigned unknown = set & ~static_cast<unsigned>(kAllLayouts);
  if (unknown != 0) out += (out.empty() ? "" : ",") + std::string("unknown bits ") + std::to_string(unknown);
  return out.empty() ? "none" : out;
}
/// The set of comma-separated layout names ("padded,packed"); throws InvalidArgument naming a
/// name that is not a layout, or an empty list.
inline LayoutSet layout_set_from_names(std::string_view names) {
  LayoutSet set = 0;
  std::size_t pos = 0;
  while (pos <= names.size()) {
    std::size_t end = names.find(',', pos);
    if (end == std::string_view::npos) end = names.size();
    const LayoutSet bit = layout_bit(layout_from_name(names.substr(pos, end - pos)));
    PACKPIPE_CHECK_ARG((set & bit) == 0, "layouts '{}': '{}' is listed twice", std::string(names),
                       std::string(names.substr(pos, end - pos)));
    set |= bit;
    pos = end + 1;
  }
  return set;
}

/// Tokens one side of a sample takes in a packed row: its length, or one token for an empty side
/// of an encoder-decoder sample (the loader lays an empty input out as one pad token and an empty
/// target as one decoder token).
constexpr std::uint64_t packed_tokens(std::uint32_t length, bool encoder_decoder) {
  return encoder_decoder && length == 0 ? 1 : length;
}

}  // namespace packpipe
