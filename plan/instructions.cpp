#include "plan/instructions.h"

#include <fmt/format.h>

#include "common/errors.h"
#include "common/recompute.h"

namespace packpipe::plan {

namespace {

constexpr std::uint8_t M = kFieldMb, S = kFieldStage, P = kFieldPeer, I = kFieldIn, I2 = kFieldIn2, O = kFieldOut,
                       SH = kFieldShape, MD = kFieldMode;

// The fields of each opcode, indexed by opcode value (names: kOpcodeNames).
constexpr std::uint8_t kOpFields[kOpcodeCount] = {
    0,                   // IterBegin
    0,                   // IterEnd
    M | S | O | SH,      // LoadMb
    M | S | I | I2 | O | MD,  // Forward
    M | S | I | O,       // Backward
    M | S | I | O,       // BackwardInput
    M | S,               // BackwardWeight
    M | S | P | I | SH,  // SendActStart
    M | S | P | I,       // SendActWait
    M | S | P | O | SH,  // RecvActStart
    M | S | P | I,       // RecvActWait
    M | S | P | I | SH,  // SendGradStart
    M | S | P | I,       // SendGradWait
    M | S | P | O | SH,  // RecvGradStart
    M | S | P | I,       // RecvGradWait
    I,                   // FreeBuf
    S,                   // ReduceGrad
    0,                   // OptStep
    S,                   // ReduceTied
};

}  // namespace

bool is_compute(Opcode op) {
  return op == Opcode::Forward || op == Opcode::Backward || op == Opcode::BackwardInput || op == Opcode::BackwardWeight;
}

std::uint8_t opcode_fields(Opcode op) {
  const auto i = static_cast<unsigned>(op);
  return i < static_cast<unsigned>(kOpcodeCount) ? kOpFields[i] : 0;
}

std::string to_string(const Instruction& ins) {
  std::string s = opcode_name(ins.op);
  const std::uint8_t f = opcode_fields(ins.op);
  auto field = [&](std::uint8_t bit, const char* key, const char* prefix, std::uint32_t v) {
    if (!(f & bit)) return;
    if (v == kNone) {
      s += fmt::format(" {}=-", key);
    } else {
      s += fmt::format(" {}={}{}", key, prefix, v);
    }
  };
  field(kFieldMb, "mb", "", ins.mb);
  field(kFieldStage, "stage", "", ins.stage);
  field(kFieldPeer, "peer", "", ins.peer);
  field(kFieldIn, "in", "b", ins.in);
  field(kFieldIn2, "in2", "b", ins.in2);
  field(kFieldOut, "out", "b", ins.out);
  field(kFieldShape, "shape", "#", ins.shape);
  if ((f & kFieldMode) && ins.mode != kNone) s += fmt::format(" recompute={}", ins.mode < 3 ? recompute_name(static_cast<Recompute>(ins.mode)) : "?");
  return s;
}

}  // namespace packpipe::plan
