// Activation recompute modes: chosen per micro-batch by the partitioner, costed by the cost model,
// recorded in plans and applied by the runtime's stage handlers.
#pragma once

#include <cstdint>
#include <string_view>

#include "common/enum_names.h"

namespace packpipe {

/// Values are part of the plan format: append only.
enum class Recompute : std::uint8_t { None = 0, Selective = 1, Full = 2 };
/// The one name table: "none", "selective", "full".
inline constexpr EnumName<Recompute> kRecomputeNames[] = {
    {Recompute::None, "none"}, {Recompute::Selective, "selective"}, {Recompute::Full, "full"}};
/// "none", "selective" or "full".
constexpr const char* recompute_name(Recompute rc) { return enum_name(kRecomputeNames, rc); }
/// The mode named `name`; throws InvalidArgument listing the names.
inline Recompute recompute_from_name(std::string_view name) {
  return enum_from_name(kRecomputeNames, name, "recompute mode");
}

}  // namespace packpipe
