// libFuzzer target: the plan decoders (binary blob, plan file, JSON) and the validator on whatever
// decodes. Every input must end in a decoded plan or a packpipe exception, never a crash.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/errors.h"
#include "plan/format.h"
#include "plan/validator.h"

using namespace packpipe::plan;

namespace {
void check(const Plan& p) {
  ValidateOptions o;
  o.max_violations = 64;
  (void)validate(p, o);
  // A decoded plan re-encodes to a blob that decodes and re-encodes to the same bytes (bytes, not
  // Plan::operator==: a NaN time is bit-exact but unequal to itself).
  try {
    const auto b = encode_plan(p);
    const Plan q = decode_plan(b.data(), b.size());
    if (encode_plan(q) != b) __builtin_trap();
  } catch (const packpipe::InvalidArgument&) {  // e.g. refs whose count differs from the samples (JSON)
  }
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    check(decode_plan(data, size, "fuzz", /*verify_checksum=*/false));
  } catch (const packpipe::Error&) {
  } catch (const packpipe::InvalidArgument&) {
  } catch (const packpipe::OutOfRange&) {
  }
  // Plan files twice: as they are (checksums verified), and with every checksum skipped, as a
  // forger who recomputes them would present the bytes, so the fuzzer reaches the structural
  // checks of the index (contiguity, iteration order, replica counts, blob-entry agreement).
  for (const bool verify : {true, false}) {
    try {
      const PlanFileReader r = PlanFileReader::from_memory(data, size, "fuzz", verify);
      (void)r.fingerprint();  // reads every blob's header: within the file whatever the index says
      try {
        r.require_complete("allow it");  // an incomplete file is refused naming it, not crashed on
      } catch (const packpipe::Error&) {
      }
      std::vector<Plan> replicas;  // the first iteration's replicas, checked against each other
      for (std::size_t i = 0; i < r.size() && i < 4; ++i) {
        Plan p = r.read(i);
        check(p);
        if (r.iteration(i) == r.iteration(0)) replicas.push_back(std::move(p));
      }
      (void)validate_replicas(replicas);
    } catch (const packpipe::Error&) {
    } catch (const packpipe::InvalidArgument&) {
    } catch (const packpipe::OutOfRange&) {
    }
  }
  return 0;
}
