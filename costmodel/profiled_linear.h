// A cost model that answers from profiles exactly as DynaPipe's planner does: multilinear
// interpolation of the raw grid values (reference dynapipe.md, section 4). It puts packpipe on
// DynaPipe's own cost basis (benchmarks/dynapipe_compare.py); ProfiledCostModel (costmodel/profiled.h)
// interpolates better. Design: docs/design/003-costmodel-profiles.md, "DynaPipe's interpolation".
#pragma once

#include <memory>
#include <string>

#include "costmodel/cost_model.h"
#include "costmodel/profile_readers.h"

namespace packpipe::costmodel {

/// Answers per (layer kind, tp, recompute) from interpolators built as DynaPipe builds its scipy
/// RegularGridInterpolators: one per quantity (forward, backward, stored, peak) over the union of
/// its points' axis values (mbs, seq and, for decoder layers, dec_seq; the post-process of an
/// encoder-decoder model on dec_seq), each axis extended by twice its largest value; repeated
/// measurements resolve to their maximum; linear within a cell, linear extrapolation below the
/// smallest value of an axis. Where DynaPipe's answer would involve an unprofiled node (an OOM hole,
/// or the extension beyond the largest value: its 1e100) the query is refused (InvalidArgument).
/// DynaPipe's backward includes the recompute: reported as backward + recompute_ms (the whole
/// forward under full recompute, its attention share of the FLOPs under selective; encoder and
/// decoder layers), the sum unchanged. The peak is DynaPipe's absolute layer peak, reported as the
/// transient above the stored bytes. Recompute modes the profile lacks for a kind and tp it measures
/// without recompute are derived node by node as ProfiledCostModel derives them (Provenance::Derived),
/// so exporting the nodes and interpolating them gives the same answers. The embedding, memory the
/// profile does not measure, and other tp go to `fallback` (Analytic); without one they are refused.
/// Immutable after construction; queries are allocation-free and thread-safe.
class LinearProfiledCostModel final : public CostModel {
 public:
  /// Builds the interpolators; throws InvalidArgument as ProfiledCostModel does for a profile
  /// without points, of another model, or with decoder layers for a decoder-only model.
  LinearProfiledCostModel(Profile profile, ModelSpec model, DeviceSpec device,
                          std::unique_ptr<CostModel> fallback = nullptr);
  ~LinearProfiledCostModel() override;
  LinearProfiledCostModel(const LinearProfiledCostModel&) = delete;
  LinearProfiledCostModel& operator=(const LinearProfiledCostModel&) = delete;

  LayerCost query(const Query& q) const override;
  /// Encoder layers read seq, decoder layers both, the post-process dec_seq of an encoder-decoder
  /// model (seq otherwise), with the fallback's.
  LengthUse lengths_used(LayerKind kind) const override;
  const ModelSpec& model() const override;
  const DeviceSpec& device() const override;
  const CommModel& comm() const override;
  std::string describe() const override;
  /// The kernel the profile was measured with (Profile::kernel()).
  AttentionKernel attention() const override;
  /// Parameter bytes of one layer of `kind` at `tp` as the profile measured them (NaN if not).
  double layer_param_bytes(LayerKind kind, std::int64_t tp) const override;

  /// Whether (kind, tp, rc) is a recompute mode the profile lacks, derived from its no-recompute grid.
  bool derived(LayerKind kind, std::int64_t tp, Recompute rc) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace packpipe::costmodel
