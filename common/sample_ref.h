// A sample of a multi-task dataset as the sampler names it. Defined here, below the data loader,
// so that plans and the runtime name samples without depending on the data loader.
#pragma once

#include <cstdint>

namespace packpipe {

/// (task, index in the task), and for a chunk of a sample the context length split (planner's
/// SeqPolicy::Split), the token where the chunk starts in the sample (input then target tokens
/// as one sequence; 0: the sample from its start). The sampler always names whole samples (offset 0).
struct SampleRef {
  std::uint32_t task = 0;
  std::uint64_t index = 0;
  std::uint32_t offset = 0;
  bool operator==(const SampleRef& o) const { return task == o.task && index == o.index && offset == o.offset; }
  bool operator!=(const SampleRef& o) const { return !(*this == o); }
  bool operator<(const SampleRef& o) const {
    return task != o.task ? task < o.task : index != o.index ? index < o.index : offset < o.offset;
  }
};

}  // namespace packpipe
