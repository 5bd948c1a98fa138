// A producer thread filling a bounded queue that one consumer drains in order: the epoch planner's
// next() and the rank loader run their work ahead of the consumer with it.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include "common/errors.h"

namespace packpipe {

/// Items of type T produced on a background thread, at most `capacity` ahead of the consumer.
/// The producer's exception reaches the consumer after every item produced before it. Destroying
/// the queue stops the producer (its next push returns false) and joins it: never a hang while the
/// producer polls push()'s result or stopped().
template <class T>
class BackgroundQueue {
 public:
  /// The producer: runs once on the queue's thread, handing items over with push(); may throw.
  using Producer = std::function<void(BackgroundQueue& queue)>;

  /// Starts `producer` on its own thread; `who` names the owner in misuse errors.
  BackgroundQueue(std::size_t capacity, Producer producer, std::string who)
      : capacity_(capacity > 0 ? capacity : 1), who_(std::move(who)) {
    worker_ = std::thread([this, producer = std::move(producer)] {
      std::exception_ptr error;
      try {
        producer(*this);
      } catch (...) {
        error = std::current_exception();
      }
      std::lock_guard<std::mutex> lock(mu_);
      error_ = error;
      done_ = true;
      cv_.notify_all();
    });
  }
  ~BackgroundQueue() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (worker_.joinable()) worker_.join();
  }
  BackgroundQueue(const BackgroundQueue&) = delete;
  BackgroundQueue& operator=(const BackgroundQueue&) = delete;

  /// The next item (true), or false at the end; rethrows the producer's error once the items
  /// before it are delivered. One consumer at a time (InvalidArgument otherwise).
  bool next(T& out) {
    std::unique_lock<std::mutex> lock(mu_);
    PACKPIPE_CHECK_ARG(!consuming_, "{}: next() called while another thread is inside next(); use one consumer", who_);
    consuming_ = true;
    cv_.wait(lock, [this] { return !ready_.empty() || done_; });
    consuming_ = false;
    if (!ready_.empty()) {
      out = std::move(ready_.front());
      ready_.pop_front();
      cv_.notify_all();
      return true;
    }
    if (error_) std::rethrow_exception(error_);
    return false;
  }
  /// Whether the consumer is gone (for producers that poll between items).
  bool stopped() const {
    std::lock_guard<std::mutex> lock(mu_);
    return stop_;
  }
  /// For the producer: hands one item to the consumer, waiting while the queue is full; false once
  /// the consumer is gone (the producer should then return).
  bool push(T&& item) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return stop_ || ready_.size() < capacity_; });
    if (stop_) return false;
    ready_.push_back(std::move(item));
    cv_.notify_all();
    return true;
  }

 private:
  const std::size_t capacity_;
  const std::string who_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<T> ready_;
  bool done_ = false, stop_ = false, consuming_ = false;
  std::exception_ptr error_;
  std::thread worker_;  // last: started after every member it uses exists
};

}  // namespace packpipe
