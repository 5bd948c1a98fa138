// Internal: the message matching shared by the single-process transports (in-process threads and
// CUDA streams). Posted sends and receives wait per channel (sender, receiver, kind) in posting
// order; the second side to post starts the move through a Mover (a host copy, a device copy with
// an event), and both requests complete when the mover says so. An abort wakes every waiter.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "runtime/transport.h"

namespace packpipe::runtime::detail {

/// One posted send or receive, shared by its request and the channel queue until matched.
struct Message {
  Buffer buffer;
  std::atomic<int> state{0};  ///< 0 posted, 1 done, 2 failed, 3 moving (the mover's token is set)
  std::string error;          ///< when failed
  std::uint64_t number = 0;   ///< its position on the channel
  std::shared_ptr<void> token;  ///< the mover's completion token while moving
  std::shared_ptr<void> ready;  ///< a send's data-ready marker for asynchronous movers (e.g. a CUDA event)
  const void* queue = nullptr;  ///< the channel it was posted on
};

/// One channel: posted sends and receives waiting for their match.
struct Queue {
  std::uint32_t src = 0, dst = 0;
  Channel channel = Channel::Activation;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::shared_ptr<Message>> sends, recvs;
  std::uint64_t sends_posted = 0, recvs_posted = 0;
};

/// How matched messages move.
class Mover {
 public:
  virtual ~Mover() = default;
  /// Starts moving send -> recv (their sizes agree). Returns a completion token, or null when the
  /// move already completed. Called under the channel's lock; may throw (the pair fails).
  virtual std::shared_ptr<void> start(Message& send, Message& recv) = 0;
  /// Whether the move behind `token` completed (polled by waiters).
  virtual bool done(const std::shared_ptr<void>& token) = 0;
  /// The memory the transport's buffers must be in.
  virtual MemoryKind memory() const = 0;
};

/// The shared state of one pipeline's ranks.
class Matcher : public std::enable_shared_from_this<Matcher> {
 public:
  Matcher(std::uint32_t ranks, std::unique_ptr<Mover> mover);
  std::uint32_t ranks() const { return ranks_; }
  Queue* queue(std::uint32_t src, std::uint32_t dst, Channel c);
  /// Posts a send (or receive) of `buffer` by `rank` to (from) `peer`.
  std::unique_ptr<Request> post(std::uint32_t rank, const Buffer& buffer, std::uint32_t peer, Channel channel,
                                bool is_send, std::shared_ptr<void> ready = nullptr);
  void abort(const std::string& why) noexcept;
  std::string abort_reason() const;
  bool aborted() const { return aborted_.load(std::memory_order_acquire); }
  std::uint64_t messages() const { return messages_.load(); }
  Mover& mover() { return *mover_; }
  /// Waits for `m` (posted on `q`) until the deadline.
  WaitStatus wait(Queue& q, Message& m, Clock::time_point deadline);

 private:
  void match(Queue& q, Message& send, Message& recv);
  std::uint32_t ranks_;
  std::unique_ptr<Mover> mover_;
  std::mutex map_mu_;
  std::unordered_map<std::uint64_t, std::unique_ptr<Queue>> queues_;
  std::atomic<bool> aborted_{false};
  mutable std::mutex abort_mu_;
  std::string reason_;
  std::atomic<std::uint64_t> messages_{0};
};

/// A transport of one rank over a matcher.
class MatchingTransport : public Transport {
 public:
  MatchingTransport(std::shared_ptr<Matcher> m, std::uint32_t rank) : m_(std::move(m)), rank_(rank) {}
  std::uint32_t rank() const override { return rank_; }
  std::uint32_t ranks() const override { return m_->ranks(); }
  std::unique_ptr<Request> send(const Buffer& buffer, std::uint32_t peer, Channel channel) override {
    return m_->post(rank_, buffer, peer, channel, true);
  }
  std::unique_ptr<Request> recv(const Buffer& buffer, std::uint32_t peer, Channel channel) override {
    return m_->post(rank_, buffer, peer, channel, false);
  }
  void abort(const std::string& why) noexcept override { m_->abort(why); }
  std::string abort_reason() const override { return m_->abort_reason(); }
  MemoryKind memory() const override { return m_->mover().memory(); }

 private:
  std::shared_ptr<Matcher> m_;
  std::uint32_t rank_;
};

}  // namespace packpipe::runtime::detail
