#include "runtime/nccl.h"

#include "common/config.h"
#include "common/errors.h"

#if PACKPIPE_HAS_NCCL
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <tuple>
#include <vector>

#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <nccl.h>

#include "common/file_io.h"
#include "runtime/detail/cuda_check.h"

/// Evaluates an ncclResult_t expression once; throws packpipe::Error naming the call and NCCL's error.
#define PACKPIPE_CHECK_NCCL(expr)                                                                     \
  do {                                                                                                \
    const ncclResult_t packpipe_nccl_status_ = (expr);                                                \
    if (packpipe_nccl_status_ != ncclSuccess && packpipe_nccl_status_ != ncclInProgress) {           \
      PACKPIPE_THROW(::packpipe::Error, "{} failed: {}", #expr, ncclGetErrorString(packpipe_nccl_status_)); \
    }                                                                                                 \
  } while (0)
#endif

namespace packpipe::runtime {

std::string nccl_abort_file(const std::string& id_file) { return id_file + ".abort"; }

#if PACKPIPE_HAS_NCCL

bool built_with_nccl() { return true; }

namespace {

using SteadyClock = std::chrono::steady_clock;

SteadyClock::time_point deadline_after(double s) {
  return s > 0 ? SteadyClock::now() + std::chrono::duration_cast<SteadyClock::duration>(std::chrono::duration<double>(s))
               : SteadyClock::time_point::max();
}

// Waits until a nonblocking communicator finished its pending work (creation, split).
void settle(ncclComm_t comm, SteadyClock::time_point deadline, const char* what, std::uint32_t rank) {
  ncclResult_t st = ncclInProgress;
  while (true) {
    PACKPIPE_CHECK_NCCL(ncclCommGetAsyncError(comm, &st));
    if (st != ncclInProgress) break;
    if (SteadyClock::now() >= deadline) {
      ncclCommAbort(comm);
      PACKPIPE_THROW(Error, "rank {}: timed out waiting for the other ranks to {}", rank, what);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  PACKPIPE_CHECK_NCCL(st);
}

class NcclRequest final : public Request {
 public:
  NcclRequest(cudaEvent_t ev, ncclComm_t comm, std::function<std::string()> aborted)
      : ev_(ev), comm_(comm), aborted_(std::move(aborted)) {}
  ~NcclRequest() override { cudaEventDestroy(ev_); }
  WaitStatus wait(Clock::time_point deadline) override {
    while (true) {
      const cudaError_t e = cudaEventQuery(ev_);
      if (e == cudaSuccess) return WaitStatus::Done;
      if (e != cudaErrorNotReady) PACKPIPE_CHECK_CUDA(e);
      ncclResult_t st = ncclSuccess;
      PACKPIPE_CHECK_NCCL(ncclCommGetAsyncError(comm_, &st));
      PACKPIPE_CHECK_NCCL(st);
      if (!aborted_().empty()) return WaitStatus::Aborted;
      if (Clock::now() >= deadline) return WaitStatus::TimedOut;
      std::this_thread::sleep_for(std::chrono::microseconds(5));
    }
  }
  bool test() override { return cudaEventQuery(ev_) == cudaSuccess; }

 private:
  cudaEvent_t ev_;
  ncclComm_t comm_;
  std::function<std::string()> aborted_;
};

class NcclTransport final : public Transport {
 public:
  NcclTransport(ncclComm_t parent, bool owns_parent, int device, std::string abort_file, double timeout_s)
      : parent_(parent), owns_parent_(owns_parent), device_(device), abort_file_(std::move(abort_file)) {
    int r = 0, n = 0;
    PACKPIPE_CHECK_NCCL(ncclCommUserRank(parent_, &r));
    PACKPIPE_CHECK_NCCL(ncclCommCount(parent_, &n));
    rank_ = static_cast<std::uint32_t>(r);
    ranks_ = static_cast<std::uint32_t>(n);
    PACKPIPE_CHECK_CUDA(cudaSetDevice(device_));
    split_channels(deadline_after(timeout_s));
    PACKPIPE_CHECK_CUDA(cudaMalloc(&control_, 64));
  }
  ~NcclTransport() override {
    cudaSetDevice(device_);
    for (auto& [k, c] : channels_) {
      if (c.comm != nullptr) (aborted_ ? ncclCommAbort(c.comm) : ncclCommDestroy(c.comm));
      if (c.stream != nullptr) cudaStreamDestroy(c.stream);
    }
    if (control_ != nullptr) cudaFree(control_);
    if (owns_parent_ && parent_ != nullptr) (aborted_ ? ncclCommAbort(parent_) : ncclCommDestroy(parent_));
  }
  std::uint32_t rank() const override { return rank_; }
  std::uint32_t ranks() const override { return ranks_; }
  MemoryKind memory() const override { return MemoryKind::Device; }

  std::unique_ptr<Request> send(const Buffer& b, std::uint32_t peer, Channel ch) override { return post(b, peer, ch, true); }
  std::unique_ptr<Request> recv(const Buffer& b, std::uint32_t peer, Channel ch) override { return post(b, peer, ch, false); }

  void abort(const std::string& why) noexcept override {
    std::lock_guard<std::mutex> lock(mu_);
    if (aborted_) return;
    aborted_ = true;
    reason_ = why;
    if (!abort_file_.empty()) {
      try {
        write_file_atomic(abort_file_, fmt::format("rank {}: {}", rank_, why));
      } catch (...) {
      }
    }
    for (auto& [k, c] : channels_) {
      if (c.comm != nullptr) ncclCommAbort(c.comm);
      c.comm = nullptr;
    }
  }
  // This rank's abort, or another rank's seen through the abort file (read at most every 10 ms).
  std::string abort_reason() const override {
    std::lock_guard<std::mutex> lock(mu_);
    if (aborted_ || !seen_.empty()) return aborted_ ? reason_ : seen_;
    const auto now = SteadyClock::now();
    if (abort_file_.empty() || now - last_check_ < std::chrono::milliseconds(10)) return {};
    last_check_ = now;
    std::ifstream f(abort_file_);
    if (f) seen_.assign((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    return seen_;
  }

 private:
  struct ChannelComm {
    ncclComm_t comm = nullptr;
    cudaStream_t stream = nullptr;
    int peer_rank = 0;  // the peer's rank in the two-rank communicator
  };
  // The channels between ring neighbours (r -> r +- 1 mod S, per kind), split in one global order on
  // every rank; a one-rank pipeline keeps one self channel per kind on the parent.
  void split_channels(SteadyClock::time_point deadline) {
    const std::uint32_t S = ranks_;
    std::vector<std::tuple<std::uint32_t, std::uint32_t, int>> all;  // (src, dst, kind)
    for (std::uint32_t s = 0; s < S && S > 1; ++s) {
      for (std::uint32_t d : {(s + 1) % S, (s + S - 1) % S}) {
        for (int k = 0; k < 3; ++k) {
          const auto key = std::make_tuple(s, d, k);
          if (std::find(all.begin(), all.end(), key) == all.end()) all.push_back(key);
        }
      }
    }
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    for (std::size_t i = 0; i < all.size(); ++i) {
      const auto [s, d, k] = all[i];
      const bool mine = s == rank_ || d == rank_;
      ncclComm_t c = nullptr;
      PACKPIPE_CHECK_NCCL(ncclCommSplit(parent_, mine ? static_cast<int>(i) : NCCL_SPLIT_NOCOLOR,
                                        static_cast<int>(s == rank_ ? 0 : 1), &c, &config));
      if (!mine) continue;
      settle(c, deadline, "split the channel communicators", rank_);
      ChannelComm cc;
      cc.comm = c;
      cc.peer_rank = s == rank_ ? 1 : 0;
      PACKPIPE_CHECK_CUDA(cudaStreamCreateWithFlags(&cc.stream, cudaStreamNonBlocking));
      channels_[{s, d, k}] = cc;
    }
    if (S == 1) {
      for (int k = 0; k < 3; ++k) {
        ChannelComm cc;
        cc.comm = parent_;
        PACKPIPE_CHECK_CUDA(cudaStreamCreateWithFlags(&cc.stream, cudaStreamNonBlocking));
        channels_[{0u, 0u, k}] = cc;
      }
    }
  }

  std::unique_ptr<Request> post(const Buffer& b, std::uint32_t peer, Channel ch, bool is_send) {
    PACKPIPE_CHECK_ARG(peer < ranks_, "rank {}: peer {} out of range ({} ranks)", rank_, peer, ranks_);
    PACKPIPE_CHECK(abort_reason().empty(), "rank {}: the pipeline was aborted: {}", rank_, abort_reason());
    const std::uint32_t src = is_send ? rank_ : peer, dst = is_send ? peer : rank_;
    auto it = channels_.find({src, dst, static_cast<int>(ch)});
    PACKPIPE_CHECK_ARG(it != channels_.end(), "rank {}: no NCCL channel {} -> {} ({}): only ring neighbours talk", rank_,
                       src, dst, channel_name(ch));
    ChannelComm& c = it->second;
    PACKPIPE_CHECK_CUDA(cudaSetDevice(device_));
    const std::uint64_t n = b.materialized;
    void* data = b.data;
    // Control messages live in host memory: staged through a small device buffer.
    if (b.kind == MemoryKind::Host) {
      PACKPIPE_CHECK_ARG(n <= 32, "rank {}: host messages over NCCL are control messages of at most 32 bytes", rank_);
      data = static_cast<char*>(control_) + (is_send ? 0 : 32);
      if (is_send) PACKPIPE_CHECK_CUDA(cudaMemcpyAsync(data, b.data, n, cudaMemcpyHostToDevice, c.stream));
    } else {
      PACKPIPE_CHECK_ARG(b.kind == MemoryKind::Device && b.device == device_, "rank {}: NCCL moves device {} memory only",
                         rank_, device_);
    }
    if (src == dst) {  // one-rank pipeline: a self send and receive form one group
      if (is_send) {
        self_sends_.push_back({data, n});
        return event_request(c);
      }
      PACKPIPE_CHECK(!self_sends_.empty(), "rank {}: a self receive before its send", rank_);
      const auto [sdata, sn] = self_sends_.front();
      self_sends_.erase(self_sends_.begin());
      PACKPIPE_CHECK(sn == n, "rank {}: self send of {} bytes, receive of {}", rank_, sn, n);
      PACKPIPE_CHECK_NCCL(ncclGroupStart());
      PACKPIPE_CHECK_NCCL(ncclSend(sdata, n, ncclUint8, 0, c.comm, c.stream));
      PACKPIPE_CHECK_NCCL(ncclRecv(data, n, ncclUint8, 0, c.comm, c.stream));
      PACKPIPE_CHECK_NCCL(ncclGroupEnd());
    } else if (is_send) {
      PACKPIPE_CHECK_NCCL(ncclSend(data, n, ncclUint8, c.peer_rank, c.comm, c.stream));
    } else {
      PACKPIPE_CHECK_NCCL(ncclRecv(data, n, ncclUint8, c.peer_rank, c.comm, c.stream));
    }
    if (b.kind == MemoryKind::Host && !is_send) {
      PACKPIPE_CHECK_CUDA(cudaMemcpyAsync(b.data, data, n, cudaMemcpyDeviceToHost, c.stream));
    }
    return event_request(c);
  }
  std::unique_ptr<Request> event_request(ChannelComm& c) {
    cudaEvent_t ev = nullptr;
    PACKPIPE_CHECK_CUDA(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    PACKPIPE_CHECK_CUDA(cudaEventRecord(ev, c.stream));
    return std::make_unique<NcclRequest>(ev, c.comm, [this] { return abort_reason(); });
  }

  ncclComm_t parent_;
  bool owns_parent_;
  int device_;
  std::string abort_file_;
  std::uint32_t rank_ = 0, ranks_ = 1;
  std::map<std::tuple<std::uint32_t, std::uint32_t, int>, ChannelComm> channels_;
  std::vector<std::pair<void*, std::uint64_t>> self_sends_;
  void* control_ = nullptr;
  mutable std::mutex mu_;
  bool aborted_ = false;
  std::string reason_;
  mutable std::string seen_;
  mutable SteadyClock::time_point last_check_{};
};

}  // namespace

std::unique_ptr<Transport> nccl_transport(std::uint32_t rank, std::uint32_t ranks, const NcclOptions& o) {
  PACKPIPE_CHECK_ARG(ranks >= 1 && rank < ranks, "rank {} out of range ({} ranks)", rank, ranks);
  PACKPIPE_CHECK_ARG(!o.id_file.empty(), "the NCCL transport needs an id file to exchange its unique id");
  PACKPIPE_CHECK_CUDA(cudaSetDevice(o.device));
  const auto deadline = deadline_after(o.timeout_s);
  ncclUniqueId id;
  if (rank == 0) {
    std::remove(nccl_abort_file(o.id_file).c_str());  // a previous run's signal
    PACKPIPE_CHECK_NCCL(ncclGetUniqueId(&id));
    write_file_atomic(o.id_file, std::string(id.internal, sizeof id.internal));
  } else {
    while (true) {
      std::ifstream f(o.id_file, std::ios::binary);
      std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
      if (s.size() == sizeof id.internal) {
        std::memcpy(id.internal, s.data(), s.size());
        break;
      }
      PACKPIPE_CHECK(SteadyClock::now() < deadline, "rank {}: timed out after {} s waiting for rank 0 to write the NCCL id "
                     "to {}", rank, o.timeout_s, o.id_file);
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  PACKPIPE_CHECK_NCCL(ncclCommInitRankConfig(&comm, static_cast<int>(ranks), id, static_cast<int>(rank), &config));
  settle(comm, deadline, "join the NCCL communicator", rank);
  return std::make_unique<NcclTransport>(comm, true, o.device, nccl_abort_file(o.id_file), o.timeout_s);
}

std::unique_ptr<Transport> nccl_transport_from_comm(void* comm, int device, const std::string& abort_file) {
  PACKPIPE_CHECK_ARG(comm != nullptr, "nccl_transport_from_comm: no communicator");
  return std::make_unique<NcclTransport>(static_cast<ncclComm_t>(comm), false, device, abort_file, 300);
}

#else  // built without NCCL

bool built_with_nccl() { return false; }
std::unique_ptr<Transport> nccl_transport(std::uint32_t, std::uint32_t, const NcclOptions&) {
  throw Unsupported("the NCCL transport: packpipe was built without NCCL");
}
std::unique_ptr<Transport> nccl_transport_from_comm(void*, int, const std::string&) {
  throw Unsupported("the NCCL transport: packpipe was built without NCCL");
}

#endif

}  // namespace packpipe::runtime
