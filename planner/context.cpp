#include "planner/context.h"

#include <algorithm>

#include "common/errors.h"

namespace packpipe::planner {

void check_context_length(const ContextLength& c, bool encoder_decoder) {
  PACKPIPE_CHECK_ARG(encoder_decoder || c.max_seq_len != 1,
                     "{} 1 leaves no token to train: a decoder-only sample's tokens are trained on the token after "
                     "each, so a context of 1 token has no label (every iteration would have 0 loss tokens); give at "
                     "least 2, or 0 for no context length",
                     c.max_seq_len_option);
  PACKPIPE_CHECK_ARG(encoder_decoder || c.max_target_len == 0,
                     "{} {} is for encoder-decoder models (their decoder side); a decoder-only model trains input and "
                     "target as one sequence, limited by {}",
                     c.max_target_len_option, c.max_target_len, c.max_seq_len_option);
  PACKPIPE_CHECK_ARG(!encoder_decoder || c.policy != SeqPolicy::Split || !c.limited(),
                     "{} '{}' is for decoder-only models: an encoder-decoder sample's input and target belong "
                     "together and cannot be cut into chunks; use '{}' or '{}'",
                     c.policy_option, seq_policy_name(SeqPolicy::Split), seq_policy_name(SeqPolicy::Truncate),
                     seq_policy_name(SeqPolicy::Drop));
}

dl::SamplerConfig budget_of_trained_tokens(dl::SamplerConfig s, const ContextLength& c, bool encoder_decoder) {
  if (!encoder_decoder && c.max_seq_len > 0 && c.policy != SeqPolicy::Split) {
    s.context_tokens = c.max_seq_len;
    s.context_drops = c.policy == SeqPolicy::Drop;
  }
  return s;
}

std::uint32_t decoder_only_loss(std::uint32_t len, std::uint32_t input, std::uint32_t offset, pl::LossMode mode) {
  if (len == 0) return 0;
  // The first position of the chunk whose next token carries loss: under Targets, the one before
  // the sample's first target token when that lies inside the chunk (position input - 1 - offset).
  const std::uint32_t first = mode == pl::LossMode::Targets && input > offset ? input - 1 - offset : 0;
  return len - 1 > first ? len - 1 - first : 0;
}

void append_sample(part::BatchLengths& b, std::vector<SampleRef>* refs, SampleRef ref, std::uint32_t input,
                   std::uint32_t target, bool encoder_decoder, pl::LossMode loss, const ContextLength& c,
                   std::uint32_t position, ContextReport& report) {
  ref.offset = 0;
  auto enter = [&](std::uint32_t in, std::uint32_t tg, std::uint32_t l, std::uint32_t offset) {
    b.input.push_back(in);
    if (encoder_decoder) b.target.push_back(tg);
    b.loss.push_back(l);
    if (refs != nullptr) {
      ref.offset = offset;
      refs->push_back(ref);
    }
  };
  auto drop = [&] {
    ++report.dropped;
    report.dropped_samples.push_back(position);
    if (refs != nullptr) report.dropped_refs.push_back(ref);
  };
  if (encoder_decoder) {
    // An empty side is planned as one token (DynaPipe's --is-supervised pads it), as a decoder-only
    // task's samples get a one-token target.
    const std::uint32_t in = std::max<std::uint32_t>(input, 1), tg = std::max<std::uint32_t>(target, 1);
    const std::uint32_t le = c.max_seq_len, ld = c.target_limit();
    const bool over = (le > 0 && in > le) || (ld > 0 && tg > ld);
    if (!over) return enter(in, tg, target, 0);
    if (c.policy == SeqPolicy::Drop) return drop();
    PACKPIPE_ASSERT(c.policy == SeqPolicy::Truncate);  // check_context_length refuses split here
    ++report.truncated;
    const std::uint32_t kept_tg = ld > 0 ? std::min(tg, ld) : tg;
    return enter(le > 0 ? std::min(in, le) : in, kept_tg, std::min(target, kept_tg), 0);
  }
  const std::uint32_t n = input + target;  // the caller checked that it fits 32 bits
  const std::uint32_t L = c.max_seq_len;
  if (L == 0 || n <= L) return enter(n, 0, decoder_only_loss(n, input, 0, loss), 0);
  switch (c.policy) {
    case SeqPolicy::Truncate:
      ++report.truncated;
      return enter(L, 0, decoder_only_loss(L, input, 0, loss), 0);
    case SeqPolicy::Drop:
      return drop();
    case SeqPolicy::Split:
      ++report.split;
      for (std::uint32_t o = 0; o < n; o += std::min(L, n - o)) {
        const std::uint32_t len = std::min(L, n - o);
        enter(len, 0, decoder_only_loss(len, input, o, loss), o);
        ++report.chunks;
      }
      return;
  }
}

bool over_context_length(const part::BatchLengths& b, const ContextLength& c) {
  if (!c.limited()) return false;
  const std::uint32_t le = c.max_seq_len, ld = b.encoder_decoder() ? c.target_limit() : 0;
  for (std::size_t s = 0; s < b.size(); ++s) {
    if ((le > 0 && b.input[s] > le) || (ld > 0 && b.target[s] > ld)) return true;
  }
  return false;
}

ContextReport limit_lengths(part::BatchLengths& b, std::vector<SampleRef>* refs, const ContextLength& c,
                            std::uint64_t iteration, std::vector<std::uint32_t>* kept) {
  const bool encdec = b.encoder_decoder();
  check_context_length(c, encdec);
  PACKPIPE_CHECK_ARG(refs == nullptr || refs->size() == b.size(), "iteration {}: {} sample refs for {} samples",
                     iteration, refs != nullptr ? refs->size() : 0, b.size());
  PACKPIPE_CHECK_ARG(b.loss.empty() || b.loss.size() == b.size(), "iteration {}: {} loss counts for {} samples",
                     iteration, b.loss.size(), b.size());
  ContextReport report;
  if (kept != nullptr) kept->clear();
  const std::uint32_t le = c.max_seq_len, ld = encdec ? c.target_limit() : 0;
  std::size_t out = 0;  // samples kept so far, compacted in place
  for (std::size_t s = 0; s < b.size(); ++s) {
    std::uint32_t in = b.input[s], tg = encdec ? b.target[s] : 0;
    const bool over = (le > 0 && in > le) || (ld > 0 && tg > ld);
    if (over) {
      PACKPIPE_CHECK_ARG(c.policy != SeqPolicy::Split,
                         "iteration {}: sample {} has {} tokens, more than {} {}; {} '{}' cuts samples into chunks "
                         "where a global batch is sampled from a dataset (plan_epoch, packpipe plan), not in lengths "
                         "given directly: give the chunks' lengths, or '{}' or '{}' them",
                         iteration, s, in, c.max_seq_len_option, le, c.policy_option, seq_policy_name(SeqPolicy::Split),
                         seq_policy_name(SeqPolicy::Truncate), seq_policy_name(SeqPolicy::Drop));
      if (c.policy == SeqPolicy::Drop) {
        ++report.dropped;
        report.dropped_samples.push_back(static_cast<std::uint32_t>(s));
        if (refs != nullptr) report.dropped_refs.push_back((*refs)[s]);
        continue;
      }
      ++report.truncated;
      if (!b.loss.empty()) {
        if (encdec) {
          b.loss[s] = std::min(b.loss[s], ld > 0 ? std::min(tg, ld) : tg);
        } else {
          const std::uint32_t cut = in - le;  // each token cut took one loss position with it
          b.loss[s] = b.loss[s] > cut ? b.loss[s] - cut : 0;
        }
      }
      if (le > 0) in = std::min(in, le);
      if (ld > 0) tg = std::min(tg, ld);
    }
    b.input[out] = in;
    if (encdec) b.target[out] = tg;
    if (!b.loss.empty()) b.loss[out] = b.loss[s];
    if (refs != nullptr) (*refs)[out] = (*refs)[s];
    if (kept != nullptr) kept->push_back(static_cast<std::uint32_t>(s));
    ++out;
  }
  b.input.resize(out);
  if (encdec) b.target.resize(out);
  if (!b.loss.empty()) b.loss.resize(out);
  if (refs != nullptr) refs->resize(out);
  return report;
}

}  // namespace packpipe::planner
