// libFuzzer target: the executor runs whatever plan the decoder accepts, on threads with the
// replay handler and a short timeout, with and without the validator in front. Every input must
// end in a completed run or a packpipe exception naming what went wrong: never a crash or a hang.
#include <cstddef>
#include <cstdint>
#include <exception>

#include "common/errors.h"
#include "plan/format.h"
#include "runtime/local.h"
#include "runtime/replay.h"

namespace pl = packpipe::plan;
namespace rt = packpipe::runtime;

namespace {

void run(const pl::Plan& p, bool validate) {
  // Threads per rank: keep the fuzzer's plans small.
  if (p.ranks == 0 || p.ranks > 8 || p.instruction_count() > 20000) return;
  rt::ExecutorOptions eo;
  eo.timeout_s = 0.05;
  eo.validate = validate;
  rt::ReplayOptions ro;
  ro.time_scale = 0;
  ro.payload_bytes = 64;
  try {
    (void)rt::run_local(p, [&](std::uint32_t) { return std::make_unique<rt::ReplayHandler>(ro); }, eo);
  } catch (const packpipe::Error&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    const pl::Plan p = pl::decode_plan(data, size, "fuzz", /*verify_checksum=*/false);
    run(p, true);
    run(p, false);
  } catch (const packpipe::Error&) {
  } catch (const packpipe::InvalidArgument&) {
  } catch (const packpipe::OutOfRange&) {
  }
  return 0;
}
