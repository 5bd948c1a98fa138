// The cost-model query: time and memory of layers of a pipeline stage for one micro-batch shape.
// Implementations: AnalyticCostModel (costmodel/analytic.h, the embedded default) and
// ProfiledCostModel (costmodel/profiled.h, from real profiles with analytic fallback flagged).
#pragma once

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/enum_names.h"
#include "common/recompute.h"
#include "costmodel/flops.h"
#include "costmodel/model.h"

namespace packpipe::costmodel {

struct Calibration;  // costmodel/calibration.h

/// Activation recompute modes (common/recompute.h, one name table).
using ::packpipe::Recompute;
using ::packpipe::recompute_name;
using ::packpipe::recompute_from_name;
using ::packpipe::kRecomputeNames;

/// Where a number came from, best first. Derived: a recompute mode the profile lacks, from its
/// no-recompute measurements (ProfiledCostModel).
enum class Provenance { Profiled, Interpolated, Extrapolated, Derived, Analytic };
/// The one name table: "profiled", "interpolated", "extrapolated", "derived", "analytic".
inline constexpr EnumName<Provenance> kProvenanceNames[] = {{Provenance::Profiled, "profiled"},
                                                            {Provenance::Interpolated, "interpolated"},
                                                            {Provenance::Extrapolated, "extrapolated"},
                                                            {Provenance::Derived, "derived"},
                                                            {Provenance::Analytic, "analytic"}};
/// The provenance's name in kProvenanceNames.
constexpr const char* provenance_name(Provenance p) { return enum_name(kProvenanceNames, p); }

/// One query: `num_layers` consecutive layers of `kind` for a micro-batch of `mbs` rows of `seq`
/// tokens (and `dec_seq` decoder tokens for encoder-decoder models) on one GPU of a tensor-parallel
/// group of size `tp`. Rows are dense (padded, or packed under a block mask) unless `attention`
/// says they are packed with varlen attention; then the linear parts cost mbs x seq tokens and the
/// attention parts the sums of `attention` (docs/design/014-layouts.md).
struct Query {
  LayerKind kind = LayerKind::Encoder;
  std::int64_t num_layers = 1;
  std::int64_t tp = 1;
  std::int64_t mbs = 1;
  std::int64_t seq = 0;
  std::int64_t dec_seq = 0;
  Recompute recompute = Recompute::None;
  AttentionWork attention;
};


/// Largest sizes a Query may name: far above any real shape, and small enough that every product
/// of them the models form (tokens x hidden x bytes, seq^2 x mbs) stays exact and in range.
inline constexpr std::int64_t kMaxQueryMbs = std::int64_t{1} << 24;
inline constexpr std::int64_t kMaxQuerySeq = std::int64_t{1} << 24;
inline constexpr std::int64_t kMaxQueryTokens = std::int64_t{1} << 32;  ///< mbs x (seq + dec_seq)
inline constexpr std::int64_t kMaxQueryLayers = std::int64_t{1} << 16;
inline constexpr std::int64_t kMaxQueryTp = std::int64_t{1} << 16;

/// Throws InvalidArgument naming the field, the value and the limit (query_limits_failed).
[[noreturn]] void query_limits_failed(const Query& q, std::int64_t mbs);
/// Throws InvalidArgument naming the sum, its value and its bounds (attention_work_failed).
[[noreturn]] void attention_work_failed(const Query& q);
/// Whether the attention sums of a varlen query are possible for `mbs` rows of (seq, dec_seq)
/// tokens: each sum at least the tokens it covers (every segment holds a token) and at most the
/// dense rows' (mbs x seq^2, ...); the decoder sums zero without decoder tokens, and both set
/// together with them; the slice sums (prefix, prefix_tokens) both zero, or, without decoder
/// tokens, 1 <= prefix_tokens <= prefix <= tokens x kMaxQuerySeq.
inline bool attention_work_ok(const Query& q, std::int64_t mbs) {
  const AttentionWork& a = q.attention;
  if (mbs <= 0 || q.seq < 0 || q.dec_seq < 0) return true;  // the models' own checks name these
  const std::int64_t enc = mbs * q.seq, dec = mbs * q.dec_seq;
  const bool self_ok = q.seq == 0 ? a.self == 0 : (a.self >= enc && a.self <= enc * q.seq);
  const bool dec_ok = q.dec_seq == 0 ? (a.dec_self == 0 && a.cross == 0)
                                     : (a.dec_self >= dec && a.dec_self <= dec * q.dec_seq && a.cross >= 0 &&
                                        a.cross <= dec * q.seq && (a.cross > 0) == (q.seq > 0));
  // Slices (decoder-only rows): every slice has a token and keeps at most kMaxQuerySeq before it.
  const bool prefix_ok = a.prefix == 0 ? a.prefix_tokens == 0
                                       : (q.dec_seq == 0 && a.prefix_tokens >= 1 && a.prefix >= a.prefix_tokens &&
                                          a.prefix <= enc * kMaxQuerySeq);
  return self_ok && dec_ok && prefix_ok;
}

/// Throws InvalidArgument naming the field, the value and the limit if a size of `q` (with mbs
/// `mbs`; sizes below 1 are left to the models' own checks) is above the limits above. Inline:
/// comparisons only until it throws.
inline void check_query_limits(const Query& q, std::int64_t mbs) {
  if (mbs > kMaxQueryMbs || q.seq > kMaxQuerySeq || q.dec_seq > kMaxQuerySeq || q.num_layers > kMaxQueryLayers ||
      q.tp > kMaxQueryTp ||
      (mbs > 0 && q.seq >= 0 && q.dec_seq >= 0 && mbs * (q.seq + q.dec_seq) > kMaxQueryTokens)) {
    query_limits_failed(q, mbs);
  }
  if (q.attention.varlen() && !attention_work_ok(q, mbs)) attention_work_failed(q);
}

/// Answer for a Query (all layers of the query together). Times in milliseconds, memory in bytes.
struct LayerCost {
  double forward_ms = 0;
  double backward_ms = 0;    ///< excludes recompute
  double recompute_ms = 0;   ///< extra forward work during backward under the recompute mode
  double stored_bytes = 0;   ///< activations kept from forward to backward (one in-flight micro-batch)
  double peak_bytes = 0;     ///< transient peak while the layers run, on top of stored activations
  double boundary_bytes = 0; ///< bytes sent to the next stage (activations; gradients come back the same size)
  Provenance time_source = Provenance::Analytic;
  Provenance memory_source = Provenance::Analytic;
  /// forward + backward + recompute
  double total_ms() const { return forward_ms + backward_ms + recompute_ms; }
};

/// Memory of parameters, gradients and optimizer state of some layers on one GPU.
struct StaticMemory {
  double params_bytes = 0;
  double grads_bytes = 0;
  double optimizer_bytes = 0;
  double total() const { return params_bytes + grads_bytes + optimizer_bytes; }
};

/// Mixed-precision Adam state of `params` parameters on one GPU of a data-parallel group of `dp`
/// ranks under ZeRO stage `zero_stage` (0-3): 2 bytes weights, 2 bytes grads, 12 bytes optimizer
/// (fp32 master, m, v) per parameter; stage >= 1 divides the optimizer by dp, >= 2 also the
/// gradients, 3 also the weights. Throws InvalidArgument for dp < 1 or a stage outside 0-3.
StaticMemory static_memory(double params, std::int64_t dp, int zero_stage);

/// Communication model: alpha-beta per link kind.
struct CommModel {
  double intra_latency_ms = 0;
  double intra_bytes_per_ms = 0;
  double inter_latency_ms = 0;
  double inter_bytes_per_ms = 0;
  /// From a device's interconnect figures.
  static CommModel from_device(const DeviceSpec& d);
  /// Point-to-point transfer of `bytes` inside a node (or across nodes), ms.
  double p2p_ms(double bytes, bool inter_node = false) const;
  /// Ring all-reduce of `bytes` over `n` ranks, ms: 2(n-1) steps of bytes/n. (Inline: the
  /// analytic query calls it per row.)
  double all_reduce_ms(double bytes, std::int64_t n, bool inter_node = false) const {
    if (!(bytes >= 0 && std::isfinite(bytes)) || n < 1) refuse(bytes, n);
    if (n == 1 || bytes == 0) return 0;
    const double steps = 2.0 * static_cast<double>(n - 1);
    const double chunk = bytes / static_cast<double>(n);
    return steps * (inter_node ? inter_latency_ms + chunk / inter_bytes_per_ms
                               : intra_latency_ms + chunk / intra_bytes_per_ms);
  }
  /// Ring all-gather / reduce-scatter of `bytes` (the full buffer) over n ranks, ms.
  double all_gather_ms(double bytes, std::int64_t n, bool inter_node = false) const;
  double reduce_scatter_ms(double bytes, std::int64_t n, bool inter_node = false) const;
  /// Throws the InvalidArgument of a bad size or rank count (out of line).
  [[noreturn]] static void refuse(double bytes, std::int64_t n);
};

/// The lengths of a Query an answer depends on (see CostModel::lengths_used).
struct LengthUse {
  bool seq = true;
  bool dec_seq = true;
};

/// The interface the planner queries (tens of thousands of times per iteration). Implementations
/// are immutable after construction and safe to query from many threads.
class CostModel {
 public:
  virtual ~CostModel() = default;
  /// Time and memory of the query; throws InvalidArgument for a non-positive size or a shape the
  /// model refuses (e.g. far beyond profiled data), naming the argument.
  virtual LayerCost query(const Query& q) const = 0;
  /// Batch query over consecutive micro-batch sizes (the partitioner's rows): out[k] is
  /// query(q with mbs = q.mbs + k), bit for bit, for k < n, where n (returned, 0..count) stops at
  /// the first row query() would refuse (InvalidArgument; never thrown for it here); rows from n
  /// on are not written. `out` holds `count` rows (caller-owned). Throws InvalidArgument only for
  /// count < 0, a null `out` with count > 0, or q.mbs + count overflowing. Thread-safe as query().
  /// The default loops over query(); the built-in models compute what does not depend on mbs once.
  virtual std::int64_t query_rows(const Query& q, std::int64_t count, LayerCost* out) const;
  /// As query_rows, but only stored_bytes, peak_bytes and memory_source of out[k] are set (bit
  /// for bit those of query()); the other fields are unspecified. The default calls
  /// query_rows; a model whose memory is cheaper alone (the analytic one) overrides it.
  virtual std::int64_t memory_rows(const Query& q, std::int64_t count, LayerCost* out) const;
  /// Which lengths the answers for `kind` depend on: a query's answer is the same, bit for bit,
  /// when a length outside the result changes (e.g. an encoder layer ignores dec_seq), also
  /// when that length is set to 0. Callers may memoise answers on the lengths used only. The
  /// default (both) is always correct.
  virtual LengthUse lengths_used(LayerKind kind) const;
  /// The model and device this cost model describes.
  virtual const ModelSpec& model() const = 0;
  virtual const DeviceSpec& device() const = 0;
  /// Communication model for stage boundaries and collectives.
  virtual const CommModel& comm() const = 0;
  /// The attention kernel the answers are for (docs/design/015-long-context.md): the analytic
  /// model's attention_kernel(model, device); a profiled model's, the one its profile was measured
  /// with; a calibrated model's, its base's. The default: attention_kernel(model(), device()).
  virtual AttentionKernel attention() const { return attention_kernel(model(), device()); }
  /// Human-readable description ("analytic", or the profile files loaded).
  virtual std::string describe() const = 0;
  /// The calibration applied to this model's stage op times and communication
  /// (costmodel/calibration.h, CalibratedCostModel), or null for an uncalibrated model.
  virtual const Calibration* calibration() const { return nullptr; }
  /// Parameter bytes of one layer of `kind` on one GPU of a tp group as a profile measured them
  /// (DynaPipe's model state), or NaN when the model has no measurement (the default).
  virtual double layer_param_bytes(LayerKind kind, std::int64_t tp) const;
};

/// The argument checks of CostModel::query_rows (for implementations): throws InvalidArgument for
/// count < 0, a null `out` with count > 0, or q.mbs + count - 1 overflowing.
void check_query_rows(const Query& q, std::int64_t count, const LayerCost* out);

/// The layers one pipeline stage holds: transformer layers of each kind, and whether the
/// embedding and the LM head / loss live there.
struct StageLayout {
  std::int64_t encoder_layers = 0;
  std::int64_t decoder_layers = 0;
  bool has_embedding = false;
  bool has_postprocess = false;
  bool operator==(const StageLayout& o) const {
    return encoder_layers == o.encoder_layers && decoder_layers == o.decoder_layers &&
           has_embedding == o.has_embedding && has_postprocess == o.has_postprocess;
  }
};

/// The query of `num_layers` layers of `kind` for micro-batch `shape` (dec_seq dropped for a
/// decoder-only model, as every stage composition asks it).
Query shape_query(const ModelSpec& m, LayerKind kind, std::int64_t num_layers, std::int64_t tp, const MicroShape& shape,
                  Recompute rc);

/// The query of one packed row (varlen attention) of samples `segments` tokens long and, for an
/// encoder-decoder model, `dec_segments` decoder tokens (one per sample; empty for decoder-only):
/// seq and dec_seq are the row's tokens, attention the segments' sums; the other fields default.
/// Throws InvalidArgument naming `what` and the segment for a length outside [1, kMaxQuerySeq],
/// counts that disagree (or decoder lengths for a decoder-only model), no segment, or a row
/// longer than kMaxQuerySeq.
/// `prefix` (optional, one per segment; decoder-only models): the tokens of each segment's sample
/// before it that it attends to, a slice's kept keys (docs/design/015-long-context.md); refused
/// naming the segment for a count that differs, a negative one, or prefix + segment above kMaxQuerySeq.
Query packed_query(const ModelSpec& m, const std::vector<std::int64_t>& segments,
                   const std::vector<std::int64_t>& dec_segments, const std::string& what = "segments",
                   const std::vector<std::int64_t>& prefix = {});

/// `q` without its slices' prefix: prefix and prefix_tokens 0, the rest as it is.
inline Query without_prefix(const Query& q) {
  Query r = q;
  r.attention.prefix = 0;
  r.attention.prefix_tokens = 0;
  return r;
}
/// A measured answer `base` for a row without its prefix, plus what another model says the prefix
/// adds (`with` - `without`, each field at least 0): how the profiled models price slices.
LayerCost add_prefix_cost(LayerCost base, const LayerCost& with, const LayerCost& without);

/// Dense rows with the tokens and attention sums of query `q` on the lengths its kind reads:
/// `rows` rows of `seq` tokens with rows x seq = the tokens and rows x seq^2 = the self-attention
/// sum; for decoder layers and an encoder-decoder post-process the decoder side sets them (rows x
/// dec_seq = decoder tokens, rows x dec_seq^2 = dec_self) and seq = encoder tokens / rows. A dense
/// query maps to its own shape. How the profiled models read a varlen query from padded grids.
struct DenseShape {
  double rows = 1, seq = 0, dec_seq = 0;
};
DenseShape dense_equivalent(const ModelSpec& m, const Query& q);

/// Cost of one micro-batch on one stage: the layers of `layout` composed (times add; stored
/// activations add; peak = max over layers of stored-so-far + that layer's peak).
LayerCost stage_cost(const CostModel& cm, const StageLayout& layout, std::int64_t tp, const MicroShape& shape,
                     Recompute rc);
/// stage_cost of `mbs` dense rows of `seq` tokens (`dec_seq` decoder tokens).
inline LayerCost stage_cost(const CostModel& cm, const StageLayout& layout, std::int64_t tp, std::int64_t mbs,
                            std::int64_t seq, std::int64_t dec_seq, Recompute rc) {
  return stage_cost(cm, layout, tp, MicroShape{mbs, seq, dec_seq, {}}, rc);
}
/// Static memory of a stage's layers (parameters / tp) under data parallelism and ZeRO.
StaticMemory stage_static_memory(const ModelSpec& m, const StageLayout& layout, std::int64_t tp,
                                 std::int64_t dp, int zero_stage);

}  // namespace packpipe::costmodel
