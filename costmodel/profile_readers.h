// Readers for measured per-layer profiles (DynaPipe grids and per-point files, Aceso op tables,
// Metis per-(device, TP, batch) JSON, AIOB kernel times, AICB collective logs) into one in-memory
// representation, and the packpipe profile file that `packpipe costmodel import` writes.
// Units inside packpipe: milliseconds and bytes. Every reader has an in-memory entry point
// (text + a source name used in error messages and, where the format keeps the shape in the file
// name, parsed for it); errors are packpipe::Error naming the source, the line and the column.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "costmodel/cost_model.h"

namespace packpipe::costmodel {

/// Not measured (e.g. Metis has no per-layer activation memory, a timing file has no memory).
inline constexpr double kNotMeasured = std::numeric_limits<double>::quiet_NaN();

/// One measured shape of one layer kind. Times are per layer; memory per layer (stored) or for the
/// running layer (peak). Repeated shapes are kept as separate points until a model is built.
struct ProfilePoint {
  LayerKind kind = LayerKind::Encoder;
  std::int64_t tp = 1;
  Recompute rc = Recompute::None;
  std::int64_t variant = 0;  ///< TP split variant (Aceso algo); 0 elsewhere
  std::int64_t mbs = 1;
  std::int64_t seq = 0;      ///< (encoder) sequence length; 0 for a T5 post-process keyed by dec_seq
  std::int64_t dec_seq = 0;  ///< decoder length (encoder-decoder), 0 otherwise
  double fwd_ms = kNotMeasured;
  double bwd_ms = kNotMeasured;  ///< as profiled: includes the recompute forward under rc full/selective
  double stored_bytes = kNotMeasured;
  double peak_bytes = kNotMeasured;
};

/// Parameter bytes of one layer of `kind` on one GPU of a TP group (fp16 weights after sharding).
struct ProfileParams {
  LayerKind kind = LayerKind::Encoder;
  std::int64_t tp = 1;
  Recompute rc = Recompute::None;
  double bytes = 0;
};

/// One measured collective or point-to-point transfer (Aceso prim/p2p tables, AICB logs).
struct CommSample {
  std::string collective;  ///< "all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "p2p"
  std::int64_t group_size = 0;  ///< ranks; 2 for p2p
  bool inter_node = false;
  double bytes = 0;
  double ms = 0;
};

/// The common representation every reader produces and the profiled cost model consumes.
struct Profile {
  std::string model;   ///< model name as the source spells it ("gpt_6.7b"); may be empty
  std::string device;  ///< device name if the source says; may be empty
  std::vector<ProfilePoint> points;
  std::vector<ProfileParams> params;
  std::vector<CommSample> comm;
  std::vector<std::string> sources;  ///< files (or in-memory names) read
  std::vector<std::string> notes;    ///< conversions and quirks worth telling the user
  /// The attention kernel the points were measured with, where the source records it (packpipe's
  /// own profiles, "attention"); unset: eager, as DynaPipe's, Aceso's, Metis', AIOB's and AICB's
  /// Megatron runs measured it (docs/design/015-long-context.md).
  std::optional<AttentionKernel> attention;
  /// The kernel of the measurements: `attention`, or Eager when unrecorded.
  AttentionKernel kernel() const { return attention.value_or(AttentionKernel::Eager); }

  /// Appends another profile (points, params, comm, sources, notes); keeps this model/device
  /// unless empty. Throws InvalidArgument naming both sources when both hold points measured with
  /// different attention kernels (one model cannot answer for two kernels).
  void merge(Profile other);
};

/// Formats the loader recognises.
enum class ProfileFormat {
  DynaPipeTiming,      ///< derived CSV: tp,rc,lm_stage,train_stage,enc_seqlen,dec_seqlen,mbs,time_ms_per_layer
  DynaPipeActivation,  ///< derived CSV: ...,stored_activation_MB_per_layer,peak_activation_MB
  DynaPipeModelState,  ///< derived CSV: tp,rc,lm_stage,param_MB_per_layer
  DynaPipeMicrobench,  ///< microbench_tp{T}_hs{H}_ah{A}_kv{K}_ffhs{F}_sl{L}[_{Ldec}]_mbs{m}[_rc_*].txt
  AcesoOps,            ///< <model>_<size>_mbs<B>_tp<T>_algo<A>.csv (µs, MiB)
  AcesoPrim,           ///< prim_<model>_<size>_<collective>_<N>gpus.csv (MiB, ms)
  AcesoP2P,            ///< p2p_{intra,inter}_node.csv (MiB, GiB/s)
  Metis,               ///< DeviceType.<DEV>_tp<t>_bs<b>.json (ms, MB)
  Aiob,                ///< AIOB computation-time text (µs)
  AicbLog,             ///< AICB run log CSV (bytes, ms)
  Packpipe,            ///< packpipe's own profile JSON (ms, bytes)
};
/// The one name table: "dynapipe-timing", "dynapipe-activation", ..., "packpipe".
inline constexpr EnumName<ProfileFormat> kProfileFormatNames[] = {
    {ProfileFormat::DynaPipeTiming, "dynapipe-timing"},
    {ProfileFormat::DynaPipeActivation, "dynapipe-activation"},
    {ProfileFormat::DynaPipeModelState, "dynapipe-model-state"},
    {ProfileFormat::DynaPipeMicrobench, "dynapipe-microbench"},
    {ProfileFormat::AcesoOps, "aceso-ops"},
    {ProfileFormat::AcesoPrim, "aceso-prim"},
    {ProfileFormat::AcesoP2P, "aceso-p2p"},
    {ProfileFormat::Metis, "metis"},
    {ProfileFormat::Aiob, "aiob"},
    {ProfileFormat::AicbLog, "aicb-log"},
    {ProfileFormat::Packpipe, "packpipe"}};
/// The format's name in kProfileFormatNames.
constexpr const char* profile_format_name(ProfileFormat f) { return enum_name(kProfileFormatNames, f); }

/// How a cost model from profiles answers between and beyond grid points.
enum class ProfileInterpolation {
  Fit,     ///< ProfiledCostModel: feature fits with residuals interpolated in log space (the default)
  Linear,  ///< LinearProfiledCostModel: DynaPipe's multilinear interpolation of the raw grid
};
/// The one name table: "fit", "linear".
inline constexpr EnumName<ProfileInterpolation> kProfileInterpolationNames[] = {
    {ProfileInterpolation::Fit, "fit"}, {ProfileInterpolation::Linear, "linear"}};
/// The interpolation's name in kProfileInterpolationNames.
constexpr const char* profile_interpolation_name(ProfileInterpolation i) {
  return enum_name(kProfileInterpolationNames, i);
}
/// Interpolation from its name; throws InvalidArgument listing the names.
inline ProfileInterpolation profile_interpolation_from_name(const std::string& name) {
  return enum_from_name(kProfileInterpolationNames, name, "profile interpolation");
}

/// Detects the format from the file name (without folders) and the first line; throws Error naming
/// the file when nothing matches.
ProfileFormat detect_profile_format(const std::string& name, const std::string& text);

/// Extra facts a format does not keep in its files.
struct ProfileReadOptions {
  std::int64_t seq = 0;      ///< sequence length for Aceso, Metis and AIOB files (0: the format's default or the file name)
  std::int64_t dec_seq = 0;  ///< decoder length for Aceso T5 files (0: 512)
  std::int64_t tp = 0;       ///< AIOB: TP degree when the name does not say
  std::int64_t mbs = 0;      ///< AIOB: micro-batch size when the name does not say
};

/// Parses `text` as format `f`; `name` is the file name (folders allowed) used for errors and for
/// shapes kept in the name. Throws Error naming the file, line and column.
Profile parse_profile(ProfileFormat f, const std::string& text, const std::string& name,
                      const ProfileReadOptions& options = {});
/// Detects the format and parses.
Profile parse_profile(const std::string& text, const std::string& name, const ProfileReadOptions& options = {});
/// Reads files, or every regular file of a folder (sorted; files that are not profiles, such as
/// README.txt, skipped only inside folders), and merges them.
Profile load_profiles(const std::vector<std::string>& paths, const ProfileReadOptions& options = {});

/// The files a profile was read from, comma-separated ("(in memory)" when none), for messages.
std::string profile_sources(const Profile& p);
/// Checks that a cost model for `model` may answer from `p`: it has points, it names no other model
/// (names compared on letters and digits, lower-case: "gpt-6.7b", "gpt_6.7b" and Aceso's "gpt_1_3B"
/// spellings alike) and holds no decoder layers for a decoder-only model. Throws InvalidArgument.
void check_profile_for(const Profile& p, const ModelSpec& model);

/// Parameter bytes of one layer of `kind` at `tp` in `p.params` (the no-recompute entries when
/// there are any, else every recompute mode's; their mean), NaN when it has none.
double profile_param_bytes(const Profile& p, LayerKind kind, std::int64_t tp);

/// packpipe's profile file (JSON, documented in docs/design/003-costmodel-profiles.md).
std::string write_packpipe_profile(const Profile& p);

/// Alpha-beta fit per (collective, group size, link): time_ms = alpha_ms + bytes / bytes_per_ms,
/// least squares over per-size medians.
struct AlphaBetaFit {
  std::string collective;
  std::int64_t group_size = 0;
  bool inter_node = false;
  std::size_t samples = 0;       ///< measurements used
  std::size_t sizes = 0;         ///< distinct message sizes
  double alpha_ms = 0;           ///< latency
  double bytes_per_ms = 0;       ///< algorithm bandwidth (message bytes / ms); 0 when one size only
  double max_rel_error = 0;      ///< worst |fit - median| / median over the sizes
};
/// Fits every (collective, group size, link) with at least one sample. Samples with a non-positive
/// time are skipped.
std::vector<AlphaBetaFit> fit_alpha_beta(const std::vector<CommSample>& samples);

}  // namespace packpipe::costmodel
