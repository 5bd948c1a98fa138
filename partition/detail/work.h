// Internal: pieces of the partitioner shared between its translation units. Not a public header.
#pragma once

#include <functional>
#include <cstdint>
#include <utility>
#include <vector>

#include "partition/detail/coster.h"

namespace packpipe::partition::detail {

/// Working lengths of one call (after truncation) and the options resolved.
struct Work {
  const std::uint32_t* input = nullptr;
  const std::uint32_t* target = nullptr;  ///< null for decoder-only
  std::int64_t round = 8;
  std::int64_t dec_extra = 2;
  std::size_t count = 0;  ///< samples in the batch (input[0 .. count))
  bool encdec() const { return target != nullptr; }
  std::int64_t le_of(std::uint64_t max_input) const { return round_up(static_cast<std::int64_t>(max_input), round); }
  std::int64_t ld_of(std::uint64_t max_target) const {
    return encdec() ? round_up(static_cast<std::int64_t>(max_target) + dec_extra, round) : 0;
  }
};

/// Packing baseline: best-fit decreasing rows of `capacity` tokens (0: the longest sample's;
/// encoder-decoder: the decoder rows of the longest target's), then `mbs` rows per micro-batch, as
/// `layout` Packed (each micro-batch's rows flattened into one varlen row) or PackedMask (the rows;
/// samples and row_offsets only). Throws InvalidArgument for a capacity below the longest sample.
/// Defined in pack.cpp.
std::vector<MicroBatch> packing_baseline(const Work& w, const std::vector<std::uint32_t>& ids, std::int64_t mbs,
                                         std::uint64_t capacity, Layout layout);

/// WLB-LLM's packing: k = ceil(tokens / capacity) packed micro-batches (capacity 0: the longest
/// sample's tokens), samples in descending order of their forward FLOPs (linear plus attention,
/// `model`'s layers) each onto the least-loaded micro-batch whose tokens stay within the capacity
/// (the least-filled one when none has room). Deterministic. Defined in varlen.cpp.
std::vector<MicroBatch> wlb_baseline(const Work& w, const cm::ModelSpec& model, const std::vector<std::uint32_t>& ids,
                                     std::uint64_t capacity);

/// Tokens of sample `s` in a packed row: (encoder or whole-sample, decoder) as packed_tokens
/// lays them out.
inline std::pair<std::int64_t, std::int64_t> packed_sample(const Work& w, std::uint32_t s) {
  const bool ed = w.encdec();
  return {static_cast<std::int64_t>(packed_tokens(w.input[s], ed)),
          ed ? static_cast<std::int64_t>(packed_tokens(w.target[s], true)) : 0};
}

/// What the balanced varlen search found: micro-batches (layout Packed, samples only) and the
/// objective (S - 1) max / c + sum / d on the coster's basis; infeasible when no count fits.
struct BalancedOutcome {
  std::vector<MicroBatch> microbatches;
  double objective = 0;
  bool feasible = false;
  /// The other counts costed exactly that fit, best objective first (candidates the planner
  /// simulates: the objective is the 1F1B bound, and schedules that fill bubbles favour fewer,
  /// larger micro-batches than it does).
  std::vector<std::pair<double, std::vector<MicroBatch>>> alternatives;
};

/// The dp method's packed varlen micro-batches: for micro-batch counts k (multiples of
/// `count_multiple`, at least dp) samples go by descending estimated cost onto the micro-batch of
/// least estimated cost (the cost model's marginal time of tokens and of attention work near the
/// average micro-batch); the counts with the best estimates are costed exactly (least recompute
/// that fits under `policy`), the best feasible one is refined by moving and swapping samples
/// between its slowest and fastest micro-batches, and returned. Deterministic. Defined in varlen.cpp.
BalancedOutcome balanced_search(const Work& w, const std::vector<std::uint32_t>& ids, Coster& coster,
                                const PipelineShape& shape, RecomputePolicy policy, std::int64_t count_multiple);

/// What the sliced search found (docs/design/015-long-context.md): packed micro-batches whose
/// entries carry spans, in the slices' order, and their objective; infeasible when no count fits
/// or no sample is sliced.
struct SlicedOutcome {
  std::vector<MicroBatch> microbatches;
  double objective = 0;
  bool feasible = false;
  std::vector<std::pair<double, std::vector<MicroBatch>>> alternatives;  ///< as BalancedOutcome's
};

/// The dp method's sliced candidates (split long, pack short), decoder-only: for micro-batch counts
/// k, a sample heavier than the average micro-batch (every sample of `must`, which cannot fit one
/// micro-batch alone) is cut into the fewest slices of at most that weight (the least max slice
/// weight on the cost model's linearisation, the prefix's attention included: TeraPipe's rule),
/// its slices placed heaviest sample first each on the least-loaded micro-batch after the previous
/// slice's, the other samples by least load; the best estimated counts are costed exactly (each
/// micro-batch fitting, and each sliced sample's micro-batches fitting together on a stage:
/// check_chains), refined by moving whole samples, and the best returned. `optional`: slice heavy
/// samples too (SlicePolicy::Auto), not only `must`. Deterministic. Defined in varlen.cpp.
SlicedOutcome sliced_search(const Work& w, const std::vector<std::uint32_t>& ids, const std::vector<char>& must,
                            Coster& coster, const PipelineShape& shape, RecomputePolicy policy,
                            std::int64_t count_multiple, std::uint32_t min_slice, bool optional);

/// Fixed-length slicing (Seq1F1B-like): every sample over `slice` tokens cut into slices of `slice`
/// tokens (the last shorter), the pieces packed best-fit decreasing into rows of `slice` tokens, one
/// packed micro-batch a row, in an order where every sample's slices come in order. Defined in
/// slices.cpp.
std::vector<MicroBatch> slicing_baseline(const Work& w, const std::vector<std::uint32_t>& ids, std::uint64_t slice);

/// Whether every sliced sample's micro-batches fit together on a stage (their stored activations
/// all held until the sample's backward): the largest static memory plus the sum of their stored
/// activations plus the largest transient peak within the limit (stage basis; the DynaPipe basis
/// is not checked). `mbs` carry their costs (finalize). Defined in slices.cpp.
bool chains_fit(const std::vector<MicroBatch>& mbs, const Coster& coster);
/// The sliced samples whose micro-batches do not fit together (chains_fit's test) in
/// `room_fraction` of the activation memory, ascending.
std::vector<std::uint32_t> chains_over(const std::vector<MicroBatch>& mbs, const Coster& coster,
                                       double room_fraction = 1.0);
/// Recomputes in full, sample by sample, the micro-batches of each sliced sample that does not fit
/// together in `room_fraction` of the activation memory, cheapest added time per MB freed first,
/// until it fits (`full(b)`: micro-batch b's costs under full recompute; `mbs` carry their costs and
/// modes; a fraction below 1 leaves room for the other micro-batches a schedule keeps in flight, 0
/// recomputes every one it can). Returns chains_over (whole memory) afterwards.
std::vector<std::uint32_t> relieve_chains(std::vector<MicroBatch>& mbs, const Coster& coster,
                                          const std::function<Choice(std::size_t)>& full, double room_fraction = 1.0);

/// (S - 1) tau / c + sum / d, computed in DynaPipe's order of operations.
inline double objective(const PipelineShape& s, double tau, double sum) {
  return static_cast<double>(s.stages - 1) * tau / static_cast<double>(s.chunks) + sum / static_cast<double>(s.dp);
}

}  // namespace packpipe::partition::detail
