// Buffers of the runtime: the memory behind a plan's buffer slots, shared by the slot and any
// request in flight. A buffer knows the size the plan gives its tensor (its logical size, which
// every send and receive is checked against) and how much of it is materialised in memory (all of
// it for real tensors; a replay may cap it, see ReplayOptions::payload_bytes).
#pragma once

#include <cstdint>
#include <memory>

namespace packpipe::runtime {

/// Where a buffer's memory lives.
enum class MemoryKind : std::uint8_t {
  Host,    ///< host memory (in-process transport, gloo)
  Device,  ///< CUDA device memory of `device`
  Opaque,  ///< a framework's object (e.g. a torch tensor) the handler and transport understand
};

/// The content of one buffer slot. Cheap to copy: copies share the memory (owner).
struct Buffer {
  void* data = nullptr;                ///< first byte (host or device pointer; may be null for Opaque)
  std::uint64_t bytes = 0;             ///< logical size: the plan's shape bytes
  std::uint64_t materialized = 0;      ///< bytes actually present at `data` (<= bytes)
  MemoryKind kind = MemoryKind::Host;
  int device = -1;                     ///< CUDA device of Device memory
  std::shared_ptr<void> owner;         ///< keeps the memory (or the framework object) alive
  /// True for a buffer that holds something (a slot in use).
  explicit operator bool() const { return owner != nullptr || data != nullptr || bytes > 0; }
};

/// A host buffer of `bytes` logical bytes of which min(bytes, cap) are allocated (cap 0: all),
/// zero-filled. Throws std::bad_alloc when memory runs out.
Buffer host_buffer(std::uint64_t bytes, std::uint64_t cap = 0);

}  // namespace packpipe::runtime
