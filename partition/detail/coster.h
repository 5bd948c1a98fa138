// Internal: memoised micro-batch costs (time, memory, fit) for the partitioner, on either cost
// basis, and the window search shared by the DP methods. Not a public header.
#pragma once

#include <array>
#include <memory>
#include <cstdint>
#include <limits>
#include <unordered_map>
#include <vector>

#include "partition/partition.h"

namespace packpipe::partition::detail {

/// Cost of one micro-batch shape under one recompute mode.
struct RcCost {
  double time_ms = 0;
  double stored_mb = 0;  ///< Stages: largest stage's stored per copy; DynaPipe: l x s-hat
  double peak_mb = 0;    ///< Stages: largest stage's transient peak; DynaPipe: max(a) + (l - 1) s-hat
  double headroom_mb = 0;    ///< Stages basis: least (limit - memory) over ranks; fits iff >= 0 (NaN: no)
};

/// A recompute choice for one shape.
struct Choice {
  double time_ms = 0;
  double stored_mb = 0;
  double peak_mb = 0;
  cm::Recompute rc = cm::Recompute::None;
  bool fits = false;
};

/// Costs of one (input length, decoder length) shape for every recompute mode.
struct ShapeSlot {
  std::array<RcCost, 3> c;
  std::uint8_t have = 0;
};

struct Scratch;
/// Cost-model answers of one layer kind at one (recompute, lengths it uses), by rows.
struct KindRows {
  struct Row {
    cm::LayerCost c;
    bool have = false;
  };
  std::vector<Row> rows;
  std::int64_t refused = std::numeric_limits<std::int64_t>::max();  ///< first row the model refuses
};

/// Memo of shape costs: (input length << 32 | decoder length) -> slots by rows, valid for one
/// setting (cost model, pipeline shape, stage layouts, basis, limit), kept in `key`; and the
/// partitioner's working storage, kept so that repeated calls reuse it.
struct ShapeMemo {
  ShapeMemo();
  ~ShapeMemo();
  std::vector<std::uint64_t> key;
  std::unordered_map<std::uint64_t, std::vector<ShapeSlot>> shapes;
  /// Answers of the kinds that ignore one of the two lengths (encoder-decoder models: e.g. the
  /// encoder layers, the post-process), shared by the shapes that differ only in the other one.
  /// Key: kind index, recompute mode and the lengths used (Coster::kind_key).
  std::unordered_map<std::uint64_t, KindRows> kind_rows;
  std::unique_ptr<Scratch> scratch;
  std::size_t slots = 0;  ///< row slots allocated over all shapes
  /// Rows the last call evaluated per window it built (1 before any): how much of a call's work
  /// is new rows rather than look-ups, which decides whether two table builders pay
  /// (PartitionOptions::threads 0).
  double last_new_share = 1.0;
  /// Bound on `slots` (default about 100 MB): a memo past it is cleared when the next call
  /// starts, so a long planning run keeps bounded memory.
  std::size_t max_slots = std::size_t{1} << 20;
  std::size_t size() const;
  /// Forgets every shape and the setting (the working storage stays).
  void clear();
};

/// Memoised costs of (rows, input length, decoder length) shapes. Not thread-safe (one per call).
class Coster {
 public:
  /// `shared` (optional) keeps costs across calls; it is reset when its key is another setting's.
  Coster(const cm::CostModel& cost, const PipelineShape& shape, const std::vector<VirtualStage>& vstages,
         CostBasis basis, double limit_mb, ShapeMemo* shared = nullptr);
  CostBasis basis() const { return basis_; }
  double limit_mb() const { return limit_mb_; }
  bool encoder_decoder() const { return encdec_; }
  /// (S - 1) / c and 1 / d of the objective.
  double max_weight() const { return max_weight_; }
  double sum_weight() const { return sum_weight_; }
  /// DynaPipe basis: model state of GPU 0 (MB) and limit - model state.
  double dynapipe_model_state_mb() const { return model_state_mb_; }
  double dynapipe_available_mb() const { return limit_mb_ - model_state_mb_; }
  /// DynaPipe basis: the stored and peak limits used by fits().
  void set_dynapipe_limits(double stored_limit_mb, double peak_limit_mb) {
    stored_limit_ = stored_limit_mb;
    peak_limit_ = peak_limit_mb;
  }
  double dynapipe_stored_limit_mb() const { return stored_limit_; }
  double dynapipe_peak_limit_mb() const { return peak_limit_; }
  /// The memo's setting (cost model, pipeline shape, layouts, basis, limit).
  const std::vector<std::uint64_t>& setting() const { return memo_->key; }
  /// Whether the shape's costs under some recompute mode are memoised already.
  bool has(std::int64_t rows, std::int64_t le, std::int64_t ld) const;
  /// Cost of the shape under `rc` (memoised).
  const RcCost& get(std::int64_t rows, std::int64_t le, std::int64_t ld, cm::Recompute rc);
  /// Whether a cost fits under the basis (DynaPipe: the limits set above).
  bool fits(const RcCost& c) const {
    return basis_ == CostBasis::Stages ? c.headroom_mb >= 0 : (c.stored_mb <= stored_limit_ && c.peak_mb <= peak_limit_);
  }
  /// Memory left under the limits (negative: does not fit); close to linear in rows.
  double headroom(const RcCost& c) const {
    return basis_ == CostBasis::Stages ? c.headroom_mb : std::min(stored_limit_ - c.stored_mb, peak_limit_ - c.peak_mb);
  }
  /// The mode allowed by `policy` that fits (Auto: the least recompute that fits, which is the
  /// fastest when recompute only adds time; otherwise that one); fits = false when none does.
  /// `first_auto` (Auto only): modes below it are known not to fit (a window that grows keeps
  /// failing a mode once it failed it) and are not queried; on return it is the least mode
  /// index that still may fit (3 when none fits).
  Choice choose(std::int64_t rows, std::int64_t le, std::int64_t ld, RecomputePolicy policy, int* first_auto = nullptr);
  /// The choice among the costs `at(rc)` gives under `policy`, as choose() makes it.
  template <typename At>
  Choice choose_with(RecomputePolicy policy, int* first_auto, At&& at);
  /// Cost of one varlen micro-batch (shape.attention set; layout Packed) under `rc`. Not memoised:
  /// every packed micro-batch has its own sums. A shape the cost model refuses costs infinity and
  /// does not fit.
  RcCost get_varlen(const cm::MicroShape& shape, cm::Recompute rc);
  /// choose() for a varlen micro-batch.
  Choice choose_varlen(const cm::MicroShape& shape, RecomputePolicy policy);
  /// choose() for rows m0, m0 + 1, .., m1 of one shape in turn (first_auto carried along), each
  /// choice's time appended to `time`, up to the first row where nothing fits.
  /// Returns the rows appended (m1 - m0 + 1 when all fit).
  std::int64_t choose_run(std::int64_t m0, std::int64_t m1, std::int64_t le, std::int64_t ld, RecomputePolicy policy,
                          int* first_auto, std::vector<double>& time);
  /// The most rows the caller's next windows of the current shape can have: get() evaluates a
  /// block of rows ahead (batched cost-model queries), never past it.
  void set_rows_hint(std::int64_t max_rows) { rows_hint_ = max_rows; }
  /// Working storage of the DP methods (the memo's: kept across calls when shared).
  Scratch& scratch() { return *memo_->scratch; }
  /// Rows (shape and recompute mode) evaluated so far by this coster.
  std::int64_t rows_evaluated() const { return evaluated_; }
  /// The attention kernel of the cost model (a slice's attention work in self units: eager l^2 + l p,
  /// flash l^2 + 2 l p; docs/design/015-long-context.md).
  cm::AttentionKernel kernel() const { return kernel_; }
  /// The largest static memory (parameters, gradients, optimizer state) of a rank, MB.
  double max_static_mb() const;

 private:
  // Costs of rows .. rows + count - 1 at (le, ld, rc) into out[0, count).
  void eval_rows(std::int64_t rows, std::int64_t count, std::int64_t le, std::int64_t ld, cm::Recompute rc,
                 RcCost* out);
  // Kind k's answers for rows .. rows + ok - 1 from the memo's shared rows (querying the missing
  // ones), pointed to from kind_ptrs_[k * cnt ..]; returns how many of them the model answers.
  std::int64_t shared_rows(std::size_t k, cm::Query query, std::int64_t rows, std::int64_t ok, std::size_t cnt);
  // One shape (`tokens` tokens: calibration's coordinate) from its per-kind query answers q[k]
  // (kinds_ order).
  RcCost compose_stages(const cm::LayerCost* const* q, const cm::MicroShape& shape, double tokens) const;
  RcCost compose_dynapipe(const cm::LayerCost* const* q, const cm::MicroShape& shape, double tokens) const;
  // What a calibrated model adds (costmodel::stage_time_delta_ms) to the stage time of `layers` x
  // the answers q[k] of `comp`, plus `once` (the DynaPipe basis's post-process; may be null), for
  // `shape` (whose attention share the calibration's attention term reads).
  double calibration_delta(const std::vector<int>& comp, const cm::LayerCost* const* q, double layers,
                           const cm::LayerCost* once, const cm::MicroShape& shape, double tokens) const;
  static constexpr std::size_t kMaxKinds = 8;

  struct KindQuery {  // one distinct (kind, layers) query of the stage layouts (DynaPipe: its per-layer queries)
    cm::LayerKind kind;
    std::int64_t layers;
  };
  struct StagePlan {  // a virtual stage: indices into the distinct queries, in execution order
    std::int64_t rank = 0;
    double inflight = 1;  // copies held under 1F1B: V - v
    std::vector<int> queries;
    int comp = 0;  // index into comps_
  };

  const cm::CostModel& cost_;
  bool calibrated_ = false;  // cost_.calibration() is set: stage times through costmodel::stage_time_ms
  bool attention_share_ = false;  // the calibration has an attention term: deltas need the stage's share
  cm::AttentionKernel kernel_ = cm::AttentionKernel::Eager;  // cost.attention(): the shares are of its executed FLOPs
  PipelineShape shape_;
  CostBasis basis_;
  bool encdec_;
  double limit_mb_;
  double max_weight_ = 0, sum_weight_ = 1;
  std::vector<KindQuery> kinds_;
  std::vector<StagePlan> stages_;
  std::vector<std::vector<int>> comps_;  // distinct query lists of the stages
  // Per distinct query: whether the cost model ignores one of the lengths for it (its answers
  // are then kept in the memo's kind_rows), and which lengths it uses.
  std::vector<char> shared_kind_;
  std::vector<cm::LengthUse> kind_use_;
  bool one_stage_per_rank_ = false;
  struct Frontier {  // one stage per rank: a stage that may hold the least headroom of its composition
    std::size_t comp;
    double static_bytes;
    double inflight;
  };
  std::vector<Frontier> frontier_;
  std::vector<double> static_bytes_;  // per rank
  double limit_bytes_ = 0;
  // DynaPipe basis
  std::int64_t dyn_layers_ = 1, dyn_chunks_ = 1;
  double model_state_mb_ = 0, stored_limit_ = 0, peak_limit_ = 0;
  ShapeMemo own_;
  ShapeMemo* memo_ = &own_;
  std::uint64_t last_key_ = 0;
  std::vector<ShapeSlot>* last_row_ = nullptr;
  static constexpr int kRecentBits = 8;
  struct RecentShape {
    std::uint64_t key = 0;
    std::vector<ShapeSlot>* row = nullptr;
  };
  std::array<RecentShape, std::size_t{1} << kRecentBits> recent_{};
  struct RecentKind {
    std::uint64_t key = 0;
    KindRows* rows = nullptr;
  };
  std::array<RecentKind, std::size_t{1} << kRecentBits> recent_kinds_{};
  std::vector<const cm::LayerCost*> kind_ptrs_;  // per row of a block and shared kind
  std::int64_t rows_hint_ = 1;
  std::int64_t evaluated_ = 0;
  mutable std::vector<cm::LayerCost> scratch_;
  std::vector<cm::LayerCost> block_rows_;  // a shared kind's missing rows, as queried
  std::vector<RcCost> block_;
};

/// Window shape helpers.
inline std::int64_t round_up(std::int64_t x, std::int64_t mult) { return (x + mult - 1) / mult * mult; }

/// Feasible windows [i, j) of an order, start-major: windows starting at i are j = i+1 .. i+count[i],
/// their values at offset[i] + (j - i - 1) in the arrays below. Starts whose windows have the same
/// shapes (decoder-only, sorted by length, same padded length) share one column of values: the
/// column of the first such start, cut to count[i] <= n - i for the later ones.
struct WindowTable {
  std::vector<std::int32_t> count;  ///< per start
  std::vector<std::int64_t> offset; ///< per start, into the arrays below
  std::vector<std::int64_t> column_end;  ///< per distinct column, ascending: its end in the arrays (columns are contiguous)
  std::vector<double> time_ms;
  std::vector<std::int32_t> rows;   ///< rows of the window (packed rows when packing pays); empty: j - i
  std::vector<double> tail_min;     ///< per value: min time of this and the longer windows of its column
  std::int32_t max_count = 0;
  double max_time_ms = 0;           ///< largest window time
};
/// Min-sum DP with a cap: windows with time <= cap. Returns the sum (inf when
/// infeasible), the realised max and the window ends on the optimal path (back-tracking order).
struct CapResult {
  double sum = 0;
  double max = 0;
  bool feasible = false;
  std::vector<std::int32_t> cuts;  ///< window starts, ascending, plus n
};
/// `ws` is scratch reused between runs (no allocation after the first). O(windows <= cap): each
/// start's scan stops where no longer window is under the cap (tail_min).
struct CapWorkspace {
  std::vector<double> F;
  std::vector<std::int64_t> P;
};
CapResult min_sum_under_cap(const WindowTable& w, double cap, CapWorkspace& ws);
/// Working storage of one partition call: the window table, the DP's arrays and the cap search's.
struct Scratch {
  WindowTable table;
  CapWorkspace ws;
  std::vector<double> cand, cover;
  std::vector<std::int64_t> padded_in, padded_tg;  ///< padded lengths by position in the order
};
/// Fills t.tail_min and t.max_time_ms from t.time_ms (call once after the table is built).
void finish_table(WindowTable& t);

}  // namespace packpipe::partition::detail
