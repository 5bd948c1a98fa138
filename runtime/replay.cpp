#include "runtime/replay.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>

#ifdef __linux__
#include <sys/prctl.h>
#endif

#include <fmt/format.h>

#include "common/errors.h"
#include "common/rng.h"
#include "runtime/transport.h"

namespace packpipe::runtime {

namespace pl = ::packpipe::plan;

namespace {

const char* kind_text(PayloadKind k) {
  switch (k) {
    case PayloadKind::Load: return "loaded inputs";
    case PayloadKind::Activation: return "activation";
    case PayloadKind::Gradient: return "gradient";
  }
  return "?";
}

}  // namespace

std::uint64_t payload_key(std::uint64_t iteration, std::uint32_t replica, std::uint32_t mb, std::uint32_t stage,
                          PayloadKind kind) {
  std::uint64_t k = mix_combine(0x5041594c4f4144ull, iteration);  // "PAYLOAD"
  k = mix_combine(k, (std::uint64_t{replica} << 32) | mb);
  return mix_combine(k, (std::uint64_t{stage} << 8) | static_cast<std::uint64_t>(kind));
}

std::uint64_t payload_word(std::uint64_t iteration, std::uint32_t replica, std::uint32_t mb, std::uint32_t stage,
                           PayloadKind kind, std::uint64_t i) {
  return mix64(payload_key(iteration, replica, mb, stage, kind) + i * kSplitMixGamma);
}

void fill_payload(const Buffer& b, std::uint64_t iteration, std::uint32_t replica, std::uint32_t mb, std::uint32_t stage,
                  PayloadKind kind) {
  if (b.materialized == 0) return;
  PACKPIPE_CHECK_ARG(b.kind == MemoryKind::Host && b.data != nullptr, "fill_payload: host buffers only");
  const std::uint64_t key = payload_key(iteration, replica, mb, stage, kind);
  auto* p = static_cast<std::uint8_t*>(b.data);
  const std::uint64_t words = b.materialized / 8;
  for (std::uint64_t i = 0; i < words; ++i) {
    const std::uint64_t w = mix64(key + i * kSplitMixGamma);
    std::memcpy(p + 8 * i, &w, 8);
  }
  const std::uint64_t tail = b.materialized - 8 * words;
  if (tail > 0) {
    const std::uint64_t w = mix64(key + words * kSplitMixGamma);
    std::memcpy(p + 8 * words, &w, tail);
  }
}

std::int64_t check_payload(const Buffer& b, std::uint64_t iteration, std::uint32_t replica, std::uint32_t mb,
                           std::uint32_t stage, PayloadKind kind) {
  if (b.materialized == 0) return -1;
  const std::uint64_t key = payload_key(iteration, replica, mb, stage, kind);
  const auto* p = static_cast<const std::uint8_t*>(b.data);
  for (std::uint64_t off = 0; off < b.materialized; off += 8) {
    const std::uint64_t w = mix64(key + (off / 8) * kSplitMixGamma);
    const std::uint64_t n = std::min<std::uint64_t>(8, b.materialized - off);
    if (std::memcmp(p + off, &w, n) != 0) {
      const auto* e = reinterpret_cast<const std::uint8_t*>(&w);
      for (std::uint64_t j = 0; j < n; ++j) {
        if (p[off + j] != e[j]) return static_cast<std::int64_t>(off + j);
      }
    }
  }
  return -1;
}

void wait_until(std::chrono::steady_clock::time_point deadline, double spin_us, const Transport* transport) {
  using namespace std::chrono;
  const auto spin = duration_cast<steady_clock::duration>(duration<double, std::micro>(std::max(0.0, spin_us)));
  const auto sleep_to = deadline - spin;
  // Sleeps in slices, polling for an abort: an op scaled to minutes or hours ends soon after another
  // rank failed (the executor then stops with the pipeline's error), not when its time is up.
  constexpr auto kSlice = milliseconds(20);
  for (auto now = steady_clock::now(); now < sleep_to; now = steady_clock::now()) {
    if (transport != nullptr && !transport->abort_reason().empty()) return;
    std::this_thread::sleep_until(std::min(sleep_to, now + kSlice));
  }
  while (steady_clock::now() < deadline) std::this_thread::yield();
}

ReplayHandler::ReplayHandler(ReplayOptions options) : o_(options) {
  PACKPIPE_CHECK_ARG(o_.time_scale >= 0 && o_.time_scale <= 1e6, "time scale must be in [0, 1e6], found {}",
                     o_.time_scale);
  PACKPIPE_CHECK_ARG(o_.spin_us >= 0 && o_.spin_us <= 1e6, "spin must be in [0, 1e6] us, found {}", o_.spin_us);
}

void ReplayHandler::begin_iteration(const pl::Plan& plan, std::uint32_t rank) {
#ifdef __linux__
  // Timed waits wake within microseconds rather than the default 50 us timer slack.
  prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);
#endif
  plan_ = &plan;
  rank_ = rank;
  durations_.clear();
  if (rank < plan.timeline.size()) {
    for (const pl::ScheduledOp& op : plan.timeline[rank]) {
      durations_[{static_cast<int>(op.kind), op.mb, op.vstage}] = op.end_ms - op.start_ms;
    }
  }
}

double ReplayHandler::planned_ms(pl::OpKind kind, std::uint32_t mb, std::uint32_t stage) const {
  auto it = durations_.find({static_cast<int>(kind), mb, stage});
  return it == durations_.end() ? 0.0 : it->second;
}

void ReplayHandler::compute(const OpContext& ctx, pl::OpKind kind) {
  if (o_.time_scale <= 0) return;
  const double ms = planned_ms(kind, ctx.ins->mb, ctx.ins->stage) * o_.time_scale;
  if (ms <= 0) return;
  // The op lasts its planned duration from the moment the handler was entered: the payload checks
  // and fills it does are part of that time, not added to it.
  wait_until(op_start_ + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                             std::chrono::duration<double, std::milli>(ms)),
             o_.spin_us, ctx.transport);
}

Buffer ReplayHandler::make(std::uint64_t bytes) { return host_buffer(bytes, o_.payload_bytes); }

void ReplayHandler::verify(const OpContext& ctx, const Buffer& b, std::uint32_t mb, std::uint32_t stage, PayloadKind kind,
                           const char* what) {
  if (!o_.verify) return;
  const std::int64_t bad = check_payload(b, plan_->iteration, plan_->replica, mb, stage, kind);
  if (bad >= 0) {
    throw Error(fmt::format("payload check failed: the {} of micro-batch {} stage {} {} differs from what its producer "
                            "wrote at byte {} of {} checked (iteration {}, replica {})",
                            kind_text(kind), mb, stage, what, bad, b.materialized, plan_->iteration, plan_->replica));
  }
  verified_ += b.materialized;
}

Buffer ReplayHandler::load(const OpContext& ctx) {
  Buffer b = make(ctx.shape != nullptr ? ctx.shape->bytes() : 0);
  fill_payload(b, plan_->iteration, plan_->replica, ctx.ins->mb, ctx.ins->stage, PayloadKind::Load);
  return b;
}

// Output of a compute op: the plan's size when it sends it, else (a same-rank hand-over, which the
// plan gives no shape) a payload-sized buffer.
Buffer ReplayHandler::allocate(const OpContext& ctx) { return make(ctx.shape != nullptr ? ctx.shape->bytes() : 0); }

Buffer ReplayHandler::forward(const OpContext& ctx, const Buffer* in, const Buffer* in2) {
  op_start_ = std::chrono::steady_clock::now();
  const std::uint32_t mb = ctx.ins->mb, v = ctx.ins->stage;
  if (in != nullptr) verify(ctx, *in, mb, v - 1, PayloadKind::Activation, "read by the forward");
  if (in2 != nullptr) verify(ctx, *in2, mb, v, PayloadKind::Load, "read by the forward");
  Buffer out;
  if (ctx.ins->out != pl::kNone) {
    out = make(ctx.out_shape != nullptr ? ctx.out_shape->bytes() : std::max<std::uint64_t>(o_.payload_bytes, 8));
    fill_payload(out, plan_->iteration, plan_->replica, mb, v, PayloadKind::Activation);
  }
  compute(ctx, pl::OpKind::Forward);
  return out;
}

Buffer ReplayHandler::backward(const OpContext& ctx, const Buffer* grad) {
  op_start_ = std::chrono::steady_clock::now();
  const std::uint32_t mb = ctx.ins->mb, v = ctx.ins->stage;
  if (grad != nullptr) verify(ctx, *grad, mb, v + 1, PayloadKind::Gradient, "read by the backward");
  Buffer out;
  if (ctx.ins->out != pl::kNone) {
    out = make(ctx.out_shape != nullptr ? ctx.out_shape->bytes() : std::max<std::uint64_t>(o_.payload_bytes, 8));
    fill_payload(out, plan_->iteration, plan_->replica, mb, v, PayloadKind::Gradient);
  }
  compute(ctx, ctx.ins->op == pl::Opcode::Backward ? pl::OpKind::Backward : pl::OpKind::BackwardInput);
  return out;
}

void ReplayHandler::backward_weight(const OpContext& ctx) {
  op_start_ = std::chrono::steady_clock::now();
  compute(ctx, pl::OpKind::BackwardWeight);
}

void ReplayHandler::received(const OpContext& ctx, const Buffer& buffer) {
  const bool act = ctx.ins->op == pl::Opcode::RecvActWait;
  const std::uint32_t mb = ctx.ins->mb, v = ctx.ins->stage;
  verify(ctx, buffer, mb, act ? v - 1 : v + 1, act ? PayloadKind::Activation : PayloadKind::Gradient,
         fmt::format("received from rank {}", ctx.ins->peer).c_str());
}

}  // namespace packpipe::runtime
