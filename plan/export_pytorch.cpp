#include "plan/export_pytorch.h"

#include <fmt/format.h>

#include "common/errors.h"

namespace packpipe::plan {

bool pytorch_exportable(const Plan& plan, std::string* why) {
  if (plan.microbatches.empty()) {
    if (why != nullptr) *why = "the plan has no micro-batches";
    return false;
  }
  for (std::size_t m = 0; m < plan.microbatches.size(); ++m) {
    if (!plan.microbatches[m].has_slices()) continue;
    if (why != nullptr) {
      *why = fmt::format(
          "micro-batch {} holds slices of a long sample (docs/design/015-long-context.md): PyTorch pipelining runs "
          "each micro-batch on its own, without the earlier slices' kept keys and values and without the reverse "
          "backward order, so it would train something else (plan with slicing off, or run the plan with "
          "packpipe's executor)",
          m);
    }
    return false;
  }
  const PlanMicroBatch& a = plan.microbatches.front();
  for (std::size_t m = 1; m < plan.microbatches.size(); ++m) {
    const PlanMicroBatch& b = plan.microbatches[m];
    if (b.rows != a.rows || b.padded_len != a.padded_len || b.padded_dec_len != a.padded_dec_len) {
      if (why != nullptr) {
        *why = fmt::format(
            "micro-batch {} is {} rows x {} tokens{} but micro-batch 0 is {} rows x {} tokens{}: PyTorch "
            "pipelining sizes its buffers once and needs one shape for every micro-batch (plan with one shape, or "
            "run the plan with packpipe's executor)",
            m, b.rows, b.padded_len, b.padded_dec_len ? fmt::format(" (+ {} decoder)", b.padded_dec_len) : "", a.rows,
            a.padded_len, a.padded_dec_len ? fmt::format(" (+ {} decoder)", a.padded_dec_len) : "");
      }
      return false;
    }
  }
  return true;
}

std::string pytorch_compute_csv(const Plan& plan) {
  std::string why;
  if (!pytorch_exportable(plan, &why)) {
    PACKPIPE_THROW(Unsupported, "cannot export iteration {} to PyTorch: {}", plan.iteration, why);
  }
  std::string out;
  for (std::size_t r = 0; r < plan.streams.size(); ++r) {
    bool first = true;
    for (const Instruction& ins : plan.streams[r]) {
      if (!is_compute(ins.op)) continue;
      const char* token = op_kind_token(compute_kind(ins.op));
      if (!first) out += ',';
      first = false;
      out += fmt::format("{}{}{}", ins.stage, token, ins.mb);
    }
    out += '\n';
  }
  return out;
}

}  // namespace packpipe::plan
