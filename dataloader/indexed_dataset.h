// Megatron-LM indexed token datasets: `<prefix>.idx` (MMIDIDX v1, or legacy TNTIDX) plus
// `<prefix>.bin` or `<prefix>.bin.zst`. Byte layout: docs/design/001-dataloader.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/enum_names.h"
#include "common/file_io.h"
#include "common/mapped_file.h"
#include "dataloader/bin_reader.h"
#include "dataloader/dtype.h"

namespace packpipe::dataloader {

enum class IndexFormat { MMIDIDX, TNTIDX };
/// The one name table: "MMIDIDX", "TNTIDX".
inline constexpr EnumName<IndexFormat> kIndexFormatNames[] = {{IndexFormat::MMIDIDX, "MMIDIDX"},
                                                              {IndexFormat::TNTIDX, "TNTIDX"}};
/// "MMIDIDX" or "TNTIDX".
constexpr const char* format_name(IndexFormat f) { return enum_name(kIndexFormatNames, f); }

/// Whether `.idx` carries the optional int8 sequence_modes array (MMIDIDX only).
enum class ModesPolicy { Auto, Present, Absent };
/// The one name table: "auto", "present", "absent".
inline constexpr EnumName<ModesPolicy> kModesPolicyNames[] = {
    {ModesPolicy::Auto, "auto"}, {ModesPolicy::Present, "present"}, {ModesPolicy::Absent, "absent"}};
/// The policy's name in kModesPolicyNames.
constexpr const char* modes_policy_name(ModesPolicy m) { return enum_name(kModesPolicyNames, m); }
/// Policy from its name; throws InvalidArgument listing the names.
inline ModesPolicy modes_policy_from_name(const std::string& name) {
  return enum_from_name(kModesPolicyNames, name, "modes policy");
}

/// Read-only array of little-endian T at any address. MMIDIDX arrays start at byte 34 of the
/// file, so int32/int64 elements in the mapped `.idx` are not naturally aligned; element access
/// goes through memcpy (one plain load on x86-64 / arm64) instead of a misaligned T*.
///
/// An array that lies in a mapped file (`file` given) reads every element through the file's SIGBUS
/// guard (MappedFile::read): a file truncated by another process after it was mapped is an Error
/// naming it, never a crash. An array in memory the process owns reads with plain loads.
template <typename T>
class UnalignedArray {
 public:
  UnalignedArray() = default;
  /// `count` elements at `data`; `file`, when given, is the mapping that holds them (it must outlive
  /// the array and stay at its address).
  UnalignedArray(const void* data, std::uint64_t count, const MappedFile* file = nullptr)
      : bytes_(static_cast<const std::uint8_t*>(data)), count_(count), file_(file) {}
  /// Element i; no bounds check (callers check against size()). Throws Error naming the file if the
  /// mapping was truncated under it.
  T operator[](std::uint64_t i) const {
    T v;
    copy(i, 1, &v);
    return v;
  }
  /// Copies elements [first, first + n) to `out` (first + n <= size(), unchecked); guarded as operator[].
  void copy(std::uint64_t first, std::uint64_t n, T* out) const {
    if (file_ != nullptr) {
      file_->read(static_cast<std::uint64_t>(bytes_ - file_->data()) + first * sizeof(T), n * sizeof(T), out);
    } else if (n > 0) {
      std::memcpy(out, bytes_ + first * sizeof(T), n * sizeof(T));
    }
  }
  std::uint64_t size() const { return count_; }
  bool empty() const { return count_ == 0; }
  /// True if the elements lie in a mapped file (read through its guard), false if in owned memory.
  bool guarded() const { return file_ != nullptr; }
  /// First byte of the array (count * sizeof(T) bytes), possibly unaligned. Reading it directly is
  /// unguarded: only for an array that is not guarded().
  const std::uint8_t* bytes() const { return bytes_; }

 private:
  const std::uint8_t* bytes_ = nullptr;
  std::uint64_t count_ = 0;
  const MappedFile* file_ = nullptr;
};

/// Header facts and validated array views of one `.idx`, parsed from bytes owned elsewhere (a
/// buffer, or a mapped file whose arrays are read through its guard). Move-only: the views may
/// point into the owned_* vectors (TNTIDX, converted on parse; the sizes IndexedDataset copies).
struct IndexView {
  IndexView() = default;
  IndexView(IndexView&&) = default;
  IndexView& operator=(IndexView&&) = default;
  IndexView(const IndexView&) = delete;
  IndexView& operator=(const IndexView&) = delete;

  IndexFormat format = IndexFormat::MMIDIDX;
  std::uint64_t version = 1;
  DType dtype = DType::UInt16;
  std::uint64_t num_sequences = 0;  ///< S
  std::uint64_t num_documents = 0;  ///< D - 1 (the doc_idx array has num_documents + 1 entries)
  UnalignedArray<std::int32_t> sizes;     ///< S tokens per sequence (MMIDIDX: points into the bytes)
  UnalignedArray<std::int64_t> pointers;  ///< S byte offsets into `.bin`
  UnalignedArray<std::int64_t> doc_idx;   ///< num_documents + 1 sequence indices
  UnalignedArray<std::int8_t> modes;      ///< S modes, or empty
  bool has_modes = false;                 ///< the file carries the modes array (MMIDIDX)
  /// TNTIDX arrays are converted on parse (int64 sizes, element offsets); they live here.
  std::vector<std::int32_t> owned_sizes;
  std::vector<std::int64_t> owned_pointers;
  std::vector<std::int64_t> owned_doc_idx;
};

/// Parses and checks the header and the file-size formula of an `.idx` held in memory (O(1) work
/// for MMIDIDX, O(S) for TNTIDX), plus doc_idx[0] == 0 and doc_idx[last] == S. `name` is used in
/// error messages. Throws Error on any mismatch. Never reads outside [data, data + size).
IndexView parse_index(const std::uint8_t* data, std::uint64_t size, const std::string& name,
                      ModesPolicy modes = ModesPolicy::Auto);
/// parse_index of a mapped `.idx`, every read through the file's SIGBUS guard, at the parse and
/// through the views it returns (MMIDIDX arrays stay in the map; `file` must outlive the view and
/// stay at its address). A file truncated while it is read is an Error naming it.
IndexView parse_index(const MappedFile& file, ModesPolicy modes = ModesPolicy::Auto);

/// Zero-copy view of the tokens of one sequence.
struct TokenSpan {
  const void* data = nullptr;
  std::uint64_t length = 0;  ///< tokens
  DType dtype = DType::UInt16;
};

/// One problem found by IndexedDataset::verify.
struct VerifyProblem {
  std::string file;
  std::string message;  ///< names the index/offset and expected versus found
};

/// A read-only Megatron indexed dataset. Opening maps `.idx` and `.bin` (or opens `.bin.zst`),
/// checks the header, the file sizes and the last pointer, and copies the sizes (4 bytes a
/// sequence) in the pass that checks them; pointers, doc_idx and modes stay in the map. Every
/// access checks the pointer and size of the sequence it touches, so a corrupt index gives an
/// Error, never a wrong or out-of-bounds read, and every read of a mapped file (index or tokens,
/// views aside) goes through the SIGBUS guard, so a file truncated under a live dataset is an
/// Error naming it. Thread-safe for concurrent reads.
class IndexedDataset {
 public:
  struct Options {
    ModesPolicy modes = ModesPolicy::Auto;
    std::size_t zstd_cache_frames = 4;
    /// Check at open that every size fits the .bin and that the sizes fill it exactly (one pass
    /// over the 4-byte sizes). Off only for verify(), which reports every problem instead.
    bool check_sizes = true;
    /// Open `<prefix>.bin.zst` even where `<prefix>.bin` exists (checking the compressed data
    /// against the index: `dataset decompress`).
    bool compressed = false;
  };

  /// Opens `<prefix>.idx` and `<prefix>.bin` (or `<prefix>.bin.zst`). Throws Error naming the file.
  explicit IndexedDataset(const std::string& prefix);
  IndexedDataset(const std::string& prefix, const Options& options);
  ~IndexedDataset();
  IndexedDataset(IndexedDataset&&) noexcept;
  IndexedDataset& operator=(IndexedDataset&&) noexcept;

  const std::string& prefix() const { return prefix_; }
  IndexFormat format() const { return index_.format; }
  std::uint64_t version() const { return index_.version; }
  DType dtype() const { return index_.dtype; }
  std::size_t itemsize() const { return dtype_size(index_.dtype); }
  /// Number of sequences S.
  std::uint64_t size() const { return index_.num_sequences; }
  std::uint64_t num_documents() const { return index_.num_documents; }
  /// Sum of all sequence lengths (from the `.bin` size; O(1)).
  std::uint64_t num_tokens() const;
  bool has_modes() const { return index_.has_modes; }
  bool compressed() const { return compressed_; }

  /// The index arrays as stored, values unchecked (valid while the dataset lives): S sizes (a copy
  /// in memory), S pointers, num_documents() + 1 doc_idx, S modes or none (read in the map through
  /// its guard: an Error naming the `.idx` if it was truncated). Use length()/checked_pointer() for
  /// checked access.
  const UnalignedArray<std::int32_t>& sizes() const { return index_.sizes; }
  const UnalignedArray<std::int64_t>& pointers() const { return index_.pointers; }
  const UnalignedArray<std::int64_t>& doc_idx() const { return index_.doc_idx; }
  const UnalignedArray<std::int8_t>& modes() const { return index_.modes; }

  /// Length of sequence i in tokens; throws OutOfRange if i >= size(), Error if it is negative.
  std::uint32_t length(std::uint64_t i) const;
  /// Byte offset of sequence i in `.bin`, after checking it against its size, its predecessor and
  /// the `.bin` size; throws OutOfRange / Error.
  std::uint64_t checked_pointer(std::uint64_t i) const;
  /// Zero-copy view of sequence i (plain `.bin` only; Unsupported for `.bin.zst`).
  TokenSpan view(std::uint64_t i) const;
  /// Copies tokens [offset, offset + length) of sequence i into out (length * itemsize bytes);
  /// throws OutOfRange if the slice is not inside the sequence.
  void read(std::uint64_t i, std::uint64_t offset, std::uint64_t length, void* out) const;
  /// Copies all tokens of sequence i into a new vector of bytes.
  std::vector<std::uint8_t> read(std::uint64_t i) const;
  /// The byte source (plain or compressed).
  const BinReader& bin() const { return *bin_; }

  /// Full consistency check: every pointer equals the prefix sum of sizes, doc_idx starts at 0,
  /// is non-decreasing and ends at S, the `.bin` size matches, every zstd frame checksum holds.
  /// Returns every problem found (empty when the dataset is consistent); reads everything.
  std::vector<VerifyProblem> verify(std::size_t max_problems = 100) const;

 private:
  std::string prefix_;
  std::unique_ptr<MappedFile> idx_file_;  ///< on the heap: the guarded views hold its address
  IndexView index_;
  std::unique_ptr<BinReader> bin_;
  bool compressed_ = false;
};

/// Streaming writer of a Megatron MMIDIDX v1 dataset (Megatron's IndexedDatasetBuilder). Tokens go
/// straight to `<prefix>.bin`; index arrays spill to temporary files, so memory does not grow
/// with the number of sequences. The output is byte-identical to Megatron's writer.
class IndexedDatasetBuilder {
 public:
  /// Creates `<prefix>.bin` (truncating) and removes a stale `<prefix>.idx`. `with_modes` writes
  /// the sequence_modes array. Temporary files `<prefix>.idx.tmp*` live until finalize().
  IndexedDatasetBuilder(const std::string& prefix, DType dtype, bool with_modes = false);
  /// Without finalize(): removes the temporary files and the incomplete `.bin`; no `.idx` is left.
  ~IndexedDatasetBuilder();
  IndexedDatasetBuilder(const IndexedDatasetBuilder&) = delete;
  IndexedDatasetBuilder& operator=(const IndexedDatasetBuilder&) = delete;

  /// Appends one sequence of `count` tokens already in the builder's dtype (count < 2^31).
  /// `mode` is stored only when the builder writes modes (ignored otherwise, as Megatron's writer does).
  void add_item(const void* tokens, std::uint64_t count, std::int8_t mode = 0);
  /// Closes the current document (Megatron end_document).
  void end_document();
  /// Appends the tokens split into sequences of `lengths` (tokens in the builder's dtype), with
  /// optional per-sequence modes, then closes the document (Megatron add_document).
  void add_document(const void* tokens, const std::int64_t* lengths, std::size_t num_sequences,
                    const std::int8_t* modes = nullptr);
  /// Appends every sequence and document of another dataset with the same dtype: byte copy of its
  /// data plus pointer shift, in constant memory (Megatron add_index).
  void add_index(const std::string& other_prefix);
  /// Writes `<prefix>.idx` (via a temporary file and rename) and closes `.bin`. Sequences added
  /// after the last end_document() are closed as one document first. Further calls throw, as does
  /// every call after one that failed part-way (the output would hold a part of what it added) or
  /// that refused the builder's own output as an input.
  void finalize();

  std::uint64_t num_sequences() const { return num_sequences_; }
  std::uint64_t num_documents() const { return num_documents_; }
  std::uint64_t num_tokens() const { return bin_bytes_ / dtype_size(dtype_); }
  /// Token dtype of the dataset being written.
  DType dtype() const { return dtype_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string prefix_;
  DType dtype_;
  bool with_modes_;
  std::uint64_t num_sequences_ = 0;
  std::uint64_t num_documents_ = 0;
  std::uint64_t bin_bytes_ = 0;
};

/// The files a dataset `prefix` is read from: `<prefix>.idx`, `.bin` and `.bin.zst` (for
/// check_command_files: whichever exist).
std::vector<std::string> dataset_input_files(const std::string& prefix);
/// The outputs IndexedDatasetBuilder(prefix) writes, `<prefix>.bin` and `<prefix>.idx`, named
/// `what` in messages (for check_command_files).
std::vector<OutputFile> dataset_output_files(const std::string& prefix, const std::string& what);

/// Throws InvalidArgument if any file of the dataset `out_prefix` (.idx, .bin, .bin.zst) is the
/// same file as any file of the datasets `in_prefixes` (through links and relative paths).
void check_output_prefix_is_not_input(const std::string& out_prefix, const std::vector<std::string>& in_prefixes);

/// Merges `inputs` (same dtype, same modes presence) into `out_prefix` in constant memory;
/// throws InvalidArgument if inputs is empty, Error naming both files on a dtype/modes mismatch.
void merge_datasets(const std::vector<std::string>& inputs, const std::string& out_prefix);

}  // namespace packpipe::dataloader
