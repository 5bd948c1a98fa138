// The in-process transport: the ranks of a pipeline as threads of one process exchanging host
// buffers. Messages match per channel in posting order; the second side to post copies the bytes
// (the materialised part) and checks that both sides agree on the size. It is the runtime's test
// bed, and it executes whole plans on a machine without GPUs.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "runtime/transport.h"

namespace packpipe::runtime {

/// Copies a sent buffer into the receive buffer matched with it (same logical size).
using CopyFn = std::function<void(const Buffer& dst, const Buffer& src)>;

/// The shared state of one pipeline's ranks. Thread-safe; must outlive its transports.
class InProcessGroup {
 public:
  /// A group of `ranks` pipeline ranks (1 to 65536) exchanging host buffers (memcpy).
  explicit InProcessGroup(std::uint32_t ranks);
  /// A group exchanging Opaque buffers (a framework's tensors, e.g. on one GPU) through `copy`,
  /// which runs on the thread of the second side to post; control messages stay host memcpy.
  InProcessGroup(std::uint32_t ranks, CopyFn copy);
  ~InProcessGroup();
  InProcessGroup(const InProcessGroup&) = delete;
  InProcessGroup& operator=(const InProcessGroup&) = delete;
  /// The transport of `rank`, for the one thread that runs it.
  std::unique_ptr<Transport> transport(std::uint32_t rank);
  std::uint32_t ranks() const;
  /// Ends every waiting rank's wait with `why` (the first reason wins).
  void abort(const std::string& why) noexcept;
  std::string abort_reason() const;
  /// Messages completed so far over all channels (control messages included).
  std::uint64_t messages() const;

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

}  // namespace packpipe::runtime
