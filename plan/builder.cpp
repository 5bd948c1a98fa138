// Instruction stream generation (build_plan).
#include "plan/builder.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <functional>
#include <tuple>
#include <queue>

#include "common/errors.h"

namespace packpipe::plan {

namespace {

constexpr std::uint32_t U32(std::int64_t v) { return static_cast<std::uint32_t>(v); }

// Position of an instruction in a rank's stream before sorting: gap p is "before compute op p"
// (p = number of ops: the end); phases order the work inside a gap.
enum Phase : std::int64_t {
  kBegin = -1,
  kAfterPrev = 0,   // frees of the previous op's inputs, its send starts
  kRecvStart = 1,   // receive starts (never block: before the send waits, or ranks waiting on each other's
                    // receives in the same gap would deadlock)
  kSendWait = 2,    // send waits and frees of the sent buffers
  kBeforeOp = 3,    // loads and receive waits of op p
  kCompute = 4,     // op p
  kReduce = 5,      // end: ReduceGrad per stage
  kStep = 6,        // end: OptStep
  kEnd = 7,         // end: IterEnd
};

struct Event {
  std::array<std::int64_t, 6> key;  // gap, phase, tie0, tie1, tie2, sequence
  Instruction ins;                  // buffers are logical ids here
};

struct OpRef {
  std::int64_t rank = -1;
  std::int64_t pos = -1;
  double start = 0, end = 0;
};

struct CommItem {
  std::int64_t src, dst, dir;  // dir 0: activation, 1: gradient
  std::uint32_t mb, send_stage, recv_stage;
  std::int64_t send_pos;  // producer op index on src
  double send_time;       // producer end
  std::int64_t consumer_pos;
  double consumer_start;
  std::uint32_t shape;
  std::uint32_t send_buf;  // logical
  std::uint32_t recv_buf;  // logical
};

// The builder's passes over one iteration, in order: check the inputs, fill the header tables,
// index the schedule's compute ops, emit compute ops with their loads and local hand-overs, emit
// each channel's sends and receives, emit the markers and the end of the iteration, then sort each
// rank's events into its stream and assign buffer slots.
class Builder {
 public:
  Builder(const Schedule& schedule, const std::vector<StageInfo>& stages, const MemoryFigures* memory,
          const PlanOptions& options)
      : sched_(schedule), stages_(stages), mem_(memory), opt_(options) {}

  Plan run(std::vector<PlanMicroBatch> mbs, const std::vector<Recompute>& recompute) {
    check_inputs(mbs, recompute);
    fill_header(std::move(mbs), recompute);
    find_model_sides();
    index_ops();
    emit_compute();
    emit_channels();
    emit_markers();
    assign_slots();
    if (opt_.keep_timeline) plan_.timeline = sched_.ops;
    return std::move(plan_);
  }

 private:
  void check_inputs(const std::vector<PlanMicroBatch>& mbs, const std::vector<Recompute>& recompute) {
    V_ = static_cast<std::int64_t>(stages_.size());
    S_ = sched_.ranks;
    N_ = static_cast<std::int64_t>(mbs.size());
    PACKPIPE_CHECK_ARG(V_ >= 1, "build_plan: no virtual stages");
    PACKPIPE_CHECK_ARG(S_ >= 1 && static_cast<std::int64_t>(sched_.ops.size()) == S_,
                       "build_plan: schedule '{}' has {} ranks but {} op lists", sched_.name, S_, sched_.ops.size());
    // N_ may be 0: a data-parallel replica without a sample still reduces its (zero) gradients and steps.
    PACKPIPE_CHECK_ARG(sched_.microbatches == 0 || sched_.microbatches == N_,
                       "build_plan: schedule '{}' orders {} micro-batches, {} given", sched_.name,
                       sched_.microbatches, N_);
    PACKPIPE_CHECK_ARG(sched_.vstages == 0 || sched_.vstages == V_,
                       "build_plan: schedule '{}' has {} virtual stages, {} given", sched_.name, sched_.vstages, V_);
    PACKPIPE_CHECK_ARG(opt_.hidden > 0 && opt_.hidden <= 0xFFFFFFFFll,
                       "build_plan: hidden size must be positive, found {}", opt_.hidden);
    PACKPIPE_CHECK_ARG(opt_.dp >= 1, "build_plan: dp must be at least 1");
    PACKPIPE_CHECK_ARG(recompute.size() == mbs.size(), "build_plan: {} recompute modes for {} micro-batches",
                       recompute.size(), mbs.size());
    if (mem_ != nullptr) {
      const std::size_t n = static_cast<std::size_t>(N_ * V_);
      PACKPIPE_CHECK_ARG(mem_->stored_bytes.size() == n && mem_->peak_bytes.size() == n &&
                             mem_->static_bytes.size() == static_cast<std::size_t>(S_),
                         "build_plan: memory tables hold {} (micro-batch, stage) entries and {} ranks, expected {} x {} "
                         "and {} ranks",
                         mem_->stored_bytes.size(), mem_->static_bytes.size(), N_, V_, S_);
    }
    for (std::int64_t m = 0; m < N_; ++m) {
      const PlanMicroBatch& mb = mbs[m];
      PACKPIPE_CHECK_ARG(mb.rows > 0 && mb.padded_len > 0, "build_plan: micro-batch {} is empty (rows {}, padded length {})",
                         m, mb.rows, mb.padded_len);
    }
  }

  // Stage map, micro-batch table (loss weights, refs), recompute modes and memory figures.
  void fill_header(std::vector<PlanMicroBatch> mbs, const std::vector<Recompute>& recompute) {
    Plan& plan = plan_;
    plan.iteration = opt_.iteration;
    plan.ranks = U32(S_);
    plan.vstages = U32(V_);
    plan.dp = opt_.dp;
    plan.schedule = sched_.name;
    plan.memory_limit_bytes = opt_.memory_limit_bytes;
    plan.makespan_ms = sched_.makespan_ms;
    plan.stage_rank.resize(static_cast<std::size_t>(V_));
    plan.stages.resize(static_cast<std::size_t>(V_));
    for (std::int64_t v = 0; v < V_; ++v) {
      const StageInfo& st = stages_[v];
      PACKPIPE_CHECK_ARG(st.rank < S_, "build_plan: virtual stage {} on rank {} of {}", v, st.rank, S_);
      plan.stage_rank[v] = st.rank;
      StageSpec& spec = plan.stages[v];
      spec.encoder_begin = st.encoder_begin;
      spec.encoder_layers = st.encoder_layers;
      spec.decoder_begin = st.decoder_begin;
      spec.decoder_layers = st.decoder_layers;
      spec.embedding = st.embedding;
      spec.head = st.head;
    }
    std::uint64_t tokens = 0, loss_tokens = 0;
    for (const auto& mb : mbs) {
      tokens += mb.tokens;
      loss_tokens += mb.loss_tokens;
    }
    plan.global_tokens = opt_.global_tokens > 0 ? opt_.global_tokens : tokens;
    plan.dtype = opt_.dtype;
    plan.loss_mode = opt_.loss_mode;
    plan.global_loss_tokens = opt_.global_loss_tokens > 0 ? opt_.global_loss_tokens : loss_tokens;
    plan.tied_embedding = opt_.tied_embedding;
    plan.max_seq_len = opt_.max_seq_len;
    plan.max_target_len = opt_.max_target_len;
    plan.microbatches = std::move(mbs);
    plan.recompute.resize(static_cast<std::size_t>(N_ * V_));
    plan.stored_bytes.assign(static_cast<std::size_t>(N_ * V_), 0);
    plan.peak_bytes.assign(static_cast<std::size_t>(N_ * V_), 0);
    plan.static_bytes.assign(static_cast<std::size_t>(S_), 0);
    auto bytes_of = [](double b) { return b > 0 ? static_cast<std::uint64_t>(std::llround(b)) : std::uint64_t{0}; };
    for (std::int64_t m = 0; m < N_; ++m) {
      PlanMicroBatch& out = plan.microbatches[m];
      out.loss_weight =
          plan.global_loss_tokens > 0 ? static_cast<double>(out.loss_tokens) / static_cast<double>(plan.global_loss_tokens)
          : plan.global_tokens > 0    ? static_cast<double>(out.tokens) / static_cast<double>(plan.global_tokens)
                                      : 0.0;
      out.refs.clear();
      if (opt_.sample_refs != nullptr) {
        for (std::size_t i = 0; i < out.samples.size(); ++i) {
          const std::uint32_t s = out.samples[i];
          PACKPIPE_CHECK_ARG(s < opt_.sample_refs->size(), "build_plan: micro-batch {} names sample {} of {} refs", m,
                             s, opt_.sample_refs->size());
          out.refs.push_back((*opt_.sample_refs)[s]);
          // A slice starts prefix tokens into its sample (a chunk's offset stays in front).
          out.refs.back().offset += out.prefix_of(i);
        }
      }
      for (std::int64_t v = 0; v < V_; ++v) {
        const std::size_t i = plan.at(static_cast<std::size_t>(m), static_cast<std::size_t>(v));
        plan.recompute[i] = static_cast<std::uint8_t>(recompute[m]);
        if (mem_ != nullptr) {
          plan.stored_bytes[i] = bytes_of(mem_->stored_bytes[i]);
          plan.peak_bytes[i] = bytes_of(mem_->peak_bytes[i]);
        }
      }
    }
    if (mem_ != nullptr) {
      for (std::int64_t r = 0; r < S_; ++r) plan.static_bytes[r] = bytes_of(mem_->static_bytes[r]);
    }
  }

  // Which stages are decoders, and which load data (and what).
  void find_model_sides() {
    bool has_enc = false, has_dec = false;
    for (const auto& st : stages_) {
      has_enc = has_enc || st.encoder_layers > 0;
      has_dec = has_dec || st.decoder_layers > 0;
    }
    encdec_ = has_enc && has_dec;
    for (std::int64_t v = 0; v < V_ && encdec_; ++v) {
      if (stages_[v].decoder_layers > 0) {
        first_dec_ = v;
        break;
      }
    }
    for (std::int64_t v = 0; v < V_; ++v) {
      std::uint8_t loads = 0;
      if (v == 0) loads |= kLoadInputIds | kLoadPositionIds;
      if (encdec_ && v == first_dec_) loads |= kLoadDecoderInputIds;
      if (v == V_ - 1) loads |= encdec_ ? kLoadDecoderLabels : kLoadLabels;
      plan_.stages[v].loads = loads;
    }
  }
  bool needs_load(std::int64_t v) const { return v == 0 || v == V_ - 1 || (encdec_ && v == first_dec_); }

  // Shape table, in first-use order.
  std::uint32_t intern(const TensorShape& s) {
    auto it = std::lower_bound(shape_index_.begin(), shape_index_.end(), s,
                               [](const auto& a, const TensorShape& b) { return a.first < b; });
    if (it != shape_index_.end() && it->first == s) return it->second;
    const auto id = U32(plan_.shapes.size());
    plan_.shapes.push_back(s);
    shape_index_.insert(it, {s, id});
    return id;
  }
  std::uint32_t boundary_shape(std::int64_t m, std::int64_t v) {  // output of stage v
    const PlanMicroBatch& mb = plan_.microbatches[m];
    TensorShape s;
    s.rows = mb.rows;
    s.hidden = U32(opt_.hidden);
    s.dtype = opt_.dtype;
    if (encdec_ && stages_[v].decoder_layers > 0) {
      s.seq = mb.padded_dec_len;
      s.enc_seq = mb.padded_len;
    } else {
      s.seq = mb.padded_len;
    }
    return intern(s);
  }
  std::uint32_t load_shape(std::int64_t m, std::int64_t v) {
    const PlanMicroBatch& mb = plan_.microbatches[m];
    TensorShape s;
    s.rows = mb.rows;
    s.hidden = 1;
    s.dtype = Dtype::I64;
    s.seq = encdec_ && stages_[v].decoder_layers > 0 && v > 0 ? mb.padded_dec_len : mb.padded_len;
    return intern(s);
  }

  std::size_t key(std::int64_t m, std::int64_t v) const { return static_cast<std::size_t>(m * V_ + v); }

  // Every (mb, stage)'s forward, backward (or input-gradient half) and weight-gradient half.
  void index_ops() {
    const auto n = static_cast<std::size_t>(N_ * V_);
    fwd_.assign(n, {});
    bwd_.assign(n, {});
    wgt_.assign(n, {});
    bwd_split_.assign(n, 0);
    for (std::int64_t r = 0; r < S_; ++r) {
      const auto& ops = sched_.ops[r];
      for (std::size_t p = 0; p < ops.size(); ++p) {
        const ScheduledOp& op = ops[p];
        PACKPIPE_CHECK_ARG(op.mb < N_ && op.vstage < V_,
                           "build_plan: rank {} op {} ({}{} of stage {}) out of range ({} micro-batches, {} stages)", r,
                           p, op_kind_token(op.kind), op.mb, op.vstage, N_, V_);
        PACKPIPE_CHECK_ARG(plan_.stage_rank[op.vstage] == r,
                           "build_plan: rank {} op {} runs stage {}, which is on rank {}", r, p, op.vstage,
                           plan_.stage_rank[op.vstage]);
        const std::size_t k = key(op.mb, op.vstage);
        OpRef ref{r, static_cast<std::int64_t>(p), op.start_ms, op.end_ms};
        OpRef* slot = nullptr;
        switch (op.kind) {
          case OpKind::Forward: slot = &fwd_[k]; break;
          case OpKind::Backward: slot = &bwd_[k]; break;
          case OpKind::BackwardInput:
            slot = &bwd_[k];
            bwd_split_[k] = 1;
            break;
          case OpKind::BackwardWeight: slot = &wgt_[k]; break;
        }
        PACKPIPE_CHECK_ARG(slot->rank < 0, "build_plan: rank {} op {}: {}{} of stage {} scheduled twice", r, p,
                           op_kind_token(op.kind), op.mb, op.vstage);
        *slot = ref;
      }
    }
    for (std::int64_t m = 0; m < N_; ++m) {
      for (std::int64_t v = 0; v < V_; ++v) {
        const std::size_t k = key(m, v);
        PACKPIPE_CHECK_ARG(fwd_[k].rank >= 0 && bwd_[k].rank >= 0,
                           "build_plan: schedule '{}' lacks the forward or backward of micro-batch {} stage {}",
                           sched_.name, m, v);
        PACKPIPE_CHECK_ARG((bwd_split_[k] != 0) == (wgt_[k].rank >= 0),
                           "build_plan: micro-batch {} stage {}: input- and weight-gradient halves must come together",
                           m, v);
      }
    }
    // Per-rank prefix maximum of start times (receive-start and send-wait placement).
    start_max_.assign(static_cast<std::size_t>(S_), {});
    for (std::int64_t r = 0; r < S_; ++r) {
      double mx = -INFINITY;
      for (const auto& op : sched_.ops[r]) {
        mx = std::max(mx, op.start_ms);
        start_max_[r].push_back(mx);
      }
    }
    events_.assign(static_cast<std::size_t>(S_), {});
  }
  // First op index of rank r with start >= t, or the op count.
  std::int64_t first_starting_at(std::int64_t r, double t) const {
    const auto& a = start_max_[r];
    return static_cast<std::int64_t>(std::lower_bound(a.begin(), a.end(), t) - a.begin());
  }

  std::uint32_t new_buf(std::int64_t r) {
    buf_rank_.push_back(r);
    return next_buf_++;
  }
  void emit(std::int64_t r, std::int64_t gap, std::int64_t phase, std::int64_t t0, std::int64_t t1, std::int64_t t2,
            const Instruction& ins) {
    events_[r].push_back(Event{{gap, phase, t0, t1, t2, seq_++}, ins});
  }
  void free_buf(std::int64_t r, std::int64_t gap, std::int64_t phase, std::int64_t t0, std::int64_t t1,
                std::int64_t t2, std::uint32_t b) {
    Instruction f;
    f.op = Opcode::FreeBuf;
    f.in = b;
    emit(r, gap, phase, t0, t1, t2, f);
  }

  // Compute instructions and their local buffers, in a fixed order over (kind, mb, stage) so that
  // producers' output buffers exist before consumers look them up; boundaries between ranks
  // become communication items.
  void emit_compute() {
    const auto n = static_cast<std::size_t>(N_ * V_);
    std::vector<std::uint32_t> fwd_out(n, kNone), bwd_out(n, kNone);
    for (std::int64_t v = 0; v < V_; ++v) {
      for (std::int64_t m = 0; m < N_; ++m) emit_forward(m, v, fwd_out);
    }
    for (std::int64_t v = V_ - 1; v >= 0; --v) {
      for (std::int64_t m = 0; m < N_; ++m) emit_backward(m, v, bwd_out);
    }
  }
  void emit_forward(std::int64_t m, std::int64_t v, std::vector<std::uint32_t>& fwd_out) {
    const std::size_t k = key(m, v);
    const OpRef& f = fwd_[k];
    Instruction ins;
    ins.op = Opcode::Forward;
    ins.mb = U32(m);
    ins.stage = U32(v);
    ins.mode = plan_.recompute[plan_.at(static_cast<std::size_t>(m), static_cast<std::size_t>(v))];
    if (needs_load(v)) {
      Instruction ld;
      ld.op = Opcode::LoadMb;
      ld.mb = U32(m);
      ld.stage = U32(v);
      ld.out = new_buf(f.rank);
      ld.shape = load_shape(m, v);
      emit(f.rank, f.pos, kBeforeOp, 0, 0, 0, ld);
      ins.in2 = ld.out;
      free_buf(f.rank, f.pos + 1, kAfterPrev, 0, 0, 0, ld.out);
    }
    if (v > 0) {
      const OpRef& pf = fwd_[key(m, v - 1)];
      if (pf.rank == f.rank) {
        ins.in = fwd_out[key(m, v - 1)];
      } else {
        CommItem it{pf.rank, f.rank, 0, U32(m), U32(v - 1), U32(v), pf.pos, pf.end, f.pos, f.start,
                    boundary_shape(m, v - 1), fwd_out[key(m, v - 1)], new_buf(f.rank)};
        items_.push_back(it);
        ins.in = it.recv_buf;
      }
      free_buf(f.rank, f.pos + 1, kAfterPrev, 0, 0, 0, ins.in);
    }
    if (v < V_ - 1) ins.out = fwd_out[k] = new_buf(f.rank);
    emit(f.rank, f.pos, kCompute, 0, 0, 0, ins);
  }
  void emit_backward(std::int64_t m, std::int64_t v, std::vector<std::uint32_t>& bwd_out) {
    const std::size_t k = key(m, v);
    const OpRef& b = bwd_[k];
    Instruction ins;
    ins.op = bwd_split_[k] ? Opcode::BackwardInput : Opcode::Backward;
    ins.mb = U32(m);
    ins.stage = U32(v);
    if (v < V_ - 1) {
      const OpRef& pb = bwd_[key(m, v + 1)];
      if (pb.rank == b.rank) {
        ins.in = bwd_out[key(m, v + 1)];
      } else {
        CommItem it{pb.rank, b.rank, 1, U32(m), U32(v + 1), U32(v), pb.pos, pb.end, b.pos, b.start,
                    boundary_shape(m, v), bwd_out[key(m, v + 1)], new_buf(b.rank)};
        items_.push_back(it);
        ins.in = it.recv_buf;
      }
      free_buf(b.rank, b.pos + 1, kAfterPrev, 0, 0, 0, ins.in);
    }
    if (v > 0) ins.out = bwd_out[k] = new_buf(b.rank);
    emit(b.rank, b.pos, kCompute, 0, 0, 0, ins);
    if (bwd_split_[k]) {
      Instruction w;
      w.op = Opcode::BackwardWeight;
      w.mb = U32(m);
      w.stage = U32(v);
      emit(wgt_[k].rank, wgt_[k].pos, kCompute, 0, 0, 0, w);
    }
  }

  // Communication: per channel in the sender's order; receives posted at the simulated send
  // instant, never after their consumer, in channel order (suffix minimum of the positions).
  void emit_channels() {
    auto& items = items_;
    std::sort(items.begin(), items.end(), [](const CommItem& a, const CommItem& b) {
      return std::make_tuple(a.src, a.dst, a.dir, a.send_pos) < std::make_tuple(b.src, b.dst, b.dir, b.send_pos);
    });
    for (std::size_t lo = 0; lo < items.size();) {
      std::size_t hi = lo;
      while (hi < items.size() && items[hi].src == items[lo].src && items[hi].dst == items[lo].dst &&
             items[hi].dir == items[lo].dir)
        ++hi;
      emit_channel(lo, hi);
      lo = hi;
    }
  }
  void emit_channel(std::size_t lo, std::size_t hi) {
    const auto& items = items_;
    std::vector<std::int64_t> pos(hi - lo);
    for (std::size_t i = lo; i < hi; ++i) {
      pos[i - lo] = std::min(first_starting_at(items[i].dst, items[i].send_time), items[i].consumer_pos);
    }
    for (std::size_t i = pos.size(); i-- > 1;) pos[i - 1] = std::min(pos[i - 1], pos[i]);
    for (std::size_t i = lo; i < hi; ++i) {
      const CommItem& it = items[i];
      const auto k = static_cast<std::int64_t>(i - lo);
      const bool act = it.dir == 0;
      Instruction s;
      s.op = act ? Opcode::SendActStart : Opcode::SendGradStart;
      s.mb = it.mb;
      s.stage = it.send_stage;
      s.peer = U32(it.dst);
      s.in = it.send_buf;
      s.shape = it.shape;
      emit(it.src, it.send_pos + 1, kAfterPrev, 1, 0, 0, s);
      Instruction sw = s;
      sw.op = act ? Opcode::SendActWait : Opcode::SendGradWait;
      sw.shape = kNone;
      const std::int64_t wait_gap = std::max(it.send_pos + 1, first_starting_at(it.src, it.consumer_start));
      emit(it.src, wait_gap, kSendWait, it.dst, it.dir, k, sw);
      free_buf(it.src, wait_gap, kSendWait, it.dst, it.dir, k, it.send_buf);
      Instruction rs;
      rs.op = act ? Opcode::RecvActStart : Opcode::RecvGradStart;
      rs.mb = it.mb;
      rs.stage = it.recv_stage;
      rs.peer = U32(it.src);
      rs.out = it.recv_buf;
      rs.shape = it.shape;
      emit(it.dst, pos[i - lo], kRecvStart, it.src, it.dir, k, rs);
      Instruction rw = rs;
      rw.op = act ? Opcode::RecvActWait : Opcode::RecvGradWait;
      rw.out = kNone;
      rw.shape = kNone;
      rw.in = it.recv_buf;
      emit(it.dst, it.consumer_pos, kBeforeOp, 1, it.src, it.dir, rw);
    }
  }

  // Markers, gradient reduction and the optimizer step.
  void emit_markers() {
    for (std::int64_t r = 0; r < S_; ++r) {
      const auto end = static_cast<std::int64_t>(sched_.ops[r].size());
      if (opt_.iteration_markers) {
        Instruction b;
        b.op = Opcode::IterBegin;
        emit(r, 0, kBegin, 0, 0, 0, b);
        Instruction e;
        e.op = Opcode::IterEnd;
        emit(r, end, kEnd, 0, 0, 0, e);
      }
      if (opt_.reduce_and_step) {
        for (std::int64_t v = V_ - 1; v >= 0; --v) {
          if (plan_.stage_rank[v] != r) continue;
          Instruction g;
          g.op = Opcode::ReduceGrad;
          g.stage = U32(v);
          emit(r, end, kReduce, V_ - v, 0, 0, g);
        }
        // The tied embedding / head weight: after both stages' data-parallel reductions.
        const std::uint32_t first = plan_.stage_rank.front(), last = plan_.stage_rank.back();
        if (opt_.tied_embedding && first != last && (r == first || r == last)) {
          Instruction t;
          t.op = Opcode::ReduceTied;
          t.stage = U32(r == first ? 0 : V_ - 1);
          emit(r, end, kReduce, V_ + 1, 0, 0, t);
        }
        Instruction o;
        o.op = Opcode::OptStep;
        emit(r, end, kStep, 0, 0, 0, o);
      }
    }
  }

  // Order each stream and map logical buffers to slots (lowest free slot first).
  void assign_slots() {
    Plan& plan = plan_;
    std::vector<std::uint32_t> slot_of(next_buf_, kNone);
    plan.streams.resize(static_cast<std::size_t>(S_));
    plan.buffer_slots.assign(static_cast<std::size_t>(S_), 0);
    for (std::int64_t r = 0; r < S_; ++r) {
      auto& ev = events_[r];
      std::sort(ev.begin(), ev.end(), [](const Event& a, const Event& b) { return a.key < b.key; });
      std::priority_queue<std::uint32_t, std::vector<std::uint32_t>, std::greater<>> free_slots;
      std::uint32_t slots = 0;
      auto& out = plan.streams[r];
      out.reserve(ev.size());
      for (const Event& e : ev) {
        Instruction ins = e.ins;
        if (ins.out != kNone) {
          PACKPIPE_ASSERT(buf_rank_[ins.out] == r && slot_of[ins.out] == kNone);
          std::uint32_t s;
          if (!free_slots.empty()) {
            s = free_slots.top();
            free_slots.pop();
          } else {
            s = slots++;
          }
          slot_of[ins.out] = s;
          ins.out = s;
        }
        auto map_in = [&](std::uint32_t& b) {
          if (b == kNone) return;
          PACKPIPE_ASSERT(buf_rank_[b] == r);
          // A buffer used before its allocation is a schedule inconsistency; keep the logical id
          // visible to the validator rather than guessing a slot.
          b = slot_of[b] == kNone ? kNone - 1 : slot_of[b];
        };
        const std::uint32_t logical_in = ins.in;
        map_in(ins.in);
        map_in(ins.in2);
        if (ins.op == Opcode::FreeBuf && logical_in != kNone && slot_of[logical_in] != kNone) {
          free_slots.push(slot_of[logical_in]);
        }
        out.push_back(ins);
      }
      plan.buffer_slots[r] = slots;
    }
  }

  const Schedule& sched_;
  const std::vector<StageInfo>& stages_;
  const MemoryFigures* mem_;
  const PlanOptions& opt_;
  Plan plan_;
  std::int64_t V_ = 0, S_ = 0, N_ = 0;
  bool encdec_ = false;
  std::int64_t first_dec_ = -1;
  std::vector<std::pair<TensorShape, std::uint32_t>> shape_index_;  // sorted by shape
  std::vector<OpRef> fwd_, bwd_, wgt_;
  std::vector<std::uint8_t> bwd_split_;
  std::vector<std::vector<double>> start_max_;
  std::vector<std::vector<Event>> events_;
  std::int64_t seq_ = 0;
  std::uint32_t next_buf_ = 0;
  std::vector<std::int64_t> buf_rank_;  // logical buffer -> rank (debug)
  std::vector<CommItem> items_;
};

}  // namespace

Plan build_plan(const Schedule& schedule, std::vector<PlanMicroBatch> microbatches,
                const std::vector<Recompute>& recompute, const std::vector<StageInfo>& stages,
                const MemoryFigures* memory, const PlanOptions& options) {
  return Builder(schedule, stages, memory, options).run(std::move(microbatches), recompute);
}

}  // namespace packpipe::plan
