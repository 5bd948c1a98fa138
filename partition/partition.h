// Micro-batch partition of one global batch: DynaPipe's exact tau-DP (the baseline), packpipe's
// faster and exact search over every cap, and the Megatron-style baselines (fixed micro-batch
// size, token budget, packing), all from one entry point. See docs/design/005-partition.md.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/enum_names.h"
#include "common/recompute.h"
#include "partition/pipeline.h"

namespace packpipe::partition {

enum class PartitionMethod {
  DP,        ///< packpipe: padded windows by the exact min over every cap of (S-1) max/c + sum/d, and
             ///< packed varlen micro-batches balanced by their attention-aware cost (`layouts`)
  DynaPipe,  ///< DynaPipe's exact algorithm (5 ms thinned caps, iteration-wide recompute)
  Fixed,     ///< `microbatch_size` samples in batch order, padded to the longest (Megatron)
  Tokens,    ///< samples sorted by length, cut when padded tokens would exceed `token_budget`
  Packing,   ///< best-fit packing into rows of `capacity` tokens, then `microbatch_size` rows a micro-batch
             ///< (`layout`: packed, the rows flattened under varlen attention as HF flattening and Megatron
             ///< THD run them; or packed-mask, dense rows under a block mask)
  Wlb,       ///< WLB-LLM's attention-balanced packing: ceil(tokens / capacity) packed varlen micro-batches,
             ///< samples by descending FLOPs (linear + attention) onto the least-loaded one with room
  Slicing,   ///< fixed-length slicing (Seq1F1B-like, decoder-only): every sample over `capacity` tokens cut
             ///< into slices of `capacity` tokens (the last shorter), the pieces packed best-fit into rows of
             ///< `capacity` tokens, `microbatch_size` rows a packed micro-batch, in the slices' order
};
/// The one name table: "dp", "dynapipe", "fixed", "tokens", "packing", "wlb", "slicing".
inline constexpr EnumName<PartitionMethod> kPartitionMethodNames[] = {
    {PartitionMethod::DP, "dp"},         {PartitionMethod::DynaPipe, "dynapipe"}, {PartitionMethod::Fixed, "fixed"},
    {PartitionMethod::Tokens, "tokens"}, {PartitionMethod::Packing, "packing"},   {PartitionMethod::Wlb, "wlb"},
    {PartitionMethod::Slicing, "slicing"}};

/// Whether the dp method may cut long samples into slices (docs/design/015-long-context.md).
enum class SlicePolicy { Auto, Off };
/// The one name table: "auto" (decoder-only models: slices are candidates beside whole samples), "off".
inline constexpr EnumName<SlicePolicy> kSlicePolicyNames[] = {{SlicePolicy::Auto, "auto"}, {SlicePolicy::Off, "off"}};
constexpr const char* slice_policy_name(SlicePolicy p) { return enum_name(kSlicePolicyNames, p); }
inline SlicePolicy slice_policy_from_name(const std::string& name) {
  return enum_from_name(kSlicePolicyNames, name, "slice policy");
}
/// The method's name in kPartitionMethodNames.
constexpr const char* partition_method_name(PartitionMethod m) { return enum_name(kPartitionMethodNames, m); }
/// Method from its name; throws InvalidArgument listing the names.
inline PartitionMethod partition_method_from_name(const std::string& name) {
  return enum_from_name(kPartitionMethodNames, name, "partition method");
}

/// Which activation recompute a micro-batch may use.
enum class RecomputePolicy { Auto, None, Selective, Full };
/// The one name table: "auto", then the recompute modes' names (common/recompute.h).
inline constexpr EnumName<RecomputePolicy> kRecomputePolicyNames[] = {
    {RecomputePolicy::Auto, "auto"},
    {RecomputePolicy::None, recompute_name(Recompute::None)},
    {RecomputePolicy::Selective, recompute_name(Recompute::Selective)},
    {RecomputePolicy::Full, recompute_name(Recompute::Full)}};
/// The policy's name in kRecomputePolicyNames.
constexpr const char* recompute_policy_name(RecomputePolicy p) { return enum_name(kRecomputePolicyNames, p); }
/// Policy from its name; throws InvalidArgument listing the names.
inline RecomputePolicy recompute_policy_from_name(const std::string& name) {
  return enum_from_name(kRecomputePolicyNames, name, "recompute policy");
}

/// What to do with a sample that does not fit in memory even alone. Slice (decoder-only models):
/// cut it into slices that each fit one micro-batch and that fit together on every stage
/// (docs/design/015-long-context.md).
enum class OversizePolicy { Error, Truncate, Drop, Slice };
/// The one name table: "error", "truncate", "drop", "slice".
inline constexpr EnumName<OversizePolicy> kOversizePolicyNames[] = {{OversizePolicy::Error, "error"},
                                                                    {OversizePolicy::Truncate, "truncate"},
                                                                    {OversizePolicy::Drop, "drop"},
                                                                    {OversizePolicy::Slice, "slice"}};
/// The policy's name in kOversizePolicyNames.
constexpr const char* oversize_policy_name(OversizePolicy p) { return enum_name(kOversizePolicyNames, p); }
/// Policy from its name; throws InvalidArgument listing the names.
inline OversizePolicy oversize_policy_from_name(const std::string& name) {
  return enum_from_name(kOversizePolicyNames, name, "oversize policy");
}

/// How a micro-batch's time and memory are computed.
enum class CostBasis {
  Auto,      ///< DynaPipe for the dynapipe method, Stages otherwise
  Stages,    ///< every virtual stage of the real layout: time = slowest rank (sum of its chunks);
             ///< memory per rank = static + sum over its stages v of (V - v) stored + max peak
  DynaPipe,  ///< DynaPipe's formula: l x per-layer costs, GPU-0 model state, budget available / S
};
/// The one name table: "auto", "stages", "dynapipe".
inline constexpr EnumName<CostBasis> kCostBasisNames[] = {
    {CostBasis::Auto, "auto"}, {CostBasis::Stages, "stages"}, {CostBasis::DynaPipe, "dynapipe"}};
/// The basis' name in kCostBasisNames.
constexpr const char* cost_basis_name(CostBasis b) { return enum_name(kCostBasisNames, b); }
/// Basis from its name; throws InvalidArgument listing the names.
inline CostBasis cost_basis_from_name(const std::string& name) {
  return enum_from_name(kCostBasisNames, name, "cost basis");
}

/// Sample order for encoder-decoder batches (decoder-only batches are always sorted by length).
enum class EncDecOrder {
  Auto,    ///< DP: partition both Sorted and Path, keep the better objective; others: Sorted
  Sorted,  ///< (input, target) descending (DynaPipe with disable_tsp)
  Path,    ///< Sorted then 2-opt and Or-opt on the L1 path length over (input, target)
};
/// The one name table: "auto", "sorted", "path".
inline constexpr EnumName<EncDecOrder> kEncDecOrderNames[] = {
    {EncDecOrder::Auto, "auto"}, {EncDecOrder::Sorted, "sorted"}, {EncDecOrder::Path, "path"}};
/// The order's name in kEncDecOrderNames.
constexpr const char* enc_dec_order_name(EncDecOrder o) { return enum_name(kEncDecOrderNames, o); }
/// Order from its name; throws InvalidArgument listing the names.
inline EncDecOrder enc_dec_order_from_name(const std::string& name) {
  return enum_from_name(kEncDecOrderNames, name, "encoder-decoder order");
}

namespace detail {
struct ShapeMemo;
}

/// Costs of micro-batch shapes kept across partition calls that share the cost model, the pipeline
/// shape, the virtual stages and the cost basis (e.g. every iteration one planning thread plans):
/// shapes recur between global batches, and a memoised shape costs a look-up instead of a
/// cost-model query per stage and recompute mode. A call with other settings starts it afresh.
/// Results never depend on it. Not thread-safe: one per thread; must not outlive its cost model.
class PartitionCache {
 public:
  PartitionCache();
  ~PartitionCache();
  PartitionCache(PartitionCache&&) noexcept;
  PartitionCache& operator=(PartitionCache&&) noexcept;
  /// Shapes (rows, lengths) memoised so far.
  std::size_t shapes() const;
  /// The memo (internal); `part` 1 is the second table builder's (PartitionOptions::threads).
  detail::ShapeMemo& memo(int part = 0) { return part == 0 ? *memo_ : *memo2_; }

 private:
  std::unique_ptr<detail::ShapeMemo> memo_, memo2_;
};

struct PartitionOptions {
  PartitionMethod method = PartitionMethod::DP;
  std::int64_t microbatch_size = 0;  ///< fixed / packing: samples (rows) per micro-batch
  std::uint64_t token_budget = 0;    ///< tokens: padded tokens (input + target) per micro-batch
  /// dp: the layouts its micro-batches may take: padded (the exact search over windows) and packed
  /// (varlen micro-batches balanced by cost); with both, the better objective wins. Other layouts
  /// are refused (packed-mask rows come from `pack_windows` and the packing baseline).
  LayoutSet layouts = layout_bit(Layout::Padded) | layout_bit(Layout::Packed);
  /// packing: the micro-batches' layout, packed (varlen, the default) or packed-mask (dense rows);
  /// fixed: padded (the default, Megatron) or packed (the samples of a micro-batch flattened into one
  /// varlen row: HF's DataCollatorWithFlattening). Unset for the other methods (refused when set).
  std::optional<Layout> layout;
  /// packing / wlb: tokens per row (input + target for encoder-decoder samples); 0: the longest
  /// sample's. A capacity below the longest sample is refused.
  std::uint64_t capacity = 0;
  /// dp: the micro-batch count must be a multiple of this (interleaved 1F1B: the stages, times dp
  /// with data parallelism); 1: any. Over 1 with dp > 1, the replicas receive equal counts (so each
  /// runs a multiple of count_multiple / dp).
  std::int64_t count_multiple = 1;
  std::int64_t round_multiple = 8;   ///< padded lengths rounded up to this multiple (kernels' tile)
  std::int64_t decoder_extra_tokens = 2;  ///< added to the longest target before rounding (BOS/EOS)
  RecomputePolicy recompute = RecomputePolicy::Auto;
  OversizePolicy oversize = OversizePolicy::Error;
  /// dp, decoder-only models: Auto lets the packed search cut a sample heavier than its micro-batches
  /// into slices (split long, pack short) when that lowers the objective, and cuts a sample that does
  /// not fit alone under OversizePolicy::Error as Slice does (refused only when no slicing fits); Off
  /// never does (slices then come only from OversizePolicy::Slice). Encoder-decoder models never slice.
  SlicePolicy slicing = SlicePolicy::Auto;
  /// The shortest slice (tokens) the dp method and OversizePolicy::Slice cut (at least 1).
  std::uint32_t min_slice_tokens = 64;
  CostBasis basis = CostBasis::Auto;
  EncDecOrder order = EncDecOrder::Auto;
  bool pack_windows = false;          ///< dp / dynapipe: pack each window's samples if cheaper
  double tau_tolerance = 0.0;         ///< dp: prune caps that cannot improve by more than this fraction (0: exact)
  double dynapipe_thin_ms = 5.0;      ///< dynapipe: MIN_TMAX_INTERVAL between kept caps
  PartitionCache* cache = nullptr;    ///< optional shape costs kept across calls (see PartitionCache)
  /// dp / dynapipe: threads building the window table: 1 serial, 2 two (from the front and the
  /// back, each with its own shape memo; batches of 64 samples or more), 0 automatic: two when
  /// the oneTBB arena allows more than one thread and the call is mostly new work (no cache, or
  /// the cache's last call evaluated at least one row per ten windows; a warm cache's call is
  /// mostly look-ups, which a second builder slows). The result is the same bits whatever the
  /// setting.
  int threads = 0;
  /// Names sample `s` of the batch in messages the way the caller's user knows it (its file line,
  /// its dataset task and index); empty: "sample s".
  std::function<std::string(std::uint32_t)> describe_sample;
  /// How the caller's user sets the oversize policy, named in messages ("--oversize" on the CLI).
  std::string oversize_option = "oversize";
  /// Non-empty: slices cannot run where the caller executes the plan, and why (the planner's
  /// interleaved 1F1B); the partition then cuts none (slicing Off, OversizePolicy::Slice refused as
  /// Error) and a sample that fits only sliced is refused with this reason, not offered slice.
  std::string slices_refused;
  /// slicing: carry the slices recomputed more in Partition::alternatives (false: none; the
  /// planner asks again only for a baseline its lower bounds did not prune).
  bool recompute_variants = true;
};

/// A baseline a user would run: a method and its setting. Families: "fixed" (padded, Megatron),
/// "fixed-packed" (a fixed number of samples flattened into one varlen row: HF's
/// DataCollatorWithFlattening), "tokens" (padded token-budget micro-batches), "packing" (rows of a
/// capacity flattened under varlen attention: HF flattening, Megatron THD), "packing-mask" (the same
/// rows dense under a block mask: DynaPipe's packing), "wlb" (WLB-LLM's attention-balanced packing),
/// "slicing" (fixed-length slices, Seq1F1B-like, decoder-only).
struct Baseline {
  PartitionMethod method = PartitionMethod::Fixed;
  std::int64_t microbatch_size = 0;  ///< fixed: samples; packing: rows per micro-batch
  std::uint64_t token_budget = 0;    ///< tokens: padded tokens per micro-batch
  std::uint64_t capacity = 0;        ///< packing: tokens per row; wlb: tokens per micro-batch
  Layout layout = Layout::Padded;    ///< its micro-batches' layout
  /// "fixed", "fixed-packed", "tokens", "packing", "packing-mask", "wlb" or "slicing".
  std::string family() const;
  /// The setting as a user reads it, e.g. "packing (capacity 4096 x 2 rows)".
  std::string label() const;
  /// `base` with this method and setting (and the baselines' plain settings: no window packing).
  PartitionOptions options(const PartitionOptions& base) const;
};

/// Which baselines baseline_grid lists.
struct BaselineGridOptions {
  std::vector<std::int64_t> microbatch_sizes = {1, 2, 4, 8, 16, 32, 64};  ///< fixed
  std::vector<std::int64_t> rows = {1, 2, 4, 8, 16};                      ///< packing: rows per micro-batch
  /// Layouts the executor runs: packing and wlb are listed when it runs packed (varlen) rows;
  /// packing-mask (DynaPipe's comparison) always.
  LayoutSet layouts = layout_bit(Layout::Padded) | layout_bit(Layout::Packed);
  std::int64_t round_multiple = 8;  ///< of the token budgets' padded lengths
  /// The longest sample the capacities and budgets are sized for (encoder-decoder: its input);
  /// 0: the batch's. A run sets its dataset's, so every batch lists the same settings.
  std::uint64_t longest = 0;
  std::uint64_t longest_target = 0;  ///< encoder-decoder: the longest target (0: the batch's)
  /// Decoder-only, with packed layouts: list fixed-length slicing (Seq1F1B-like) at slices of C / 16,
  /// C / 8, C / 4 and C / 2 tokens (at least min_slice_tokens).
  bool slicing = true;
  std::uint64_t min_slice_tokens = 64;
};

/// The baselines of one batch: fixed at each micro-batch size; tokens at budgets of 1, 2, 4, 8 and
/// 16 times the longest padded sample; packing at capacity C (the least power of two that holds
/// the longest sample) with each row count (flattened rows: C x 2r rows covers 2C x r); wlb at
/// capacities C, 2C and 4C; fixed-packed at each micro-batch size; slicing (decoder-only) at slices
/// of C / 16, C / 8, C / 4 and C / 2; packing-mask at capacity C with each row count. The packed
/// families only when the executor runs packed rows. Deterministic, in that order.
std::vector<Baseline> baseline_grid(const BatchLengths& lengths, const BaselineGridOptions& options);

/// Largest round_multiple accepted (padded lengths stay far below the cost model's bounds).
constexpr std::int64_t kMaxRoundMultiple = std::int64_t{1} << 16;

/// The layout a fixed or packing partition's micro-batches take under `o` (o.layout, else the
/// method's default: packed for packing, padded for fixed).
inline Layout method_layout(const PartitionOptions& o) {
  return o.layout.value_or(o.method == PartitionMethod::Packing ? Layout::Packed : Layout::Padded);
}

/// Result of partitioning one global batch.
struct Partition {
  std::vector<MicroBatch> microbatches;          ///< in order of the sample order used
  std::vector<std::vector<std::uint32_t>> ranks;  ///< micro-batch indices per data-parallel rank, ascending
  std::vector<double> rank_time_ms;              ///< sum of time_ms per data-parallel rank
  std::vector<std::uint32_t> order;              ///< sample order the windows were cut from
  double objective_ms = 0;           ///< what the method minimised ((S-1) tau/c + sum/d for dp/dynapipe)
  double tau_ms = 0;                 ///< cap charged (dynapipe: the chosen candidate; others: realised max)
  double max_time_ms = 0;            ///< realised max over micro-batches
  double sum_time_ms = 0;            ///< sum over micro-batches
  double predicted_iteration_ms = 0; ///< (S-1) max/c + sum/d: the 1F1B bound, not a simulation
  std::uint64_t input_tokens = 0, target_tokens = 0;                ///< real tokens (after truncation)
  std::uint64_t padded_input_tokens = 0, padded_target_tokens = 0;  ///< rows x padded lengths
  double efficiency = 0;          ///< real / padded, input and target together
  double input_efficiency = 0;    ///< encoder (or whole-sample) side
  double target_efficiency = 0;   ///< decoder side (0 for decoder-only)
  CostBasis basis = CostBasis::Stages;  ///< the basis the times and memory above use
  cm::Recompute dynapipe_recompute = cm::Recompute::None;  ///< dynapipe: the iteration-wide mode chosen
  double memory_limit_mb = 0;        ///< the limit checked
  std::vector<std::uint32_t> truncated;  ///< sample ids truncated (OversizePolicy::Truncate)
  BatchLengths lengths;                  ///< the batch as partitioned: input and target lengths after truncation
  std::vector<std::uint32_t> dropped;    ///< sample ids dropped (OversizePolicy::Drop)
  std::int64_t tau_evaluations = 0;  ///< min-sum DP runs (one per cap tried)
  /// dp: other partitions of the batch that fit (the chosen micro-batches with their slices
  /// recomputed more, the layout or family not chosen, then fewer and larger, more and smaller, and
  /// other micro-batch counts of the packed and sliced searches), at most kMaxAlternatives beyond
  /// the recompute variants; slicing: its slices recomputed more. The objective is the 1F1B bound
  /// and ignores what else a schedule keeps in flight beside a sliced sample; schedules that fill
  /// bubbles can run another of them faster, so the planner simulates them too and keeps the
  /// fastest (for packpipe's plan, and for a slicing baseline's).
  std::vector<Partition> alternatives;
};

/// The most alternatives a dp partition carries (Partition::alternatives).
constexpr std::size_t kMaxAlternatives = 8;

/// Partitions `lengths` into micro-batches for `shape` (virtual stages `vstages`, from
/// virtual_stages(cost.model(), shape)) under `options`. Every sample lands in exactly one
/// micro-batch unless dropped by OversizePolicy::Drop; every micro-batch fits the memory limit
/// (shape.memory_limit_mb, or the device's memory when 0) under the cost basis. Deterministic.
/// Throws InvalidArgument naming the sample (options.describe_sample) and its length when one cannot
/// fit alone (policy Error), saying why when the cost model refuses its shape, naming the rank when
/// the model state alone exceeds the memory limit (whatever the policy: no sample can fit), naming
/// the option when a parameter is missing or invalid, or naming the micro-batch when a fixed-size
/// baseline does not fit. Thread-safe (the cost model is only queried).
Partition partition(const BatchLengths& lengths, const cm::CostModel& cost, const PipelineShape& shape,
                    const std::vector<VirtualStage>& vstages, const PartitionOptions& options);
/// As above with vstages = virtual_stages(cost.model(), shape).
Partition partition(const BatchLengths& lengths, const cm::CostModel& cost, const PipelineShape& shape,
                    const PartitionOptions& options);

/// Recomputes the padded shapes, recompute modes (fastest that fits under options.recompute),
/// times, memory, figures and rank assignment of given micro-batches (their `samples`, slice
/// `spans` and `row_offsets`) under `basis`, e.g. to compare another method's micro-batches on
/// packpipe's stage basis; the result records `lengths`. objective_ms is (S-1) max/c + sum/d.
/// Throws InvalidArgument naming a micro-batch that does not fit, a sample index out of range, or
/// a sample whose slices do not cover it in order.
Partition evaluate_partition(const BatchLengths& lengths, const cm::CostModel& cost, const PipelineShape& shape,
                             const std::vector<VirtualStage>& vstages, std::vector<MicroBatch> microbatches,
                             const PartitionOptions& options, CostBasis basis);

/// Splits micro-batch costs across `dp` ranks by longest-processing-time (largest first, onto
/// the least-loaded rank, ties to the lower index); each rank's list ascending. Deterministic. A
/// rank may receive none (fewer micro-batches than ranks). `per_rank` > 0: every rank receives
/// exactly that many (the least-loaded rank with room); it must be the count / dp.
std::vector<std::vector<std::uint32_t>> assign_ranks(const std::vector<double>& time_ms, std::int64_t dp,
                                                     std::size_t per_rank = 0);
/// As above for micro-batches that slice links join (slice_edges): each group of linked
/// micro-batches goes to one rank as a whole (a sample's slices need each other's keys and values);
/// with `per_rank` > 0, where the greedy cannot fill every rank evenly with whole groups, the split
/// without counts.
std::vector<std::vector<std::uint32_t>> assign_ranks(const std::vector<double>& time_ms, std::int64_t dp,
                                                     const std::vector<std::pair<std::uint32_t, std::uint32_t>>& edges,
                                                     std::size_t per_rank = 0);

/// Encoder-decoder sample order: (input, target) descending, then (if `improve`) 2-opt and
/// Or-opt moves on the open L1 path over (input, target) until no move shortens it. Ties by
/// sample index; deterministic. Batches with a length of 2^28 or more keep the sorted order.
std::vector<std::uint32_t> encdec_order(const std::vector<std::uint32_t>& input, const std::vector<std::uint32_t>& target,
                                        bool improve);
/// L1 length of the path visiting samples in `order`: sum of |input difference| + |target difference|.
std::uint64_t path_length(const std::vector<std::uint32_t>& input, const std::vector<std::uint32_t>& target,
                          const std::vector<std::uint32_t>& order);

}  // namespace packpipe::partition
