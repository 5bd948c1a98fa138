// Plan serialization: a compact versioned binary form (optionally zstd-compressed, checksummed),
// a JSON form for people, and a multi-iteration plan file read by iteration (mmap).
//
// Binary plan ("blob"): 32-byte header, little-endian:
//   magic "PPLN" | u16 version | u16 flags (bit 0: body zstd-compressed) | u64 body size
//   (uncompressed) | u64 stored size | u64 XXH64 of the stored body bytes
// followed by the body (varints and f64, see docs/design/007-instructions.md).
// Plan file (format 3): "PPLF" u16 version u16 flags(0) | blobs back to back | index (per plan: u64
// iteration, u64 offset, u64 size) | dataset (flag bit 1 only: u64 fingerprint, varint task count,
// per task varint name length, name, varint samples) | 64-byte footer: plan count, index offset,
// first iteration, iterations held, iterations declared, flags (bit 0: complete, bit 1: dataset),
// XXH64 of the bytes from the index to the footer's first 48 bytes, "PPLI", footer version.
// Format 2 (no dataset) is still read.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "common/mapped_file.h"
#include "plan/plan.h"

namespace packpipe {
class AtomicFile;
}

namespace packpipe::plan {

/// Plan (blob and JSON) format: 2 adds what a trainer needs (stage specs, activation dtype, loss
/// tokens, tied embedding, per-sample lengths, recompute on FWD, REDUCE_TIED); 3 adds each
/// micro-batch's layout (PlanMicroBatch::layout); 4 adds the context length (Plan::max_seq_len,
/// max_target_len) and the token offset of each sample ref (SampleRef::offset: chunks of samples
/// split at the context length). Older plans are still read (format 1 without the trainer's fields:
/// Plan::stages empty; formats 1-2 with layouts implied by row_offsets; formats 1-3 with no context
/// length and every offset 0); 5 adds the fingerprint of the dataset whose samples the refs name
/// (Plan::dataset; older plans: unknown, which loaders accept without a check).
constexpr std::uint16_t kPlanFormatVersion = 6;

struct EncodeOptions {
  bool compress = false;  ///< zstd-compress the body
  int zstd_level = 3;
};

/// The binary form of `plan`. Deterministic: the same plan gives the same bytes. Throws
/// InvalidArgument if a field cannot be represented (e.g. a buffer id equal to kNone).
std::vector<std::uint8_t> encode_plan(const Plan& plan, const EncodeOptions& options = {});
/// Decodes a binary plan from memory. `what` names the source in errors (a file name). Throws
/// packpipe::Error naming `what`, the byte offset, the field and expected versus found on any
/// truncation, corruption (checksum), unknown version or out-of-range value; never reads outside
/// [data, data + size). `verify_checksum` false skips the checksum (fuzzing only). Round trip: encode_plan(decode_plan(encode_plan(p))) == encode_plan(p).
Plan decode_plan(const std::uint8_t* data, std::size_t size, const std::string& what = "plan", bool verify_checksum = true);

/// The most spaces plan_to_json indents a JSON level by (nlohmann's dump misbehaves far above it).
inline constexpr int kMaxJsonIndent = 64;

/// The JSON form (one object, keys in a fixed order; shapes and instructions by name). `indent`
/// in [-1, kMaxJsonIndent] (-1: one line); a rank outside the plan is refused. Deterministic; plan_to_json(plan_from_json(j)) == j for any j that plan_to_json wrote.
/// `rank` >= 0 keeps only that rank's stream (for `plan inspect --rank`); the result then no
/// longer reads back as a whole plan.
std::string plan_to_json(const Plan& plan, int indent = 1, std::int64_t rank = -1);
/// Parses the JSON form; throws Error naming the field (JSON pointer) and expected versus found.
Plan plan_from_json(const std::string& json, const std::string& what = "plan JSON");

/// Writes plans to one file, one iteration at a time; holds only the index in memory (24 bytes
/// per plan). Not thread-safe. The file is written to a temporary beside `path` and appears only
/// when close() succeeds; a writer destroyed before (a run that failed mid-epoch) leaves nothing,
/// and a second writer of the same path fails at once (common/file_io.h AtomicFile). The footer
/// records the iterations held, those declared by expect_iterations(), whether the two agree
/// (complete), and an XXH64 of the index and footer.
///
/// The writer refuses at once what PlanFileReader would refuse to open: iterations are consecutive
/// (from the declared first one), and each holds the same replicas 0, 1, ... in order.
/// The file records the dataset its plans index (their Plan::dataset, or set_dataset()): one per
/// file, so a plan of another dataset is refused.
/// A writer refuses (Error naming the path) a file that a PlanFileReader of this process has open: the
/// plans being read are an input. A reader in another process keeps reading the file it opened:
/// close() renames a new file into place, and the reader's mapping holds the old one until the
/// reader is destroyed; a reader opened after close() reads the new file.
class PlanFileWriter {
 public:
  /// Starts writing `path`; throws Error naming the path on failure (or if another writer has it).
  explicit PlanFileWriter(const std::string& path, const EncodeOptions& options = {});
  /// Declares that the file will hold iterations [first_iteration, first_iteration + count);
  /// close() marks the file complete only if it does. Call before the first append.
  void expect_iterations(std::uint64_t first_iteration, std::uint64_t count);
  /// Records the dataset the plans index (for append_encoded, whose blobs the writer does not
  /// read; append() takes it from the plans). Throws InvalidArgument, recording nothing, when the
  /// file already records another one (another fingerprint, or other tasks).
  void set_dataset(const DatasetIdentity& dataset);
  /// The dataset recorded so far (unknown until a plan or set_dataset() gives one).
  const DatasetIdentity& dataset() const { return dataset_; }
  ~PlanFileWriter();
  PlanFileWriter(const PlanFileWriter&) = delete;
  PlanFileWriter& operator=(const PlanFileWriter&) = delete;
  /// Appends `plan` (its iteration number goes to the index). Throws InvalidArgument, writing
  /// nothing, for a plan out of order: an iteration that is not the last one or the next one (the
  /// declared first one for the first plan), a replica that is not the next of its iteration (0
  /// for a new one), a new iteration after one with fewer or more replicas than the first, or a
  /// plan of another dataset than the file records (set_dataset). Throws Error on I/O failure.
  void append(const Plan& plan);
  /// Appends an already encoded plan (encode_plan's output of replica `replica` of `iteration`;
  /// e.g. from a worker thread); refuses as append(), but reads no dataset from the blob: give the
  /// plans' dataset with set_dataset().
  void append_encoded(std::uint64_t iteration, std::uint32_t replica, const std::vector<std::uint8_t>& blob);
  /// Writes the index and footer and renames the file into place; idempotent. Throws
  /// InvalidArgument (the file does not appear) when the last iteration holds fewer replicas than
  /// the first.
  void close();
  /// Drops what was written (nothing appears at the path); idempotent, never throws.
  void discard() noexcept;
  std::uint64_t plans_written() const { return index_.size(); }

 private:
  struct Entry {
    std::uint64_t iteration, offset, size;
  };
  std::string path_;
  EncodeOptions options_;
  std::unique_ptr<AtomicFile> out_;
  std::uint64_t offset_ = 0;
  std::uint64_t first_expected_ = 0;
  std::uint64_t expected_ = 0;
  std::vector<Entry> index_;
  std::uint64_t replicas_ = 0;       ///< plans per iteration (0 until the first iteration ends)
  std::uint64_t last_replicas_ = 0;  ///< plans of the last iteration so far
  DatasetIdentity dataset_;          ///< written at close() when known
};

/// Reads a plan file by iteration without reading the others (the file is memory-mapped; only the
/// footer and index are touched on open). Also opens a single binary plan or a JSON plan (as a
/// file of one plan). Read-only and thread-safe after construction.
class PlanFileReader {
 public:
  /// Opens `path`; throws Error naming the path, offset and field if the footer or index is bad.
  explicit PlanFileReader(const std::string& path);
  /// A reader over bytes in memory (copied); `what` names them in errors. `verify_checksums` false
  /// skips the index and blob checksums (fuzzing only: the semantic checks still run).
  static PlanFileReader from_memory(const std::uint8_t* data, std::size_t size, const std::string& what = "memory",
                                    bool verify_checksums = true);
  /// Number of plans.
  std::size_t size() const { return entries_.size(); }
  /// Iteration number of the i-th plan.
  std::uint64_t iteration(std::size_t i) const;
  /// Position of the first plan of `iteration` (replica 0), or -1. O(log n): files are written in
  /// iteration order, the replicas of one iteration one after another.
  std::int64_t find(std::uint64_t iteration) const;
  /// Decodes the i-th plan (0 <= i < size(); OutOfRange otherwise). A plan that names its dataset
  /// gets the file's record of it (with the tasks); Error when the file records another one.
  Plan read(std::size_t i) const;
  /// Decodes the plan of `iteration` for data-parallel `replica`; OutOfRange naming the available
  /// range if absent.
  Plan read_iteration(std::uint64_t iteration, std::uint32_t replica = 0) const;
  /// Bytes of the i-th plan's blob as stored.
  std::uint64_t stored_size(std::size_t i) const;
  /// True if the writer closed the file with every declared iteration (a single plan or a JSON
  /// plan is complete).
  bool complete() const { return complete_; }
  /// First iteration and number of distinct iterations held.
  std::uint64_t first_iteration() const { return first_iteration_; }
  std::uint64_t iterations() const { return iterations_; }
  /// Iterations the writer declared (0: none declared).
  std::uint64_t expected_iterations() const { return expected_iterations_; }
  /// The one refusal of an incomplete file by its consumers (`packpipe run`, RankLoader): throws
  /// Error naming the file, the iterations it holds and those declared unless complete(); the
  /// message ends with `how_to_allow` (e.g. "pass --allow-incomplete"), how to train its prefix.
  void require_complete(const std::string& how_to_allow) const;
  const std::string& path() const { return path_; }
  /// True for a plan file (PPLF), false for a single binary or JSON plan.
  bool is_plan_file() const { return !single_; }
  /// The dataset the plans index: a plan file's record (format 3), a single plan's own; unknown
  /// for a file that records none (format 2, or plans that named none), which loaders accept
  /// without a check.
  const DatasetIdentity& dataset() const { return dataset_; }
  /// 64-bit identity of the plans this file delivers: XXH64 of every plan's iteration, size and
  /// stored body checksum (the whole text of a JSON plan). Another file, or the same path planned
  /// again differently, differs (loader states carry it). Reads one 32-byte header per plan.
  std::uint64_t fingerprint() const;

 private:
  PlanFileReader() = default;
  void open(const std::uint8_t* data, std::size_t size);
  struct Entry {
    std::uint64_t iteration, offset, size;
    std::uint64_t replica = 0;  ///< position within its iteration's plans
  };
  std::string path_;
  std::shared_ptr<MappedFile> map_;
  std::shared_ptr<std::vector<std::uint8_t>> bytes_;
  const std::uint8_t* data_ = nullptr;
  std::size_t size_ = 0;
  bool json_ = false;
  bool single_ = false;  ///< one plan (binary or JSON), not a plan file
  bool verify_ = true;   ///< check the index and blob checksums
  bool complete_ = true;
  std::uint64_t first_iteration_ = 0;
  std::uint64_t iterations_ = 0;
  std::uint64_t expected_iterations_ = 0;
  DatasetIdentity dataset_;
  std::vector<Entry> entries_;
};

}  // namespace packpipe::plan
