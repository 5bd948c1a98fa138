// libFuzzer target: the packpipe-calibration reader, then the calibration applied over the model it
// names (its fingerprint replaced by the analytic model's, so every file that parses is applied):
// op times, stage times and the communication model. Only packpipe's documented exception types may
// escape the library.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "common/errors.h"
#include "costmodel/analytic.h"
#include "costmodel/calibration.h"
#include "costmodel/stage_ops.h"

namespace {

namespace cm = packpipe::costmodel;

std::shared_ptr<const cm::CostModel> gpt() {
  static const auto m =
      std::make_shared<const cm::AnalyticCostModel>(cm::load_model("gpt-350m"), cm::load_device("A100-40GB"));
  return m;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  cm::Calibration c;
  try {
    c = cm::Calibration::from_json(std::string(reinterpret_cast<const char*>(data), size), "fuzz.json");
  } catch (const packpipe::Error&) {
    return 0;
  }
  if (cm::Calibration::from_json(c.to_json(), "again").to_json() != c.to_json()) __builtin_trap();
  c.base.fingerprint = cm::cost_model_fingerprint(*gpt());
  const cm::CalibratedCostModel model(gpt(), c);
  const cm::StageLayout layout{2, 0, true, false};
  for (std::int64_t rows : {1, 4}) {
    for (std::int64_t seq : {64, 2048}) {
      const cm::MicroShape shape{rows, seq, 0, {}};
      const cm::StageOpTimes t = cm::stage_op_times(model, layout, 1, shape, cm::Recompute::None);
      if (!(t.backward_weight_ms <= t.backward_ms)) __builtin_trap();
      (void)cm::stage_time_ms(model, cm::stage_cost(*gpt(), layout, 1, rows, seq, 0, cm::Recompute::None),
                              cm::shape_tokens(gpt()->model(), shape), cm::attention_share(gpt()->model(), layout, shape, gpt()->attention()));
    }
  }
  (void)model.comm().p2p_ms(1 << 20, true);
  return 0;
}
