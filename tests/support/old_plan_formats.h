// Plans and plan files as older packpipe versions wrote them, made from current plans: the tests
// that older files are still read need them without an older build (tests only).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "plan/plan.h"

namespace packpipe::test {

/// The blob of `plan` as format 4 wrote it: encode_plan's (uncompressed) without format 5's dataset
/// fingerprint and format 6's slice flag, version 4 (a plan with slices is refused). The plan's dataset is dropped (format 4 has none).
std::vector<std::uint8_t> plan_blob_v4(const plan::Plan& plan);

/// The bytes of a plan file as format 2 wrote it (no dataset record) holding plan_blob_v4 of each
/// of `plans` (iterations consecutive, each iteration's replicas in order), marked complete.
std::string plan_file_v2(const std::vector<plan::Plan>& plans);

}  // namespace packpipe::test
