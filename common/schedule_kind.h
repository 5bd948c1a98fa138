// The pipeline schedule kinds and their names: what the schedule component builds, and what a
// calibration's schedule factors (costmodel/calibration.h) and a measurement's iteration lines
// (costmodel/measurements.h) name, so a layer below the schedules can check the names.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/enum_names.h"

namespace packpipe {

enum class ScheduleKind : std::uint8_t { GPipe, OneFOneB, Interleaved1F1B, Cyclic, WaitFreeCyclic, ZeroBubble };

/// The one name table, in the order of the enum: "gpipe", "1f1b", "interleaved-1f1b", "cyclic",
/// "wait-free-cyclic", "zero-bubble".
inline constexpr EnumName<ScheduleKind> kScheduleKindNames[] = {
    {ScheduleKind::GPipe, "gpipe"},
    {ScheduleKind::OneFOneB, "1f1b"},
    {ScheduleKind::Interleaved1F1B, "interleaved-1f1b"},
    {ScheduleKind::Cyclic, "cyclic"},
    {ScheduleKind::WaitFreeCyclic, "wait-free-cyclic"},
    {ScheduleKind::ZeroBubble, "zero-bubble"}};
/// How many kinds there are.
inline constexpr std::size_t kScheduleKinds = sizeof(kScheduleKindNames) / sizeof(kScheduleKindNames[0]);
/// The kind's name in kScheduleKindNames.
constexpr const char* schedule_kind_name(ScheduleKind k) { return enum_name(kScheduleKindNames, k); }
/// The kind from its name; throws InvalidArgument listing the names.
inline ScheduleKind schedule_kind_from_name(const std::string& name) {
  return enum_from_name(kScheduleKindNames, name, "schedule");
}

}  // namespace packpipe
