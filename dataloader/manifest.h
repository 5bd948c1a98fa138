// Multi-task manifests: a JSON file listing tasks, their dataset prefixes, layout and weight.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "common/enum_names.h"

namespace packpipe::dataloader {

enum class TaskLayout {
  Sequence,         ///< one sequence per sample (decoder-only); "dataset"/"datasets"
  PairedPrefixes,   ///< input and target in two prefixes matched by document; "inputs" + "targets"
  PairedSequences,  ///< two sequences per document (input, target; modes 0/1 if present)
};
/// The one name table: "sequence", "paired_prefixes", "paired_sequences" (a task's "layout").
inline constexpr EnumName<TaskLayout> kTaskLayoutNames[] = {{TaskLayout::Sequence, "sequence"},
                                                            {TaskLayout::PairedPrefixes, "paired_prefixes"},
                                                            {TaskLayout::PairedSequences, "paired_sequences"}};
/// "sequence", "paired_prefixes" or "paired_sequences".
constexpr const char* layout_name(TaskLayout layout) { return enum_name(kTaskLayoutNames, layout); }

struct TaskSpec {
  std::string name;
  TaskLayout layout = TaskLayout::Sequence;
  std::vector<std::string> prefixes;         ///< shards, concatenated in order (inputs if paired)
  std::vector<std::string> target_prefixes;  ///< PairedPrefixes only: one per entry of prefixes
  double weight = 1.0;                       ///< sampling weight (meaningful if Manifest::weighted)
};

struct Manifest {
  std::string path;                          ///< file it was read from, or a name for errors
  std::vector<TaskSpec> tasks;
  bool weighted = false;                     ///< true if every task gave "weight"
  std::array<double, 3> split{1.0, 0.0, 0.0};  ///< train/valid/test fractions, normalised
  std::uint64_t samples_per_epoch = 0;       ///< weighted epochs: 0 means the sum of task sizes
};

/// Reads a manifest file; relative prefixes resolve against the manifest's folder and every
/// `.idx` and `.bin`/`.bin.zst` must exist. Throws Error / InvalidArgument naming the file, the task
/// index and the field (missing file, negative weight, unknown key, wrong type, ...).
Manifest load_manifest(const std::string& path);
/// Parses manifest JSON text; `name` is used in messages, `base_dir` resolves relative prefixes.
/// Does not touch the file system when `check_files` is false (used by the fuzzer).
Manifest parse_manifest(const std::string& json_text, const std::string& name,
                        const std::string& base_dir, bool check_files = true);
/// The manifest as JSON text (prefixes as stored).
std::string manifest_to_json(const Manifest& manifest);

}  // namespace packpipe::dataloader
