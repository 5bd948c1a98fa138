// libFuzzer target: the sampler-state reader and restore(). Every input ends in a restored sampler
// that delivers the rest of its epoch exactly (each position once, in order, ending at the epoch
// size) or in a packpipe exception, never a crash, a hang or a skipped or repeated sample.
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/errors.h"
#include "dataloader/sampler.h"

using namespace packpipe::dataloader;

namespace {

// Two small tasks with varied lengths.
class Source final : public SampleSource {
 public:
  std::size_t num_tasks() const override { return 2; }
  std::uint64_t task_size(std::size_t task) const override { return task == 0 ? 37 : 53; }
  std::uint64_t sample_tokens(std::size_t task, std::uint64_t index) const override {
    return 1 + (index * 7 + task * 13) % 29;
  }
};

void run(const Source& src, const SamplerConfig& c, const SamplerState& st) {
  Sampler s(src, c);
  s.restore(st);  // throws for an inconsistent state
  GlobalBatch b;
  std::uint64_t pos = st.position, index = st.batch_index;
  while (s.next_batch(b)) {
    if (b.first_position != pos || b.index != index || b.samples.empty()) __builtin_trap();
    pos += b.samples.size();
    ++index;
    if (index > s.epoch_size() + 1) __builtin_trap();  // a batch holds at least one sample
  }
  if (pos != s.epoch_size()) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const Source src;
  SamplerState st;
  try {
    st = SamplerState::from_json(std::string(reinterpret_cast<const char*>(data), size));
  } catch (const packpipe::Error&) {
    return 0;
  } catch (const packpipe::InvalidArgument&) {
    return 0;
  }
  for (const bool tokens : {true, false}) {
    SamplerConfig c;
    c.seed = st.seed;  // so that the fingerprint, not the seed, decides
    if (tokens) {
      c.global_batch_tokens = 60;
    } else {
      c.global_batch_samples = 6;
    }
    // The fingerprint of this config, so that the fuzzer reaches the position checks.
    SamplerState real = Sampler(src, c).state();
    SamplerState forged = st;
    forged.fingerprint = real.fingerprint;
    for (const SamplerState& s : {st, forged}) {
      try {
        run(src, c, s);
      } catch (const packpipe::InvalidArgument&) {
      } catch (const packpipe::OutOfRange&) {
      } catch (const packpipe::Error&) {
      }
    }
  }
  return 0;
}
