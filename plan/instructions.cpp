#include "plan/instructions.h"

#include <fmt/format.h>

#include "common/errors.h"

namespace packpipe::plan {

namespace {

struct OpInfo {
  const char* name;
  std::uint8_t fields;
};

constexpr std::uint8_t M = kFieldMb, S = kFieldStage, P = kFieldPeer, I = kFieldIn, I2 = kFieldIn2, O = kFieldOut,
                       SH = kFieldShape;

// Indexed by opcode value.
constexpr OpInfo kOps[kOpcodeCount] = {
    {"ITER_BEGIN", 0},
    {"ITER_END", 0},
    {"LOAD_MB", M | S | O | SH},
    {"FWD", M | S | I | I2 | O},
    {"BWD", M | S | I | O},
    {"BWD_I", M | S | I | O},
    {"BWD_W", M | S},
    {"SEND_ACT_START", M | S | P | I | SH},
    {"SEND_ACT_WAIT", M | S | P | I},
    {"RECV_ACT_START", M | S | P | O | SH},
    {"RECV_ACT_WAIT", M | S | P | I},
    {"SEND_GRAD_START", M | S | P | I | SH},
    {"SEND_GRAD_WAIT", M | S | P | I},
    {"RECV_GRAD_START", M | S | P | O | SH},
    {"RECV_GRAD_WAIT", M | S | P | I},
    {"FREE_BUF", I},
    {"REDUCE_GRAD", S},
    {"OPT_STEP", 0},
};

}  // namespace

const char* opcode_name(Opcode op) {
  const auto i = static_cast<unsigned>(op);
  return i < static_cast<unsigned>(kOpcodeCount) ? kOps[i].name : "?";
}

Opcode opcode_from_name(const std::string& name) {
  for (int i = 0; i < kOpcodeCount; ++i) {
    if (name == kOps[i].name) return static_cast<Opcode>(i);
  }
  PACKPIPE_THROW(InvalidArgument, "unknown instruction '{}' (expected FWD, BWD, BWD_I, BWD_W, LOAD_MB, SEND_ACT_START, ...)",
                 name);
}

bool is_compute(Opcode op) {
  return op == Opcode::Forward || op == Opcode::Backward || op == Opcode::BackwardInput || op == Opcode::BackwardWeight;
}

std::uint8_t opcode_fields(Opcode op) {
  const auto i = static_cast<unsigned>(op);
  return i < static_cast<unsigned>(kOpcodeCount) ? kOps[i].fields : 0;
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
  return s;
}

}  // namespace packpipe::plan
