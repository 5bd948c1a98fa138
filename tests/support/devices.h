// Device presets for tests that check the eager kernel's formulas (Korthikanti's stored scores,
// DynaPipe's and Aceso's eager profiles): the presets themselves run the flash kernel (015).
#pragma once

#include <string>

#include "costmodel/model.h"

namespace packpipe::test {

/// The device preset `name` with the eager attention kernel.
inline costmodel::DeviceSpec eager_device(const std::string& name) {
  costmodel::DeviceSpec d = costmodel::load_device(name);
  d.attention = costmodel::AttentionKernel::Eager;
  return d;
}

}  // namespace packpipe::test
