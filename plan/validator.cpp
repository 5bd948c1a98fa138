#include "plan/validator.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "common/errors.h"
#include "plan/dry_run.h"

namespace packpipe::plan {


namespace {

// "(task t, index i)" or, for a chunk, "(task t, index i, tokens from o)": a dataset sample in messages.
std::string ref_name(const SampleRef& r) {
  return r.offset == 0 ? fmt::format("(task {}, index {})", r.task, r.index)
                       : fmt::format("(task {}, index {}, its chunk from token {})", r.task, r.index, r.offset);
}

// The tokens [begin, end) of one dataset sample that a plan trains, and where (a micro-batch or a
// replica). A dataset sample's chunks must not overlap: each of its tokens is trained once.
struct Span {
  std::uint64_t begin = 0, end = 0;
  std::size_t where = 0;
};
using Spans = std::map<std::pair<std::uint32_t, std::uint64_t>, std::vector<Span>>;

// Calls `report(task, index, a, b)` for every span that overlaps the one before it (by begin) of
// the same dataset sample. Spans of identical tokens are draws of one sample under several ids (a
// weighted task repeats samples: dataloader/sampler.h), not an overlap.
template <class F>
void overlapping_spans(Spans& spans, F report) {
  for (auto& [key, v] : spans) {
    if (v.size() < 2) continue;
    std::sort(v.begin(), v.end(), [](const Span& a, const Span& b) {
      return std::tie(a.begin, a.end, a.where) < std::tie(b.begin, b.end, b.where);
    });
    for (std::size_t k = 1; k < v.size(); ++k) {
      const bool repeat = v[k].begin == v[k - 1].begin && v[k].end == v[k - 1].end;
      if (!repeat && v[k].begin < v[k - 1].end) report(key.first, key.second, v[k - 1], v[k]);
    }
  }
}

// The tokens each sample id trains of its dataset sample (its slices joined: they cover one range),
// filed as spans by dataset sample for overlapping_spans.
struct IdRange {
  std::uint32_t task = 0;
  std::uint64_t index = 0, begin = 0, end = 0;
  std::size_t where = 0;
};
void add_id_spans(const std::map<std::uint32_t, IdRange>& ranges, Spans& spans) {
  for (const auto& [id, r] : ranges) spans[{r.task, r.index}].push_back(Span{r.begin, r.end, r.where});
}
void add_id_range(std::map<std::uint32_t, IdRange>& ranges, std::uint32_t id, const SampleRef& r, std::uint32_t length,
                  std::size_t where) {
  const auto [it, fresh] = ranges.try_emplace(id, IdRange{r.task, r.index, r.offset, std::uint64_t{r.offset} + length, where});
  if (!fresh) {
    it->second.begin = std::min<std::uint64_t>(it->second.begin, r.offset);
    it->second.end = std::max<std::uint64_t>(it->second.end, std::uint64_t{r.offset} + length);
  }
}

class Checker {
 public:
  Checker(const Plan& p, const ValidateOptions& o) : p_(p), o_(o) {}

  ValidationReport run() {
    if (!check_header()) return std::move(rep_);
    check_fields();
    check_tables();
    check_timeline();
    check_slice_order();
    DryRunOptions dro;
    dro.count_buffers = o_.count_buffers;
    DryRun dry(p_, [this](const char* kind, std::int64_t rank, std::int64_t index, std::string msg) {
      add(kind, rank, index, std::move(msg));
      return !full();
    }, &bad_, dro);
    check_channels(dry.channels());
    if (!full()) dry.run();
    rep_.peak_bytes = dry.peak_bytes();
    rep_.peak_buffer_bytes = dry.peak_buffer_bytes();
    rep_.peak_buffers = dry.peak_buffers();
    check_counts(dry);
    return std::move(rep_);
  }

 private:
  const Plan& p_;
  const ValidateOptions& o_;
  ValidationReport rep_;
  std::size_t N_ = 0, V_ = 0, S_ = 0;
  std::vector<std::vector<std::uint8_t>> bad_;  // [rank][index]: skip in the simulation

  bool full() const { return o_.max_violations > 0 && rep_.violations.size() >= o_.max_violations; }
  void add(const char* kind, std::int64_t rank, std::int64_t index, std::string msg) {
    if (full()) return;
    rep_.violations.push_back(Violation{kind, rank, index, std::move(msg)});
  }

  bool check_header() {
    const Plan& p = p_;
    const std::size_t before = rep_.violations.size();
    if (p.ranks == 0) add("header", -1, -1, "ranks: expected at least 1, found 0");
    if (p.vstages == 0) add("header", -1, -1, "vstages: expected at least 1, found 0");
    // A replica without a sample has no micro-batch: its plan only reduces and steps.
    if (p.dp == 0) add("header", -1, -1, "dp: expected at least 1, found 0");
    if (p.replica >= p.dp && p.dp > 0) {
      add("header", -1, -1, fmt::format("replica: expected below dp {}, found {}", p.dp, p.replica));
    }
    auto size_is = [&](const char* name, std::size_t found, std::size_t expected) {
      if (found != expected) add("header", -1, -1, fmt::format("{}: expected {} entries, found {}", name, expected, found));
    };
    size_is("stage_rank", p.stage_rank.size(), p.vstages);
    size_is("streams", p.streams.size(), p.ranks);
    size_is("buffer_slots", p.buffer_slots.size(), p.ranks);
    size_is("static_bytes", p.static_bytes.size(), p.ranks);
    const std::size_t nv = p.microbatches.size() * static_cast<std::size_t>(p.vstages);
    size_is("recompute", p.recompute.size(), nv);
    size_is("stored_bytes", p.stored_bytes.size(), nv);
    size_is("peak_bytes", p.peak_bytes.size(), nv);
    if (!p.timeline.empty()) size_is("timeline", p.timeline.size(), p.ranks);
    if (rep_.violations.size() != before) return false;
    for (std::size_t r = 0; r < p.ranks; ++r) {
      // Every slot is allocated by some instruction: more slots than instructions is corrupt (and
      // would make the simulation allocate state for slots that cannot be used).
      if (p.buffer_slots[r] > p.streams[r].size()) {
        add("header", static_cast<std::int64_t>(r), -1,
            fmt::format("buffer_slots[{}]: expected at most the stream's {} instructions, found {}", r,
                        p.streams[r].size(), p.buffer_slots[r]));
      }
    }
    if (rep_.violations.size() != before) return false;
    N_ = p.microbatches.size();
    V_ = p.vstages;
    S_ = p.ranks;
    std::vector<std::uint32_t> stages_on(S_, 0);
    for (std::size_t v = 0; v < V_; ++v) {
      if (p.stage_rank[v] >= S_) {
        add("header", -1, -1, fmt::format("stage_rank[{}]: expected a rank below {}, found {}", v, S_, p.stage_rank[v]));
      } else {
        ++stages_on[p.stage_rank[v]];
      }
    }
    if (rep_.violations.size() != before) return false;
    for (std::size_t r = 0; r < S_; ++r) {
      if (stages_on[r] == 0) add("header", static_cast<std::int64_t>(r), -1, fmt::format("rank {} runs no stage", r));
    }
    for (std::size_t i = 0; i < p.recompute.size(); ++i) {
      if (p.recompute[i] > 2) {
        add("header", -1, -1, fmt::format("recompute[{}] (micro-batch {} stage {}): expected 0, 1 or 2, found {}", i,
                                          i / V_, i % V_, p.recompute[i]));
      }
    }
    std::uint64_t tokens = 0;
    for (std::size_t m = 0; m < N_; ++m) {
      const PlanMicroBatch& mb = p.microbatches[m];
      tokens += mb.tokens;
      const std::size_t rows = mb.row_offsets.empty() ? mb.samples.size() : mb.row_offsets.size() - 1;
      if (mb.rows == 0 || mb.rows != rows) {
        add("header", -1, -1, fmt::format("micro-batch {}: rows {} but {} rows of samples", m, mb.rows, rows));
      }
      if (!mb.refs.empty() && mb.refs.size() != mb.samples.size()) {
        add("header", -1, -1, fmt::format("micro-batch {}: {} sample refs for {} samples", m, mb.refs.size(), mb.samples.size()));
      }
      if (!mb.row_offsets.empty()) {
        bool mono = mb.row_offsets.front() == 0 && mb.row_offsets.back() == mb.samples.size();
        for (std::size_t i = 1; i < mb.row_offsets.size(); ++i) mono = mono && mb.row_offsets[i - 1] <= mb.row_offsets[i];
        if (!mono) add("header", -1, -1, fmt::format("micro-batch {}: row offsets are not 0 .. {} non-decreasing", m, mb.samples.size()));
      }
      if (mb.padded_len == 0) add("header", -1, -1, fmt::format("micro-batch {}: padded length 0", m));
      if (std::string_view(layout_name(mb.layout)) == "?") {
        add("header", -1, -1, fmt::format("micro-batch {}: unknown layout value {}", m, static_cast<int>(mb.layout)));
      } else if (mb.layout == Layout::Padded && !mb.row_offsets.empty()) {
        add("header", -1, -1, fmt::format("micro-batch {}: layout padded (one sample a row) with row offsets", m));
      } else if (mb.layout == Layout::Packed && mb.rows != 1) {
        add("header", -1, -1, fmt::format("micro-batch {}: layout packed holds every sample in one row, found {} rows", m,
                                          mb.rows));
      }
      if (p.has_stage_specs() && p.global_loss_tokens > 0) {
        // Format 2: the tokens that carry loss over the global batch's (one correctly rounded division).
        const double expected = static_cast<double>(mb.loss_tokens) / static_cast<double>(p.global_loss_tokens);
        if (!(mb.loss_weight == expected)) {
          add("header", -1, -1, fmt::format("micro-batch {}: loss weight expected loss tokens / global loss tokens = {} / "
                                            "{} = {}, found {}", m, mb.loss_tokens, p.global_loss_tokens, expected,
                                            mb.loss_weight));
        }
      } else if (p.global_tokens > 0) {
        const double expected = static_cast<double>(mb.tokens) / static_cast<double>(p.global_tokens);
        // Exactly tokens / global tokens (one correctly rounded division): any other value is edited.
        if (!(mb.loss_weight == expected)) {
          add("header", -1, -1, fmt::format("micro-batch {}: loss weight expected tokens / global tokens = {} / {} = {}, found {}",
                                            m, mb.tokens, p.global_tokens, expected, mb.loss_weight));
        }
      }
    }
    if (p.global_tokens > 0 && tokens > p.global_tokens) {
      add("header", -1, -1, fmt::format("global_tokens: expected at least the micro-batches' {} tokens, found {}", tokens,
                                        p.global_tokens));
    }
    check_contents();
    check_slices();
    if (p.has_stage_specs()) check_trainer_tables();
    return true;
  }

  // Format 2: the stage specs, the per-sample lengths and loss tokens, and what they imply.
  void check_trainer_tables() {
    const Plan& p = p_;
    if (p.stages.size() != V_) {
      add("header", -1, -1, fmt::format("stages: expected {} entries, found {}", V_, p.stages.size()));
      return;
    }
    if (!is_float(p.dtype) || static_cast<unsigned>(p.dtype) > static_cast<unsigned>(Dtype::F64)) {
      add("header", -1, -1, fmt::format("dtype: activations expected fp16, bf16, fp32 or fp64, found {}",
                                        static_cast<unsigned>(p.dtype) <= static_cast<unsigned>(Dtype::F64)
                                            ? dtype_name(p.dtype) : "an unknown value"));
    }
    // Layers are contiguous per side, in pipeline order; the first stage embeds, the last has the head.
    std::uint32_t enc = 0, dec = 0;
    bool encdec = false;
    for (const auto& s : p.stages) encdec = encdec || s.decoder_layers > 0;
    for (std::size_t v = 0; v < V_; ++v) {
      const StageSpec& s = p.stages[v];
      if (s.encoder_begin != enc || s.decoder_begin != dec) {
        add("header", -1, -1, fmt::format("stages[{}]: expected layers from encoder {} / decoder {} (contiguous after the "
                                          "previous stage), found {} / {}", v, enc, dec, s.encoder_begin, s.decoder_begin));
      }
      if (s.encoder_layers + s.decoder_layers == 0) add("header", -1, -1, fmt::format("stages[{}]: holds no layer", v));
      enc += s.encoder_layers;
      dec += s.decoder_layers;
      if (s.head != (v + 1 == V_)) {
        add("header", -1, -1, fmt::format("stages[{}]: the LM head expected on the last stage only, found {}", v,
                                          s.head ? "here" : "missing"));
      }
      if (v == 0 && !s.embedding) add("header", -1, -1, "stages[0]: expected the token embedding on the first stage");
    }
    // The context length (format 4): every sample within it; chunks only of decoder-only samples.
    if (!encdec && p.max_target_len > 0) {
      add("header", -1, -1, fmt::format("max_target_len: a decoder-only plan has no decoder side, found {}",
                                        p.max_target_len));
    }
    for (std::size_t m = 0; m < N_; ++m) {
      const PlanMicroBatch& mb = p.microbatches[m];
      for (std::size_t i = 0; i < mb.samples.size(); ++i) {
        if (p.max_seq_len > 0 && i < mb.lengths.size() && mb.lengths[i] > p.max_seq_len) {
          add("header", -1, -1, fmt::format("micro-batch {}: sample {} has {} tokens, more than max_seq_len {}", m,
                                            mb.samples[i], mb.lengths[i], p.max_seq_len));
        }
        if (encdec && p.max_target_len > 0 && i < mb.target_lengths.size() && mb.target_lengths[i] > p.max_target_len) {
          add("header", -1, -1, fmt::format("micro-batch {}: sample {} has {} decoder tokens, more than max_target_len {}",
                                            m, mb.samples[i], mb.target_lengths[i], p.max_target_len));
        }
        if (encdec && i < mb.refs.size() && mb.refs[i].offset != 0) {
          add("header", -1, -1, fmt::format("micro-batch {}: sample {} is a chunk of dataset sample {}: only decoder-only "
                                            "samples are split", m, mb.samples[i], ref_name(mb.refs[i])));
        }
      }
    }
    // Every micro-batch lists its samples' lengths; they fill its rows and give its tokens.
    std::uint64_t loss = 0;
    for (std::size_t m = 0; m < N_; ++m) {
      const PlanMicroBatch& mb = p.microbatches[m];
      if (mb.lengths.size() != mb.samples.size() || (encdec && mb.target_lengths.size() != mb.samples.size()) ||
          (!encdec && !mb.target_lengths.empty())) {
        add("header", -1, -1, fmt::format("micro-batch {}: {} lengths and {} target lengths for {} samples ({})", m,
                                          mb.lengths.size(), mb.target_lengths.size(), mb.samples.size(),
                                          encdec ? "encoder-decoder: both" : "decoder-only: lengths only"));
        continue;
      }
      std::uint64_t sum = 0;
      for (std::size_t i = 0; i < mb.samples.size(); ++i) {
        const std::uint32_t in = mb.lengths[i], tg = encdec ? mb.target_lengths[i] : 0;
        sum += in + tg;
        const bool packed = !mb.row_offsets.empty();
        if ((!packed && in > mb.padded_len) || tg > mb.padded_dec_len || (in == 0 && tg == 0)) {
          add("header", -1, -1, fmt::format("micro-batch {}: sample {} of length {}{} does not fit a padded row of {}{}", m,
                                            mb.samples[i], in, encdec ? fmt::format(" + {}", tg) : std::string(),
                                            mb.padded_len, encdec ? fmt::format(" + {}", mb.padded_dec_len) : std::string()));
        }
      }
      if (!mb.row_offsets.empty()) {
        for (std::size_t row = 0; row + 1 < mb.row_offsets.size(); ++row) {
          std::uint64_t used = 0;
          for (std::uint32_t i = mb.row_offsets[row]; i < mb.row_offsets[row + 1] && i < mb.lengths.size(); ++i) used += mb.lengths[i];
          if (used > mb.padded_len) {
            add("header", -1, -1, fmt::format("micro-batch {}: packed row {} holds {} tokens, more than its padded "
                                              "length {}", m, row, used, mb.padded_len));
          }
        }
      }
      if (sum != mb.tokens) {
        add("header", -1, -1, fmt::format("micro-batch {}: its samples' lengths sum to {} tokens, the micro-batch says {}",
                                          m, sum, mb.tokens));
      }
      if (mb.layout == Layout::Packed) {
        // One row of the samples back to back, no padding: the row is exactly their tokens (an empty
        // side of an encoder-decoder sample takes one token, as the loader lays it out).
        std::uint64_t enc = 0, dec = 0;
        for (std::size_t i = 0; i < mb.samples.size(); ++i) {
          enc += packed_tokens(mb.lengths[i], encdec);
          if (encdec) dec += packed_tokens(mb.target_lengths[i], true);
        }
        if (enc != mb.padded_len || dec != mb.padded_dec_len) {
          add("header", -1, -1, fmt::format("micro-batch {}: layout packed: its row of {}{} tokens should be its samples' "
                                            "{}{}", m, mb.padded_len,
                                            encdec ? fmt::format(" + {}", mb.padded_dec_len) : std::string(), enc,
                                            encdec ? fmt::format(" + {}", dec) : std::string()));
        }
      }
      if (mb.loss_tokens > mb.tokens) {
        add("header", -1, -1, fmt::format("micro-batch {}: {} loss tokens, more than its {} tokens", m, mb.loss_tokens,
                                          mb.tokens));
      }
      loss += mb.loss_tokens;
    }
    if (loss > p.global_loss_tokens) {
      add("header", -1, -1, fmt::format("global_loss_tokens: expected at least the micro-batches' {} loss tokens, found "
                                        "{}", loss, p.global_loss_tokens));
    }
    // FWD carries its (micro-batch, stage)'s recompute mode; REDUCE_TIED only with a tied embedding
    // on distinct ranks, once on each of them, for its own stage.
    const std::uint32_t first = p.stage_rank.front(), last = p.stage_rank.back();
    const bool tied_comm = p.tied_embedding && first != last;
    for (std::size_t r = 0; r < S_; ++r) {
      std::size_t tied = 0;
      for (std::size_t i = 0; i < p.streams[r].size(); ++i) {
        const Instruction& ins = p.streams[r][i];
        const auto R = static_cast<std::int64_t>(r);
        const auto I = static_cast<std::int64_t>(i);
        if (ins.op == Opcode::Forward && ins.mb < N_ && ins.stage < V_ && ins.mode != p.recompute[p.at(ins.mb, ins.stage)]) {
          add("field", R, I, fmt::format("recompute: expected micro-batch {}'s mode {}, found {}", ins.mb,
                                         p.recompute[p.at(ins.mb, ins.stage)], ins.mode == kNone ? -1 : static_cast<std::int64_t>(ins.mode)));
        }
        if (ins.op != Opcode::ReduceTied) continue;
        ++tied;
        const std::uint32_t expected = r == first ? 0 : static_cast<std::uint32_t>(V_ - 1);
        if (!tied_comm || (r != first && r != last) || ins.stage != expected) {
          add("count", R, I, tied_comm ? fmt::format("REDUCE_TIED: expected on ranks {} (stage 0) and {} (stage {}) only, "
                                                     "found on rank {} for stage {}", first, last, V_ - 1, r, ins.stage)
                                       : std::string("REDUCE_TIED: the plan has no tied embedding across ranks"));
        }
      }
      if (tied_comm && (r == first || r == last) && tied != 1) {
        add("count", static_cast<std::int64_t>(r), -1,
            fmt::format("REDUCE_TIED: expected once on rank {} (the tied embedding's {}), found {}", r,
                        r == first ? "first stage" : "last stage", tied));
      }
    }
  }

  // What a runtime or a trainer reads besides the streams: samples, lengths, tokens, weights,
  // shapes and the simulated timeline. Each check names the field and expected versus found.
  void check_contents() {
    const Plan& p = p_;
    if (p.global_tokens == 0) add("header", -1, -1, "global_tokens: expected at least 1 (the loss weights' denominator), found 0");
    // A sample (by id in the global batch, and by dataset reference) is trained once.
    std::map<std::uint32_t, std::size_t> sample_mb;
    std::map<SampleRef, std::pair<std::size_t, std::uint32_t>> ref_mb;  // -> (micro-batch, sample id)
    std::map<std::uint32_t, IdRange> id_ranges;  // the tokens each sample id trains (format 2: lengths known)
    Spans spans;
    std::size_t with_dec = 0;
    double weights = 0;
    const SliceLinks links = slice_links(p);
    for (std::size_t m = 0; m < N_; ++m) {
      const PlanMicroBatch& mb = p.microbatches[m];
      for (std::size_t i = 0; i < mb.samples.size(); ++i) {
        const std::uint32_t s = mb.samples[i];
        const auto [it, fresh] = sample_mb.emplace(s, m);
        // A later slice shares its sample's id with the slices before it (check_slices checks the link).
        if (!fresh && !links.prev[m][i].valid()) {
          add("header", -1, -1, fmt::format("micro-batch {}: sample {} is already in micro-batch {} (each sample is "
                                            "trained once)", m, s, it->second));
        }
      }
      for (std::size_t i = 0; i < mb.refs.size(); ++i) {
        const SampleRef& r = mb.refs[i];
        const std::uint32_t id = i < mb.samples.size() ? mb.samples[i] : std::numeric_limits<std::uint32_t>::max();
        const auto [it, fresh] = ref_mb.emplace(r, std::make_pair(m, id));
        // Under another id it is another draw of the sample (a weighted task); under the same id, twice.
        if (!fresh && it->second.second == id) {
          add("header", -1, -1, fmt::format("micro-batch {}: dataset sample {} of sample {} is already in micro-batch {}",
                                            m, ref_name(r), id, it->second.first));
        } else if (mb.lengths.size() == mb.refs.size()) {
          add_id_range(id_ranges, id, r, mb.lengths[i], m);
        }
      }
      if (mb.samples.empty()) add("header", -1, -1, fmt::format("micro-batch {}: no samples", m));
      // Every real token sits in a padded row: tokens <= rows x (padded length + decoder length).
      const std::uint64_t room = static_cast<std::uint64_t>(mb.rows) * (std::uint64_t{mb.padded_len} + mb.padded_dec_len);
      if (mb.tokens > room) {
        add("header", -1, -1, fmt::format("micro-batch {}: {} tokens do not fit {} rows x ({} + {}) padded tokens; a "
                                          "padded length is below its samples' tokens", m, mb.tokens, mb.rows,
                                          mb.padded_len, mb.padded_dec_len));
      }
      if (!std::isfinite(mb.loss_weight) || mb.loss_weight < 0 || mb.loss_weight > 1) {
        add("header", -1, -1, fmt::format("micro-batch {}: loss weight expected in [0, 1], found {}", m, mb.loss_weight));
      } else {
        weights += mb.loss_weight;
      }
      with_dec += mb.padded_dec_len > 0;
    }
    add_id_spans(id_ranges, spans);
    overlapping_spans(spans, [&](std::uint32_t task, std::uint64_t index, const Span& a, const Span& b) {
      add("header", -1, -1, fmt::format("micro-batch {}: dataset sample (task {}, index {}): its tokens [{}, {}) overlap "
                                        "tokens [{}, {}) in micro-batch {} (each token is trained once)", b.where, task,
                                        index, b.begin, b.end, a.begin, a.end, a.where));
    });
    if (weights > 1 + 1e-9) add("header", -1, -1, fmt::format("loss weights: expected a sum of at most 1, found {}", weights));
    // Decoder lengths: all micro-batches of an encoder-decoder plan have one, none of a decoder-only plan.
    if (with_dec != 0 && with_dec != N_) {
      add("header", -1, -1, fmt::format("padded_dec_len: {} of {} micro-batches have a decoder length; expected all "
                                        "(encoder-decoder) or none (decoder-only)", with_dec, N_));
    }
    for (std::size_t k = 0; k < p.shapes.size(); ++k) {
      const TensorShape& s = p.shapes[k];
      if (s.rows == 0 || s.seq == 0 || s.hidden == 0) {
        add("header", -1, -1, fmt::format("shape #{} ({}): expected rows, seq and hidden of at least 1", k, to_string(s)));
      }
      if (static_cast<unsigned>(s.dtype) > static_cast<unsigned>(Dtype::F64)) {
        add("header", -1, -1, fmt::format("shape #{}: dtype {} is not a known dtype", k, static_cast<unsigned>(s.dtype)));
      }
    }
    // The simulated figures a trainer reports.
    if (!std::isfinite(p.makespan_ms) || p.makespan_ms < 0) {
      add("header", -1, -1, fmt::format("makespan_ms: expected a finite value >= 0, found {}", p.makespan_ms));
    }
    timeline_violations_ = rep_.violations.size();
    if (!p.timeline.empty()) {
      const double end = std::isfinite(p.makespan_ms) ? p.makespan_ms * (1 + 1e-9) + 1e-9 : 0;
      for (std::size_t r = 0; r < p.timeline.size(); ++r) {
        for (std::size_t i = 0; i < p.timeline[r].size(); ++i) {
          const ScheduledOp& op = p.timeline[r][i];
          const auto R = static_cast<std::int64_t>(r);
          const auto I = static_cast<std::int64_t>(i);
          if (op.mb >= N_ || op.vstage >= V_) {
            add("timeline", R, I, fmt::format("op of micro-batch {} stage {}: expected below {} micro-batches and {} "
                                              "stages", op.mb, op.vstage, N_, V_));
          } else if (p.stage_rank[op.vstage] != r) {
            add("timeline", R, I, fmt::format("op of stage {} on rank {}: the stage runs on rank {}", op.vstage, r,
                                              p.stage_rank[op.vstage]));
          }
          if (static_cast<unsigned>(op.kind) > static_cast<unsigned>(OpKind::BackwardWeight)) {
            add("timeline", R, I, fmt::format("op kind {} is not F, B, I or W", static_cast<unsigned>(op.kind)));
          }
          if (!std::isfinite(op.start_ms) || !std::isfinite(op.end_ms) || op.start_ms < 0 || op.end_ms < op.start_ms ||
              (p.makespan_ms > 0 && op.end_ms > end)) {
            add("timeline", R, I, fmt::format("op times {} .. {} ms: expected 0 <= start <= end <= makespan {} ms",
                                              op.start_ms, op.end_ms, p.makespan_ms));
          }
        }
      }
    }
    timeline_violations_ = rep_.violations.size() - timeline_violations_;
  }

  // Per-(micro-batch, stage) tables and the shape table, against what the streams use.
  void check_tables() {
    const Plan& p = p_;
    // Recompute is chosen per micro-batch: the same mode on every stage of it.
    for (std::size_t m = 0; m < N_; ++m) {
      for (std::size_t v = 1; v < V_; ++v) {
        if (p.recompute[m * V_ + v] != p.recompute[m * V_]) {
          add("header", -1, -1, fmt::format("recompute[{}] (micro-batch {} stage {}): expected micro-batch {}'s mode {} "
                                            "on every stage, found {}", m * V_ + v, m, v, m, p.recompute[m * V_],
                                            p.recompute[m * V_ + v]));
          break;
        }
      }
    }
    // Every slot a rank declares is allocated by its stream (slots are handed out lowest first).
    for (std::size_t r = 0; r < S_; ++r) {
      std::uint64_t used = 0;
      for (const Instruction& ins : p.streams[r]) {
        if ((opcode_fields(ins.op) & kFieldOut) && ins.out != kNone) used = std::max<std::uint64_t>(used, std::uint64_t{ins.out} + 1);
      }
      if (used != p.buffer_slots[r]) {
        add("header", static_cast<std::int64_t>(r), -1,
            fmt::format("buffer_slots[{}]: expected {} (the slots the stream allocates), found {}", r, used,
                        p.buffer_slots[r]));
      }
    }
    // Shapes: each one referenced; loaded inputs are token ids (an integer dtype), boundary tensors
    // (activations, gradients) a floating dtype, and every boundary tensor has the model's hidden
    // size and dtype.
    enum : std::uint8_t { kUnused = 0, kLoad = 1, kBoundary = 2 };
    std::vector<std::uint8_t> use(p.shapes.size(), kUnused);
    for (std::size_t r = 0; r < S_; ++r) {
      for (const Instruction& ins : p.streams[r]) {
        if (!(opcode_fields(ins.op) & kFieldShape) || ins.shape >= p.shapes.size()) continue;
        use[ins.shape] |= ins.op == Opcode::LoadMb ? kLoad : kBoundary;
      }
    }
    std::int64_t first_boundary = -1, first_load = -1;
    for (std::size_t k = 0; k < p.shapes.size(); ++k) {
      const TensorShape& s = p.shapes[k];
      const bool integer = s.dtype == Dtype::I32 || s.dtype == Dtype::I64;
      if (use[k] == kUnused) {
        add("header", -1, -1, fmt::format("shape #{} ({}): referenced by no instruction", k, to_string(s)));
      } else if (use[k] == (kLoad | kBoundary)) {
        add("header", -1, -1, fmt::format("shape #{} ({}): used both for loaded inputs and for activations or gradients",
                                          k, to_string(s)));
      } else if (use[k] == kLoad && !integer) {
        add("header", -1, -1, fmt::format("shape #{} ({}): loaded inputs are token ids, expected int32 or int64, found {}",
                                          k, to_string(s), dtype_name(s.dtype)));
      } else if (use[k] == kBoundary && integer) {
        add("header", -1, -1, fmt::format("shape #{} ({}): activations and gradients expected fp16, bf16, fp32 or fp64, found {}",
                                          k, to_string(s), dtype_name(s.dtype)));
      } else if (use[k] == kLoad && s.hidden != 1) {
        add("header", -1, -1, fmt::format("shape #{} ({}): loaded inputs are token ids, expected hidden size 1, found {}", k,
                                          to_string(s), s.hidden));
      } else if (use[k] == kLoad && first_load >= 0 && s.dtype != p.shapes[static_cast<std::size_t>(first_load)].dtype) {
        add("header", -1, -1, fmt::format("shape #{} ({}): expected the dtype {} of every loaded input (shape #{}), found {}",
                                          k, to_string(s), dtype_name(p.shapes[static_cast<std::size_t>(first_load)].dtype),
                                          first_load, dtype_name(s.dtype)));
      } else if (use[k] == kLoad) {
        if (first_load < 0) first_load = static_cast<std::int64_t>(k);
      } else if (use[k] == kBoundary && first_boundary < 0) {
        first_boundary = static_cast<std::int64_t>(k);
      } else if (use[k] == kBoundary) {
        const TensorShape& f = p.shapes[static_cast<std::size_t>(first_boundary)];
        if (s.hidden != f.hidden || s.dtype != f.dtype) {
          add("header", -1, -1, fmt::format("shape #{} ({}): expected the hidden size {} and dtype {} of every activation "
                                            "(shape #{}), found {} {}", k, to_string(s), f.hidden, dtype_name(f.dtype),
                                            first_boundary, s.hidden, dtype_name(s.dtype)));
        }
      }
    }
  }

  // The simulated timeline is the streams' compute order with times: per rank the same ops in the
  // same order, one at a time, each after the ops it depends on, the last ending at the makespan.
  void check_timeline() {
    const Plan& p = p_;
    if (p.timeline.empty() || timeline_violations_ > 0 || full()) return;
    const std::size_t before = rep_.violations.size();
    for (std::size_t r = 0; r < S_; ++r) {
      const auto R = static_cast<std::int64_t>(r);
      const auto& ops = p.timeline[r];
      std::size_t k = 0;
      for (std::size_t i = 0; i < p.streams[r].size(); ++i) {
        const Instruction& ins = p.streams[r][i];
        if (!is_compute(ins.op)) continue;
        const OpKind kind = compute_kind(ins.op);
        if (k >= ops.size()) {
          add("timeline", R, static_cast<std::int64_t>(k),
              fmt::format("the stream's compute op #{} ({}) has no timeline op (the timeline holds {})", k,
                          to_string(ins), ops.size()));
          break;
        }
        const ScheduledOp& op = ops[k];
        if (op.kind != kind || op.mb != ins.mb || op.vstage != ins.stage) {
          add("timeline", R, static_cast<std::int64_t>(k),
              fmt::format("op {}{} of stage {}: expected the stream's compute op #{} ({}, instruction {})",
                          op_kind_token(op.kind), op.mb, op.vstage, k, to_string(ins), i));
          break;
        }
        ++k;
      }
      if (k < ops.size() && rep_.violations.size() == before) {
        add("timeline", R, static_cast<std::int64_t>(k),
            fmt::format("{} ops, the stream runs {} compute ops", ops.size(), k));
      }
    }
    if (rep_.violations.size() != before) return;
    const double tol = 1e-9 * std::max(1.0, p.makespan_ms);
    const double kNo = -1;
    std::vector<double> f_end(N_ * V_, kNo), g_end(N_ * V_, kNo);  // forward; backward (B or I)
    double last = 0;
    for (std::size_t r = 0; r < S_; ++r) {
      const auto& ops = p.timeline[r];
      for (std::size_t i = 0; i < ops.size(); ++i) {
        const ScheduledOp& op = ops[i];
        if (i > 0 && op.start_ms < ops[i - 1].end_ms - tol) {
          add("timeline", static_cast<std::int64_t>(r), static_cast<std::int64_t>(i),
              fmt::format("op {}{} of stage {} starts at {} ms, before the rank's previous op ends at {} ms (a rank runs one "
                          "op at a time)", op_kind_token(op.kind), op.mb, op.vstage, op.start_ms, ops[i - 1].end_ms));
        }
        const std::size_t at = static_cast<std::size_t>(op.mb) * V_ + op.vstage;
        if (op.kind == OpKind::Forward) f_end[at] = op.end_ms;
        if (op.kind == OpKind::Backward || op.kind == OpKind::BackwardInput) g_end[at] = op.end_ms;
        last = std::max(last, op.end_ms);
      }
    }
    for (std::size_t r = 0; r < S_; ++r) {
      const auto& ops = p.timeline[r];
      for (std::size_t i = 0; i < ops.size(); ++i) {
        const ScheduledOp& op = ops[i];
        const std::size_t at = static_cast<std::size_t>(op.mb) * V_ + op.vstage;
        auto after = [&](double dep_end, const char* dep) {
          if (dep_end == kNo || op.start_ms >= dep_end - tol) return;
          add("timeline", static_cast<std::int64_t>(r), static_cast<std::int64_t>(i),
              fmt::format("op {}{} of stage {} starts at {} ms, before {} ends at {} ms", op_kind_token(op.kind), op.mb,
                          op.vstage, op.start_ms, dep, dep_end));
        };
        if (op.kind == OpKind::Forward) {
          if (op.vstage > 0) after(f_end[at - 1], "the forward of the previous stage");
        } else if (op.kind == OpKind::BackwardWeight) {
          after(g_end[at], "its input gradient (I)");
        } else {
          after(f_end[at], "its forward");
          if (op.vstage + 1 < V_) after(g_end[at + 1], "the backward of the next stage");
        }
      }
    }
    if (!(std::fabs(last - p.makespan_ms) <= tol)) {
      add("timeline", -1, -1, fmt::format("makespan_ms: expected the end of the last timeline op, {} ms, found {} ms", last,
                                          p.makespan_ms));
    }
  }
  std::size_t timeline_violations_ = 0;

  // Slices (format 6): the links between micro-batches that hold consecutive slices of one sample.
  void check_slices() {
    const Plan& p = p_;
    if (!p.has_slices()) return;
    const SliceLinks links = slice_links(p);
    const bool encdec = std::any_of(p.microbatches.begin(), p.microbatches.end(),
                                    [](const PlanMicroBatch& mb) { return mb.padded_dec_len > 0 || !mb.target_lengths.empty(); });
    for (std::size_t m = 0; m < N_; ++m) {
      const PlanMicroBatch& mb = p.microbatches[m];
      if (!mb.has_slices()) continue;
      auto bad = [&](std::string msg) { add("header", -1, -1, fmt::format("micro-batch {}: {}", m, msg)); };
      if (mb.prefix.size() != mb.samples.size() || mb.prev.size() != mb.samples.size()) {
        bad(fmt::format("{} prefixes and {} previous slices for {} samples", mb.prefix.size(), mb.prev.size(),
                        mb.samples.size()));
        continue;
      }
      if (mb.layout != Layout::Packed) {
        bad(fmt::format("holds slices in layout {}; slices are entries of packed (varlen) micro-batches",
                        layout_name(mb.layout)));
      }
      if (encdec) bad("holds slices in an encoder-decoder plan; only decoder-only samples are sliced");
      for (std::size_t i = 0; i < mb.samples.size(); ++i) {
        const std::uint32_t pv = mb.prev[i], pre = mb.prefix[i];
        const std::uint32_t len = i < mb.lengths.size() ? mb.lengths[i] : 0;
        if (pv == kNoSlice) {
          if (pre != 0) bad(fmt::format("sample {} keeps a prefix of {} tokens but names no previous slice", mb.samples[i], pre));
          continue;
        }
        if (pv >= N_ || pv == m) {
          bad(fmt::format("sample {}: previous slice in micro-batch {}: expected another micro-batch below {}",
                          mb.samples[i], pv, N_));
          continue;
        }
        const EntryRef from = links.prev[m][i];
        if (!from.valid()) {
          bad(fmt::format("sample {}: its previous slice should be in micro-batch {}, which holds no entry of sample {} "
                          "that another slice does not already continue", mb.samples[i], pv, mb.samples[i]));
          continue;
        }
        const PlanMicroBatch& pm = p.microbatches[from.mb];
        const std::uint32_t plen = from.entry < pm.lengths.size() ? pm.lengths[from.entry] : 0;
        const std::uint64_t want = std::uint64_t{pm.prefix_of(from.entry)} + plen;
        if (pre != want) {
          bad(fmt::format("sample {}: prefix {} tokens, expected {} (the previous slice's prefix {} plus its {} tokens, "
                          "micro-batch {})", mb.samples[i], pre, want, pm.prefix_of(from.entry), plen, from.mb));
        }
        if (i < mb.refs.size() && from.entry < pm.refs.size()) {
          const SampleRef& a = pm.refs[from.entry];
          const SampleRef& b = mb.refs[i];
          if (a.task != b.task || a.index != b.index || std::uint64_t{a.offset} + plen != b.offset) {
            bad(fmt::format("sample {}: dataset sample {} does not continue {} ({} tokens) of micro-batch {}",
                            mb.samples[i], ref_name(b), ref_name(a), plen, from.mb));
          }
        }
        if (p.max_seq_len > 0 && std::uint64_t{pre} + len > p.max_seq_len) {
          bad(fmt::format("sample {}: its slice reaches position {} (prefix {} + {} tokens), past max_seq_len {}",
                          mb.samples[i], std::uint64_t{pre} + len, pre, len, p.max_seq_len));
        }
      }
    }
  }

  // Slices in the streams: on every stage, the previous slice's forward before this one's, this
  // one's backward (or input gradient) before the previous slice's (docs/design/015-long-context.md).
  void check_slice_order() {
    const Plan& p = p_;
    if (!p.has_slices()) return;
    const SliceLinks links = slice_links(p);
    constexpr std::size_t kAbsent = SIZE_MAX;
    for (std::size_t r = 0; r < S_; ++r) {
      std::vector<std::size_t> fwd(N_ * V_, kAbsent), bwd(N_ * V_, kAbsent);
      const auto& st = p.streams[r];
      for (std::size_t i = 0; i < st.size(); ++i) {
        const Instruction& ins = st[i];
        if (!is_compute(ins.op) || ins.mb >= N_ || ins.stage >= V_) continue;
        const std::size_t at = static_cast<std::size_t>(ins.mb) * V_ + ins.stage;
        if (ins.op == Opcode::Forward && fwd[at] == kAbsent) fwd[at] = i;
        if ((ins.op == Opcode::Backward || ins.op == Opcode::BackwardInput) && bwd[at] == kAbsent) bwd[at] = i;
      }
      for (std::size_t m = 0; m < N_; ++m) {
        for (std::size_t e = 0; e < links.prev[m].size(); ++e) {
          const EntryRef from = links.prev[m][e];
          if (!from.valid()) continue;
          for (std::size_t v = 0; v < V_; ++v) {
            if (p.stage_rank[v] != r) continue;
            const std::size_t a = from.mb * V_ + v, b = m * V_ + v;
            if (fwd[a] != kAbsent && fwd[b] != kAbsent && fwd[b] < fwd[a]) {
              add("order", static_cast<std::int64_t>(r), static_cast<std::int64_t>(fwd[b]),
                  fmt::format("FWD of micro-batch {} stage {} comes before the FWD of micro-batch {}, which holds the "
                              "previous slice of sample {} (its keys and values must exist first)",
                              m, v, from.mb, p.microbatches[m].samples[e]));
            }
            if (bwd[a] != kAbsent && bwd[b] != kAbsent && bwd[a] < bwd[b]) {
              add("order", static_cast<std::int64_t>(r), static_cast<std::int64_t>(bwd[a]),
                  fmt::format("backward of micro-batch {} stage {} comes before the backward of micro-batch {}, which "
                              "holds the next slice of sample {} (its gradients flow into the earlier slice's keys and "
                              "values: backward runs in reverse slice order)",
                              from.mb, v, m, p.microbatches[m].samples[e]));
            }
          }
        }
      }
    }
  }

  // Field ranges and per-instruction static rules.
  void check_fields() {
    const Plan& p = p_;
    bad_.resize(S_);
    for (std::size_t r = 0; r < S_; ++r) {
      const auto& st = p.streams[r];
      bad_[r].assign(st.size(), 0);
      for (std::size_t i = 0; i < st.size(); ++i) {
        const Instruction& ins = st[i];
        const auto R = static_cast<std::int64_t>(r);
        const auto I = static_cast<std::int64_t>(i);
        auto fail = [&](std::string msg) {
          bad_[r][i] = 1;
          add("field", R, I, std::move(msg));
        };
        const auto opv = static_cast<unsigned>(ins.op);
        if (opv >= static_cast<unsigned>(kOpcodeCount)) {
          fail(fmt::format("opcode: expected below {}, found {}", kOpcodeCount, opv));
          continue;
        }
        const std::uint8_t f = opcode_fields(ins.op);
        if ((f & kFieldMb) && ins.mb >= N_) {
          fail(fmt::format("micro-batch: expected below {}, found {}", N_, ins.mb == kNone ? -1 : static_cast<std::int64_t>(ins.mb)));
          continue;
        }
        if (f & kFieldStage) {
          if (ins.stage >= V_) {
            fail(fmt::format("stage: expected below {}, found {}", V_, ins.stage == kNone ? -1 : static_cast<std::int64_t>(ins.stage)));
            continue;
          }
          if (p.stage_rank[ins.stage] != r) {
            fail(fmt::format("stage {} runs on rank {}, not on this rank", ins.stage, p.stage_rank[ins.stage]));
            continue;
          }
        }
        if (f & kFieldPeer) {
          // Activations flow from stage v to v + 1, gradients from v to v - 1.
          const bool act = ins.op == Opcode::SendActStart || ins.op == Opcode::SendActWait ||
                           ins.op == Opcode::RecvActStart || ins.op == Opcode::RecvActWait;
          const bool send = ins.op == Opcode::SendActStart || ins.op == Opcode::SendActWait ||
                            ins.op == Opcode::SendGradStart || ins.op == Opcode::SendGradWait;
          const bool up = act == send;  // the peer's stage is stage + 1
          if (up ? ins.stage + 1 >= V_ : ins.stage == 0) {
            fail(fmt::format("stage {} has no {} stage to communicate with", ins.stage, up ? "next" : "previous"));
            continue;
          }
          const std::uint32_t expected = p.stage_rank[up ? ins.stage + 1 : ins.stage - 1];
          if (ins.peer != expected || ins.peer == r) {
            fail(fmt::format("peer: expected rank {} (runs stage {}){}, found {}", expected, up ? ins.stage + 1 : ins.stage - 1,
                             expected == r ? " which is this rank: same-rank stages hand over without communication" : "",
                             ins.peer == kNone ? -1 : static_cast<std::int64_t>(ins.peer)));
            continue;
          }
        }
        if ((f & kFieldShape) && ins.shape != kNone) {
          if (ins.shape >= p.shapes.size()) {
            fail(fmt::format("shape: expected an index below {}, found {}", p.shapes.size(), ins.shape));
            continue;
          }
          if (p.shapes[ins.shape].rows != p.microbatches[ins.mb].rows) {
            fail(fmt::format("shape #{} ({}) has {} rows, micro-batch {} has {}", ins.shape, to_string(p.shapes[ins.shape]),
                             p.shapes[ins.shape].rows, ins.mb, p.microbatches[ins.mb].rows));
            continue;
          }
          // The shape's lengths are the micro-batch's: the encoder (or whole-sample) length, or on
          // decoder stages the decoder length with the encoder output beside it.
          const TensorShape& s = p.shapes[ins.shape];
          const PlanMicroBatch& mb = p.microbatches[ins.mb];
          const bool seq_ok = s.seq > 0 && (s.seq == mb.padded_len || (mb.padded_dec_len > 0 && s.seq == mb.padded_dec_len));
          const bool enc_ok = s.enc_seq == 0 || (s.enc_seq == mb.padded_len && s.seq == mb.padded_dec_len);
          if (!seq_ok || !enc_ok) {
            fail(fmt::format("shape #{} ({}): expected the sequence length of micro-batch {} ({}{}), found {}{}", ins.shape,
                             to_string(s), ins.mb, mb.padded_len,
                             mb.padded_dec_len > 0 ? fmt::format(", or decoder {}", mb.padded_dec_len) : std::string(),
                             s.seq, s.enc_seq > 0 ? fmt::format(" with encoder {}", s.enc_seq) : std::string()));
            continue;
          }
        }
        if ((f & kFieldShape) && ins.shape == kNone) {
          fail("shape: expected a shape index, found none");
          continue;
        }
        bool buf_ok = true;
        auto buf = [&](std::uint8_t bit, const char* name, std::uint32_t b) {
          if (!(f & bit) || b == kNone || !buf_ok) return;
          if (b >= p.buffer_slots[r]) {
            buf_ok = false;
            fail(fmt::format("{}: expected a buffer slot below {}, found {}", name, p.buffer_slots[r], b));
          }
        };
        buf(kFieldIn, "in", ins.in);
        buf(kFieldIn2, "in2", ins.in2);
        buf(kFieldOut, "out", ins.out);
        if (!buf_ok) continue;
        // Required buffers.
        const bool needs_in = ins.op == Opcode::FreeBuf || ins.op == Opcode::SendActStart || ins.op == Opcode::SendGradStart ||
                              ins.op == Opcode::SendActWait || ins.op == Opcode::SendGradWait ||
                              ins.op == Opcode::RecvActWait || ins.op == Opcode::RecvGradWait ||
                              (ins.op == Opcode::Forward && ins.stage > 0) ||
                              ((ins.op == Opcode::Backward || ins.op == Opcode::BackwardInput) && ins.stage + 1 < V_);
        const bool needs_out = ins.op == Opcode::LoadMb || ins.op == Opcode::RecvActStart || ins.op == Opcode::RecvGradStart ||
                               (ins.op == Opcode::Forward && ins.stage + 1 < V_) ||
                               ((ins.op == Opcode::Backward || ins.op == Opcode::BackwardInput) && ins.stage > 0);
        if (needs_in && ins.in == kNone) {
          fail(fmt::format("in: expected a buffer ({}), found none",
                           is_compute(ins.op) ? (ins.op == Opcode::Forward ? "the activation of the previous stage"
                                                                           : "the output gradient of the next stage")
                                              : "the buffer it names"));
          continue;
        }
        const bool no_in = (ins.op == Opcode::Forward && ins.stage == 0) ||
                           ((ins.op == Opcode::Backward || ins.op == Opcode::BackwardInput) && ins.stage + 1 == V_);
        const bool no_out = (ins.op == Opcode::Forward && ins.stage + 1 == V_) ||
                            ((ins.op == Opcode::Backward || ins.op == Opcode::BackwardInput) && ins.stage == 0);
        if (no_in && ins.in != kNone) {
          fail(fmt::format("in: expected none ({} stage has no {}), found b{}", ins.stage == 0 ? "the first" : "the last",
                           ins.op == Opcode::Forward ? "previous activation" : "next gradient", ins.in));
          continue;
        }
        if (no_out && ins.out != kNone) {
          fail(fmt::format("out: expected none ({} stage sends nothing on), found b{}", ins.stage == 0 ? "the first" : "the last",
                           ins.out));
          continue;
        }
        if (needs_out && ins.out == kNone) {
          fail("out: expected a buffer to write, found none");
          continue;
        }
        if (ins.op == Opcode::Forward && ins.stage == 0 && ins.in2 == kNone) {
          fail("in2: the first stage's forward needs the loaded micro-batch, found none");
          continue;
        }
        if (ins.op == Opcode::IterBegin && i != 0) add("order", R, I, "ITER_BEGIN: expected at index 0 only");
        if (ins.op == Opcode::IterEnd && i + 1 != st.size()) add("order", R, I, "ITER_END: expected as the last instruction only");
      }
    }
  }

  // Per channel, the i-th send start and the i-th receive start name the same micro-batch,
  // adjacent stages and one shape; every message has both ends.
  void check_channels(const std::vector<ChannelState>& channels) {
    const Plan& p = p_;
    for (const ChannelState& c : channels) {
      const char* dir = c.dir == 0 ? "activation" : "gradient";
      const std::size_t n = std::min(c.sends.size(), c.recvs.size());
      for (std::size_t k = 0; k < n; ++k) {
        const MessageEnd &s = c.sends[k], &rv = c.recvs[k];
        const std::uint32_t expected_stage = c.dir == 0 ? s.stage + 1 : s.stage - 1;
        if (s.mb != rv.mb || rv.stage != expected_stage || p.shapes[s.shape] != p.shapes[rv.shape]) {
          add("channel", rv.rank, rv.index,
              fmt::format("{} channel rank {} -> rank {}, message #{}: expected micro-batch {} stage {} shape {} (rank {} "
                          "instruction {}), found micro-batch {} stage {} shape {}",
                          dir, c.src, c.dst, k, s.mb, expected_stage, to_string(p.shapes[s.shape]), s.rank, s.index, rv.mb,
                          rv.stage, to_string(p.shapes[rv.shape])));
        }
      }
      for (std::size_t k = n; k < c.sends.size(); ++k) {
        add("channel", c.sends[k].rank, c.sends[k].index,
            fmt::format("{} channel rank {} -> rank {}: send #{} (micro-batch {} stage {}) has no matching receive on rank {} "
                        "({} receives)", dir, c.src, c.dst, k, c.sends[k].mb, c.sends[k].stage, c.dst, c.recvs.size()));
      }
      for (std::size_t k = n; k < c.recvs.size(); ++k) {
        add("channel", c.recvs[k].rank, c.recvs[k].index,
            fmt::format("{} channel rank {} -> rank {}: receive #{} (micro-batch {} stage {}) has no matching send on rank {} "
                        "({} sends)", dir, c.src, c.dst, k, c.recvs[k].mb, c.recvs[k].stage, c.src, c.sends.size()));
      }
    }
  }

  void check_counts(const DryRun& dry) {
    if (full()) return;
    const auto& nf = dry.forwards();
    const auto& nb = dry.backwards();
    const auto& ni = dry.input_grads();
    const auto& nw = dry.weight_grads();
    // Optional instructions: either on every rank (once) or on none.
    for (Opcode op : {Opcode::IterBegin, Opcode::IterEnd, Opcode::OptStep}) {
      std::vector<std::size_t> n(S_, 0);
      std::size_t with = 0;
      for (std::size_t r = 0; r < S_; ++r) {
        for (const auto& ins : p_.streams[r]) n[r] += ins.op == op;
        with += n[r] > 0;
      }
      for (std::size_t r = 0; r < S_ && with > 0; ++r) {
        if (n[r] != 1) {
          add("count", static_cast<std::int64_t>(r), -1,
              fmt::format("{}: expected once on every rank (it is on {} of {} ranks), found {} here", opcode_name(op), with,
                          S_, n[r]));
        }
      }
    }
    bool any = false;
    for (std::size_t r = 0; r < S_; ++r) any = any || dry.has_reduce(r);
    for (std::size_t m = 0; m < N_; ++m) {
      for (std::size_t v = 0; v < V_; ++v) {
        const std::size_t k = m * V_ + v;
        const auto R = static_cast<std::int64_t>(p_.stage_rank[v]);
        if (nf[k] == 0) add("count", R, -1, fmt::format("forward of micro-batch {} stage {}: expected once, found none", m, v));
        if (nb[k] + ni[k] == 0) {
          add("count", R, -1, fmt::format("backward of micro-batch {} stage {}: expected one B or one I and one W, found none", m, v));
        } else if (ni[k] != nw[k]) {
          add("count", R, -1, fmt::format("micro-batch {} stage {}: expected as many weight (W) as input (I) gradients, found {} and {}",
                                          m, v, nw[k], ni[k]));
        }
      }
    }
    for (std::size_t v = 0; v < V_; ++v) {
      const std::size_t r = p_.stage_rank[v];
      if (any && !dry.reduced()[v]) {
        add("count", static_cast<std::int64_t>(r), -1, fmt::format("REDUCE_GRAD of stage {}: expected once on rank {}, found none", v, r));
      }
    }
  }
};

}  // namespace

std::string to_string(const Violation& v, const Plan* plan) {
  std::string where;
  if (v.kind == "replicas") {  // validate_replicas: `rank` is the replica
    where = v.rank < 0 ? std::string("iteration") : fmt::format("replica {}", v.rank);
  } else if (v.rank < 0) {
    where = "header";
  } else if (v.index < 0) {
    where = fmt::format("rank {}", v.rank);
  } else if (v.kind == "timeline") {  // `index` is the op's position in the rank's timeline
    where = fmt::format("rank {}, timeline op {}", v.rank, v.index);
  } else {
    where = fmt::format("rank {}, instruction {}", v.rank, v.index);
    if (plan != nullptr && static_cast<std::size_t>(v.rank) < plan->streams.size() &&
        static_cast<std::size_t>(v.index) < plan->streams[v.rank].size()) {
      where += fmt::format(" ({})", to_string(plan->streams[v.rank][v.index]));
    }
  }
  return fmt::format("{}: [{}] {}", where, v.kind, v.message);
}

ValidationReport validate(const Plan& plan, const ValidateOptions& options) { return Checker(plan, options).run(); }

std::vector<Violation> validate_replicas(const std::vector<Plan>& replicas) {
  std::vector<Violation> out;
  if (replicas.empty()) return out;
  auto add = [&](std::int64_t replica, std::string msg) { out.push_back(Violation{"replicas", replica, -1, std::move(msg)}); };
  const Plan& first = replicas.front();
  if (replicas.size() != first.dp) {
    add(-1, fmt::format("iteration {}: expected dp = {} replicas' plans, found {} (a replica is missing, or dp was edited)",
                        first.iteration, first.dp, replicas.size()));
  }
  std::uint64_t tokens = 0;
  std::map<std::uint32_t, std::size_t> sample_of;
  std::map<SampleRef, std::pair<std::size_t, std::uint32_t>> ref_of;  // -> (replica, sample id)
  std::map<std::uint32_t, IdRange> id_ranges;  // the tokens each sample id trains (lengths known)
  Spans spans;
  for (std::size_t k = 0; k < replicas.size(); ++k) {
    const Plan& p = replicas[k];
    const auto K = static_cast<std::int64_t>(k);
    // (the list's position names the plan: its replica field may be the wrong one)
    auto same = [&](const char* field, auto a, auto b) {
      if (a != b) {
        add(K, fmt::format("{}: plans[{}] has {}, expected {} (plans[0]'s: one iteration, one pipeline)", field, k, a, b));
      }
    };
    same("iteration", p.iteration, first.iteration);
    if (p.replica != k) {
      add(K, fmt::format("replica: plans[{}] has replica {}, expected {} (the plans in replica order)", k, p.replica, k));
    }
    same("dp", p.dp, first.dp);
    same("ranks", p.ranks, first.ranks);
    same("vstages", p.vstages, first.vstages);
    same("global_tokens", p.global_tokens, first.global_tokens);
    if (p.stage_rank != first.stage_rank) add(K, fmt::format("stage_rank: plans[{}] maps stages to ranks unlike plans[0]", k));
    for (std::size_t m = 0; m < p.microbatches.size(); ++m) {
      const PlanMicroBatch& mb = p.microbatches[m];
      tokens += mb.tokens;
      for (const std::uint32_t s : mb.samples) {
        const auto [it, fresh] = sample_of.emplace(s, k);
        if (!fresh && it->second != k) {
          add(K, fmt::format("micro-batch {}: sample {} is also in replica {} (each sample is trained once)", m, s, it->second));
        }
      }
      for (std::size_t i = 0; i < mb.refs.size(); ++i) {
        const SampleRef& r = mb.refs[i];
        const std::uint32_t id = i < mb.samples.size() ? mb.samples[i] : std::numeric_limits<std::uint32_t>::max();
        const auto [it, fresh] = ref_of.emplace(r, std::make_pair(k, id));
        if (!fresh && it->second.first != k && it->second.second == id) {
          add(K, fmt::format("micro-batch {}: dataset sample {} of sample {} is also in replica {}", m, ref_name(r), id,
                             it->second.first));
        } else if (mb.lengths.size() == mb.refs.size()) {
          add_id_range(id_ranges, id, r, mb.lengths[i], k);
        }
      }
    }
  }
  add_id_spans(id_ranges, spans);
  overlapping_spans(spans, [&](std::uint32_t task, std::uint64_t index, const Span& a, const Span& b) {
    // Within one replica the plan's own validation reports it.
    if (a.where != b.where) {
      add(static_cast<std::int64_t>(b.where),
          fmt::format("dataset sample (task {}, index {}): tokens [{}, {}) in replica {} overlap tokens [{}, {}) in "
                      "replica {} (each token is trained once)", task, index, b.begin, b.end, b.where, a.begin, a.end,
                      a.where));
    }
  });
  if (replicas.size() == first.dp && tokens != first.global_tokens) {
    add(-1, fmt::format("global_tokens: expected the {} replicas' {} tokens, found {}", replicas.size(), tokens,
                        first.global_tokens));
  }
  return out;
}

void validate_or_throw(const Plan& plan, const ValidateOptions& options) {
  const ValidationReport rep = validate(plan, options);
  if (rep.ok()) return;
  std::string msg = fmt::format("plan of iteration {} (schedule '{}') is invalid: {} violation{}", plan.iteration,
                                plan.schedule, rep.violations.size(), rep.violations.size() == 1 ? "" : "s");
  for (std::size_t i = 0; i < rep.violations.size() && i < 10; ++i) msg += "\n  " + to_string(rep.violations[i], &plan);
  if (rep.violations.size() > 10) msg += fmt::format("\n  ... and {} more", rep.violations.size() - 10);
  throw Error(msg);
}

}  // namespace packpipe::plan
