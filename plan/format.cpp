#include "plan/format.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include <sys/stat.h>

#include <nlohmann/json.hpp>
#include <zstd.h>
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "common/errors.h"
#include "common/file_io.h"
#include "common/json.h"
#include "common/mapped_file.h"
#include "common/recompute.h"
#include "common/zstd_check.h"

namespace packpipe::plan {

namespace {

using Json = nlohmann::ordered_json;

constexpr char kPlanMagic[4] = {'P', 'P', 'L', 'N'};
constexpr char kFileMagic[4] = {'P', 'P', 'L', 'F'};
constexpr char kIndexMagic[4] = {'P', 'P', 'L', 'I'};
constexpr std::size_t kHeaderSize = 32;
constexpr std::size_t kFileHeaderSize = 8;
// Plan file footer (formats 2 and 3), after the index and (format 3, flag bit 1) the dataset record:
// count, index offset, first iteration, distinct iterations held, iterations declared by the writer
// (0: none declared), flags (bit 0: complete, bit 1: dataset), XXH64 of the bytes from the index to
// the footer's first 48 bytes, 'PPLI', footer version (the file's).
constexpr std::size_t kFooterSize = 64;
constexpr std::uint16_t kPlanFileVersion = 3;
constexpr std::uint16_t kOldestPlanFileVersion = 2;  // format 2: no dataset record
constexpr std::uint64_t kFlagComplete = 1;
constexpr std::uint64_t kFlagDataset = 2;
constexpr std::uint16_t kFlagZstd = 1;
constexpr std::uint64_t kMaxBody = std::uint64_t{1} << 32;  // 4 GiB: far above any plan

// ------------------------------------------------------------------------------------------
// Binary writer / reader

class Out {
 public:
  std::vector<std::uint8_t> b;
  void u8(std::uint8_t v) { b.push_back(v); }
  void var(std::uint64_t v) {
    while (v >= 0x80) {
      b.push_back(static_cast<std::uint8_t>(v | 0x80));
      v >>= 7;
    }
    b.push_back(static_cast<std::uint8_t>(v));
  }
  void opt(std::uint32_t v) { var(v == kNone ? 0 : std::uint64_t{v} + 1); }
  void f64(double d) {
    std::uint64_t u;
    std::memcpy(&u, &d, 8);
    le(u, 8);
  }
  void le(std::uint64_t v, int n) {
    for (int i = 0; i < n; ++i) b.push_back(static_cast<std::uint8_t>(v >> (8 * i)));
  }
  void str(const std::string& s) {
    var(s.size());
    b.insert(b.end(), s.begin(), s.end());
  }
};

class In {
 public:
  In(const std::uint8_t* d, std::size_t n, const std::string& what, std::size_t base) : d_(d), n_(n), what_(what), base_(base) {}
  [[noreturn]] void fail(const char* field, const std::string& msg) const {
    PACKPIPE_THROW(Error, "{}: offset {}: field '{}': {}", what_, base_ + p_, field, msg);
  }
  std::size_t left() const { return n_ - p_; }
  std::size_t pos() const { return p_; }
  void need(std::uint64_t k, const char* field) const {
    if (k > left()) fail(field, fmt::format("expected {} more bytes, found {} (truncated)", k, left()));
  }
  std::uint8_t u8(const char* field) {
    need(1, field);
    return d_[p_++];
  }
  std::uint64_t var(const char* field) {
    std::uint64_t v = 0;
    const std::size_t start = p_;
    for (int shift = 0;; shift += 7) {
      if (p_ >= n_) {
        p_ = start;
        fail(field, "expected a varint, found the end of the data (truncated)");
      }
      const std::uint8_t byte = d_[p_++];
      if (shift == 63 && byte > 1) {
        p_ = start;
        fail(field, "varint overflows 64 bits");
      }
      v |= static_cast<std::uint64_t>(byte & 0x7F) << shift;
      if (!(byte & 0x80)) {
        if (byte == 0 && shift > 0) {
          p_ = start;
          fail(field, "varint has a redundant trailing zero byte (non-canonical)");
        }
        return v;
      }
    }
  }
  std::uint64_t var_max(const char* field, std::uint64_t max) {
    const std::size_t start = p_;
    const std::uint64_t v = var(field);
    if (v > max) {
      p_ = start;
      fail(field, fmt::format("expected at most {}, found {}", max, v));
    }
    return v;
  }
  std::uint32_t u32(const char* field) { return static_cast<std::uint32_t>(var_max(field, 0xFFFFFFFFull)); }
  std::uint32_t opt(const char* field) {
    const std::uint64_t v = var_max(field, 0xFFFFFFFFull);
    return v == 0 ? kNone : static_cast<std::uint32_t>(v - 1);
  }
  // A count of elements of at least `min_bytes` bytes each: bounded by what is left.
  std::size_t count(const char* field, std::uint64_t min_bytes) {
    const std::size_t start = p_;
    const std::uint64_t c = var(field);
    if (min_bytes > 0 && c > left() / min_bytes) {
      p_ = start;
      fail(field, fmt::format("count {} needs at least {} bytes, only {} left (truncated or corrupt)", c,
                              c > std::numeric_limits<std::uint64_t>::max() / min_bytes ? c : c * min_bytes, left()));
    }
    return static_cast<std::size_t>(c);
  }
  std::uint64_t fixed64(const char* field) {
    need(8, field);
    std::uint64_t u = 0;
    for (int i = 0; i < 8; ++i) u |= static_cast<std::uint64_t>(d_[p_ + i]) << (8 * i);
    p_ += 8;
    return u;
  }
  double f64(const char* field) {
    const std::uint64_t u = fixed64(field);
    double d;
    std::memcpy(&d, &u, 8);
    return d;
  }
  std::string str(const char* field) {
    const std::size_t n = count(field, 1);
    std::string s(reinterpret_cast<const char*>(d_ + p_), n);
    p_ += n;
    return s;
  }

 private:
  const std::uint8_t* d_;
  std::size_t n_;
  std::string what_;
  std::size_t base_;
  std::size_t p_ = 0;
};

std::uint64_t rd_le(const std::uint8_t* p, int n) {
  std::uint64_t v = 0;
  for (int i = 0; i < n; ++i) v |= static_cast<std::uint64_t>(p[i]) << (8 * i);
  return v;
}

std::string show_magic(const std::uint8_t* p, std::size_t n) {
  std::string s;
  for (std::size_t i = 0; i < n && i < 4; ++i) {
    s += (p[i] >= 32 && p[i] < 127) ? fmt::format("{}", static_cast<char>(p[i])) : fmt::format("\\x{:02x}", p[i]);
  }
  return "'" + s + "'";
}

// Format 2: what a trainer needs (stage specs, dtype, loss, tied embedding, per-sample lengths).
void encode_trainer(const Plan& p, Out& o) {
  o.u8(p.stages.empty() ? 0 : 1);
  if (p.stages.empty()) return;
  PACKPIPE_CHECK_ARG(p.stages.size() == p.vstages, "encode_plan: stages has {} entries, expected {}", p.stages.size(),
                     p.vstages);
  for (const auto& s : p.stages) {
    o.var(s.encoder_begin);
    o.var(s.encoder_layers);
    o.var(s.decoder_begin);
    o.var(s.decoder_layers);
    o.u8(static_cast<std::uint8_t>((s.embedding ? 1 : 0) | (s.head ? 2 : 0)));
    o.u8(s.loads);
  }
  o.u8(static_cast<std::uint8_t>(p.dtype));
  o.u8(static_cast<std::uint8_t>(p.loss_mode));
  o.var(p.global_loss_tokens);
  o.u8(p.tied_embedding ? 1 : 0);
  o.u8(p.rank_layout);
  for (std::size_t m = 0; m < p.microbatches.size(); ++m) {
    const auto& mb = p.microbatches[m];
    PACKPIPE_CHECK_ARG(mb.lengths.size() == mb.samples.size() &&
                           (mb.target_lengths.empty() || mb.target_lengths.size() == mb.samples.size()),
                       "encode_plan: micro-batch {} has {} lengths and {} target lengths for {} samples", m,
                       mb.lengths.size(), mb.target_lengths.size(), mb.samples.size());
    o.var(mb.loss_tokens);
    for (auto x : mb.lengths) o.var(x);
    o.u8(mb.target_lengths.empty() ? 0 : 1);
    for (auto x : mb.target_lengths) o.var(x);
  }
}

void encode_body(const Plan& p, Out& o) {
  auto check_size = [](const char* name, std::size_t found, std::size_t expected) {
    PACKPIPE_CHECK_ARG(found == expected, "encode_plan: {} has {} entries, expected {}", name, found, expected);
  };
  check_size("stage_rank", p.stage_rank.size(), p.vstages);
  check_size("static_bytes", p.static_bytes.size(), p.ranks);
  check_size("buffer_slots", p.buffer_slots.size(), p.ranks);
  check_size("streams", p.streams.size(), p.ranks);
  const std::size_t nv = p.microbatches.size() * p.vstages;
  check_size("recompute", p.recompute.size(), nv);
  check_size("stored_bytes", p.stored_bytes.size(), nv);
  check_size("peak_bytes", p.peak_bytes.size(), nv);
  PACKPIPE_CHECK_ARG(p.timeline.empty() || p.timeline.size() == p.ranks, "encode_plan: timeline has {} ranks, expected {}",
                     p.timeline.size(), p.ranks);
  o.var(p.iteration);
  o.var(p.ranks);
  o.var(p.vstages);
  o.str(p.schedule);
  for (auto r : p.stage_rank) o.var(r);
  o.var(p.dp);
  o.var(p.replica);
  o.var(p.global_tokens);
  o.f64(p.makespan_ms);
  o.var(p.memory_limit_bytes);
  for (auto b : p.static_bytes) o.var(b);
  for (auto b : p.buffer_slots) o.var(b);
  o.var(p.shapes.size());
  for (const auto& s : p.shapes) {
    o.var(s.rows);
    o.var(s.seq);
    o.var(s.hidden);
    o.var(s.enc_seq);
    o.u8(static_cast<std::uint8_t>(s.dtype));
  }
  o.var(p.microbatches.size());
  for (std::size_t m = 0; m < p.microbatches.size(); ++m) {
    const auto& mb = p.microbatches[m];
    PACKPIPE_CHECK_ARG(mb.refs.empty() || mb.refs.size() == mb.samples.size(),
                       "encode_plan: micro-batch {} has {} sample refs for {} samples", m, mb.refs.size(), mb.samples.size());
    o.var(mb.rows);
    o.var(mb.padded_len);
    o.var(mb.padded_dec_len);
    o.var(mb.tokens);
    o.f64(mb.loss_weight);
    o.var(mb.samples.size());
    for (auto s : mb.samples) o.var(s);
    o.u8(mb.refs.empty() ? 0 : 1);
    for (const auto& r : mb.refs) {
      o.var(r.task);
      o.var(r.index);
    }
    o.var(mb.row_offsets.size());
    for (auto x : mb.row_offsets) o.var(x);
  }
  for (std::size_t i = 0; i < nv; ++i) {
    o.u8(p.recompute[i]);
    o.var(p.stored_bytes[i]);
    o.var(p.peak_bytes[i]);
  }
  for (const auto& st : p.streams) {
    o.var(st.size());
    for (const auto& ins : st) {
      PACKPIPE_CHECK_ARG(static_cast<unsigned>(ins.op) < static_cast<unsigned>(kOpcodeCount),
                         "encode_plan: opcode {} out of range", static_cast<unsigned>(ins.op));
      o.u8(static_cast<std::uint8_t>(ins.op));
      const std::uint8_t f = opcode_fields(ins.op);
      if (f & kFieldMb) o.opt(ins.mb);
      if (f & kFieldStage) o.opt(ins.stage);
      if (f & kFieldPeer) o.opt(ins.peer);
      if (f & kFieldIn) o.opt(ins.in);
      if (f & kFieldIn2) o.opt(ins.in2);
      if (f & kFieldOut) o.opt(ins.out);
      if (f & kFieldShape) o.opt(ins.shape);
      if (f & kFieldMode) o.opt(ins.mode);
    }
  }
  o.u8(p.timeline.empty() ? 0 : 1);
  for (const auto& ops : p.timeline) {
    o.var(ops.size());
    for (const auto& op : ops) {
      o.u8(static_cast<std::uint8_t>(op.kind));
      o.var(op.mb);
      o.var(op.vstage);
      o.f64(op.start_ms);
      o.f64(op.end_ms);
    }
  }
  encode_trainer(p, o);
  for (const auto& mb : p.microbatches) o.u8(static_cast<std::uint8_t>(mb.layout));  // format 3
  // Format 4: the context length, then the chunks' offsets (refs of split samples), when any.
  o.var(p.max_seq_len);
  o.var(p.max_target_len);
  const bool offsets = std::any_of(p.microbatches.begin(), p.microbatches.end(), [](const PlanMicroBatch& mb) {
    return std::any_of(mb.refs.begin(), mb.refs.end(), [](const SampleRef& r) { return r.offset != 0; });
  });
  o.u8(offsets ? 1 : 0);
  if (offsets) {
    for (const auto& mb : p.microbatches) {
      for (const auto& r : mb.refs) o.var(r.offset);
    }
  }
  o.le(p.dataset.fingerprint, 8);  // format 5: the dataset the refs index (0: unknown)
  // Format 6: slices. A flag, then per micro-batch a flag and, when set, every entry's prefix and
  // previous micro-batch + 1 (0: none).
  const bool slices = p.has_slices();
  o.u8(slices ? 1 : 0);
  if (slices) {
    for (std::size_t m = 0; m < p.microbatches.size(); ++m) {
      const auto& mb = p.microbatches[m];
      PACKPIPE_CHECK_ARG(!mb.has_slices() || (mb.prefix.size() == mb.samples.size() && mb.prev.size() == mb.samples.size()),
                         "encode_plan: micro-batch {} has {} prefixes and {} previous slices for {} samples", m,
                         mb.prefix.size(), mb.prev.size(), mb.samples.size());
      o.u8(mb.has_slices() ? 1 : 0);
      if (!mb.has_slices()) continue;
      for (std::size_t i = 0; i < mb.samples.size(); ++i) {
        o.var(mb.prefix[i]);
        o.var(mb.prev[i] == kNoSlice ? 0 : static_cast<std::uint64_t>(mb.prev[i]) + 1);
      }
    }
  }
}

/// The layout a format-1 or -2 plan implies: rows packed under a block mask when it gives row
/// offsets, else padded rows.
Layout implied_layout(const PlanMicroBatch& mb) {
  return mb.row_offsets.empty() ? Layout::Padded : Layout::PackedMask;
}

void decode_trainer(In& in, Plan& p) {
  const std::uint8_t has = in.u8("has_trainer");
  if (has > 1) in.fail("has_trainer", fmt::format("expected 0 or 1, found {}", has));
  if (has == 0) return;
  in.need(6ull * p.vstages, "stages");
  p.stages.resize(p.vstages);
  for (auto& s : p.stages) {
    s.encoder_begin = in.u32("stage.encoder_begin");
    s.encoder_layers = in.u32("stage.encoder_layers");
    s.decoder_begin = in.u32("stage.decoder_begin");
    s.decoder_layers = in.u32("stage.decoder_layers");
    const std::uint8_t f = in.u8("stage.flags");
    if (f > 3) in.fail("stage.flags", fmt::format("expected 0..3, found {}", f));
    s.embedding = (f & 1) != 0;
    s.head = (f & 2) != 0;
    s.loads = in.u8("stage.loads");
    if (s.loads > 31) in.fail("stage.loads", fmt::format("expected 0..31, found {}", s.loads));
  }
  const std::uint8_t d = in.u8("dtype");
  if (d > static_cast<std::uint8_t>(Dtype::F64)) in.fail("dtype", fmt::format("expected 0..5, found {}", d));
  p.dtype = static_cast<Dtype>(d);
  const std::uint8_t lm = in.u8("loss_mode");
  if (lm > 1) in.fail("loss_mode", fmt::format("expected 0 (all) or 1 (targets), found {}", lm));
  p.loss_mode = static_cast<LossMode>(lm);
  p.global_loss_tokens = in.var("global_loss_tokens");
  const std::uint8_t tied = in.u8("tied_embedding");
  if (tied > 1) in.fail("tied_embedding", fmt::format("expected 0 or 1, found {}", tied));
  p.tied_embedding = tied != 0;
  p.rank_layout = in.u8("rank_layout");
  if (p.rank_layout != 0) in.fail("rank_layout", fmt::format("expected 0 (world rank = replica x ranks + rank), found {}", p.rank_layout));
  for (auto& mb : p.microbatches) {
    mb.loss_tokens = in.var("microbatch.loss_tokens");
    in.need(mb.samples.size(), "microbatch.lengths");
    mb.lengths.resize(mb.samples.size());
    for (auto& x : mb.lengths) x = in.u32("microbatch.lengths");
    const std::uint8_t ht = in.u8("microbatch.has_target_lengths");
    if (ht > 1) in.fail("microbatch.has_target_lengths", fmt::format("expected 0 or 1, found {}", ht));
    if (ht) {
      in.need(mb.samples.size(), "microbatch.target_lengths");
      mb.target_lengths.resize(mb.samples.size());
      for (auto& x : mb.target_lengths) x = in.u32("microbatch.target_lengths");
    }
  }
}

// A format-1 plan's FWD carries no recompute mode: it is the (micro-batch, stage)'s in the table.
void fill_forward_modes(Plan& p) {
  for (auto& st : p.streams) {
    for (auto& ins : st) {
      if (ins.op != Opcode::Forward || ins.mb == kNone || ins.stage == kNone) continue;
      const std::uint64_t k = std::uint64_t{ins.mb} * p.vstages + ins.stage;
      if (ins.mb < p.microbatches.size() && ins.stage < p.vstages && k < p.recompute.size()) ins.mode = p.recompute[k];
    }
  }
}

Plan decode_body(In& in, std::uint16_t version) {
  Plan p;
  p.iteration = in.var("iteration");
  p.ranks = static_cast<std::uint32_t>(in.var_max("ranks", 1u << 24));
  p.vstages = static_cast<std::uint32_t>(in.var_max("vstages", 1u << 24));
  p.schedule = in.str("schedule");
  in.need(p.vstages, "stage_rank");
  p.stage_rank.resize(p.vstages);
  for (auto& r : p.stage_rank) r = in.u32("stage_rank");
  p.dp = in.u32("dp");
  p.replica = in.u32("replica");
  p.global_tokens = in.var("global_tokens");
  p.makespan_ms = in.f64("makespan_ms");
  p.memory_limit_bytes = in.var("memory_limit_bytes");
  in.need(2ull * p.ranks, "static_bytes");
  p.static_bytes.resize(p.ranks);
  for (auto& b : p.static_bytes) b = in.var("static_bytes");
  p.buffer_slots.resize(p.ranks);
  for (auto& b : p.buffer_slots) b = in.u32("buffer_slots");
  p.shapes.resize(in.count("shapes", 5));
  for (auto& s : p.shapes) {
    s.rows = in.u32("shape.rows");
    s.seq = in.u32("shape.seq");
    s.hidden = in.u32("shape.hidden");
    s.enc_seq = in.u32("shape.enc_seq");
    const std::uint8_t d = in.u8("shape.dtype");
    if (d > static_cast<std::uint8_t>(Dtype::F64)) in.fail("shape.dtype", fmt::format("expected 0..5, found {}", d));
    s.dtype = static_cast<Dtype>(d);
  }
  p.microbatches.resize(in.count("microbatches", 15));
  for (auto& mb : p.microbatches) {
    mb.rows = in.u32("microbatch.rows");
    mb.padded_len = in.u32("microbatch.padded_len");
    mb.padded_dec_len = in.u32("microbatch.padded_dec_len");
    mb.tokens = in.var("microbatch.tokens");
    mb.loss_weight = in.f64("microbatch.loss_weight");
    mb.samples.resize(in.count("microbatch.samples", 1));
    for (auto& s : mb.samples) s = in.u32("microbatch.samples");
    const std::uint8_t has_refs = in.u8("microbatch.has_refs");
    if (has_refs > 1) in.fail("microbatch.has_refs", fmt::format("expected 0 or 1, found {}", has_refs));
    if (has_refs) {
      in.need(2ull * mb.samples.size(), "microbatch.refs");
      mb.refs.resize(mb.samples.size());
      for (auto& r : mb.refs) {
        r.task = in.u32("microbatch.refs.task");
        r.index = in.var("microbatch.refs.index");
      }
    }
    mb.row_offsets.resize(in.count("microbatch.row_offsets", 1));
    for (auto& x : mb.row_offsets) x = in.u32("microbatch.row_offsets");
  }
  const std::uint64_t nv = static_cast<std::uint64_t>(p.microbatches.size()) * p.vstages;
  in.need(nv * 3, "recompute/stored/peak table");
  p.recompute.resize(nv);
  p.stored_bytes.resize(nv);
  p.peak_bytes.resize(nv);
  for (std::uint64_t i = 0; i < nv; ++i) {
    p.recompute[i] = in.u8("recompute");
    if (p.recompute[i] > 2) in.fail("recompute", fmt::format("expected 0 (none), 1 (selective) or 2 (full), found {}", p.recompute[i]));
    p.stored_bytes[i] = in.var("stored_bytes");
    p.peak_bytes[i] = in.var("peak_bytes");
  }
  in.need(p.ranks, "streams");
  p.streams.resize(p.ranks);
  for (auto& st : p.streams) {
    st.resize(in.count("stream.length", 1));
    for (auto& ins : st) {
      const std::uint8_t op = in.u8("instruction.opcode");
      const int count = version >= 2 ? kOpcodeCount : static_cast<int>(Opcode::ReduceTied);
      if (op >= count) in.fail("instruction.opcode", fmt::format("expected below {}, found {}", count, op));
      ins.op = static_cast<Opcode>(op);
      const std::uint8_t f = opcode_fields(ins.op) & (version >= 2 ? 0xFF : ~kFieldMode);
      if (f & kFieldMb) ins.mb = in.opt("instruction.mb");
      if (f & kFieldStage) ins.stage = in.opt("instruction.stage");
      if (f & kFieldPeer) ins.peer = in.opt("instruction.peer");
      if (f & kFieldIn) ins.in = in.opt("instruction.in");
      if (f & kFieldIn2) ins.in2 = in.opt("instruction.in2");
      if (f & kFieldOut) ins.out = in.opt("instruction.out");
      if (f & kFieldShape) ins.shape = in.opt("instruction.shape");
      if (f & kFieldMode) ins.mode = in.opt("instruction.mode");
    }
  }
  const std::uint8_t has_tl = in.u8("has_timeline");
  if (has_tl > 1) in.fail("has_timeline", fmt::format("expected 0 or 1, found {}", has_tl));
  if (has_tl) {
    in.need(p.ranks, "timeline");
    p.timeline.resize(p.ranks);
    for (auto& ops : p.timeline) {
      ops.resize(in.count("timeline.length", 19));
      for (auto& op : ops) {
        const std::uint8_t k = in.u8("timeline.kind");
        if (k > static_cast<std::uint8_t>(OpKind::BackwardWeight)) in.fail("timeline.kind", fmt::format("expected 0..3, found {}", k));
        op.kind = static_cast<OpKind>(k);
        op.mb = in.u32("timeline.mb");
        op.vstage = in.u32("timeline.vstage");
        op.start_ms = in.f64("timeline.start_ms");
        op.end_ms = in.f64("timeline.end_ms");
      }
    }
  }
  if (version >= 2) {
    decode_trainer(in, p);
  } else {
    fill_forward_modes(p);
  }
  for (auto& mb : p.microbatches) {
    if (version < 3) {
      mb.layout = implied_layout(mb);
      continue;
    }
    const std::uint8_t l = in.u8("microbatch.layout");
    if (std::string_view(layout_name(static_cast<Layout>(l))) == "?") {
      in.fail("microbatch.layout", fmt::format("expected 0 (padded), 1 (packed) or 2 (packed-mask), found {}", l));
    }
    mb.layout = static_cast<Layout>(l);
  }
  if (version >= 4) {
    p.max_seq_len = in.u32("max_seq_len");
    p.max_target_len = in.u32("max_target_len");
    const std::uint8_t offsets = in.u8("has_offsets");
    if (offsets > 1) in.fail("has_offsets", fmt::format("expected 0 or 1, found {}", offsets));
    bool any = false;
    for (auto& mb : p.microbatches) {
      if (offsets == 0) break;
      in.need(mb.refs.size(), "microbatch.refs.offset");
      for (auto& r : mb.refs) {
        r.offset = in.u32("microbatch.refs.offset");
        any = any || r.offset != 0;
      }
    }
    // Canonical: the flag is set exactly when some offset is not 0 (decode -> encode is byte-identical).
    if (offsets == 1 && !any) in.fail("has_offsets", "expected 0: no ref is a chunk (every offset is 0)");
  }
  if (version >= 5) p.dataset.fingerprint = in.fixed64("dataset");
  if (version >= 6) {
    const std::uint8_t slices = in.u8("has_slices");
    if (slices > 1) in.fail("has_slices", fmt::format("expected 0 or 1, found {}", slices));
    bool any = false;
    for (auto& mb : p.microbatches) {
      if (slices == 0) break;
      const std::uint8_t has = in.u8("microbatch.has_slices");
      if (has > 1) in.fail("microbatch.has_slices", fmt::format("expected 0 or 1, found {}", has));
      if (has == 0) continue;
      in.need(2ull * mb.samples.size(), "microbatch.slices");
      mb.prefix.resize(mb.samples.size());
      mb.prev.resize(mb.samples.size());
      bool linked = false;
      for (std::size_t i = 0; i < mb.samples.size(); ++i) {
        mb.prefix[i] = in.u32("microbatch.prefix");
        const std::uint64_t pv = in.var("microbatch.prev");
        if (pv > 0xFFFFFFFFull) in.fail("microbatch.prev", fmt::format("expected at most 2^32, found {}", pv));
        mb.prev[i] = pv == 0 ? kNoSlice : static_cast<std::uint32_t>(pv - 1);
        linked = linked || pv != 0 || mb.prefix[i] != 0;
      }
      // Canonical: a micro-batch's flag is set exactly when one of its entries is a later slice.
      if (!linked) in.fail("microbatch.has_slices", "expected 0: no entry has a prefix or a previous slice");
      any = true;
    }
    if (slices == 1 && !any) in.fail("has_slices", "expected 0: no micro-batch holds a later slice");
  }
  if (in.left() != 0) in.fail("end", fmt::format("expected the end of the body, found {} more bytes", in.left()));
  return p;
}

// ------------------------------------------------------------------------------------------
// JSON

Json ins_json(const Instruction& ins) {
  Json j;
  j["op"] = opcode_name(ins.op);
  const std::uint8_t f = opcode_fields(ins.op);
  auto put = [&](std::uint8_t bit, const char* key, std::uint32_t v) {
    if ((f & bit) && v != kNone) j[key] = v;
  };
  put(kFieldMb, "mb", ins.mb);
  put(kFieldStage, "stage", ins.stage);
  put(kFieldPeer, "peer", ins.peer);
  put(kFieldIn, "in", ins.in);
  put(kFieldIn2, "in2", ins.in2);
  put(kFieldOut, "out", ins.out);
  put(kFieldShape, "shape", ins.shape);
  if ((f & kFieldMode) && ins.mode != kNone) {
    j["recompute"] = ins.mode < 3 ? recompute_name(static_cast<Recompute>(ins.mode)) : "?";
  }
  return j;
}

class JIn {
 public:
  explicit JIn(const std::string& what) : what_(what) {}
  [[noreturn]] void fail(const std::string& ptr, const std::string& msg) const {
    PACKPIPE_THROW(Error, "{}: field '{}': {}", what_, ptr, msg);
  }
  static std::string kind(const Json& j) { return j.type_name(); }
  const Json& at(const Json& j, const std::string& ptr, const char* key) const {
    if (!j.is_object()) fail(ptr, fmt::format("expected an object, found {}", kind(j)));
    auto it = j.find(key);
    if (it == j.end()) fail(ptr + "/" + key, "expected a value, found none (missing)");
    return *it;
  }
  std::uint64_t u64(const Json& j, const std::string& ptr, std::uint64_t max = std::numeric_limits<std::uint64_t>::max()) const {
    if (!j.is_number_unsigned() && !(j.is_number_integer() && j.get<std::int64_t>() >= 0)) {
      fail(ptr, fmt::format("expected a non-negative integer, found {} {}", kind(j), j.dump()));
    }
    const auto v = j.get<std::uint64_t>();
    if (v > max) fail(ptr, fmt::format("expected at most {}, found {}", max, v));
    return v;
  }
  std::uint32_t u32(const Json& j, const std::string& ptr) const { return static_cast<std::uint32_t>(u64(j, ptr, 0xFFFFFFFEull)); }
  double num(const Json& j, const std::string& ptr) const {
    if (!j.is_number()) fail(ptr, fmt::format("expected a number, found {} {}", kind(j), j.dump()));
    return j.get<double>();
  }
  std::string str(const Json& j, const std::string& ptr) const {
    if (!j.is_string()) fail(ptr, fmt::format("expected a string, found {} {}", kind(j), j.dump()));
    return j.get<std::string>();
  }
  const Json& arr(const Json& j, const std::string& ptr, std::size_t expected = SIZE_MAX) const {
    if (!j.is_array()) fail(ptr, fmt::format("expected an array, found {}", kind(j)));
    if (expected != SIZE_MAX && j.size() != expected) fail(ptr, fmt::format("expected {} entries, found {}", expected, j.size()));
    return j;
  }
  // Refuses a key not in `keys`: a misspelt optional field ("refz") would otherwise be dropped.
  void only(const Json& j, const std::string& ptr, std::initializer_list<const char*> keys) const {
    if (!j.is_object()) fail(ptr, fmt::format("expected an object, found {}", kind(j)));
    for (auto it = j.begin(); it != j.end(); ++it) {
      if (std::none_of(keys.begin(), keys.end(), [&](const char* k) { return it.key() == k; })) {
        std::string known;
        for (const char* k : keys) known += (known.empty() ? "" : ", ") + std::string(k);
        fail(ptr + "/" + it.key(), fmt::format("unknown field; expected one of {}", known));
      }
    }
  }
  template <class T>
  std::vector<T> u_list(const Json& j, const std::string& ptr, std::size_t expected = SIZE_MAX) const {
    arr(j, ptr, expected);
    std::vector<T> out;
    out.reserve(j.size());
    for (std::size_t i = 0; i < j.size(); ++i) {
      out.push_back(static_cast<T>(u64(j[i], ptr + "/" + std::to_string(i),
                                       sizeof(T) == 4 ? 0xFFFFFFFFull : std::numeric_limits<std::uint64_t>::max())));
    }
    return out;
  }

 private:
  std::string what_;
};

}  // namespace

// ------------------------------------------------------------------------------------------

std::vector<std::uint8_t> encode_plan(const Plan& plan, const EncodeOptions& options) {
  Out body;
  encode_body(plan, body);
  std::vector<std::uint8_t> stored;
  std::uint16_t flags = 0;
  if (options.compress) {
    flags |= kFlagZstd;
    stored.resize(ZSTD_compressBound(body.b.size()));
    const std::size_t n = PACKPIPE_CHECK_ZSTD(
        ZSTD_compress(stored.data(), stored.size(), body.b.data(), body.b.size(), options.zstd_level),
        "encode_plan: compression of a {}-byte body failed", body.b.size());
    stored.resize(n);
  } else {
    stored = std::move(body.b);
  }
  Out o;
  o.b.reserve(kHeaderSize + stored.size());
  o.b.insert(o.b.end(), kPlanMagic, kPlanMagic + 4);
  o.le(kPlanFormatVersion, 2);
  o.le(flags, 2);
  o.le(options.compress ? body.b.size() : stored.size(), 8);
  o.le(stored.size(), 8);
  o.le(XXH64(stored.data(), stored.size(), 0), 8);
  o.b.insert(o.b.end(), stored.begin(), stored.end());
  return std::move(o.b);
}

Plan decode_plan(const std::uint8_t* data, std::size_t size, const std::string& what, bool verify_checksum) {
  PACKPIPE_CHECK(size >= kHeaderSize, "{}: offset 0: field 'header': expected {} bytes, found {} (truncated)", what,
                 kHeaderSize, size);
  PACKPIPE_CHECK(std::memcmp(data, kPlanMagic, 4) == 0, "{}: offset 0: field 'magic': expected 'PPLN', found {}", what,
                 show_magic(data, size));
  const auto version = static_cast<std::uint16_t>(rd_le(data + 4, 2));
  PACKPIPE_CHECK(version >= 1 && version <= kPlanFormatVersion,
                 "{}: offset 4: field 'version': expected 1..{}, found {} (written by a newer packpipe?)", what,
                 kPlanFormatVersion, version);
  const auto flags = static_cast<std::uint16_t>(rd_le(data + 6, 2));
  PACKPIPE_CHECK((flags & ~kFlagZstd) == 0, "{}: offset 6: field 'flags': expected bits 0x{:x}, found 0x{:x}", what,
                 kFlagZstd, flags);
  const std::uint64_t body_size = rd_le(data + 8, 8);
  const std::uint64_t stored_size = rd_le(data + 16, 8);
  const std::uint64_t checksum = rd_le(data + 24, 8);
  PACKPIPE_CHECK(stored_size == size - kHeaderSize,
                 "{}: offset 16: field 'stored_size': expected {} (the bytes after the header), found {}{}", what,
                 size - kHeaderSize, stored_size, stored_size > size - kHeaderSize ? " (truncated)" : "");
  const std::uint8_t* stored = data + kHeaderSize;
  if (verify_checksum) {
    const std::uint64_t actual = XXH64(stored, stored_size, 0);
    PACKPIPE_CHECK(actual == checksum,
                   "{}: offset 24: field 'checksum': expected XXH64 0x{:016x} of the body, found 0x{:016x} (corrupt)", what,
                   actual, checksum);
  }
  std::vector<std::uint8_t> raw;
  const std::uint8_t* body = stored;
  if (flags & kFlagZstd) {
    PACKPIPE_CHECK(body_size <= kMaxBody, "{}: offset 8: field 'body_size': expected at most {}, found {}", what, kMaxBody,
                   body_size);
    const unsigned long long frame = ZSTD_getFrameContentSize(stored, stored_size);
    PACKPIPE_CHECK(frame != ZSTD_CONTENTSIZE_ERROR && frame != ZSTD_CONTENTSIZE_UNKNOWN && frame == body_size,
                   "{}: offset {}: field 'zstd frame': expected a frame of {} bytes, found {}", what, kHeaderSize, body_size,
                   frame == ZSTD_CONTENTSIZE_ERROR ? std::string("no valid frame")
                   : frame == ZSTD_CONTENTSIZE_UNKNOWN ? std::string("an unknown size")
                                                       : std::to_string(frame));
    raw.resize(body_size);
    const std::size_t n = PACKPIPE_CHECK_ZSTD(ZSTD_decompress(raw.data(), raw.size(), stored, stored_size),
                                              "{}: offset {}: field 'body': decompression failed", what, kHeaderSize);
    PACKPIPE_CHECK(n == body_size, "{}: offset {}: field 'body': zstd decompression failed: {} of {} bytes", what,
                   kHeaderSize, n, body_size);
    body = raw.data();
  } else {
    PACKPIPE_CHECK(body_size == stored_size, "{}: offset 8: field 'body_size': expected {} (uncompressed), found {}", what,
                   stored_size, body_size);
  }
  // Offsets in errors are file offsets when uncompressed, offsets into the body otherwise.
  In in(body, static_cast<std::size_t>(body_size), (flags & kFlagZstd) ? what + " (decompressed body)" : what,
        (flags & kFlagZstd) ? 0 : kHeaderSize);
  return decode_body(in, version);
}

std::string plan_to_json(const Plan& p, int indent, std::int64_t rank) {
  PACKPIPE_CHECK_ARG(indent >= -1 && indent <= kMaxJsonIndent,
                     "indent must be in [-1, {}] (-1: one line, 0: one value a line), found {}", kMaxJsonIndent, indent);
  PACKPIPE_CHECK_ARG(rank >= -1 && (rank < 0 || static_cast<std::size_t>(rank) < p.streams.size()),
                     "rank must be -1 (every rank) or one of the plan's {} ranks (0 to {}), found {}", p.streams.size(),
                     static_cast<std::int64_t>(p.streams.size()) - 1, rank);
  Json j;
  j["format"] = "packpipe-plan";
  j["version"] = kPlanFormatVersion;
  j["iteration"] = p.iteration;
  j["schedule"] = p.schedule;
  j["ranks"] = p.ranks;
  j["vstages"] = p.vstages;
  j["stage_rank"] = p.stage_rank;
  j["dp"] = p.dp;
  j["replica"] = p.replica;
  j["global_tokens"] = p.global_tokens;
  j["makespan_ms"] = p.makespan_ms;
  j["memory_limit_bytes"] = p.memory_limit_bytes;
  if (p.max_seq_len > 0) j["max_seq_len"] = p.max_seq_len;
  if (p.max_target_len > 0) j["max_target_len"] = p.max_target_len;
  if (p.dataset.known()) j["dataset"] = fmt::format("{:016x}", p.dataset.fingerprint);
  j["static_bytes"] = p.static_bytes;
  j["buffer_slots"] = p.buffer_slots;
  Json shapes = Json::array();
  for (const auto& s : p.shapes) {
    shapes.push_back(Json{{"rows", s.rows}, {"seq", s.seq}, {"hidden", s.hidden}, {"enc_seq", s.enc_seq},
                          {"dtype", dtype_name(s.dtype)}});
  }
  j["shapes"] = std::move(shapes);
  Json mbs = Json::array();
  for (std::size_t m = 0; m < p.microbatches.size(); ++m) {
    const auto& mb = p.microbatches[m];
    Json o;
    o["rows"] = mb.rows;
    o["padded_len"] = mb.padded_len;
    o["padded_dec_len"] = mb.padded_dec_len;
    o["tokens"] = mb.tokens;
    o["loss_weight"] = mb.loss_weight;
    o["samples"] = mb.samples;
    if (!mb.refs.empty()) {
      Json refs = Json::array();
      for (const auto& r : mb.refs) {
        refs.push_back(r.offset == 0 ? Json::array({r.task, r.index}) : Json::array({r.task, r.index, r.offset}));
      }
      o["refs"] = std::move(refs);
    }
    if (!mb.row_offsets.empty()) o["row_offsets"] = mb.row_offsets;
    o["layout"] = layout_name(mb.layout);
    Json rc = Json::array(), st = Json::array(), pk = Json::array();
    for (std::size_t v = 0; v < p.vstages; ++v) {
      const std::size_t i = m * p.vstages + v;
      rc.push_back(i < p.recompute.size() ? recompute_name(static_cast<Recompute>(p.recompute[i])) : "?");
      st.push_back(i < p.stored_bytes.size() ? p.stored_bytes[i] : 0);
      pk.push_back(i < p.peak_bytes.size() ? p.peak_bytes[i] : 0);
    }
    o["recompute"] = std::move(rc);
    o["stored_bytes"] = std::move(st);
    o["peak_bytes"] = std::move(pk);
    if (!p.stages.empty()) {
      o["loss_tokens"] = mb.loss_tokens;
      o["lengths"] = mb.lengths;
      if (!mb.target_lengths.empty()) o["target_lengths"] = mb.target_lengths;
    }
    if (mb.has_slices()) {
      o["prefix"] = mb.prefix;
      Json prev = Json::array();
      for (const auto x : mb.prev) prev.push_back(x == kNoSlice ? Json(nullptr) : Json(x));
      o["prev"] = std::move(prev);
    }
    mbs.push_back(std::move(o));
  }
  j["microbatches"] = std::move(mbs);
  if (!p.stages.empty()) {
    Json stages = Json::array();
    for (const auto& s : p.stages) {
      Json loads = Json::array();
      for (const auto& t : kLoadTensorNames) {
        if (s.loads & t.value) loads.push_back(t.name);
      }
      stages.push_back(Json{{"encoder_layers", Json::array({s.encoder_begin, s.encoder_layers})},
                            {"decoder_layers", Json::array({s.decoder_begin, s.decoder_layers})},
                            {"embedding", s.embedding},
                            {"head", s.head},
                            {"loads", std::move(loads)}});
    }
    j["stages"] = std::move(stages);
    j["dtype"] = dtype_name(p.dtype);
    j["loss_mode"] = loss_mode_name(p.loss_mode);
    j["global_loss_tokens"] = p.global_loss_tokens;
    j["tied_embedding"] = p.tied_embedding;
    j["rank_layout"] = "replica-major";
  }
  Json streams = Json::array();
  for (std::size_t r = 0; r < p.streams.size(); ++r) {
    if (rank >= 0 && static_cast<std::size_t>(rank) != r) continue;
    Json s = Json::array();
    for (const auto& ins : p.streams[r]) s.push_back(ins_json(ins));
    streams.push_back(std::move(s));
  }
  if (rank >= 0) {
    j["rank"] = rank;
    j["stream"] = streams.empty() ? Json::array() : streams[0];
  } else {
    j["streams"] = std::move(streams);
  }
  if (!p.timeline.empty()) {
    Json tl = Json::array();
    for (std::size_t r = 0; r < p.timeline.size(); ++r) {
      if (rank >= 0 && static_cast<std::size_t>(rank) != r) continue;
      Json ops = Json::array();
      for (const auto& op : p.timeline[r]) {
        ops.push_back(Json::array({op_kind_token(op.kind), op.mb, op.vstage, op.start_ms, op.end_ms}));
      }
      tl.push_back(std::move(ops));
    }
    j["timeline"] = std::move(tl);
  }
  return j.dump(indent);
}

namespace {

void read_json_trainer(const Json& j, const JIn& in, Plan& p) {
  const Json& stages = in.arr(j["stages"], "/stages", p.vstages);
  for (std::size_t v = 0; v < stages.size(); ++v) {
    const std::string ptr = "/stages/" + std::to_string(v);
    const Json& s = stages[v];
    in.only(s, ptr, {"encoder_layers", "decoder_layers", "embedding", "head", "loads"});
    StageSpec st;
    const auto enc = in.u_list<std::uint32_t>(in.at(s, ptr, "encoder_layers"), ptr + "/encoder_layers", 2);
    const auto dec = in.u_list<std::uint32_t>(in.at(s, ptr, "decoder_layers"), ptr + "/decoder_layers", 2);
    st.encoder_begin = enc[0];
    st.encoder_layers = enc[1];
    st.decoder_begin = dec[0];
    st.decoder_layers = dec[1];
    const Json& e = in.at(s, ptr, "embedding");
    const Json& h = in.at(s, ptr, "head");
    if (!e.is_boolean()) in.fail(ptr + "/embedding", "expected true or false");
    if (!h.is_boolean()) in.fail(ptr + "/head", "expected true or false");
    st.embedding = e.get<bool>();
    st.head = h.get<bool>();
    const Json& loads = in.arr(in.at(s, ptr, "loads"), ptr + "/loads");
    for (std::size_t i = 0; i < loads.size(); ++i) {
      const std::string name = in.str(loads[i], ptr + "/loads/" + std::to_string(i));
      const auto* t = enum_find(kLoadTensorNames, name);
      if (t == nullptr) {
        in.fail(ptr + "/loads/" + std::to_string(i),
                fmt::format("expected one of {}, found \"{}\"", enum_name_list(kLoadTensorNames), name));
      }
      st.loads |= t->value;
    }
    p.stages.push_back(st);
  }
  const std::string d = in.str(in.at(j, "", "dtype"), "/dtype");
  const auto* dt = enum_find(kDtypeNames, d);
  if (dt == nullptr) in.fail("/dtype", fmt::format("expected one of {}, found \"{}\"", enum_name_list(kDtypeNames), d));
  p.dtype = dt->value;
  const std::string lm = in.str(in.at(j, "", "loss_mode"), "/loss_mode");
  const auto* mode = enum_find(kLossModeNames, lm);
  if (mode == nullptr) in.fail("/loss_mode", fmt::format("expected one of {}, found \"{}\"", enum_name_list(kLossModeNames), lm));
  p.loss_mode = mode->value;
  p.global_loss_tokens = in.u64(in.at(j, "", "global_loss_tokens"), "/global_loss_tokens");
  const Json& tied = in.at(j, "", "tied_embedding");
  if (!tied.is_boolean()) in.fail("/tied_embedding", "expected true or false");
  p.tied_embedding = tied.get<bool>();
  const std::string layout = in.str(in.at(j, "", "rank_layout"), "/rank_layout");
  if (layout != "replica-major") in.fail("/rank_layout", fmt::format("expected \"replica-major\", found \"{}\"", layout));
  for (std::size_t m = 0; m < p.microbatches.size(); ++m) {
    const auto& mb = p.microbatches[m];
    if (mb.lengths.size() != mb.samples.size()) {
      in.fail("/microbatches/" + std::to_string(m) + "/lengths",
              fmt::format("expected {} entries (a format-2 plan lists every sample's length), found {}", mb.samples.size(),
                          mb.lengths.size()));
    }
  }
}

}  // namespace

Plan plan_from_json(const std::string& text, const std::string& what) {
  Json j;
  j = parse_ordered_json(text, what);  // duplicate keys refused, depth bounded; Error names byte and line
  JIn in(what);
  Plan p;
  const std::string fmt_name = in.str(in.at(j, "", "format"), "/format");
  if (fmt_name != "packpipe-plan") in.fail("/format", fmt::format("expected \"packpipe-plan\", found \"{}\"", fmt_name));
  const auto version = in.u64(in.at(j, "", "version"), "/version");
  if (version < 1 || version > kPlanFormatVersion) in.fail("/version", fmt::format("expected 1..{}, found {}", kPlanFormatVersion, version));
  if (j.contains("stream")) in.fail("/stream", "this JSON holds one rank's stream only (written by inspect --rank); it is not a whole plan");
  in.only(j, "", {"format", "version", "iteration", "schedule", "ranks", "vstages", "stage_rank", "dp", "replica",
                  "global_tokens", "makespan_ms", "memory_limit_bytes", "static_bytes", "buffer_slots", "shapes",
                  "microbatches", "streams", "timeline", "stages", "dtype", "loss_mode", "global_loss_tokens",
                  "tied_embedding", "rank_layout", "max_seq_len", "max_target_len", "dataset"});
  p.iteration = in.u64(in.at(j, "", "iteration"), "/iteration");
  for (auto [key, field] :
       {std::pair{"max_seq_len", &Plan::max_seq_len}, std::pair{"max_target_len", &Plan::max_target_len}}) {
    if (!j.contains(key)) continue;
    const std::string ptr = std::string("/") + key;
    if (version < 4) in.fail(ptr, "a format-1 to -3 plan has no context length (format 4 has)");
    p.*field = static_cast<std::uint32_t>(in.u64(j[key], ptr, 0xFFFFFFFFull));
  }
  if (j.contains("dataset")) {
    if (version < 5) in.fail("/dataset", "a format-1 to -4 plan names no dataset (format 5 does)");
    // Canonical: 16 lower-case hex digits, never all 0 (an unknown dataset is written as no field).
    const std::string hex = in.str(j["dataset"], "/dataset");
    std::uint64_t f = 0;
    const auto [end, ec] = std::from_chars(hex.data(), hex.data() + hex.size(), f, 16);
    if (ec != std::errc() || end != hex.data() + hex.size() || f == 0 || fmt::format("{:016x}", f) != hex) {
      in.fail("/dataset", fmt::format("expected the dataset's fingerprint, 16 lower-case hex digits not all 0, "
                                      "found \"{}\"", hex));
    }
    p.dataset.fingerprint = f;
  }
  p.schedule = in.str(in.at(j, "", "schedule"), "/schedule");
  p.ranks = static_cast<std::uint32_t>(in.u64(in.at(j, "", "ranks"), "/ranks", 1u << 24));
  p.vstages = static_cast<std::uint32_t>(in.u64(in.at(j, "", "vstages"), "/vstages", 1u << 24));
  p.stage_rank = in.u_list<std::uint32_t>(in.at(j, "", "stage_rank"), "/stage_rank", p.vstages);
  p.dp = static_cast<std::uint32_t>(in.u64(in.at(j, "", "dp"), "/dp", 0xFFFFFFFFull));
  p.replica = static_cast<std::uint32_t>(in.u64(in.at(j, "", "replica"), "/replica", 0xFFFFFFFFull));
  p.global_tokens = in.u64(in.at(j, "", "global_tokens"), "/global_tokens");
  p.makespan_ms = in.num(in.at(j, "", "makespan_ms"), "/makespan_ms");
  p.memory_limit_bytes = in.u64(in.at(j, "", "memory_limit_bytes"), "/memory_limit_bytes");
  p.static_bytes = in.u_list<std::uint64_t>(in.at(j, "", "static_bytes"), "/static_bytes", p.ranks);
  p.buffer_slots = in.u_list<std::uint32_t>(in.at(j, "", "buffer_slots"), "/buffer_slots", p.ranks);
  const Json& shapes = in.arr(in.at(j, "", "shapes"), "/shapes");
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    const std::string ptr = "/shapes/" + std::to_string(i);
    const Json& s = shapes[i];
    in.only(s, ptr, {"rows", "seq", "hidden", "enc_seq", "dtype"});
    TensorShape t;
    t.rows = static_cast<std::uint32_t>(in.u64(in.at(s, ptr, "rows"), ptr + "/rows", 0xFFFFFFFFull));
    t.seq = static_cast<std::uint32_t>(in.u64(in.at(s, ptr, "seq"), ptr + "/seq", 0xFFFFFFFFull));
    t.hidden = static_cast<std::uint32_t>(in.u64(in.at(s, ptr, "hidden"), ptr + "/hidden", 0xFFFFFFFFull));
    t.enc_seq = static_cast<std::uint32_t>(in.u64(in.at(s, ptr, "enc_seq"), ptr + "/enc_seq", 0xFFFFFFFFull));
    const std::string d = in.str(in.at(s, ptr, "dtype"), ptr + "/dtype");
    const auto* dt = enum_find(kDtypeNames, d);
    if (dt == nullptr) in.fail(ptr + "/dtype", fmt::format("expected one of {}, found \"{}\"", enum_name_list(kDtypeNames), d));
    t.dtype = dt->value;
    p.shapes.push_back(t);
  }
  const Json& mbs = in.arr(in.at(j, "", "microbatches"), "/microbatches");
  const std::size_t N = mbs.size(), V = p.vstages;
  p.recompute.resize(N * V);
  p.stored_bytes.resize(N * V);
  p.peak_bytes.resize(N * V);
  for (std::size_t m = 0; m < N; ++m) {
    const std::string ptr = "/microbatches/" + std::to_string(m);
    const Json& o = mbs[m];
    in.only(o, ptr, {"rows", "padded_len", "padded_dec_len", "tokens", "loss_weight", "samples", "refs", "row_offsets",
                     "layout", "recompute", "stored_bytes", "peak_bytes", "loss_tokens", "lengths", "target_lengths",
                     "prefix", "prev"});
    PlanMicroBatch mb;
    mb.rows = static_cast<std::uint32_t>(in.u64(in.at(o, ptr, "rows"), ptr + "/rows", 0xFFFFFFFFull));
    mb.padded_len = static_cast<std::uint32_t>(in.u64(in.at(o, ptr, "padded_len"), ptr + "/padded_len", 0xFFFFFFFFull));
    mb.padded_dec_len = static_cast<std::uint32_t>(in.u64(in.at(o, ptr, "padded_dec_len"), ptr + "/padded_dec_len", 0xFFFFFFFFull));
    mb.tokens = in.u64(in.at(o, ptr, "tokens"), ptr + "/tokens");
    mb.loss_weight = in.num(in.at(o, ptr, "loss_weight"), ptr + "/loss_weight");
    mb.samples = in.u_list<std::uint32_t>(in.at(o, ptr, "samples"), ptr + "/samples");
    if (o.contains("refs")) {
      const Json& refs = in.arr(o["refs"], ptr + "/refs", mb.samples.size());
      for (std::size_t i = 0; i < refs.size(); ++i) {
        const std::string rp = ptr + "/refs/" + std::to_string(i);
        // [task, index], or [task, index, offset] for a chunk (format 4)
        const Json& ref = in.arr(refs[i], rp);
        if (ref.size() != 2 && !(ref.size() == 3 && version >= 4)) {
          in.fail(rp, fmt::format("expected [task, index]{}, found {} entries",
                                  version >= 4 ? " or [task, index, offset]" : "", ref.size()));
        }
        SampleRef r{static_cast<std::uint32_t>(in.u64(ref[0], rp + "/0", 0xFFFFFFFFull)), in.u64(ref[1], rp + "/1")};
        if (ref.size() == 3) r.offset = static_cast<std::uint32_t>(in.u64(ref[2], rp + "/2", 0xFFFFFFFFull));
        mb.refs.push_back(r);
      }
    }
    if (o.contains("row_offsets")) mb.row_offsets = in.u_list<std::uint32_t>(o["row_offsets"], ptr + "/row_offsets");
    if (version >= 3) {
      const std::string name = in.str(in.at(o, ptr, "layout"), ptr + "/layout");
      const auto* l = enum_find(kLayoutNames, name);
      if (l == nullptr) {
        in.fail(ptr + "/layout", fmt::format("expected one of {}, found \"{}\"", enum_name_list(kLayoutNames), name));
      }
      mb.layout = l->value;
    } else {
      if (o.contains("layout")) in.fail(ptr + "/layout", "a format-1 or -2 plan has no layouts (format 3 has)");
      mb.layout = implied_layout(mb);
    }
    if (o.contains("loss_tokens")) mb.loss_tokens = in.u64(o["loss_tokens"], ptr + "/loss_tokens");
    if (o.contains("lengths")) mb.lengths = in.u_list<std::uint32_t>(o["lengths"], ptr + "/lengths", mb.samples.size());
    if (o.contains("target_lengths")) {
      mb.target_lengths = in.u_list<std::uint32_t>(o["target_lengths"], ptr + "/target_lengths", mb.samples.size());
    }
    if (o.contains("prefix") || o.contains("prev")) {
      if (version < 6) in.fail(ptr + "/prefix", "a format-1 to -5 plan has no slices (format 6 has)");
      mb.prefix = in.u_list<std::uint32_t>(in.at(o, ptr, "prefix"), ptr + "/prefix", mb.samples.size());
      const Json& prev = in.arr(in.at(o, ptr, "prev"), ptr + "/prev", mb.samples.size());
      bool linked = false;
      for (std::size_t i = 0; i < prev.size(); ++i) {
        const std::string pp = ptr + "/prev/" + std::to_string(i);
        mb.prev.push_back(prev[i].is_null() ? kNoSlice : static_cast<std::uint32_t>(in.u64(prev[i], pp, 0xFFFFFFFEull)));
        linked = linked || mb.prev.back() != kNoSlice || mb.prefix[i] != 0;
      }
      if (!linked) in.fail(ptr + "/prefix", "no entry has a prefix or a previous slice: leave out prefix and prev");
    }
    const Json& rc = in.arr(in.at(o, ptr, "recompute"), ptr + "/recompute", V);
    const auto st = in.u_list<std::uint64_t>(in.at(o, ptr, "stored_bytes"), ptr + "/stored_bytes", V);
    const auto pk = in.u_list<std::uint64_t>(in.at(o, ptr, "peak_bytes"), ptr + "/peak_bytes", V);
    for (std::size_t v = 0; v < V; ++v) {
      const std::string name = in.str(rc[v], ptr + "/recompute/" + std::to_string(v));
      const auto* mode = enum_find(kRecomputeNames, name);
      if (mode == nullptr) {
        in.fail(ptr + "/recompute/" + std::to_string(v),
                fmt::format("expected one of {}, found \"{}\"", enum_name_list(kRecomputeNames), name));
      }
      p.recompute[m * V + v] = static_cast<std::uint8_t>(mode->value);
      p.stored_bytes[m * V + v] = st[v];
      p.peak_bytes[m * V + v] = pk[v];
    }
    p.microbatches.push_back(std::move(mb));
  }
  const Json& streams = in.arr(in.at(j, "", "streams"), "/streams", p.ranks);
  p.streams.resize(p.ranks);
  for (std::size_t r = 0; r < p.ranks; ++r) {
    const std::string sp = "/streams/" + std::to_string(r);
    const Json& s = in.arr(streams[r], sp);
    for (std::size_t i = 0; i < s.size(); ++i) {
      const std::string ptr = sp + "/" + std::to_string(i);
      Instruction ins;
      const std::string name = in.str(in.at(s[i], ptr, "op"), ptr + "/op");
      try {
        ins.op = opcode_from_name(name);
      } catch (const InvalidArgument&) {
        in.fail(ptr + "/op", fmt::format("expected an instruction name (FWD, BWD, SEND_ACT_START, ...), found \"{}\"", name));
      }
      const std::uint8_t f = opcode_fields(ins.op);
      for (auto it = s[i].begin(); it != s[i].end(); ++it) {
        const std::string& key = it.key();
        if (key == "op") continue;
        struct K {
          const char* name;
          std::uint8_t bit;
          std::uint32_t Instruction::*field;
        };
        static const K keys[] = {{"mb", kFieldMb, &Instruction::mb},       {"stage", kFieldStage, &Instruction::stage},
                                 {"peer", kFieldPeer, &Instruction::peer}, {"in", kFieldIn, &Instruction::in},
                                 {"in2", kFieldIn2, &Instruction::in2},    {"out", kFieldOut, &Instruction::out},
                                 {"shape", kFieldShape, &Instruction::shape}};
        if (key == "recompute" && (f & kFieldMode) && version >= 2) {
          const std::string rn = in.str(it.value(), ptr + "/recompute");
          const auto* mode = enum_find(kRecomputeNames, rn);
          if (mode == nullptr) {
            in.fail(ptr + "/recompute", fmt::format("expected one of {}, found \"{}\"", enum_name_list(kRecomputeNames), rn));
          }
          ins.mode = static_cast<std::uint32_t>(mode->value);
          continue;
        }
        bool known = false;
        for (const auto& k : keys) {
          if (key != k.name) continue;
          known = true;
          if (!(f & k.bit)) in.fail(ptr + "/" + key, fmt::format("{} has no field '{}'", name, key));
          ins.*(k.field) = in.u32(it.value(), ptr + "/" + key);
        }
        if (!known) in.fail(ptr + "/" + key, "unknown instruction field");
      }
      p.streams[r].push_back(ins);
    }
  }
  if (version < 2) fill_forward_modes(p);
  if (j.contains("stages")) read_json_trainer(j, in, p);
  if (j.contains("timeline")) {
    const Json& tl = in.arr(j["timeline"], "/timeline", p.ranks);
    p.timeline.resize(p.ranks);
    for (std::size_t r = 0; r < p.ranks; ++r) {
      const Json& ops = in.arr(tl[r], "/timeline/" + std::to_string(r));
      for (std::size_t i = 0; i < ops.size(); ++i) {
        const std::string ptr = "/timeline/" + std::to_string(r) + "/" + std::to_string(i);
        const Json& a = in.arr(ops[i], ptr, 5);
        ScheduledOp op;
        const std::string k = in.str(a[0], ptr + "/0");
        const auto* kind = enum_find(kOpKindTokens, k);
        if (kind == nullptr) in.fail(ptr + "/0", fmt::format("expected one of {}, found \"{}\"", enum_name_list(kOpKindTokens), k));
        op.kind = kind->value;
        op.mb = static_cast<std::uint32_t>(in.u64(a[1], ptr + "/1", 0xFFFFFFFFull));
        op.vstage = static_cast<std::uint32_t>(in.u64(a[2], ptr + "/2", 0xFFFFFFFFull));
        op.start_ms = in.num(a[3], ptr + "/3");
        op.end_ms = in.num(a[4], ptr + "/4");
        p.timeline[r].push_back(op);
      }
    }
  }
  return p;
}

// ------------------------------------------------------------------------------------------
// Plan files

namespace {

// The files this process's PlanFileReaders have open, by (device, inode): a writer refuses to
// replace one (a plan file being read is an input of whatever writes beside it).
struct OpenPlanFiles {
  std::mutex mutex;
  std::map<std::pair<dev_t, ino_t>, std::vector<std::weak_ptr<const MappedFile>>> files;
};
OpenPlanFiles& open_plan_files() {
  static OpenPlanFiles* registry = new OpenPlanFiles;  // never destroyed: readers may outlive statics
  return *registry;
}

bool file_id(const std::string& path, std::pair<dev_t, ino_t>& id) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return false;
  id = {st.st_dev, st.st_ino};
  return true;
}

void register_open(const std::string& path, const std::shared_ptr<const MappedFile>& map) {
  std::pair<dev_t, ino_t> id;
  if (!file_id(path, id)) return;
  OpenPlanFiles& r = open_plan_files();
  const std::lock_guard<std::mutex> lock(r.mutex);
  auto& v = r.files[id];
  v.erase(std::remove_if(v.begin(), v.end(), [](const auto& w) { return w.expired(); }), v.end());
  v.push_back(map);
}

bool open_for_reading(const std::string& path) {
  std::pair<dev_t, ino_t> id;
  if (!file_id(path, id)) return false;
  OpenPlanFiles& r = open_plan_files();
  const std::lock_guard<std::mutex> lock(r.mutex);
  const auto it = r.files.find(id);
  if (it == r.files.end()) return false;
  return std::any_of(it->second.begin(), it->second.end(), [](const auto& w) { return !w.expired(); });
}

std::unique_ptr<AtomicFile> open_plan_output(const std::string& path) {
  PACKPIPE_CHECK(!open_for_reading(path),
                 "plan file '{}' is open for reading by a PlanFileReader (or a loader) of this process: writing it "
                 "would replace the plans being read; write to another path, or let the reader go first",
                 path);
  return std::make_unique<AtomicFile>(path);
}

}  // namespace

PlanFileWriter::PlanFileWriter(const std::string& path, const EncodeOptions& options)
    : path_(path), options_(options), out_(open_plan_output(path)) {
  Out h;
  h.b.insert(h.b.end(), kFileMagic, kFileMagic + 4);
  h.le(kPlanFileVersion, 2);
  h.le(0, 2);
  out_->write(h.b.data(), h.b.size());
  offset_ = h.b.size();
}

// Without a successful close() the temporary is removed: a run that fails mid-epoch leaves no file.
PlanFileWriter::~PlanFileWriter() = default;

void PlanFileWriter::expect_iterations(std::uint64_t first_iteration, std::uint64_t count) {
  PACKPIPE_CHECK_ARG(index_.empty(), "plan file '{}': expect_iterations() after the first plan", path_);
  PACKPIPE_CHECK_ARG(count > 0, "plan file '{}': expect_iterations() with 0 iterations", path_);
  first_expected_ = first_iteration;
  expected_ = count;
}

void PlanFileWriter::discard() noexcept { out_.reset(); }

namespace {

// Why plans of dataset `add` cannot join a file of dataset `have` (empty: they can; an unknown
// dataset joins any file).
std::string dataset_conflict(const DatasetIdentity& have, const DatasetIdentity& add) {
  if (!have.known() || !add.known()) return {};
  if (add.fingerprint != have.fingerprint) {
    return fmt::format("it indexes dataset {:016x}, the file's plans dataset {:016x}", add.fingerprint,
                       have.fingerprint);
  }
  if (have.tasks != nullptr && add.tasks != nullptr && *have.tasks != *add.tasks) {
    return fmt::format("dataset {:016x} is given with other tasks than before", add.fingerprint);
  }
  return {};
}

// `have` after plans of `add` joined it (dataset_conflict(have, add) is empty).
void adopt_dataset(DatasetIdentity& have, const DatasetIdentity& add) {
  if (!add.known()) return;
  if (!have.known()) {
    have = add;
  } else if (have.tasks == nullptr) {
    have.tasks = add.tasks;
  }
}

}  // namespace

void PlanFileWriter::set_dataset(const DatasetIdentity& dataset) {
  const std::string why = dataset_conflict(dataset_, dataset);
  PACKPIPE_CHECK_ARG(why.empty(), "plan file '{}': set_dataset: {} (a plan file indexes one dataset)", path_, why);
  adopt_dataset(dataset_, dataset);
}

void PlanFileWriter::append(const Plan& plan) {
  PACKPIPE_CHECK_ARG(plan.dp == 0 || plan.replica < plan.dp, "plan file '{}': iteration {}: replica {} of a plan of {} "
                     "replicas", path_, plan.iteration, plan.replica, plan.dp);
  const std::string why = dataset_conflict(dataset_, plan.dataset);
  PACKPIPE_CHECK_ARG(why.empty(), "plan file '{}': iteration {} replica {}: {} (a plan file indexes one dataset: "
                     "write the plans of another dataset to another file)", path_, plan.iteration, plan.replica, why);
  append_encoded(plan.iteration, plan.replica, encode_plan(plan, options_));
  adopt_dataset(dataset_, plan.dataset);
}

void PlanFileWriter::append_encoded(std::uint64_t iteration, std::uint32_t replica,
                                    const std::vector<std::uint8_t>& blob) {
  PACKPIPE_CHECK(out_ != nullptr, "plan file '{}' is closed", path_);
  PACKPIPE_CHECK_ARG(expected_ == 0 || (iteration >= first_expected_ && iteration - first_expected_ < expected_),
                     "plan file '{}': iteration {} is outside the declared iterations {}..{}", path_, iteration,
                     first_expected_, first_expected_ + expected_ - 1);
  // What the reader requires (PlanFileReader::open), refused here at once rather than in a file no
  // reader opens: consecutive iterations, replicas 0, 1, ... of each, as many in each as in the first.
  const char* rule = "plans go in iteration order, one iteration after another, each with the same replicas 0, 1, "
                     "... in order";
  if (index_.empty()) {
    PACKPIPE_CHECK_ARG(expected_ == 0 || iteration == first_expected_,
                       "plan file '{}': the first plan is iteration {}, the declared first iteration is {} ({})", path_,
                       iteration, first_expected_, rule);
    PACKPIPE_CHECK_ARG(replica == 0, "plan file '{}': iteration {} starts with replica {}, expected replica 0 ({})",
                       path_, iteration, replica, rule);
  } else if (iteration == index_.back().iteration) {
    PACKPIPE_CHECK_ARG(replica == last_replicas_ && (replicas_ == 0 || replica < replicas_),
                       "plan file '{}': iteration {} replica {} after its replica {}: expected replica {}{} ({})", path_,
                       iteration, replica, last_replicas_ - 1, last_replicas_,
                       replicas_ == 0 || last_replicas_ < replicas_
                           ? std::string()
                           : fmt::format(", but iteration {} had only {} replicas", index_.front().iteration, replicas_),
                       rule);
  } else {
    PACKPIPE_CHECK_ARG(iteration == index_.back().iteration + 1,
                       "plan file '{}': iteration {} appended after iteration {}: expected iteration {} or {} ({})",
                       path_, iteration, index_.back().iteration, index_.back().iteration,
                       index_.back().iteration + 1, rule);
    PACKPIPE_CHECK_ARG(replicas_ == 0 || last_replicas_ == replicas_,
                       "plan file '{}': iteration {} holds {} replicas, iteration {} held {} ({})", path_,
                       index_.back().iteration, last_replicas_, index_.front().iteration, replicas_, rule);
    PACKPIPE_CHECK_ARG(replica == 0, "plan file '{}': iteration {} starts with replica {}, expected replica 0 ({})",
                       path_, iteration, replica, rule);
  }
  out_->write(blob.data(), blob.size());
  if (!index_.empty() && iteration != index_.back().iteration) {
    if (replicas_ == 0) replicas_ = last_replicas_;
    last_replicas_ = 0;
  }
  index_.push_back(Entry{iteration, offset_, blob.size()});
  offset_ += blob.size();
  ++last_replicas_;
}

void PlanFileWriter::close() {
  if (out_ == nullptr) return;
  PACKPIPE_CHECK_ARG(replicas_ == 0 || last_replicas_ == replicas_,
                     "plan file '{}': the last iteration {} holds {} replicas, iteration {} held {}; a reader refuses "
                     "such a file (append the missing replicas, or discard())",
                     path_, index_.back().iteration, last_replicas_, index_.front().iteration, replicas_);
  Out o;
  for (const auto& e : index_) {
    o.le(e.iteration, 8);
    o.le(e.offset, 8);
    o.le(e.size, 8);
  }
  std::uint64_t distinct = 0;
  for (std::size_t i = 0; i < index_.size(); ++i) distinct += i == 0 || index_[i].iteration != index_[i - 1].iteration;
  const std::uint64_t first = index_.empty() ? first_expected_ : index_.front().iteration;
  const bool complete = expected_ == 0 || (distinct == expected_ && first == first_expected_);
  if (dataset_.known()) {  // the dataset record (format 3)
    o.le(dataset_.fingerprint, 8);
    const auto& tasks = dataset_.task_list();
    o.var(tasks.size());
    for (const auto& t : tasks) {
      o.str(t.name);
      o.var(t.samples);
    }
  }
  const std::size_t foot = o.b.size();
  o.le(index_.size(), 8);
  o.le(offset_, 8);
  o.le(first, 8);
  o.le(distinct, 8);
  o.le(expected_, 8);
  o.le((complete ? kFlagComplete : 0) | (dataset_.known() ? kFlagDataset : 0), 8);
  o.le(XXH64(o.b.data(), foot + 48, 0), 8);
  o.b.insert(o.b.end(), kIndexMagic, kIndexMagic + 4);
  o.le(kPlanFileVersion, 4);
  std::unique_ptr<AtomicFile> out = std::move(out_);
  out->write(o.b.data(), o.b.size());
  out->commit();
}

PlanFileReader::PlanFileReader(const std::string& path) : path_(path) {
  map_ = std::make_shared<MappedFile>(path);
  open(map_->data(), static_cast<std::size_t>(map_->size()));
  register_open(path, map_);
}

PlanFileReader PlanFileReader::from_memory(const std::uint8_t* data, std::size_t size, const std::string& what,
                                           bool verify_checksums) {
  PlanFileReader r;
  r.path_ = what;
  r.verify_ = verify_checksums;
  r.bytes_ = std::make_shared<std::vector<std::uint8_t>>(data, data + size);
  r.open(r.bytes_->data(), r.bytes_->size());
  return r;
}

void PlanFileReader::open(const std::uint8_t* data, std::size_t size) {
  data_ = data;
  size_ = size;
  const std::string& w = path_;
  std::size_t first = 0;
  while (first < size && (data[first] == ' ' || data[first] == '\n' || data[first] == '\r' || data[first] == '\t')) ++first;
  if (first < size && data[first] == '{') {
    json_ = true;
    const Plan p = plan_from_json(std::string(reinterpret_cast<const char*>(data), size), w);
    entries_.push_back(Entry{p.iteration, 0, size, p.replica});
    dataset_ = p.dataset;
    single_ = true;
    first_iteration_ = p.iteration;
    iterations_ = 1;
    return;
  }
  PACKPIPE_CHECK(size >= 4, "{}: offset 0: field 'magic': expected 'PPLF' (plan file), 'PPLN' (one plan) or a JSON object, "
                 "found {} bytes (truncated)", w, size);
  if (std::memcmp(data, kPlanMagic, 4) == 0) {
    const Plan p = decode_plan(data, size, w);
    entries_.push_back(Entry{p.iteration, 0, size, p.replica});
    dataset_ = p.dataset;
    single_ = true;
    first_iteration_ = p.iteration;
    iterations_ = 1;
    return;
  }
  PACKPIPE_CHECK(std::memcmp(data, kFileMagic, 4) == 0,
                 "{}: offset 0: field 'magic': expected 'PPLF' (plan file), 'PPLN' (one plan) or a JSON object, found {}", w,
                 show_magic(data, size));
  PACKPIPE_CHECK(size >= kFileHeaderSize + kFooterSize,
                 "{}: offset {}: field 'footer': expected at least {} bytes, found {} (truncated, or the writer was not "
                 "closed)", w, size, kFileHeaderSize + kFooterSize, size);
  const auto version = rd_le(data + 4, 2);
  PACKPIPE_CHECK(version >= kOldestPlanFileVersion && version <= kPlanFileVersion,
                 "{}: offset 4: field 'version': expected plan file format {} to {}, found {}{}", w,
                 kOldestPlanFileVersion, kPlanFileVersion, version,
                 version == 1 ? " (format 1 has no index checksum or completeness record: plan the epoch again to "
                                "rewrite it)"
                 : version > kPlanFileVersion ? " (written by a newer packpipe?)"
                                              : "");
  const auto header_flags = rd_le(data + 6, 2);
  PACKPIPE_CHECK(header_flags == 0, "{}: offset 6: field 'flags': expected 0 (no header flag is defined), found 0x{:x} "
                 "(corrupt, or written by a newer packpipe?)", w, header_flags);
  const std::uint8_t* foot = data + size - kFooterSize;
  PACKPIPE_CHECK(std::memcmp(foot + 56, kIndexMagic, 4) == 0,
                 "{}: offset {}: field 'footer magic': expected 'PPLI', found {} (truncated, or the writer was not "
                 "closed)", w, size - kFooterSize + 56, show_magic(foot + 56, 4));
  PACKPIPE_CHECK(rd_le(foot + 60, 4) == version,
                 "{}: offset {}: field 'footer version': expected {} (the header's), found {} (corrupt)", w,
                 size - kFooterSize + 60, version, rd_le(foot + 60, 4));
  const std::uint64_t count = rd_le(foot, 8);
  const std::uint64_t index_offset = rd_le(foot + 8, 8);
  const std::uint64_t foot_at = size - kFooterSize;
  const std::uint64_t flags = rd_le(foot + 40, 8);
  const std::uint64_t known_flags = kFlagComplete | (version >= 3 ? kFlagDataset : 0);
  PACKPIPE_CHECK((flags & ~known_flags) == 0, "{}: offset {}: field 'flags': unknown bits 0x{:x}", w,
                 size - kFooterSize + 40, flags & ~known_flags);
  const bool has_dataset = (flags & kFlagDataset) != 0;
  // The index, then (flag bit 1) the dataset record, then the footer: nothing else between them.
  PACKPIPE_CHECK(index_offset >= kFileHeaderSize && index_offset <= foot_at && count <= (foot_at - index_offset) / 24 &&
                     (has_dataset ? foot_at - index_offset > 24 * count : foot_at - index_offset == 24 * count),
                 "{}: offset {}: field 'index': expected {} entries of 24 bytes from offset {}{} up to the footer at {}, "
                 "found an index at offset {} for {} plans", w, size - kFooterSize, count, index_offset,
                 has_dataset ? ", then the dataset record," : "", foot_at, index_offset, count);
  const std::uint64_t index_end = index_offset + 24 * count;
  const std::uint64_t sum = XXH64(data + index_offset, static_cast<std::size_t>(foot_at - index_offset) + 48, 0);
  PACKPIPE_CHECK(!verify_ || sum == rd_le(foot + 48, 8),
                 "{}: offset {}: field 'index checksum': expected XXH64 0x{:016x} of the index and footer, found "
                 "0x{:016x} (corrupt or edited)", w, size - kFooterSize + 48, sum, rd_le(foot + 48, 8));
  if (has_dataset) {
    In in(data + index_end, static_cast<std::size_t>(foot_at - index_end), w, static_cast<std::size_t>(index_end));
    dataset_.fingerprint = in.fixed64("dataset.fingerprint");
    if (!dataset_.known()) in.fail("dataset.fingerprint", "expected a dataset's fingerprint, found 0 (flag bit 1 set)");
    auto tasks = std::make_shared<std::vector<DatasetTask>>(in.count("dataset.tasks", 2));
    for (auto& t : *tasks) {
      t.name = in.str("dataset.task.name");
      t.samples = in.var("dataset.task.samples");
    }
    if (in.left() != 0) in.fail("dataset", fmt::format("expected the footer, found {} more bytes", in.left()));
    if (!tasks->empty()) dataset_.tasks = std::move(tasks);
  }
  first_iteration_ = rd_le(foot + 16, 8);
  iterations_ = rd_le(foot + 24, 8);
  expected_iterations_ = rd_le(foot + 32, 8);
  complete_ = (flags & kFlagComplete) != 0;
  entries_.resize(count);
  std::uint64_t expect_offset = kFileHeaderSize, distinct = 0, group = 0, replicas = 0;
  for (std::uint64_t i = 0; i < count; ++i) {
    const std::uint8_t* e = data + index_offset + 24 * i;
    Entry& en = entries_[i];
    en.iteration = rd_le(e, 8);
    en.offset = rd_le(e + 8, 8);
    en.size = rd_le(e + 16, 8);
    const std::string field = fmt::format("{}: offset {}: field 'index[{}]'", w, index_offset + 24 * i, i);
    // Blobs are back to back: a removed, duplicated or redirected entry leaves a gap or an overlap.
    PACKPIPE_CHECK(en.offset == expect_offset && en.size <= index_offset - en.offset,
                   "{}: expected a plan at offset {} within bytes {}..{}, found offset {} size {}", field,
                   expect_offset, kFileHeaderSize, index_offset, en.offset, en.size);
    expect_offset = en.offset + en.size;
    const bool starts = i == 0 || en.iteration != entries_[i - 1].iteration;
    if (starts) {
      PACKPIPE_CHECK(i == 0 || en.iteration == entries_[i - 1].iteration + 1,
                     "{}: expected iteration {} (iterations are consecutive), found {}", field,
                     entries_[i - 1].iteration + 1, en.iteration);
      PACKPIPE_CHECK(i == 0 || group == replicas || replicas == 0, "{}: iteration {} has {} plans, the first has {}",
                     field, entries_[i - 1].iteration, group, replicas);
      if (i > 0 && replicas == 0) replicas = group;
      group = 0;
      ++distinct;
    }
    en.replica = group++;
  }
  PACKPIPE_CHECK(count == 0 || replicas == 0 || group == replicas,
                 "{}: field 'index': the last iteration has {} plans, the others {}", w, group, replicas);
  PACKPIPE_CHECK(expect_offset == index_offset || count == 0,
                 "{}: field 'index': the plans end at offset {} but the index starts at {}", w, expect_offset,
                 index_offset);
  PACKPIPE_CHECK(distinct == iterations_ && (count == 0 || entries_.front().iteration == first_iteration_),
                 "{}: field 'footer': records {} iterations from {}, the index holds {} from {}", w, iterations_,
                 first_iteration_, distinct, count == 0 ? 0 : entries_.front().iteration);
  PACKPIPE_CHECK(!complete_ || expected_iterations_ == 0 || expected_iterations_ == iterations_,
                 "{}: field 'footer': marked complete with {} of {} declared iterations", w, iterations_,
                 expected_iterations_);
}

std::uint64_t PlanFileReader::fingerprint() const {
  auto copy = [&](std::uint64_t offset, std::uint64_t n, std::uint8_t* out) {
    if (map_ != nullptr) {
      map_->read(offset, n, out);  // guarded: a truncated file is an Error
    } else {
      std::memcpy(out, data_ + offset, static_cast<std::size_t>(n));
    }
  };
  std::vector<std::uint8_t> ids;
  if (json_) {
    ids.resize(size_);
    copy(0, size_, ids.data());
    return XXH64(ids.data(), ids.size(), 0);
  }
  Out o;
  std::uint8_t header[kHeaderSize];
  for (const Entry& e : entries_) {
    copy(e.offset, kHeaderSize, header);  // every blob is at least a header (checked on open or read)
    o.le(e.iteration, 8);
    o.le(e.size, 8);
    o.b.insert(o.b.end(), header + 24, header + 32);  // XXH64 of the stored body
  }
  return XXH64(o.b.data(), o.b.size(), 0);
}

void PlanFileReader::require_complete(const std::string& how_to_allow) const {
  PACKPIPE_CHECK(complete_,
                 "{}: incomplete plan file: it holds {} of the {} iterations its writer declared ({}; the planning "
                 "run stopped early). Plan the epoch again, or, to train only the iterations it holds, {}",
                 path_, iterations_, expected_iterations_,
                 iterations_ == 0 ? std::string("none")
                                  : fmt::format("iterations {}..{}", first_iteration_, first_iteration_ + iterations_ - 1),
                 how_to_allow);
}

std::uint64_t PlanFileReader::iteration(std::size_t i) const {
  PACKPIPE_CHECK_RANGE(i < entries_.size(), "{}: plan {} out of range (file holds {})", path_, i, entries_.size());
  return entries_[i].iteration;
}

std::int64_t PlanFileReader::find(std::uint64_t iteration) const {
  const bool sorted = std::is_sorted(entries_.begin(), entries_.end(),
                                     [](const Entry& a, const Entry& b) { return a.iteration < b.iteration; });
  if (sorted) {
    const auto it = std::lower_bound(entries_.begin(), entries_.end(), iteration,
                                     [](const Entry& e, std::uint64_t x) { return e.iteration < x; });
    return it != entries_.end() && it->iteration == iteration ? static_cast<std::int64_t>(it - entries_.begin()) : -1;
  }
  for (std::size_t i = 0; i < entries_.size(); ++i) {
    if (entries_[i].iteration == iteration) return static_cast<std::int64_t>(i);
  }
  return -1;
}

Plan PlanFileReader::read(std::size_t i) const {
  PACKPIPE_CHECK_RANGE(i < entries_.size(), "{}: plan {} out of range (file holds {})", path_, i, entries_.size());
  const Entry& e = entries_[i];
  if (json_) return plan_from_json(std::string(reinterpret_cast<const char*>(data_), size_), path_);
  const std::string what =
      entries_.size() == 1 && e.offset == 0 ? path_ : fmt::format("{} (plan {} at offset {})", path_, i, e.offset);
  Plan p;
  if (map_ != nullptr) {
    // A copy through the SIGBUS guard: a plan file truncated by another process is an Error.
    std::vector<std::uint8_t> blob(static_cast<std::size_t>(e.size));
    map_->read(e.offset, e.size, blob.data());
    p = decode_plan(blob.data(), blob.size(), what, verify_);
  } else {
    p = decode_plan(data_ + e.offset, static_cast<std::size_t>(e.size), what, verify_);
  }
  if (!single_) {
    PACKPIPE_CHECK(p.iteration == e.iteration && p.replica == e.replica,
                   "{}: the index entry says iteration {} replica {}, the plan is iteration {} replica {} (the index "
                   "was edited or points at another plan)", what, e.iteration, e.replica, p.iteration, p.replica);
  }
  if (p.dataset.known() && dataset_.known() && !single_) {
    PACKPIPE_CHECK(p.dataset.fingerprint == dataset_.fingerprint,
                   "{}: the plan indexes dataset {:016x}, the file records dataset {:016x} (the file was edited or put "
                   "together from plans of several datasets)", what, p.dataset.fingerprint, dataset_.fingerprint);
    p.dataset = dataset_;  // with the file's tasks
  }
  return p;
}

Plan PlanFileReader::read_iteration(std::uint64_t iteration, std::uint32_t replica) const {
  const std::int64_t first = find(iteration);
  const std::size_t i = static_cast<std::size_t>(first) + replica;
  PACKPIPE_CHECK_RANGE(first >= 0 && i < entries_.size() && entries_[i].iteration == iteration,
                       "{}: no plan for iteration {} replica {} (the file holds {} plans{})", path_, iteration, replica,
                       entries_.size(),
                       entries_.empty() ? std::string()
                                        : fmt::format(", iterations {} .. {}", entries_.front().iteration,
                                                      entries_.back().iteration));
  Plan p = read(i);
  PACKPIPE_CHECK(p.replica == replica, "{}: plan {} is replica {}, expected replica {} of iteration {}", path_, i,
                 p.replica, replica, iteration);
  return p;
}

std::uint64_t PlanFileReader::stored_size(std::size_t i) const {
  PACKPIPE_CHECK_RANGE(i < entries_.size(), "{}: plan {} out of range (file holds {})", path_, i, entries_.size());
  return entries_[i].size;
}

}  // namespace packpipe::plan
