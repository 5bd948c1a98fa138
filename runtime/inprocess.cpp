#include "runtime/inprocess.h"

#include <algorithm>
#include <cstring>

#include "common/errors.h"
#include "runtime/detail/matching.h"

namespace packpipe::runtime {

namespace {

// Host memory: the second side to post copies the bytes at once.
class HostMover final : public detail::Mover {
 public:
  std::shared_ptr<void> start(detail::Message& send, detail::Message& recv) override {
    const std::uint64_t n = std::min(send.buffer.materialized, recv.buffer.materialized);
    if (n > 0) std::memcpy(recv.buffer.data, send.buffer.data, n);
    return nullptr;
  }
  bool done(const std::shared_ptr<void>&) override { return true; }
  MemoryKind memory() const override { return MemoryKind::Host; }
};

// Opaque memory: the caller's copy function moves the bytes; host buffers (control messages) are
// copied as by HostMover.
class CopyMover final : public detail::Mover {
 public:
  explicit CopyMover(CopyFn copy) : copy_(std::move(copy)) {}
  std::shared_ptr<void> start(detail::Message& send, detail::Message& recv) override {
    if (send.buffer.kind == MemoryKind::Host && recv.buffer.kind == MemoryKind::Host) return host_.start(send, recv);
    copy_(recv.buffer, send.buffer);
    return nullptr;
  }
  bool done(const std::shared_ptr<void>&) override { return true; }
  MemoryKind memory() const override { return MemoryKind::Opaque; }

 private:
  CopyFn copy_;
  HostMover host_;
};

}  // namespace

struct InProcessGroup::Impl {
  std::shared_ptr<detail::Matcher> m;
};

InProcessGroup::InProcessGroup(std::uint32_t ranks) : impl_(std::make_shared<Impl>()) {
  impl_->m = std::make_shared<detail::Matcher>(ranks, std::make_unique<HostMover>());
}

InProcessGroup::InProcessGroup(std::uint32_t ranks, CopyFn copy) : impl_(std::make_shared<Impl>()) {
  PACKPIPE_CHECK_ARG(copy != nullptr, "an in-process group of opaque buffers needs a copy function");
  impl_->m = std::make_shared<detail::Matcher>(ranks, std::make_unique<CopyMover>(std::move(copy)));
}

InProcessGroup::~InProcessGroup() = default;

std::unique_ptr<Transport> InProcessGroup::transport(std::uint32_t rank) {
  PACKPIPE_CHECK_ARG(rank < impl_->m->ranks(), "rank {} out of range ({} ranks)", rank, impl_->m->ranks());
  return std::make_unique<detail::MatchingTransport>(impl_->m, rank);
}

std::uint32_t InProcessGroup::ranks() const { return impl_->m->ranks(); }
void InProcessGroup::abort(const std::string& why) noexcept { impl_->m->abort(why); }
std::string InProcessGroup::abort_reason() const { return impl_->m->abort_reason(); }
std::uint64_t InProcessGroup::messages() const { return impl_->m->messages(); }

}  // namespace packpipe::runtime
