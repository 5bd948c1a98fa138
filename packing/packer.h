// Packing variable-length samples into rows of a token capacity (one or two dimensions).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/enum_names.h"

namespace packpipe::packing {

enum class Algorithm {
  FirstFitDecreasing,  ///< longest first, into the first row with room
  BestFitDecreasing,   ///< longest first, into the row whose remaining room fits tightest
  Histogram,           ///< SPFHP-style: works on the length histogram, for very large inputs
};
/// The one name table: "ffd", "bfd", "histogram".
inline constexpr EnumName<Algorithm> kAlgorithmNames[] = {{Algorithm::FirstFitDecreasing, "ffd"},
                                                          {Algorithm::BestFitDecreasing, "bfd"},
                                                          {Algorithm::Histogram, "histogram"}};
/// The algorithm's name in kAlgorithmNames.
constexpr const char* algorithm_name(Algorithm a) { return enum_name(kAlgorithmNames, a); }
/// Algorithm from its name; throws InvalidArgument listing the names.
inline Algorithm algorithm_from_name(const std::string& name) {
  return enum_from_name(kAlgorithmNames, name, "packing algorithm");
}

struct PackOptions {
  Algorithm algorithm = Algorithm::BestFitDecreasing;
  std::uint64_t capacity = 0;         ///< tokens per row (input side, or the whole sample)
  std::uint64_t target_capacity = 0;  ///< decoder tokens per row for two-dimensional packing; 0: one dimension
  std::uint64_t max_samples_per_row = 0;  ///< at most this many samples in a row (0: no limit)
};

/// Rows in CSR form: row r holds samples[row_offsets[r] .. row_offsets[r + 1]), in placement order.
struct Packing {
  std::vector<std::uint32_t> samples;
  std::vector<std::uint64_t> row_offsets;        ///< rows + 1 entries, starts at 0
  std::vector<std::uint64_t> row_tokens;         ///< input tokens per row
  std::vector<std::uint64_t> row_target_tokens;  ///< target tokens per row (two-dimensional only)
  std::uint64_t capacity = 0;
  std::uint64_t target_capacity = 0;
  std::size_t rows() const { return row_offsets.empty() ? 0 : row_offsets.size() - 1; }
  /// Real tokens over rows x capacity (both dimensions together when two-dimensional); 0 without rows.
  double efficiency() const;
};

/// Packs the `n` samples of `lengths` (and `target_lengths` when target_capacity > 0) into rows.
/// Every sample lands in exactly one row and no row exceeds a capacity; deterministic (samples
/// sorted by decreasing length, ties by sample index; rows numbered in creation order). Throws
/// InvalidArgument naming the first sample whose length exceeds a capacity, for a zero capacity,
/// for target lengths without a target capacity (or the reverse), and for histogram packing in
/// two dimensions. Reads the arrays only during the call; thread-safe (no shared state).
/// Costs: ffd and bfd O(n log n) (bfd O(n + C) for capacities up to 2^22 by a counting sort and a
/// bitset over remaining room); histogram O(n + C^2 / 64 + groups). See docs/design/004-packing.md.
Packing pack(const std::uint32_t* lengths, std::size_t n, const PackOptions& options,
             const std::uint32_t* target_lengths = nullptr);

}  // namespace packpipe::packing
