#include "runtime/detail/matching.h"

#include <thread>

#include <fmt/format.h>

#include "common/errors.h"

namespace packpipe::runtime::detail {

namespace {

std::string channel_text(const Queue& q) {
  return fmt::format("{} channel rank {} -> rank {}", channel_name(q.channel), q.src, q.dst);
}

std::uint64_t queue_key(std::uint32_t src, std::uint32_t dst, Channel c) {
  return (std::uint64_t{src} << 34) | (std::uint64_t{dst} << 2) | static_cast<std::uint64_t>(c);
}

class MatchedRequest final : public Request {
 public:
  MatchedRequest(std::shared_ptr<Matcher> g, Queue* q, std::shared_ptr<Message> m)
      : g_(std::move(g)), q_(q), m_(std::move(m)) {}
  WaitStatus wait(Clock::time_point deadline) override { return g_->wait(*q_, *m_, deadline); }
  bool test() override {
    const int s = m_->state.load(std::memory_order_acquire);
    if (s == 3) return g_->mover().done(m_->token);
    return s != 0;
  }

 private:
  std::shared_ptr<Matcher> g_;
  Queue* q_;
  std::shared_ptr<Message> m_;
};

}  // namespace

Matcher::Matcher(std::uint32_t ranks, std::unique_ptr<Mover> mover) : ranks_(ranks), mover_(std::move(mover)) {
  PACKPIPE_CHECK_ARG(ranks >= 1 && ranks <= 65536, "a pipeline has 1 to 65536 ranks, found {}", ranks);
}

Queue* Matcher::queue(std::uint32_t src, std::uint32_t dst, Channel c) {
  std::lock_guard<std::mutex> lock(map_mu_);
  auto& q = queues_[queue_key(src, dst, c)];
  if (q == nullptr) {
    q = std::make_unique<Queue>();
    q->src = src;
    q->dst = dst;
    q->channel = c;
  }
  return q.get();
}

// Completes or starts a matched send and receive (under the queue's lock).
void Matcher::match(Queue& q, Message& send, Message& recv) {
  auto failed = [&](const std::string& e) {
    send.error = recv.error = e;
    send.state.store(2, std::memory_order_release);
    recv.state.store(2, std::memory_order_release);
  };
  if (send.buffer.bytes != recv.buffer.bytes) {
    failed(fmt::format("message #{} on the {}: rank {} sent {} bytes, rank {} posted a receive of {} bytes (the two "
                       "sides' plans disagree on the tensor's shape)",
                       send.number, channel_text(q), q.src, send.buffer.bytes, q.dst, recv.buffer.bytes));
    return;
  }
  std::shared_ptr<void> token;
  try {
    token = mover_->start(send, recv);
  } catch (const std::exception& e) {
    failed(fmt::format("message #{} on the {}: {}", send.number, channel_text(q), e.what()));
    return;
  }
  const int st = token ? 3 : 1;
  send.token = recv.token = token;
  send.state.store(st, std::memory_order_release);
  recv.state.store(st, std::memory_order_release);
  messages_.fetch_add(1, std::memory_order_relaxed);
}

std::unique_ptr<Request> Matcher::post(std::uint32_t rank, const Buffer& buffer, std::uint32_t peer, Channel channel,
                                       bool is_send, std::shared_ptr<void> ready) {
  PACKPIPE_CHECK_ARG(peer < ranks_ && peer != rank, "rank {}: {} peer {} out of range ({} ranks)", rank,
                     is_send ? "send" : "receive", peer, ranks_);
  const MemoryKind need = channel == Channel::Control ? MemoryKind::Host : mover_->memory();
  PACKPIPE_CHECK_ARG(buffer.kind == need, "rank {}: this transport moves {} memory only", rank,
                     need == MemoryKind::Host ? "host" : "device");
  PACKPIPE_CHECK_ARG(buffer.materialized <= buffer.bytes && (buffer.materialized == 0 || buffer.data != nullptr),
                     "rank {}: a buffer of {} bytes claims {} materialised bytes at {}", rank, buffer.bytes,
                     buffer.materialized, buffer.data);
  Queue* q = is_send ? queue(rank, peer, channel) : queue(peer, rank, channel);
  auto m = std::make_shared<Message>();
  m->buffer = buffer;
  m->ready = std::move(ready);
  m->queue = q;
  bool matched = false;
  {
    std::lock_guard<std::mutex> lock(q->mu);
    auto& mine = is_send ? q->sends : q->recvs;
    auto& theirs = is_send ? q->recvs : q->sends;
    m->number = is_send ? q->sends_posted++ : q->recvs_posted++;
    if (!theirs.empty()) {  // then mine is empty: a channel holds one side's waiting posts at most
      std::shared_ptr<Message> other = std::move(theirs.front());
      theirs.pop_front();
      if (is_send) {
        match(*q, *m, *other);
      } else {
        match(*q, *other, *m);
      }
      matched = true;
    } else {
      mine.push_back(m);
    }
  }
  if (matched) q->cv.notify_all();
  return std::make_unique<MatchedRequest>(shared_from_this(), q, std::move(m));
}

WaitStatus Matcher::wait(Queue& q, Message& m, Clock::time_point deadline) {
  int s = m.state.load(std::memory_order_acquire);
  if (s == 0) {
    std::unique_lock<std::mutex> lock(q.mu);
    while ((s = m.state.load(std::memory_order_acquire)) == 0) {
      if (aborted()) return WaitStatus::Aborted;
      if (q.cv.wait_until(lock, deadline) == std::cv_status::timeout && m.state.load(std::memory_order_acquire) == 0) {
        return aborted() ? WaitStatus::Aborted : WaitStatus::TimedOut;
      }
    }
  }
  if (s == 2) throw Error(m.error);
  if (s == 3) {  // an asynchronous move: poll its completion
    while (!mover_->done(m.token)) {
      if (aborted()) return WaitStatus::Aborted;
      if (Clock::now() >= deadline) return WaitStatus::TimedOut;
      std::this_thread::sleep_for(std::chrono::microseconds(5));
    }
  }
  return WaitStatus::Done;
}

void Matcher::abort(const std::string& why) noexcept {
  {
    std::lock_guard<std::mutex> lock(abort_mu_);
    if (aborted_.load()) return;
    try {
      reason_ = why;
    } catch (...) {
    }
    aborted_.store(true, std::memory_order_release);
  }
  std::lock_guard<std::mutex> lock(map_mu_);
  for (auto& [k, q] : queues_) {
    std::lock_guard<std::mutex> ql(q->mu);  // waiters check the flag under this lock: none misses the wake-up
    q->cv.notify_all();
  }
}

std::string Matcher::abort_reason() const {
  if (!aborted()) return {};
  std::lock_guard<std::mutex> lock(abort_mu_);
  return reason_;
}

}  // namespace packpipe::runtime::detail
