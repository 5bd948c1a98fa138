// Instruction stream generation (build_plan) and the synthetic schedules used by tests,
// benchmarks and examples.
#include "scheduler/plan_builder.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <deque>
#include <functional>
#include <queue>
#include <set>

#include "common/errors.h"

namespace packpipe::scheduler {

namespace {

constexpr std::uint32_t U32(std::int64_t v) { return static_cast<std::uint32_t>(v); }

// Position of an instruction in a rank's stream before sorting: gap p is "before compute op p"
// (p = number of ops: the end); phases order the work inside a gap.
enum Phase : std::int64_t {
  kBegin = -1,
  kAfterPrev = 0,   // frees of the previous op's inputs, its send starts
  kSendWait = 1,    // send waits and frees of the sent buffers
  kRecvStart = 2,   // receive starts
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

}  // namespace

Plan build_plan(const Schedule& schedule, const std::vector<MicroBatch>& mbs, const std::vector<VirtualStage>& vstages,
                const StageCostTable* costs, const PlanOptions& options) {
  const std::int64_t V = static_cast<std::int64_t>(vstages.size());
  const std::int64_t S = schedule.ranks;
  const std::int64_t N = static_cast<std::int64_t>(mbs.size());
  PACKPIPE_CHECK_ARG(V >= 1, "build_plan: no virtual stages");
  PACKPIPE_CHECK_ARG(S >= 1 && static_cast<std::int64_t>(schedule.ops.size()) == S,
                     "build_plan: schedule '{}' has {} ranks but {} op lists", schedule.name, S, schedule.ops.size());
  PACKPIPE_CHECK_ARG(N >= 1, "build_plan: no micro-batches");
  PACKPIPE_CHECK_ARG(schedule.microbatches == 0 || schedule.microbatches == N,
                     "build_plan: schedule '{}' orders {} micro-batches, {} given", schedule.name,
                     schedule.microbatches, N);
  PACKPIPE_CHECK_ARG(schedule.vstages == 0 || schedule.vstages == V,
                     "build_plan: schedule '{}' has {} virtual stages, {} given", schedule.name, schedule.vstages, V);
  PACKPIPE_CHECK_ARG(options.hidden > 0 && options.hidden <= 0xFFFFFFFFll, "build_plan: hidden size must be positive, found {}",
                     options.hidden);
  PACKPIPE_CHECK_ARG(options.dp >= 1, "build_plan: dp must be at least 1");
  if (costs != nullptr) {
    const std::size_t n = static_cast<std::size_t>(N * V);
    PACKPIPE_CHECK_ARG(costs->microbatches == N && costs->vstages == V && costs->stored_bytes.size() == n &&
                           costs->peak_bytes.size() == n && costs->static_bytes.size() == static_cast<std::size_t>(S),
                       "build_plan: cost table is {} micro-batches x {} stages ({} ranks), expected {} x {} ({} ranks)",
                       costs->microbatches, costs->vstages, costs->static_bytes.size(), N, V, S);
  }

  Plan plan;
  plan.iteration = options.iteration;
  plan.ranks = U32(S);
  plan.vstages = U32(V);
  plan.dp = options.dp;
  plan.schedule = schedule.name;
  plan.memory_limit_bytes = options.memory_limit_bytes;
  plan.makespan_ms = schedule.makespan_ms;
  plan.stage_rank.resize(static_cast<std::size_t>(V));
  for (std::int64_t v = 0; v < V; ++v) {
    PACKPIPE_CHECK_ARG(vstages[v].index == v, "build_plan: virtual stage {} has index {}", v, vstages[v].index);
    PACKPIPE_CHECK_ARG(vstages[v].rank >= 0 && vstages[v].rank < S, "build_plan: virtual stage {} on rank {} of {}", v,
                       vstages[v].rank, S);
    plan.stage_rank[v] = U32(vstages[v].rank);
  }

  // Micro-batch table.
  std::uint64_t tokens = 0;
  for (const auto& mb : mbs) tokens += mb.tokens;
  plan.global_tokens = options.global_tokens > 0 ? options.global_tokens : tokens;
  plan.microbatches.resize(static_cast<std::size_t>(N));
  plan.recompute.resize(static_cast<std::size_t>(N * V));
  plan.stored_bytes.assign(static_cast<std::size_t>(N * V), 0);
  plan.peak_bytes.assign(static_cast<std::size_t>(N * V), 0);
  plan.static_bytes.assign(static_cast<std::size_t>(S), 0);
  auto bytes_of = [](double b) { return b > 0 ? static_cast<std::uint64_t>(std::llround(b)) : std::uint64_t{0}; };
  for (std::int64_t m = 0; m < N; ++m) {
    const MicroBatch& in = mbs[m];
    PlanMicroBatch& out = plan.microbatches[m];
    PACKPIPE_CHECK_ARG(in.rows() > 0 && in.padded_len > 0 && in.padded_len <= 0xFFFFFFFFll && in.padded_dec_len >= 0,
                       "build_plan: micro-batch {} is empty (rows {}, padded length {})", m, in.rows(), in.padded_len);
    out.samples = in.samples;
    out.row_offsets = in.row_offsets;
    out.rows = U32(in.rows());
    out.padded_len = U32(in.padded_len);
    out.padded_dec_len = U32(in.padded_dec_len);
    out.tokens = in.tokens;
    out.loss_weight = plan.global_tokens > 0 ? static_cast<double>(in.tokens) / static_cast<double>(plan.global_tokens) : 0.0;
    if (options.sample_refs != nullptr) {
      for (std::uint32_t s : in.samples) {
        PACKPIPE_CHECK_ARG(s < options.sample_refs->size(), "build_plan: micro-batch {} names sample {} of {} refs", m,
                           s, options.sample_refs->size());
        out.refs.push_back((*options.sample_refs)[s]);
      }
    }
    for (std::int64_t v = 0; v < V; ++v) {
      const std::size_t i = plan.at(static_cast<std::size_t>(m), static_cast<std::size_t>(v));
      plan.recompute[i] = static_cast<std::uint8_t>(in.recompute);
      if (costs != nullptr) {
        plan.stored_bytes[i] = bytes_of(costs->stored_bytes[i]);
        plan.peak_bytes[i] = bytes_of(costs->peak_bytes[i]);
      }
    }
  }
  if (costs != nullptr) {
    for (std::int64_t r = 0; r < S; ++r) plan.static_bytes[r] = bytes_of(costs->static_bytes[r]);
  }

  // Which stages are decoders, and which load data.
  bool has_enc = false, has_dec = false;
  for (const auto& vs : vstages) {
    has_enc = has_enc || vs.layout.encoder_layers > 0;
    has_dec = has_dec || vs.layout.decoder_layers > 0;
  }
  const bool encdec = has_enc && has_dec;
  std::int64_t first_dec = -1;
  for (std::int64_t v = 0; v < V && encdec; ++v) {
    if (vstages[v].layout.decoder_layers > 0) {
      first_dec = v;
      break;
    }
  }
  auto needs_load = [&](std::int64_t v) { return v == 0 || v == V - 1 || (encdec && v == first_dec); };

  // Shape table, in first-use order.
  std::vector<std::pair<TensorShape, std::uint32_t>> shape_index;  // sorted by shape
  auto intern = [&](const TensorShape& s) {
    auto it = std::lower_bound(shape_index.begin(), shape_index.end(), s,
                               [](const auto& a, const TensorShape& b) { return a.first < b; });
    if (it != shape_index.end() && it->first == s) return it->second;
    const auto id = U32(plan.shapes.size());
    plan.shapes.push_back(s);
    shape_index.insert(it, {s, id});
    return id;
  };
  const auto hidden = U32(options.hidden);
  auto boundary_shape = [&](std::int64_t m, std::int64_t v) {  // output of stage v
    const PlanMicroBatch& mb = plan.microbatches[m];
    TensorShape s;
    s.rows = mb.rows;
    s.hidden = hidden;
    s.dtype = options.dtype;
    if (encdec && vstages[v].layout.decoder_layers > 0) {
      s.seq = mb.padded_dec_len;
      s.enc_seq = mb.padded_len;
    } else {
      s.seq = mb.padded_len;
    }
    return intern(s);
  };
  auto load_shape = [&](std::int64_t m, std::int64_t v) {
    const PlanMicroBatch& mb = plan.microbatches[m];
    TensorShape s;
    s.rows = mb.rows;
    s.hidden = 1;
    s.dtype = Dtype::I32;
    s.seq = encdec && vstages[v].layout.decoder_layers > 0 && v > 0 ? mb.padded_dec_len : mb.padded_len;
    return intern(s);
  };

  // Index the compute ops.
  auto key = [&](std::int64_t m, std::int64_t v) { return static_cast<std::size_t>(m * V + v); };
  std::vector<OpRef> fwd(static_cast<std::size_t>(N * V)), bwd(static_cast<std::size_t>(N * V)),
      wgt(static_cast<std::size_t>(N * V));
  std::vector<std::uint8_t> bwd_split(static_cast<std::size_t>(N * V), 0);
  for (std::int64_t r = 0; r < S; ++r) {
    const auto& ops = schedule.ops[r];
    for (std::size_t p = 0; p < ops.size(); ++p) {
      const ScheduledOp& op = ops[p];
      PACKPIPE_CHECK_ARG(op.mb < N && op.vstage < V, "build_plan: rank {} op {} ({}{} of stage {}) out of range ({} "
                         "micro-batches, {} stages)", r, p, op_kind_token(op.kind), op.mb, op.vstage, N, V);
      PACKPIPE_CHECK_ARG(plan.stage_rank[op.vstage] == r, "build_plan: rank {} op {} runs stage {}, which is on rank {}",
                         r, p, op.vstage, plan.stage_rank[op.vstage]);
      const std::size_t k = key(op.mb, op.vstage);
      OpRef ref{r, static_cast<std::int64_t>(p), op.start_ms, op.end_ms};
      OpRef* slot = nullptr;
      switch (op.kind) {
        case OpKind::Forward: slot = &fwd[k]; break;
        case OpKind::Backward: slot = &bwd[k]; break;
        case OpKind::BackwardInput:
          slot = &bwd[k];
          bwd_split[k] = 1;
          break;
        case OpKind::BackwardWeight: slot = &wgt[k]; break;
      }
      PACKPIPE_CHECK_ARG(slot->rank < 0, "build_plan: rank {} op {}: {}{} of stage {} scheduled twice", r, p,
                         op_kind_token(op.kind), op.mb, op.vstage);
      *slot = ref;
    }
  }
  for (std::int64_t m = 0; m < N; ++m) {
    for (std::int64_t v = 0; v < V; ++v) {
      const std::size_t k = key(m, v);
      PACKPIPE_CHECK_ARG(fwd[k].rank >= 0 && bwd[k].rank >= 0,
                         "build_plan: schedule '{}' lacks the forward or backward of micro-batch {} stage {}",
                         schedule.name, m, v);
      PACKPIPE_CHECK_ARG((bwd_split[k] != 0) == (wgt[k].rank >= 0),
                         "build_plan: micro-batch {} stage {}: input- and weight-gradient halves must come together", m,
                         v);
    }
  }

  // Per-rank prefix maximum of start times (receive-start and send-wait placement).
  std::vector<std::vector<double>> start_max(static_cast<std::size_t>(S));
  for (std::int64_t r = 0; r < S; ++r) {
    double mx = -INFINITY;
    for (const auto& op : schedule.ops[r]) {
      mx = std::max(mx, op.start_ms);
      start_max[r].push_back(mx);
    }
  }
  auto first_starting_at = [&](std::int64_t r, double t) {  // first op index with start >= t, or op count
    const auto& a = start_max[r];
    return static_cast<std::int64_t>(std::lower_bound(a.begin(), a.end(), t) - a.begin());
  };

  std::vector<std::vector<Event>> events(static_cast<std::size_t>(S));
  std::int64_t seq = 0;
  std::uint32_t next_buf = 0;
  std::vector<std::int64_t> buf_rank;  // logical buffer -> rank (debug)
  auto new_buf = [&](std::int64_t r) {
    buf_rank.push_back(r);
    return next_buf++;
  };
  auto emit = [&](std::int64_t r, std::int64_t gap, std::int64_t phase, std::int64_t t0, std::int64_t t1,
                  std::int64_t t2, const Instruction& ins) {
    events[r].push_back(Event{{gap, phase, t0, t1, t2, seq++}, ins});
  };
  auto free_buf = [&](std::int64_t r, std::int64_t gap, std::int64_t phase, std::int64_t t0, std::int64_t t1,
                      std::int64_t t2, std::uint32_t b) {
    Instruction f;
    f.op = Opcode::FreeBuf;
    f.in = b;
    emit(r, gap, phase, t0, t1, t2, f);
  };

  std::vector<std::uint32_t> fwd_out(static_cast<std::size_t>(N * V), kNone), bwd_out(static_cast<std::size_t>(N * V), kNone);
  std::vector<CommItem> items;
  // Compute instructions and their local buffers, in a fixed order over (kind, mb, stage) so that
  // producers' output buffers exist before consumers look them up.
  for (std::int64_t v = 0; v < V; ++v) {
    for (std::int64_t m = 0; m < N; ++m) {
      const std::size_t k = key(m, v);
      const OpRef& f = fwd[k];
      Instruction ins;
      ins.op = Opcode::Forward;
      ins.mb = U32(m);
      ins.stage = U32(v);
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
        const OpRef& pf = fwd[key(m, v - 1)];
        if (pf.rank == f.rank) {
          ins.in = fwd_out[key(m, v - 1)];
        } else {
          CommItem it{pf.rank, f.rank, 0, U32(m), U32(v - 1), U32(v), pf.pos, pf.end, f.pos, f.start,
                      boundary_shape(m, v - 1), fwd_out[key(m, v - 1)], new_buf(f.rank)};
          items.push_back(it);
          ins.in = it.recv_buf;
        }
        free_buf(f.rank, f.pos + 1, kAfterPrev, 0, 0, 0, ins.in);
      }
      if (v < V - 1) ins.out = fwd_out[k] = new_buf(f.rank);
      emit(f.rank, f.pos, kCompute, 0, 0, 0, ins);
    }
  }
  for (std::int64_t v = V - 1; v >= 0; --v) {
    for (std::int64_t m = 0; m < N; ++m) {
      const std::size_t k = key(m, v);
      const OpRef& b = bwd[k];
      Instruction ins;
      ins.op = bwd_split[k] ? Opcode::BackwardInput : Opcode::Backward;
      ins.mb = U32(m);
      ins.stage = U32(v);
      if (v < V - 1) {
        const OpRef& pb = bwd[key(m, v + 1)];
        if (pb.rank == b.rank) {
          ins.in = bwd_out[key(m, v + 1)];
        } else {
          CommItem it{pb.rank, b.rank, 1, U32(m), U32(v + 1), U32(v), pb.pos, pb.end, b.pos, b.start,
                      boundary_shape(m, v), bwd_out[key(m, v + 1)], new_buf(b.rank)};
          items.push_back(it);
          ins.in = it.recv_buf;
        }
        free_buf(b.rank, b.pos + 1, kAfterPrev, 0, 0, 0, ins.in);
      }
      if (v > 0) ins.out = bwd_out[k] = new_buf(b.rank);
      emit(b.rank, b.pos, kCompute, 0, 0, 0, ins);
      if (bwd_split[k]) {
        Instruction w;
        w.op = Opcode::BackwardWeight;
        w.mb = U32(m);
        w.stage = U32(v);
        emit(wgt[k].rank, wgt[k].pos, kCompute, 0, 0, 0, w);
      }
    }
  }

  // Communication: per channel in the sender's order; receives posted at the simulated send
  // instant, never after their consumer, in channel order (suffix minimum of the positions).
  std::sort(items.begin(), items.end(), [](const CommItem& a, const CommItem& b) {
    return std::make_tuple(a.src, a.dst, a.dir, a.send_pos) < std::make_tuple(b.src, b.dst, b.dir, b.send_pos);
  });
  for (std::size_t lo = 0; lo < items.size();) {
    std::size_t hi = lo;
    while (hi < items.size() && items[hi].src == items[lo].src && items[hi].dst == items[lo].dst &&
           items[hi].dir == items[lo].dir)
      ++hi;
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
    lo = hi;
  }

  // Markers, gradient reduction and the optimizer step.
  for (std::int64_t r = 0; r < S; ++r) {
    const auto end = static_cast<std::int64_t>(schedule.ops[r].size());
    if (options.iteration_markers) {
      Instruction b;
      b.op = Opcode::IterBegin;
      emit(r, 0, kBegin, 0, 0, 0, b);
      Instruction e;
      e.op = Opcode::IterEnd;
      emit(r, end, kEnd, 0, 0, 0, e);
    }
    if (options.reduce_and_step) {
      for (std::int64_t v = V - 1; v >= 0; --v) {
        if (plan.stage_rank[v] != r) continue;
        Instruction g;
        g.op = Opcode::ReduceGrad;
        g.stage = U32(v);
        emit(r, end, kReduce, V - v, 0, 0, g);
      }
      Instruction o;
      o.op = Opcode::OptStep;
      emit(r, end, kStep, 0, 0, 0, o);
    }
  }

  // Order each stream and map logical buffers to slots (lowest free slot first).
  std::vector<std::uint32_t> slot_of(next_buf, kNone);
  plan.streams.resize(static_cast<std::size_t>(S));
  plan.buffer_slots.assign(static_cast<std::size_t>(S), 0);
  for (std::int64_t r = 0; r < S; ++r) {
    auto& ev = events[r];
    std::sort(ev.begin(), ev.end(), [](const Event& a, const Event& b) { return a.key < b.key; });
    std::priority_queue<std::uint32_t, std::vector<std::uint32_t>, std::greater<>> free_slots;
    std::uint32_t slots = 0;
    auto& out = plan.streams[r];
    out.reserve(ev.size());
    for (const Event& e : ev) {
      Instruction ins = e.ins;
      if (ins.out != kNone) {
        PACKPIPE_ASSERT(buf_rank[ins.out] == r && slot_of[ins.out] == kNone);
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
        PACKPIPE_ASSERT(buf_rank[b] == r);
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
  if (options.keep_timeline) plan.timeline = schedule.ops;
  return plan;
}

// ---------------------------------------------------------------------------------------------
// Synthetic schedules

namespace synthetic {

namespace {

struct Rng {  // splitmix64: deterministic on every platform
  std::uint64_t s;
  std::uint64_t next() {
    std::uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  std::int64_t uniform(std::int64_t lo, std::int64_t hi) {  // [lo, hi]
    return lo + static_cast<std::int64_t>(next() % static_cast<std::uint64_t>(hi - lo + 1));
  }
};

ScheduledOp op(OpKind k, std::int64_t mb, std::int64_t v) {
  ScheduledOp o;
  o.kind = k;
  o.mb = U32(mb);
  o.vstage = U32(v);
  return o;
}

}  // namespace

Schedule order(const std::string& kind, std::int64_t ranks, std::int64_t chunks, std::int64_t microbatches) {
  PACKPIPE_CHECK_ARG(ranks >= 1 && chunks >= 1 && microbatches >= 1,
                     "synthetic::order: ranks, chunks and micro-batches must be positive ({}, {}, {})", ranks, chunks,
                     microbatches);
  const std::int64_t S = ranks, C = chunks, N = microbatches, V = S * C;
  Schedule s;
  s.name = kind;
  s.ranks = S;
  s.vstages = V;
  s.microbatches = N;
  s.ops.resize(static_cast<std::size_t>(S));
  for (std::int64_t m = 0; m < N; ++m) s.order.push_back(U32(m));
  if (kind == "gpipe") {
    for (std::int64_t r = 0; r < S; ++r) {
      for (std::int64_t c = 0; c < C; ++c)
        for (std::int64_t m = 0; m < N; ++m) s.ops[r].push_back(op(OpKind::Forward, m, c * S + r));
      for (std::int64_t c = C - 1; c >= 0; --c)
        for (std::int64_t m = 0; m < N; ++m) s.ops[r].push_back(op(OpKind::Backward, m, c * S + r));
    }
    return s;
  }
  const bool zb = kind == "zero-bubble";
  PACKPIPE_CHECK_ARG(kind == "1f1b" || zb, "synthetic::order: unknown schedule '{}' (gpipe, 1f1b, zero-bubble)", kind);
  PACKPIPE_CHECK_ARG(C == 1 || N % S == 0,
                     "synthetic::order: interleaved orders need micro-batches ({}) divisible by ranks ({})", N, S);
  const std::int64_t total = N * C;
  for (std::int64_t r = 0; r < S; ++r) {
    // Megatron's order: k-th forward of the rank is chunk (k mod SC) / S, micro-batch
    // (k / SC) S + k mod S; backward chunks run in reverse. With one chunk this is plain 1F1B.
    auto fwd_at = [&](std::int64_t k) {
      if (C == 1) return op(OpKind::Forward, k, r);
      const std::int64_t c = (k % (S * C)) / S, m = (k / (S * C)) * S + k % S;
      return op(OpKind::Forward, m, c * S + r);
    };
    auto bwd_at = [&](std::int64_t k) {
      if (C == 1) return op(zb ? OpKind::BackwardInput : OpKind::Backward, k, r);
      const std::int64_t c = C - 1 - (k % (S * C)) / S, m = (k / (S * C)) * S + k % S;
      return op(zb ? OpKind::BackwardInput : OpKind::Backward, m, c * S + r);
    };
    const std::int64_t warm =
        std::min(total, C == 1 ? S - r - 1 : (S - r - 1) * 2 + (C - 1) * S);
    std::deque<ScheduledOp> pending_w;
    const auto w_budget = static_cast<std::size_t>(S - 1 - r);
    auto push_b = [&](std::int64_t k) {
      ScheduledOp b = bwd_at(k);
      s.ops[r].push_back(b);
      if (zb) {
        b.kind = OpKind::BackwardWeight;
        pending_w.push_back(b);
        while (pending_w.size() > w_budget) {
          s.ops[r].push_back(pending_w.front());
          pending_w.pop_front();
        }
      }
    };
    std::int64_t f = 0, b = 0;
    for (; f < warm; ++f) s.ops[r].push_back(fwd_at(f));
    while (f < total) {
      s.ops[r].push_back(fwd_at(f++));
      push_b(b++);
    }
    while (b < total) push_b(b++);
    for (const auto& w : pending_w) s.ops[r].push_back(w);
  }
  return s;
}

void assign_times(Schedule& schedule, const StageCostTable& costs, double comm_ms) {
  const std::int64_t S = schedule.ranks, V = costs.vstages, N = costs.microbatches;
  PACKPIPE_CHECK_ARG(static_cast<std::int64_t>(schedule.ops.size()) == S, "assign_times: {} op lists for {} ranks",
                     schedule.ops.size(), S);
  const auto n = static_cast<std::size_t>(N * V);
  std::vector<double> f_end(n, -1), b_end(n, -1);  // b: Backward or BackwardInput
  std::vector<std::int64_t> rank_of_stage(static_cast<std::size_t>(V), -1);
  for (std::int64_t r = 0; r < S; ++r)
    for (const auto& o : schedule.ops[r]) {
      PACKPIPE_CHECK_ARG(o.mb < N && o.vstage < V, "assign_times: op {}{} of stage {} out of range",
                         op_kind_token(o.kind), o.mb, o.vstage);
      rank_of_stage[o.vstage] = r;
    }
  std::vector<std::size_t> pc(static_cast<std::size_t>(S), 0);
  std::vector<double> free_at(static_cast<std::size_t>(S), 0);
  double makespan = 0;
  bool progress = true;
  while (progress) {
    progress = false;
    for (std::int64_t r = 0; r < S; ++r) {
      auto& ops = schedule.ops[r];
      while (pc[r] < ops.size()) {
        ScheduledOp& o = ops[pc[r]];
        const std::size_t k = static_cast<std::size_t>(o.mb * V + o.vstage);
        double ready = free_at[r];
        double dur = 0;
        auto dep = [&](double end, std::int64_t from_stage) {
          if (end < 0) return false;
          ready = std::max(ready, end + (rank_of_stage[from_stage] == r ? 0.0 : comm_ms));
          return true;
        };
        bool ok = true;
        switch (o.kind) {
          case OpKind::Forward:
            if (o.vstage > 0) ok = dep(f_end[k - 1], o.vstage - 1);
            dur = costs.forward_ms[k];
            break;
          case OpKind::Backward:
          case OpKind::BackwardInput:
            ok = dep(f_end[k], o.vstage);
            if (ok && o.vstage + 1 < V) ok = dep(b_end[k + 1], o.vstage + 1);
            dur = o.kind == OpKind::Backward ? costs.backward_ms[k] : costs.backward_ms[k] - costs.backward_weight_ms[k];
            break;
          case OpKind::BackwardWeight:
            ok = dep(b_end[k], o.vstage);
            dur = costs.backward_weight_ms[k];
            break;
        }
        if (!ok) break;
        o.start_ms = ready;
        o.end_ms = ready + dur;
        free_at[r] = o.end_ms;
        makespan = std::max(makespan, o.end_ms);
        if (o.kind == OpKind::Forward) f_end[k] = o.end_ms;
        if (o.kind == OpKind::Backward || o.kind == OpKind::BackwardInput) b_end[k] = o.end_ms;
        ++pc[r];
        progress = true;
      }
    }
  }
  for (std::int64_t r = 0; r < S; ++r) {
    PACKPIPE_CHECK_ARG(pc[r] == schedule.ops[r].size(), "assign_times: schedule '{}' deadlocks at rank {} op {}",
                       schedule.name, r, pc[r]);
  }
  schedule.makespan_ms = makespan;
}

Case random_case(const std::string& kind, std::int64_t ranks, std::int64_t chunks, std::int64_t microbatches,
                 std::uint64_t seed, bool same_shape, bool encoder_decoder) {
  Case c;
  Rng rng{seed * 0x2545F4914F6CDD1Dull + 0x1234567ull};
  const std::int64_t V = ranks * chunks;
  PACKPIPE_CHECK_ARG(!encoder_decoder || V == 1 || V % 2 == 0,
                     "synthetic::random_case: encoder-decoder needs an even number of virtual stages, found {}", V);
  for (std::int64_t v = 0; v < V; ++v) {
    VirtualStage vs;
    vs.index = v;
    vs.rank = v % ranks;
    if (!encoder_decoder) {
      vs.layout.encoder_layers = 1;
    } else if (V == 1) {
      vs.layout.encoder_layers = vs.layout.decoder_layers = 1;
    } else if (v < V / 2) {
      vs.layout.encoder_layers = 1;
    } else {
      vs.layout.decoder_layers = 1;
    }
    c.vstages.push_back(vs);
  }
  c.vstages.front().layout.has_embedding = true;
  c.vstages.back().layout.has_postprocess = true;
  std::uint32_t sample = 0;
  const std::int64_t rows0 = rng.uniform(1, 8), len0 = 64 * rng.uniform(1, 32), dec0 = 32 * rng.uniform(1, 8);
  for (std::int64_t m = 0; m < microbatches; ++m) {
    MicroBatch mb;
    const std::int64_t rows = same_shape ? rows0 : rng.uniform(1, 8);
    mb.padded_len = same_shape ? len0 : 64 * rng.uniform(1, 32);
    mb.padded_dec_len = encoder_decoder ? (same_shape ? dec0 : 32 * rng.uniform(1, 8)) : 0;
    for (std::int64_t i = 0; i < rows; ++i) mb.samples.push_back(sample++);
    const std::int64_t cap = rows * (mb.padded_len + mb.padded_dec_len);
    mb.tokens = static_cast<std::uint64_t>(rng.uniform(rows, cap));
    mb.recompute = static_cast<cm::Recompute>(rng.uniform(0, 2));
    c.mbs.push_back(mb);
  }
  const std::int64_t hidden = 1024;
  StageCostTable& t = c.costs;
  t.microbatches = microbatches;
  t.vstages = V;
  const auto n = static_cast<std::size_t>(microbatches * V);
  t.forward_ms.resize(n);
  t.backward_ms.resize(n);
  t.backward_weight_ms.resize(n);
  t.stored_bytes.resize(n);
  t.peak_bytes.resize(n);
  t.send_bytes.resize(n);
  t.static_bytes.assign(static_cast<std::size_t>(ranks), 2e9);
  for (std::int64_t m = 0; m < microbatches; ++m) {
    const auto& mb = c.mbs[m];
    const double tok = static_cast<double>(mb.rows() * (mb.padded_len + mb.padded_dec_len));
    for (std::int64_t v = 0; v < V; ++v) {
      const std::size_t i = t.at(m, v);
      const double jitter = 1.0 + 0.05 * static_cast<double>(rng.uniform(0, 10));
      t.forward_ms[i] = 1e-3 * tok * jitter;
      t.backward_ms[i] = 2.0 * t.forward_ms[i] * (mb.recompute == cm::Recompute::Full ? 1.5 : 1.0);
      t.backward_weight_ms[i] = 0.4 * t.backward_ms[i];
      const double rc = mb.recompute == cm::Recompute::Full ? 0.1 : mb.recompute == cm::Recompute::Selective ? 0.6 : 1.0;
      t.stored_bytes[i] = tok * static_cast<double>(hidden) * 2 * 16 * rc;
      t.peak_bytes[i] = tok * static_cast<double>(hidden) * 2 * 4;
      t.send_bytes[i] = tok * static_cast<double>(hidden) * 2;
    }
  }
  c.schedule = order(kind, ranks, chunks, microbatches);
  assign_times(c.schedule, c.costs, 0.05);
  c.options.hidden = hidden;
  c.options.iteration = seed;
  c.options.memory_limit_bytes = 80'000'000'000ull;
  return c;
}

Plan random_plan(const std::string& kind, std::int64_t ranks, std::int64_t chunks, std::int64_t microbatches,
                 std::uint64_t seed, bool same_shape, bool encoder_decoder) {
  Case c = random_case(kind, ranks, chunks, microbatches, seed, same_shape, encoder_decoder);
  return build_plan(c.schedule, c.mbs, c.vstages, &c.costs, c.options);
}

}  // namespace synthetic

}  // namespace packpipe::scheduler
