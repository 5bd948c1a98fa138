// A sample of a multi-task dataset as the sampler names it. Defined here, below the data loader,
// so that plans and the runtime name samples without depending on the data loader.
#pragma once

#include <cstdint>

namespace packpipe {

/// (task, index in the task).
struct SampleRef {
  std::uint32_t task = 0;
  std::uint64_t index = 0;
  bool operator==(const SampleRef& o) const { return task == o.task && index == o.index; }
  bool operator!=(const SampleRef& o) const { return !(*this == o); }
  bool operator<(const SampleRef& o) const { return task != o.task ? task < o.task : index < o.index; }
};

}  // namespace packpipe
