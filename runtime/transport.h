// Transports: how the runtime moves one buffer between two pipeline ranks. A transport posts sends
// and receives (never blocking) and returns a request to wait on with a deadline; per channel
// (sender, receiver, kind) messages match in posting order, which is the order the plan validator
// checked. Implementations: in-process (threads, host memory), CUDA single-device (streams and
// device copies), NCCL (one process per GPU), and Python ones (packpipe.torch).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "runtime/buffer.h"

namespace packpipe::runtime {

using Clock = std::chrono::steady_clock;

/// Kind of message: the plan's activations and gradients, and the executor's control messages
/// (plan agreement). Each kind is its own channel between two ranks.
enum class Channel : std::uint8_t { Activation = 0, Gradient = 1, Control = 2 };
/// "activation", "gradient", "control".
const char* channel_name(Channel c);

/// How a wait ended.
enum class WaitStatus : std::uint8_t { Done, TimedOut, Aborted };

/// One posted send or receive. Destroying a request that has not completed is allowed after an
/// abort or a failure only (the executor never does it otherwise).
class Request {
 public:
  virtual ~Request() = default;
  /// Blocks until the message completed, the deadline passed, or the transport was aborted.
  /// Throws packpipe::Error for a failure the transport detected (e.g. the two sides' sizes
  /// disagree), naming both ranks and sizes.
  virtual WaitStatus wait(Clock::time_point deadline) = 0;
  /// True once the message completed (non-blocking).
  virtual bool test() = 0;
};

/// The communication side of one pipeline rank. Not thread-safe: one executor uses it.
class Transport {
 public:
  virtual ~Transport() = default;
  /// This executor's pipeline rank and the pipeline's ranks.
  virtual std::uint32_t rank() const = 0;
  virtual std::uint32_t ranks() const = 0;
  /// Posts the send of `buffer` to `peer` on `channel` (buffer.bytes is the message size). Never
  /// blocks; the buffer stays alive until the request completes.
  virtual std::unique_ptr<Request> send(const Buffer& buffer, std::uint32_t peer, Channel channel) = 0;
  /// Posts the receive into `buffer` from `peer` on `channel`; the sender's size must equal
  /// buffer.bytes. Never blocks.
  virtual std::unique_ptr<Request> recv(const Buffer& buffer, std::uint32_t peer, Channel channel) = 0;
  /// Ends the waits of every rank of the pipeline where the transport can reach them (in-process
  /// and CUDA at once; across processes through the transport's shared abort signal), with `why`;
  /// the others reach it through their timeouts. Never throws.
  virtual void abort(const std::string& why) noexcept = 0;
  /// Why the pipeline was aborted (empty if it was not).
  virtual std::string abort_reason() const = 0;
  /// The memory this transport's buffers must be in.
  virtual MemoryKind memory() const { return MemoryKind::Host; }
};

}  // namespace packpipe::runtime
