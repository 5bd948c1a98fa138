// Replay: executing a plan with no model. Each compute op takes its planned duration (from the
// plan's simulated timeline, scaled): a timed wait that leaves the CPU free, so many ranks replay
// on few cores. Every activation, gradient and loaded input carries a payload derived from
// (iteration, replica, micro-batch, stage, kind), which is verified where it is received and
// where it is read, so a transport or executor that delivers other bytes is caught.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <tuple>

#include "runtime/handler.h"

namespace packpipe::runtime {

struct ReplayOptions {
  /// Replayed duration = planned duration x time_scale (0: no waiting at all).
  double time_scale = 1.0;
  /// Bytes of each buffer materialised, filled and checked (0: the whole tensor). Sizes are still
  /// checked at their full value; a cap keeps large models' replays from measuring memcpy.
  std::uint64_t payload_bytes = 65536;
  /// Check payloads on receipt and on read.
  bool verify = true;
  /// The last microseconds of each op are spent polling the clock instead of sleeping (the sleep's
  /// timer slack is set to 1 ns on Linux, so a short poll suffices); 0: sleep only.
  double spin_us = 20;
};

/// What a payload is: one tensor of one micro-batch and stage.
enum class PayloadKind : std::uint8_t { Load = 0, Activation = 1, Gradient = 2 };

/// The key of the payload of (iteration, replica, mb, stage, kind): word i is
/// mix64(key + i x splitmix64's gamma).
std::uint64_t payload_key(std::uint64_t iteration, std::uint32_t replica, std::uint32_t mb, std::uint32_t stage,
                          PayloadKind kind);
/// The 8-byte word `i` of the payload of (iteration, replica, mb, stage, kind).
std::uint64_t payload_word(std::uint64_t iteration, std::uint32_t replica, std::uint32_t mb, std::uint32_t stage,
                           PayloadKind kind, std::uint64_t i);
/// Fills the materialised bytes of `b` with that payload.
void fill_payload(const Buffer& b, std::uint64_t iteration, std::uint32_t replica, std::uint32_t mb, std::uint32_t stage,
                  PayloadKind kind);
/// The first byte of `b` that differs from that payload, or -1 when every materialised byte matches.
std::int64_t check_payload(const Buffer& b, std::uint64_t iteration, std::uint32_t replica, std::uint32_t mb,
                           std::uint32_t stage, PayloadKind kind);

/// A stage handler that replays a plan (host memory). One per rank thread.
class ReplayHandler : public StageHandler {
 public:
  explicit ReplayHandler(ReplayOptions options = {});
  void begin_iteration(const plan::Plan& plan, std::uint32_t rank) override;
  Buffer load(const OpContext& ctx) override;
  Buffer forward(const OpContext& ctx, const Buffer* in, const Buffer* in2) override;
  Buffer backward(const OpContext& ctx, const Buffer* grad) override;
  void backward_weight(const OpContext& ctx) override;
  void reduce_grad(const OpContext& ctx) override {}
  void optimizer_step(const OpContext& ctx) override {}
  void reduce_tied(const OpContext& ctx) override {}
  Buffer allocate(const OpContext& ctx) override;
  void received(const OpContext& ctx, const Buffer& buffer) override;
  /// Payload bytes checked so far.
  std::uint64_t verified_bytes() const { return verified_; }

 protected:
  /// Waits for the planned duration of (kind, mb, stage) on this rank, scaled.
  virtual void compute(const OpContext& ctx, plan::OpKind kind);
  /// A buffer for a tensor of `bytes` bytes (host memory, payload-capped).
  virtual Buffer make(std::uint64_t bytes);
  void verify(const OpContext& ctx, const Buffer& b, std::uint32_t mb, std::uint32_t stage, PayloadKind kind,
              const char* what);
  /// Planned duration of (kind, mb, stage) in ms (0 when the plan has no timeline).
  double planned_ms(plan::OpKind kind, std::uint32_t mb, std::uint32_t stage) const;

  ReplayOptions o_;
  std::chrono::steady_clock::time_point op_start_{};  ///< when the current compute op's handler was entered
  const plan::Plan* plan_ = nullptr;
  std::uint32_t rank_ = 0;
  std::map<std::tuple<int, std::uint32_t, std::uint32_t>, double> durations_;  // (kind, mb, stage) -> ms
  std::uint64_t verified_ = 0;
};

/// Sleeps until `deadline`, polling the clock for its last `spin_us` microseconds; returns early once
/// `transport` (when given) reports an abort.
void wait_until(std::chrono::steady_clock::time_point deadline, double spin_us, const Transport* transport = nullptr);

}  // namespace packpipe::runtime
