#include "runtime/cuda.h"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>

#include "common/config.h"
#include "common/errors.h"
#include "runtime/detail/matching.h"

#if PACKPIPE_HAS_CUDA
#include <cuda_runtime_api.h>

#include "runtime/detail/cuda_check.h"

namespace packpipe::runtime::cuda_kernels {
cudaError_t launch_spin(long long cycles, cudaStream_t s);
cudaError_t launch_fill(void* p, std::uint64_t n, std::uint64_t key, cudaStream_t s);
}  // namespace packpipe::runtime::cuda_kernels
#endif

namespace packpipe::runtime {

#if PACKPIPE_HAS_CUDA

namespace {

namespace pl = ::packpipe::plan;

// Device-to-device copies on a copy stream per channel, after the sender's data-ready event;
// completion is an event the waiters poll. Control messages (host memory) are copied at once.
class CudaMover final : public detail::Mover {
 public:
  explicit CudaMover(int device) : device_(device) {}
  ~CudaMover() override {
    cudaSetDevice(device_);
    for (auto& [q, s] : streams_) cudaStreamDestroy(s);
  }
  std::shared_ptr<void> start(detail::Message& send, detail::Message& recv) override {
    const std::uint64_t n = std::min(send.buffer.materialized, recv.buffer.materialized);
    if (send.buffer.kind == MemoryKind::Host) {
      if (n > 0) std::memcpy(recv.buffer.data, send.buffer.data, n);
      return nullptr;
    }
    PACKPIPE_CHECK_CUDA(cudaSetDevice(device_));
    cudaStream_t s = stream_for(&send);
    if (send.ready) PACKPIPE_CHECK_CUDA(cudaStreamWaitEvent(s, static_cast<cudaEvent_t>(send.ready.get()), 0));
    if (n > 0) PACKPIPE_CHECK_CUDA(cudaMemcpyAsync(recv.buffer.data, send.buffer.data, n, cudaMemcpyDeviceToDevice, s));
    return record(s);
  }
  bool done(const std::shared_ptr<void>& token) override {
    const cudaError_t e = cudaEventQuery(static_cast<cudaEvent_t>(token.get()));
    if (e == cudaErrorNotReady) return false;
    PACKPIPE_CHECK_CUDA(e);
    return true;
  }
  MemoryKind memory() const override { return MemoryKind::Device; }

  // An event recorded on `s`, destroyed with its last owner.
  static std::shared_ptr<void> record(cudaStream_t s) {
    cudaEvent_t ev = nullptr;
    PACKPIPE_CHECK_CUDA(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    std::shared_ptr<void> token(ev, [](void* e) { cudaEventDestroy(static_cast<cudaEvent_t>(e)); });
    PACKPIPE_CHECK_CUDA(cudaEventRecord(ev, s));
    return token;
  }

 private:
  cudaStream_t stream_for(const detail::Message* m) {
    // One copy stream per channel: keyed by the message's queue, which the matcher fixes.
    const void* q = m->queue;
    std::lock_guard<std::mutex> lock(mu_);
    auto it = streams_.find(q);
    if (it != streams_.end()) return it->second;
    cudaStream_t s = nullptr;
    PACKPIPE_CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    streams_.emplace(q, s);
    return s;
  }
  int device_;
  std::mutex mu_;
  std::unordered_map<const void*, cudaStream_t> streams_;
};

// A rank's transport: sends carry an event recorded on the rank's compute stream (the data is
// ready when the stream reaches it).
class CudaTransport final : public Transport {
 public:
  CudaTransport(std::shared_ptr<detail::Matcher> m, std::uint32_t rank, cudaStream_t stream, int device)
      : base_(m, rank), m_(std::move(m)), stream_(stream), device_(device) {}
  std::uint32_t rank() const override { return base_.rank(); }
  std::uint32_t ranks() const override { return base_.ranks(); }
  std::unique_ptr<Request> send(const Buffer& b, std::uint32_t peer, Channel ch) override {
    std::shared_ptr<void> ready;
    if (b.kind == MemoryKind::Device) {
      PACKPIPE_CHECK_CUDA(cudaSetDevice(device_));
      ready = CudaMover::record(stream_);
    }
    return m_->post(rank(), b, peer, ch, true, std::move(ready));
  }
  std::unique_ptr<Request> recv(const Buffer& b, std::uint32_t peer, Channel ch) override { return base_.recv(b, peer, ch); }
  void abort(const std::string& why) noexcept override { base_.abort(why); }
  std::string abort_reason() const override { return base_.abort_reason(); }
  MemoryKind memory() const override { return MemoryKind::Device; }

 private:
  detail::MatchingTransport base_;
  std::shared_ptr<detail::Matcher> m_;
  cudaStream_t stream_;
  int device_;
};

// Device buffer of `bytes` logical bytes, min(bytes, cap) allocated.
Buffer device_buffer(int device, std::uint64_t bytes, std::uint64_t cap) {
  const std::uint64_t n = cap > 0 ? std::min(bytes, cap) : bytes;
  PACKPIPE_CHECK_CUDA(cudaSetDevice(device));
  void* p = nullptr;
  PACKPIPE_CHECK_CUDA(cudaMalloc(&p, std::max<std::uint64_t>(n, 1)));
  Buffer b;
  b.data = p;
  b.bytes = bytes;
  b.materialized = n;
  b.kind = MemoryKind::Device;
  b.device = device;
  b.owner = std::shared_ptr<void>(p, [](void* q) { cudaFree(q); });
  return b;
}

// Replay on the device: spin kernels timed by events, payloads filled by a kernel and checked
// on the host after a copy back.
class CudaReplay final : public ReplayHandler {
 public:
  CudaReplay(CudaGroup& g, std::uint32_t rank, ReplayOptions o)
      : ReplayHandler(o), g_(g), stream_(static_cast<cudaStream_t>(g.stream(rank))) {
    PACKPIPE_CHECK_CUDA(cudaEventCreate(&start_));
    PACKPIPE_CHECK_CUDA(cudaEventCreate(&stop_));
  }
  ~CudaReplay() override {
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
  }
  Buffer load(const OpContext& ctx) override {
    Buffer b = make(ctx.shape != nullptr ? ctx.shape->bytes() : 0);
    fill(b, ctx.ins->mb, ctx.ins->stage, PayloadKind::Load);
    return b;
  }
  Buffer forward(const OpContext& ctx, const Buffer* in, const Buffer* in2) override {
    const std::uint32_t mb = ctx.ins->mb, v = ctx.ins->stage;
    if (in != nullptr) check(*in, mb, v - 1, PayloadKind::Activation, "read by the forward");
    if (in2 != nullptr) check(*in2, mb, v, PayloadKind::Load, "read by the forward");
    compute(ctx, pl::OpKind::Forward);
    if (ctx.ins->out == pl::kNone) return {};
    Buffer out = make(ctx.out_shape != nullptr ? ctx.out_shape->bytes() : std::max<std::uint64_t>(o_.payload_bytes, 8));
    fill(out, mb, v, PayloadKind::Activation);
    return out;
  }
  Buffer backward(const OpContext& ctx, const Buffer* grad) override {
    const std::uint32_t mb = ctx.ins->mb, v = ctx.ins->stage;
    if (grad != nullptr) check(*grad, mb, v + 1, PayloadKind::Gradient, "read by the backward");
    compute(ctx, ctx.ins->op == pl::Opcode::Backward ? pl::OpKind::Backward : pl::OpKind::BackwardInput);
    if (ctx.ins->out == pl::kNone) return {};
    Buffer out = make(ctx.out_shape != nullptr ? ctx.out_shape->bytes() : std::max<std::uint64_t>(o_.payload_bytes, 8));
    fill(out, mb, v, PayloadKind::Gradient);
    return out;
  }
  void received(const OpContext& ctx, const Buffer& b) override {
    const bool act = ctx.ins->op == pl::Opcode::RecvActWait;
    check(b, ctx.ins->mb, act ? ctx.ins->stage - 1 : ctx.ins->stage + 1,
          act ? PayloadKind::Activation : PayloadKind::Gradient, fmt::format("received from rank {}", ctx.ins->peer).c_str());
  }
  /// Device time of the compute ops so far, measured by events (ms).
  double device_ms() const { return device_ms_; }

 protected:
  Buffer make(std::uint64_t bytes) override { return device_buffer(g_.device(), bytes, o_.payload_bytes); }
  void compute(const OpContext& ctx, pl::OpKind kind) override {
    const double ms = o_.time_scale > 0 ? planned_ms(kind, ctx.ins->mb, ctx.ins->stage) * o_.time_scale : 0.0;
    if (ms <= 0) return;
    PACKPIPE_CHECK_CUDA(cudaEventRecord(start_, stream_));
    PACKPIPE_CHECK_CUDA(cuda_kernels::launch_spin(static_cast<long long>(ms * g_.cycles_per_ms()), stream_));
    PACKPIPE_CHECK_CUDA(cudaEventRecord(stop_, stream_));
    PACKPIPE_CHECK_CUDA(cudaEventSynchronize(stop_));  // the op ends when its kernel does
    float elapsed = 0;
    PACKPIPE_CHECK_CUDA(cudaEventElapsedTime(&elapsed, start_, stop_));
    device_ms_ += elapsed;
  }

 private:
  void fill(const Buffer& b, std::uint32_t mb, std::uint32_t stage, PayloadKind kind) {
    PACKPIPE_CHECK_CUDA(cuda_kernels::launch_fill(b.data, b.materialized,
                                                  payload_key(plan_->iteration, plan_->replica, mb, stage, kind), stream_));
  }
  void check(const Buffer& b, std::uint32_t mb, std::uint32_t stage, PayloadKind kind, const char* what) {
    if (!o_.verify || b.materialized == 0) return;
    std::vector<std::uint8_t> host(b.materialized);
    PACKPIPE_CHECK_CUDA(cudaMemcpyAsync(host.data(), b.data, b.materialized, cudaMemcpyDeviceToHost, stream_));
    PACKPIPE_CHECK_CUDA(cudaStreamSynchronize(stream_));
    Buffer h;
    h.data = host.data();
    h.bytes = h.materialized = b.materialized;
    OpContext none;
    verify(none, h, mb, stage, kind, what);
  }
  CudaGroup& g_;
  cudaStream_t stream_;
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
  double device_ms_ = 0;
};

}  // namespace

struct CudaGroup::Impl {
  int device = 0;
  std::shared_ptr<detail::Matcher> m;
  std::vector<cudaStream_t> streams;
  double cycles_per_ms = 0;
  ~Impl() {
    cudaSetDevice(device);
    for (auto s : streams) cudaStreamDestroy(s);
  }
};

CudaGroup::CudaGroup(std::uint32_t ranks, int device) : impl_(std::make_shared<Impl>()) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    n = 0;
  }
  PACKPIPE_CHECK(device >= 0 && device < n, "CUDA device {} is not available ({} devices)", device, n);
  impl_->device = device;
  PACKPIPE_CHECK_CUDA(cudaSetDevice(device));
  impl_->m = std::make_shared<detail::Matcher>(ranks, std::make_unique<CudaMover>(device));
  for (std::uint32_t r = 0; r < ranks; ++r) {
    cudaStream_t s = nullptr;
    PACKPIPE_CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    impl_->streams.push_back(s);
  }
  // Spin calibration: cycles per millisecond as the device runs them now.
  cudaEvent_t a = nullptr, b = nullptr;
  PACKPIPE_CHECK_CUDA(cudaEventCreate(&a));
  PACKPIPE_CHECK_CUDA(cudaEventCreate(&b));
  const long long cycles = 20'000'000;
  PACKPIPE_CHECK_CUDA(cuda_kernels::launch_spin(cycles / 10, impl_->streams[0]));  // warm-up
  PACKPIPE_CHECK_CUDA(cudaEventRecord(a, impl_->streams[0]));
  PACKPIPE_CHECK_CUDA(cuda_kernels::launch_spin(cycles, impl_->streams[0]));
  PACKPIPE_CHECK_CUDA(cudaEventRecord(b, impl_->streams[0]));
  PACKPIPE_CHECK_CUDA(cudaEventSynchronize(b));
  float ms = 0;
  PACKPIPE_CHECK_CUDA(cudaEventElapsedTime(&ms, a, b));
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  PACKPIPE_CHECK(ms > 0, "CUDA device {}: spin calibration measured {} ms", device, ms);
  impl_->cycles_per_ms = static_cast<double>(cycles) / ms;
}

CudaGroup::~CudaGroup() = default;

std::unique_ptr<Transport> CudaGroup::transport(std::uint32_t rank) {
  PACKPIPE_CHECK_ARG(rank < ranks(), "rank {} out of range ({} ranks)", rank, ranks());
  return std::make_unique<CudaTransport>(impl_->m, rank, impl_->streams[rank], impl_->device);
}
void* CudaGroup::stream(std::uint32_t rank) const { return impl_->streams.at(rank); }
int CudaGroup::device() const { return impl_->device; }
std::uint32_t CudaGroup::ranks() const { return impl_->m->ranks(); }
void CudaGroup::abort(const std::string& why) noexcept { impl_->m->abort(why); }
std::string CudaGroup::abort_reason() const { return impl_->m->abort_reason(); }
std::uint64_t CudaGroup::messages() const { return impl_->m->messages(); }
double CudaGroup::cycles_per_ms() const { return impl_->cycles_per_ms; }

std::unique_ptr<StageHandler> cuda_replay_handler(CudaGroup& group, std::uint32_t rank, ReplayOptions options) {
  return std::make_unique<CudaReplay>(group, rank, options);
}

LocalRun run_cuda_replay(const plan::Plan& plan, int device, const ReplayOptions& replay, const ExecutorOptions& options) {
  CudaGroup group(std::max<std::uint32_t>(plan.ranks, 1), device);
  const auto epoch = Clock::now();
  std::vector<RankRecord> records(group.ranks());
  std::vector<std::string> errors(group.ranks());
  std::vector<std::thread> threads;
  for (std::uint32_t r = 0; r < group.ranks(); ++r) {
    threads.emplace_back([&, r] {
      try {
        PACKPIPE_CHECK_CUDA(cudaSetDevice(device));
        auto t = group.transport(r);
        auto h = cuda_replay_handler(group, r, replay);
        Executor ex(*h, *t, options);
        RankRecord rec = ex.run(plan);
        const auto shift = std::chrono::duration_cast<std::chrono::nanoseconds>(ex.epoch() - epoch).count();
        rec.start_ns += shift;
        rec.end_ns += shift;
        for (auto& x : rec.times) {
          x.start_ns += shift;
          x.end_ns += shift;
        }
        records[r] = std::move(rec);
      } catch (const std::exception& e) {
        errors[r] = e.what();
        group.abort(e.what());
      }
    });
  }
  for (auto& t : threads) t.join();
  std::string msg;
  for (std::size_t r = 0; r < errors.size(); ++r) {
    if (!errors[r].empty()) msg += fmt::format("\n  rank {}: {}", r, errors[r]);
  }
  if (!msg.empty()) throw Error(fmt::format("iteration {}: CUDA replay failed{}", plan.iteration, msg));
  return LocalRun{std::move(records), group.messages()};
}

#else  // built without CUDA: the same API, refusing.

struct CudaGroup::Impl {};

CudaGroup::CudaGroup(std::uint32_t, int) { throw Unsupported("the CUDA transport: packpipe was built without CUDA"); }
CudaGroup::~CudaGroup() = default;
std::unique_ptr<Transport> CudaGroup::transport(std::uint32_t) { throw Unsupported("built without CUDA"); }
void* CudaGroup::stream(std::uint32_t) const { throw Unsupported("built without CUDA"); }
int CudaGroup::device() const { return -1; }
std::uint32_t CudaGroup::ranks() const { return 0; }
void CudaGroup::abort(const std::string&) noexcept {}
std::string CudaGroup::abort_reason() const { return {}; }
std::uint64_t CudaGroup::messages() const { return 0; }
double CudaGroup::cycles_per_ms() const { return 0; }
std::unique_ptr<StageHandler> cuda_replay_handler(CudaGroup&, std::uint32_t, ReplayOptions) {
  throw Unsupported("the CUDA replay: packpipe was built without CUDA");
}
LocalRun run_cuda_replay(const plan::Plan&, int, const ReplayOptions&, const ExecutorOptions&) {
  throw Unsupported("the CUDA replay: packpipe was built without CUDA");
}

#endif

}  // namespace packpipe::runtime
