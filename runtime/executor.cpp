#include "runtime/executor.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <memory>

#include <fmt/format.h>
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "common/errors.h"
#include "plan/format.h"
#include "plan/validator.h"

namespace packpipe::runtime {

namespace pl = ::packpipe::plan;

void StageHandler::reduce_tied(const OpContext& ctx) {
  throw Unsupported(fmt::format("REDUCE_TIED (plan with a tied embedding): this stage handler does not implement "
                                "reduce_tied for stage {}", ctx.ins != nullptr ? ctx.ins->stage : 0));
}

const char* channel_name(Channel c) {
  switch (c) {
    case Channel::Activation: return "activation";
    case Channel::Gradient: return "gradient";
    case Channel::Control: return "control";
  }
  return "?";
}

Buffer host_buffer(std::uint64_t bytes, std::uint64_t cap) {
  const std::uint64_t n = cap > 0 ? std::min(bytes, cap) : bytes;
  auto mem = std::shared_ptr<std::uint8_t>(new std::uint8_t[n > 0 ? n : 1](), std::default_delete<std::uint8_t[]>());
  Buffer b;
  b.data = mem.get();
  b.bytes = bytes;
  b.materialized = n;
  b.kind = MemoryKind::Host;
  b.owner = std::move(mem);
  return b;
}

std::uint64_t plan_fingerprint(const pl::Plan& plan) {
  pl::EncodeOptions o;
  o.compress = false;
  const std::vector<std::uint8_t> bytes = pl::encode_plan(plan, o);
  return XXH64(bytes.data(), bytes.size(), 0);
}

namespace {

std::int64_t ns_since(Clock::time_point epoch, Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t - epoch).count();
}

// The plan-agreement message: who sends it and the plan it runs.
struct Agreement {
  std::uint64_t magic = 0x5050414752454521ull;  // "PPAGREE!"
  std::uint64_t iteration = 0;
  std::uint64_t replica_ranks = 0;  // replica << 32 | ranks
  std::uint64_t fingerprint = 0;
};

}  // namespace

// One run of one rank's stream: the slots, the requests in flight, the record, and the context of
// every error.
struct Executor::State {
  Executor& ex;
  const pl::Plan& p;
  const std::uint32_t rank;
  const std::vector<pl::Instruction>& stream;
  std::vector<Buffer> slots;
  // Where the stream is: handlers are called between ITER_BEGIN and ITER_END only, so a handler
  // always sees begin_iteration first (the validator requires this order; unvalidated runs check it).
  enum class Phase { Before, Running, Ended } phase = Phase::Before;
  std::vector<std::unique_ptr<Request>> sends, recvs;  // per slot: in flight
  std::vector<const pl::TensorShape*> out_shape;       // per instruction: compute ops' sent shape
  RankRecord rec;
  std::size_t i = 0;  // current instruction

  State(Executor& e, const pl::Plan& plan, std::uint32_t r)
      : ex(e), p(plan), rank(r), stream(plan.streams[r]) {}

  std::string where() const {
    std::string s = fmt::format("rank {}, iteration {}", rank, p.iteration);
    if (i < stream.size()) s += fmt::format(", instruction {} ({})", i, pl::to_string(stream[i]));
    return s;
  }
  // A malformed plan (reachable only without validation): an error naming the instruction.
  void require(bool ok, const char* what) {
    if (!ok) fail_local(fmt::format("{}: malformed plan: {}", where(), what));
  }
  Clock::time_point deadline() const {
    return ex.options_.timeout_s > 0 ? Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                                          std::chrono::duration<double>(ex.options_.timeout_s))
                                     : Clock::time_point::max();
  }
  Buffer& slot(std::uint32_t b) {
    require(b < slots.size(), "buffer slot out of range");
    return slots[b];
  }
  const pl::TensorShape* shape_of(const pl::Instruction& ins) {
    if (ins.shape == pl::kNone) return nullptr;
    require(ins.shape < p.shapes.size(), "shape index out of range");
    return &p.shapes[ins.shape];
  }
  OpContext context(const pl::Instruction& ins) {
    OpContext c;
    c.plan = &p;
    c.rank = rank;
    c.index = i;
    c.ins = &ins;
    c.shape = shape_of(ins);
    c.out_shape = out_shape[i];
    c.transport = &ex.transport_;
    if (ins.mb != pl::kNone) {
      require(ins.mb < p.microbatches.size(), "micro-batch out of range");
      c.mb = &p.microbatches[ins.mb];
      c.loss_weight = c.mb->loss_weight;
      if (ins.stage != pl::kNone) {
        require(ins.stage < p.vstages, "stage out of range");
        const std::size_t k = p.at(ins.mb, ins.stage);
        if (k < p.recompute.size()) c.recompute = static_cast<Recompute>(p.recompute[k]);
      }
    }
    return c;
  }
  // A compute op's output goes to the slot a later send posts with a shape: that shape.
  void find_out_shapes() {
    out_shape.assign(stream.size(), nullptr);
    for (std::size_t k = 0; k < stream.size(); ++k) {
      const pl::Instruction& c = stream[k];
      if (!pl::is_compute(c.op) || c.out == pl::kNone) continue;
      for (std::size_t j = k + 1; j < stream.size(); ++j) {
        const pl::Instruction& s = stream[j];
        if ((s.op == pl::Opcode::SendActStart || s.op == pl::Opcode::SendGradStart) && s.in == c.out) {
          if (s.shape < p.shapes.size()) out_shape[k] = &p.shapes[s.shape];
          break;
        }
        if (s.op == pl::Opcode::FreeBuf && s.in == c.out) break;
      }
    }
  }

  // The handler's buffer against the plan's size for it.
  void check_size(const Buffer& b, const pl::TensorShape* s, const char* what) {
    if (s == nullptr) return;
    if (b.bytes != s->bytes()) {
      fail_local(fmt::format("{}: the handler's {} holds {} bytes, the plan's shape {} is {} bytes", where(), what,
                             b.bytes, pl::to_string(*s), s->bytes()));
    }
  }

  // Calls into the handler or the transport, timed into `acc`; an exception there becomes this
  // rank's error (naming the instruction) after the pipeline is aborted.
  template <class F>
  auto timed(std::int64_t& acc, const char* who, F&& f) {
    struct Add {
      std::int64_t& acc;
      Clock::time_point t0;
      ~Add() { acc += std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count(); }
    } add{acc, Clock::now()};
    try {
      return f();
    } catch (const std::exception& e) {
      fail_local(fmt::format("{}: the {} failed: {}", where(), who, e.what()));
    }
  }
  template <class F>
  auto timed_handler(F&& f) { return timed(rec.handler_ns, "stage handler", std::forward<F>(f)); }
  template <class F>
  auto timed_transport(F&& f) { return timed(rec.transport_ns, "transport", std::forward<F>(f)); }

  // Waits for `r` until the deadline; `what` names what was awaited.
  void wait(Request& r, const std::string& what) {
    const auto t0 = Clock::now();
    WaitStatus st;
    try {
      st = r.wait(deadline());
    } catch (const std::exception& e) {
      rec.wait_ns += ns_since(t0, Clock::now());
      fail_local(fmt::format("{}: {} failed: {}", where(), what, e.what()));
    }
    rec.wait_ns += ns_since(t0, Clock::now());
    if (st == WaitStatus::Done) return;
    if (st == WaitStatus::Aborted) {
      throw Error(fmt::format("{}: stopped while waiting for {}: the pipeline was aborted: {}", where(), what,
                              ex.transport_.abort_reason()));
    }
    fail_local(fmt::format("{}: timed out after {} s waiting for {}", where(), ex.options_.timeout_s, what));
  }
  // A failure found here: abort the pipeline so that every rank ends, then throw.
  [[noreturn]] void fail_local(const std::string& msg) {
    ex.transport_.abort(msg);
    throw Error(msg);
  }

  std::string awaited(const pl::Instruction& ins, bool recv) const {
    const bool act = ins.op == pl::Opcode::RecvActWait || ins.op == pl::Opcode::SendActWait;
    if (recv) {
      return fmt::format("the {} of micro-batch {} stage {} from rank {}", act ? "activation" : "gradient", ins.mb,
                         act ? ins.stage - 1 : ins.stage + 1, ins.peer);
    }
    return fmt::format("rank {} to receive the {} of micro-batch {} stage {}", ins.peer,
                       act ? "activation" : "gradient", ins.mb, ins.stage);
  }

  void agree() {
    const std::uint32_t S = p.ranks;
    if (S <= 1) return;
    std::vector<std::uint32_t> peers{(rank + S - 1) % S};
    if ((rank + 1) % S != peers[0]) peers.push_back((rank + 1) % S);
    Agreement mine;
    mine.iteration = p.iteration;
    mine.replica_ranks = (std::uint64_t{p.replica} << 32) | p.ranks;
    mine.fingerprint = plan_fingerprint(p);
    Buffer out = host_buffer(sizeof(Agreement));
    std::memcpy(out.data, &mine, sizeof mine);
    std::vector<Buffer> in;
    std::vector<std::unique_ptr<Request>> reqs;
    for (std::uint32_t q : peers) {
      in.push_back(host_buffer(sizeof(Agreement)));
      reqs.push_back(timed_transport([&] { return ex.transport_.recv(in.back(), q, Channel::Control); }));
    }
    for (std::uint32_t q : peers) {
      reqs.push_back(timed_transport([&] { return ex.transport_.send(out, q, Channel::Control); }));
    }
    for (std::size_t k = 0; k < reqs.size(); ++k) {
      const std::uint32_t q = peers[k % peers.size()];
      wait(*reqs[k], k < peers.size() ? fmt::format("rank {}'s plan fingerprint", q)
                                      : fmt::format("rank {} to take this rank's plan fingerprint", q));
    }
    for (std::size_t k = 0; k < peers.size(); ++k) {
      Agreement theirs;
      std::memcpy(&theirs, in[k].data, sizeof theirs);
      if (theirs.magic != mine.magic || theirs.iteration != mine.iteration ||
          theirs.replica_ranks != mine.replica_ranks || theirs.fingerprint != mine.fingerprint) {
        fail_local(fmt::format(
            "{}: plan disagreement: rank {} runs iteration {} replica {} of {} ranks, plan fingerprint {:#018x}; rank {} "
            "runs iteration {} replica {} of {} ranks, plan fingerprint {:#018x} (every rank must execute the same plan)",
            where(), rank, mine.iteration, p.replica, p.ranks, mine.fingerprint, peers[k], theirs.iteration,
            theirs.replica_ranks >> 32, theirs.replica_ranks & 0xFFFFFFFFu, theirs.fingerprint));
      }
    }
  }

  // ---- one handler per opcode ----
  void on_iter_begin() {
    timed_handler([&] { ex.handler_.begin_iteration(p, rank); });
    if (ex.options_.check_agreement) agree();
  }
  void on_iter_end() {
    for (std::size_t b = 0; b < slots.size(); ++b) {
      if (sends[b] || recvs[b]) fail_local(fmt::format("{}: b{} still has a message in flight at the end", where(), b));
    }
    timed_handler([&] { ex.handler_.end_iteration(p, rank); });
  }
  void on_load(const pl::Instruction& ins) {
    const OpContext c = context(ins);
    Buffer b = timed_handler([&] { return ex.handler_.load(c); });
    check_size(b, c.shape, "loaded inputs");
    slot(ins.out) = std::move(b);
  }
  const Buffer* input(std::uint32_t b) {
    if (b == pl::kNone) return nullptr;
    const Buffer& x = slot(b);
    require(static_cast<bool>(x), "reads an empty buffer slot");
    require(!recvs[b], "reads a buffer whose receive was not waited for");
    return &x;
  }
  void on_forward(const pl::Instruction& ins) {
    const OpContext c = context(ins);
    const Buffer* in = input(ins.in);
    const Buffer* in2 = input(ins.in2);
    Buffer out = timed_handler([&] { return ex.handler_.forward(c, in, in2); });
    if (ins.out != pl::kNone) {
      require(static_cast<bool>(out), "the handler's forward returned no output for a stage that hands one on");
      check_size(out, c.out_shape, "activation");
      slot(ins.out) = std::move(out);
    }
  }
  void on_backward(const pl::Instruction& ins) {
    const OpContext c = context(ins);
    const Buffer* grad = input(ins.in);
    Buffer out = timed_handler([&] { return ex.handler_.backward(c, grad); });
    if (ins.out != pl::kNone) {
      require(static_cast<bool>(out), "the handler's backward returned no input gradient for a stage that sends one");
      check_size(out, c.out_shape, "input gradient");
      slot(ins.out) = std::move(out);
    }
  }
  void on_backward_weight(const pl::Instruction& ins) {
    const OpContext c = context(ins);
    timed_handler([&] { ex.handler_.backward_weight(c); });
  }
  Channel channel_of(pl::Opcode op) const {
    return op == pl::Opcode::SendActStart || op == pl::Opcode::RecvActStart ? Channel::Activation : Channel::Gradient;
  }
  void check_peer(const pl::Instruction& ins) {
    require(ins.peer < p.ranks && ins.peer != rank, "peer out of range");
  }
  void on_send_start(const pl::Instruction& ins) {
    check_peer(ins);
    const Buffer& b = slot(ins.in);
    require(static_cast<bool>(b), "sends an empty buffer slot");
    require(!sends[ins.in], "sends from a buffer whose previous send was not waited for");
    const pl::TensorShape* s = shape_of(ins);
    require(s != nullptr, "a send without a shape");
    if (b.bytes != s->bytes()) {
      fail_local(fmt::format("{}: b{} holds {} bytes, the plan's shape {} is {} bytes: refusing to send it", where(),
                             ins.in, b.bytes, pl::to_string(*s), s->bytes()));
    }
    sends[ins.in] = timed_transport([&] { return ex.transport_.send(b, ins.peer, channel_of(ins.op)); });
  }
  void on_recv_start(const pl::Instruction& ins) {
    check_peer(ins);
    require(ins.out < slots.size(), "buffer slot out of range");
    require(!slots[ins.out], "receives into a buffer slot that is in use");
    const OpContext c = context(ins);
    require(c.shape != nullptr, "a receive without a shape");
    Buffer b = timed_handler([&] { return ex.handler_.allocate(c); });
    check_size(b, c.shape, "receive buffer");
    slots[ins.out] = b;
    recvs[ins.out] = timed_transport([&] { return ex.transport_.recv(slots[ins.out], ins.peer, channel_of(ins.op)); });
  }
  void on_recv_wait(const pl::Instruction& ins) {
    require(ins.in < slots.size() && recvs[ins.in], "waits for a receive that was not posted");
    wait(*recvs[ins.in], awaited(ins, true));
    recvs[ins.in].reset();
    const OpContext c = context(ins);
    timed_handler([&] { ex.handler_.received(c, slots[ins.in]); });
  }
  void on_send_wait(const pl::Instruction& ins) {
    require(ins.in < slots.size() && sends[ins.in], "waits for a send that was not posted");
    wait(*sends[ins.in], awaited(ins, false));
    sends[ins.in].reset();
  }
  void on_free(const pl::Instruction& ins) {
    Buffer& b = slot(ins.in);
    require(!sends[ins.in] && !recvs[ins.in], "frees a buffer with a message in flight");
    b = Buffer{};
  }
  void on_reduce(const pl::Instruction& ins) {
    require(ins.stage < p.vstages, "stage out of range");
    const OpContext c = context(ins);
    timed_handler([&] { ex.handler_.reduce_grad(c); });
  }
  void on_opt_step(const pl::Instruction& ins) {
    const OpContext c = context(ins);
    timed_handler([&] { ex.handler_.optimizer_step(c); });
  }
  void on_reduce_tied(const pl::Instruction& ins) {
    require(ins.stage < p.vstages, "stage out of range");
    const OpContext c = context(ins);
    timed_handler([&] { ex.handler_.reduce_tied(c); });
  }

  void execute(const pl::Instruction& ins) {
    if (ins.op == pl::Opcode::IterBegin) {
      require(phase == Phase::Before, "a second ITER_BEGIN (expected one, first in the stream)");
      phase = Phase::Running;
    } else if (ins.op == pl::Opcode::IterEnd) {
      require(phase == Phase::Running, "ITER_END without its ITER_BEGIN");
      phase = Phase::Ended;
    } else {
      require(phase == Phase::Running, phase == Phase::Before ? "an instruction before ITER_BEGIN"
                                                              : "an instruction after ITER_END");
    }
    switch (ins.op) {
      case pl::Opcode::IterBegin: on_iter_begin(); break;
      case pl::Opcode::IterEnd: on_iter_end(); break;
      case pl::Opcode::LoadMb: on_load(ins); break;
      case pl::Opcode::Forward: on_forward(ins); break;
      case pl::Opcode::Backward:
      case pl::Opcode::BackwardInput: on_backward(ins); break;
      case pl::Opcode::BackwardWeight: on_backward_weight(ins); break;
      case pl::Opcode::SendActStart:
      case pl::Opcode::SendGradStart: on_send_start(ins); break;
      case pl::Opcode::SendActWait:
      case pl::Opcode::SendGradWait: on_send_wait(ins); break;
      case pl::Opcode::RecvActStart:
      case pl::Opcode::RecvGradStart: on_recv_start(ins); break;
      case pl::Opcode::RecvActWait:
      case pl::Opcode::RecvGradWait: on_recv_wait(ins); break;
      case pl::Opcode::FreeBuf: on_free(ins); break;
      case pl::Opcode::ReduceGrad: on_reduce(ins); break;
      case pl::Opcode::OptStep: on_opt_step(ins); break;
      case pl::Opcode::ReduceTied: on_reduce_tied(ins); break;
      default: require(false, "unknown opcode");
    }
  }

  void run() {
    const std::size_t n = stream.size();
    slots.assign(p.buffer_slots[rank], Buffer{});
    sends.resize(slots.size());
    recvs.resize(slots.size());
    find_out_shapes();
    rec.rank = rank;
    rec.iteration = p.iteration;
    rec.instructions = n;
    const bool record = ex.options_.record;
    if (record) rec.times.resize(n);
    const auto t_begin = Clock::now();
    rec.start_ns = ns_since(ex.epoch_, t_begin);
    for (i = 0; i < n; ++i) {
      const pl::Instruction& ins = stream[i];
      const auto t0 = record ? Clock::now() : Clock::time_point{};
      if (is_abortable_point(ins)) {
        const std::string why = ex.transport_.abort_reason();
        if (!why.empty()) throw Error(fmt::format("{}: stopped: the pipeline was aborted: {}", where(), why));
      }
      try {
        execute(ins);
      } catch (const Error&) {
        throw;  // names the instruction; a local failure aborted the pipeline already
      } catch (const std::exception& e) {
        fail_local(fmt::format("{}: {}", where(), e.what()));
      }
      if (record) rec.times[i] = {ns_since(ex.epoch_, t0), ns_since(ex.epoch_, Clock::now())};
    }
    if (phase != Phase::Ended) fail_local(fmt::format("rank {}, iteration {}: malformed plan: the stream ends without "
                                                      "ITER_END", rank, p.iteration));
    rec.end_ns = ns_since(ex.epoch_, Clock::now());
  }
  // Compute instructions check for an abort first, so that a failed pipeline stops computing.
  static bool is_abortable_point(const pl::Instruction& ins) { return pl::is_compute(ins.op); }
};

Executor::Executor(StageHandler& handler, Transport& transport, ExecutorOptions options)
    : handler_(handler), transport_(transport), options_(options), epoch_(Clock::now()) {
  PACKPIPE_CHECK_ARG(options_.timeout_s >= 0 && options_.timeout_s <= kMaxTimeoutS,
                     "timeout must be in [0, {}] s (0: forever), found {}", kMaxTimeoutS, options_.timeout_s);
}

RankRecord Executor::run(const pl::Plan& plan) {
  const std::uint32_t rank = transport_.rank();
  auto fail = [&](const std::string& msg) {
    transport_.abort(msg);
    throw Error(msg);
  };
  if (plan.ranks != transport_.ranks()) {
    fail(fmt::format("rank {}, iteration {}: the plan has {} pipeline ranks, the transport {}", rank, plan.iteration,
                     plan.ranks, transport_.ranks()));
  }
  if (options_.validate) {
    const pl::ValidationReport rep = pl::validate(plan);
    if (!rep.ok()) {
      std::string msg = fmt::format("rank {}, iteration {}: refusing to run an invalid plan ({} violations)", rank,
                                    plan.iteration, rep.violations.size());
      for (std::size_t k = 0; k < rep.violations.size() && k < 5; ++k) msg += "\n  " + pl::to_string(rep.violations[k], &plan);
      fail(msg);
    }
  } else if (plan.streams.size() != plan.ranks || plan.buffer_slots.size() != plan.ranks || rank >= plan.ranks ||
             plan.recompute.size() != plan.microbatches.size() * plan.vstages) {
    fail(fmt::format("rank {}, iteration {}: the plan's tables do not have their declared sizes", rank, plan.iteration));
  } else if (plan.buffer_slots[rank] > plan.streams[rank].size()) {
    // Unvalidated plans still size the slot table from the plan: a slot is allocated by an
    // instruction, so more slots than instructions is a corrupt plan (the validator's rule).
    fail(fmt::format("rank {}, iteration {}: buffer_slots[{}]: expected at most the stream's {} instructions, found {}",
                     rank, plan.iteration, rank, plan.streams[rank].size(), plan.buffer_slots[rank]));
  }
  State st(*this, plan, rank);
  st.run();
  return std::move(st.rec);
}

}  // namespace packpipe::runtime
