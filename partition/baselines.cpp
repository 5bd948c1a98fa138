// The baselines a user would run, as a grid of methods and settings for one batch
// (docs/design/014-layouts.md).
#include <algorithm>

#include <fmt/format.h>

#include "common/errors.h"
#include "partition/partition.h"

namespace packpipe::partition {

std::string Baseline::family() const {
  switch (method) {
    case PartitionMethod::Fixed: return layout == Layout::Packed ? "fixed-packed" : "fixed";
    case PartitionMethod::Tokens: return "tokens";
    case PartitionMethod::Packing: return layout == Layout::PackedMask ? "packing-mask" : "packing";
    case PartitionMethod::Wlb: return "wlb";
    default: return partition_method_name(method);
  }
}

std::string Baseline::label() const {
  switch (method) {
    case PartitionMethod::Fixed: return fmt::format("{} (mbs {})", family(), microbatch_size);
    case PartitionMethod::Tokens: return fmt::format("tokens (budget {})", token_budget);
    case PartitionMethod::Packing:
      return fmt::format("{} (capacity {} x {} row{})", family(), capacity, microbatch_size,
                         microbatch_size == 1 ? "" : "s");
    case PartitionMethod::Wlb: return fmt::format("wlb (capacity {})", capacity);
    case PartitionMethod::Slicing:
      return fmt::format("slicing (slices of {} x {} row{})", capacity, microbatch_size, microbatch_size == 1 ? "" : "s");
    default: return family();
  }
}

PartitionOptions Baseline::options(const PartitionOptions& base) const {
  PartitionOptions o = base;
  o.method = method;
  o.microbatch_size = microbatch_size;
  o.token_budget = token_budget;
  o.capacity = capacity;
  o.layout.reset();
  if (method == PartitionMethod::Packing || method == PartitionMethod::Fixed) o.layout = layout;
  o.pack_windows = false;
  o.count_multiple = 1;
  return o;
}

std::vector<Baseline> baseline_grid(const BatchLengths& lengths, const BaselineGridOptions& options) {
  PACKPIPE_CHECK_ARG(options.round_multiple >= 1 && options.round_multiple <= kMaxRoundMultiple,
                     "baseline_grid: round_multiple must be in [1, {}], found {}", kMaxRoundMultiple,
                     options.round_multiple);
  std::vector<Baseline> out;
  std::uint64_t longest_in = 1, longest_tg = 0;
  for (std::size_t i = 0; i < lengths.size(); ++i) {
    longest_in = std::max<std::uint64_t>(longest_in, lengths.input[i]);
    if (lengths.encoder_decoder()) longest_tg = std::max<std::uint64_t>(longest_tg, lengths.target[i]);
  }
  if (options.longest != 0) longest_in = std::max(longest_in, options.longest);
  if (options.longest_target != 0) longest_tg = std::max(longest_tg, options.longest_target);
  const std::uint64_t m = static_cast<std::uint64_t>(options.round_multiple);
  std::uint64_t longest_padded = (longest_in + m - 1) / m * m;
  if (lengths.encoder_decoder()) longest_padded += (longest_tg + 2 + m - 1) / m * m;
  std::uint64_t c = 1;
  while (c < longest_in) c *= 2;
  for (const std::int64_t b : options.microbatch_sizes) {
    PACKPIPE_CHECK_ARG(b >= 1, "baseline_grid: micro-batch size {} must be at least 1", b);
    out.push_back({PartitionMethod::Fixed, b, 0, 0, Layout::Padded});
  }
  for (const std::uint64_t f : {1u, 2u, 4u, 8u, 16u}) {
    out.push_back({PartitionMethod::Tokens, 0, f * longest_padded, 0, Layout::Padded});
  }
  const bool varlen = has_layout(options.layouts, Layout::Packed);
  if (varlen) {
    // Flattened rows: capacity 2C x r rows packs about as capacity C x 2r rows does, so one
    // capacity and the row counts cover the grid of micro-batch token budgets.
    for (const std::int64_t r : options.rows) {
      PACKPIPE_CHECK_ARG(r >= 1, "baseline_grid: rows per micro-batch {} must be at least 1", r);
      out.push_back({PartitionMethod::Packing, r, 0, c, Layout::Packed});
    }
    for (const std::uint64_t f : {1u, 2u, 4u}) out.push_back({PartitionMethod::Wlb, 0, 0, f * c, Layout::Packed});
    // HF's DataCollatorWithFlattening: a fixed number of samples flattened into one varlen row.
    for (const std::int64_t b : options.microbatch_sizes) out.push_back({PartitionMethod::Fixed, b, 0, 0, Layout::Packed});
    // Seq1F1B-like fixed-length slicing (decoder-only): slices of C / 16 to C / 2 tokens (Seq1F1B
    // cuts a sequence into 2 to 16 slices).
    if (!lengths.encoder_decoder() && options.slicing) {
      for (const std::uint64_t f : {16u, 8u, 4u, 2u}) {
        if (c / f >= options.min_slice_tokens) out.push_back({PartitionMethod::Slicing, 1, 0, c / f, Layout::Packed});
      }
    }
  }
  // DynaPipe's packing (dense rows under a block mask), always listed: the comparison of 2023. It is
  // a candidate for the plan only where the executor runs packed-mask rows (planner).
  for (const std::int64_t r : options.rows) out.push_back({PartitionMethod::Packing, r, 0, c, Layout::PackedMask});
  return out;
}

}  // namespace packpipe::partition
