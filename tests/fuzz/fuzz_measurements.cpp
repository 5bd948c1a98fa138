// libFuzzer target: the packpipe-measurements reader, then what reads its result: the file form
// written again (it must parse to the same bytes), a calibration fitted over the analytic model and
// the validation against it. Only packpipe's documented exception types may escape the library.
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/errors.h"
#include "costmodel/analytic.h"
#include "costmodel/calibration.h"
#include "costmodel/measurements.h"
#include "planner/measure.h"

namespace {

namespace cm = packpipe::costmodel;

const cm::AnalyticCostModel& gpt() {
  static const cm::AnalyticCostModel m(cm::load_model("gpt-350m"), cm::load_device("A100-40GB"));
  return m;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  cm::MeasurementSet set;
  try {
    set = cm::parse_measurements(text, "fuzz.jsonl");
  } catch (const packpipe::Error&) {
    return 0;
  }
  // What the reader accepts, the writer writes, and the reader reads back to the same bytes.
  const std::string again = cm::measurements_to_jsonl(set);
  if (cm::measurements_to_jsonl(cm::parse_measurements(again, "again")) != again) __builtin_trap();
  try {
    const cm::Calibration c = cm::fit_calibration(gpt(), set.ops);
    if (cm::Calibration::from_json(c.to_json(), "fit").to_json() != c.to_json()) __builtin_trap();
  } catch (const packpipe::InvalidArgument&) {  // a shape the model refuses
  }
  try {
    (void)packpipe::planner::validate_measurements(gpt(), set);
  } catch (const packpipe::InvalidArgument&) {  // a refused shape, an incomplete iteration
  }
  return 0;
}
