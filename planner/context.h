// The context length: the most tokens a sample trains with (a model's position table, Megatron's
// --seq-length) and what happens to a longer sample: truncated, dropped, or split into chunks that
// are samples of their own. It is applied where a global batch becomes lengths (batch_lengths,
// planner/epoch.h) and to lengths given directly (limit_lengths; plan_iteration applies it), before
// the partitioner's memory oversize policy (partition::OversizePolicy), which then sees only
// samples within the context length. See docs/design/008-planner.md.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/enum_names.h"
#include "common/sample_ref.h"
#include "partition/pipeline.h"
#include "dataloader/sampler.h"
#include "plan/plan.h"

namespace packpipe::planner {

namespace dl = ::packpipe::dataloader;
namespace part = ::packpipe::partition;
namespace pl = ::packpipe::plan;

/// What happens to a sample longer than the context length.
enum class SeqPolicy : std::uint8_t {
  Truncate,  ///< keep its first tokens (encoder-decoder: each side's first tokens)
  Drop,      ///< leave it out of the global batch (counted and listed)
  Split,     ///< decoder-only: consecutive chunks of at most max_seq_len tokens, each a sample of its own
};
/// The one name table: "truncate", "drop", "split".
inline constexpr EnumName<SeqPolicy> kSeqPolicyNames[] = {
    {SeqPolicy::Truncate, "truncate"}, {SeqPolicy::Drop, "drop"}, {SeqPolicy::Split, "split"}};
constexpr const char* seq_policy_name(SeqPolicy p) { return enum_name(kSeqPolicyNames, p); }
/// Policy from its name; throws InvalidArgument listing the names.
inline SeqPolicy seq_policy_from_name(const std::string& name) {
  return enum_from_name(kSeqPolicyNames, name, "sequence policy");
}

/// The context length and its policy. Decoder-only models: a sample (input then target tokens, one
/// sequence) of more than max_seq_len tokens is over it. Encoder-decoder models: one whose input
/// is over max_seq_len or whose target is over the decoder limit (max_target_len, or max_seq_len
/// when that is 0); an empty side counts one token, as planned.
struct ContextLength {
  std::uint32_t max_seq_len = 0;     ///< tokens of a sample (encoder-decoder: of its input); 0: no limit
  std::uint32_t max_target_len = 0;  ///< encoder-decoder: decoder tokens (0: max_seq_len); decoder-only: 0
  SeqPolicy policy = SeqPolicy::Truncate;
  /// How the caller's user sets these, named in messages (the CLI: "--max-seq-len", ...).
  std::string max_seq_len_option = "max_seq_len", max_target_len_option = "max_target_len",
              policy_option = "seq_policy";
  /// Whether any side is limited.
  bool limited() const { return max_seq_len > 0 || max_target_len > 0; }
  /// The decoder side's limit of an encoder-decoder model (0: none).
  std::uint32_t target_limit() const { return max_target_len > 0 ? max_target_len : max_seq_len; }
};

/// Checks `c` for a model (InvalidArgument naming the option): a decoder-only max_seq_len of 1 (no token
/// would have a label) is refused; max_target_len only for an
/// encoder-decoder model (a decoder-only one trains input and target as one sequence), split only for
/// a decoder-only one (an encoder-decoder sample's input and target belong together).
void check_context_length(const ContextLength& c, bool encoder_decoder);

/// The sampler's token budget counts what `c` trains of each sample (decoder-only, truncate or drop:
/// a sample over the context length counts max_seq_len tokens, or none; split trains every token):
/// `s` with context_tokens and context_drops set so; unchanged otherwise.
dl::SamplerConfig budget_of_trained_tokens(dl::SamplerConfig s, const ContextLength& c, bool encoder_decoder);

/// What the context length did to one global batch.
struct ContextReport {
  std::uint64_t truncated = 0;  ///< samples cut to the context length
  std::uint64_t dropped = 0;    ///< samples left out
  std::uint64_t split = 0;      ///< samples split into chunks
  std::uint64_t chunks = 0;     ///< samples of the global batch the split samples became
  /// The dropped samples' positions in the batch as given (GlobalBatch::samples, or the lengths
  /// given), ascending.
  std::vector<std::uint32_t> dropped_samples;
  std::vector<SampleRef> dropped_refs;  ///< their (task, index) when the batch names its samples
  bool operator==(const ContextReport& o) const {
    return truncated == o.truncated && dropped == o.dropped && split == o.split && chunks == o.chunks &&
           dropped_samples == o.dropped_samples && dropped_refs == o.dropped_refs;
  }
};

/// Loss tokens of `len` tokens of a decoder-only sample from its token `offset` on (0: the sample
/// from its start), whose input part has `input` tokens: the next-token predictions within those
/// tokens (len - 1), or under LossMode::Targets those whose next token is a target token (index
/// >= input in the sample). The one count of the token rule (planner/loader.h) for whole samples,
/// truncated ones and chunks.
std::uint32_t decoder_only_loss(std::uint32_t len, std::uint32_t input, std::uint32_t offset, pl::LossMode mode);

/// Appends one sampled sample to `b` (and its ref to `refs`, optional) under `c`, as batch_lengths
/// does for each sample of a global batch: decoder-only, `tokens` (< 2^32) tokens of which `input`
/// are its input, entered as one sequence; encoder-decoder, (max(input, 1), max(target, 1)). Loss
/// tokens by decoder_only_loss (encoder-decoder: the real target tokens kept). Over the limit:
/// truncate enters the first tokens, drop enters nothing and lists `position`, split enters
/// consecutive chunks of at most max_seq_len tokens with their offsets in the refs. Counts in `report`.
void append_sample(part::BatchLengths& b, std::vector<SampleRef>* refs, SampleRef ref, std::uint32_t input,
                   std::uint32_t target, bool encoder_decoder, pl::LossMode loss, const ContextLength& c,
                   std::uint32_t position, ContextReport& report);

/// Applies `c` (truncate or drop) to lengths given directly, as plan_iteration does: a decoder-only
/// sample over the limit keeps its first max_seq_len tokens (its loss tokens, when `b.loss` gives
/// them, lose one per token cut, never below 0) or is removed with its ref (`refs`, optional);
/// encoder-decoder samples likewise per side (loss: at most the kept target). `kept` (optional)
/// receives the given position of every sample left. Split needs the samples' tokens (batch_lengths):
/// a sample over the limit under it throws InvalidArgument naming `iteration`, the sample and the
/// options, as does a decoder-only batch with max_target_len.
ContextReport limit_lengths(part::BatchLengths& b, std::vector<SampleRef>* refs, const ContextLength& c,
                            std::uint64_t iteration = 0, std::vector<std::uint32_t>* kept = nullptr);

/// Whether some sample of `b` is over the context length `c`.
bool over_context_length(const part::BatchLengths& b, const ContextLength& c);

}  // namespace packpipe::planner
