// The instruction set of packpipe's per-rank pipeline streams: a superset of DeepSpeed's,
// PyTorch's and DynaPipe's instructions (see docs/design/007-instructions.md).
//
// Every instruction is one fixed-size record in memory; its binary form (plan/format.h) is an
// opcode byte followed by the opcode's fields as varints, a few bytes in all. Tensor shapes live in
// the plan's shape table and are referenced by index; buffers are per-rank slot ids.
#pragma once

#include <cstdint>
#include <string>

#include "common/enum_names.h"

namespace packpipe::plan {

/// Operations of a rank's stream. Values are part of the binary format: append only.
enum class Opcode : std::uint8_t {
  IterBegin = 0,      ///< start of the iteration (scope marker)
  IterEnd = 1,        ///< end of the iteration: every outstanding communication has completed
  LoadMb = 2,         ///< host->device inputs of (mb, stage) into buffer `out` (tokens / labels); shape = token tensor
  Forward = 3,        ///< forward of (mb, stage): reads `in` (activation) and `in2` (loaded inputs), writes `out`;
                      ///< the last stage adds loss x the micro-batch's loss weight
  Backward = 4,       ///< full backward of (mb, stage): reads `in` (output gradient), writes `out` (input gradient)
  BackwardInput = 5,  ///< input-gradient half of Backward (same buffers); frees nothing stored
  BackwardWeight = 6, ///< weight-gradient half, after BackwardInput of the same (mb, stage); no buffers
  SendActStart = 7,   ///< post the send of (mb, stage)'s output activation in buffer `in` to rank `peer`
  SendActWait = 8,    ///< wait until that send completed (buffer `in` may then be freed)
  RecvActStart = 9,   ///< allocate buffer `out` (shape) and post the receive of (mb, stage)'s input from `peer`
  RecvActWait = 10,   ///< wait until the activation in buffer `in` arrived
  SendGradStart = 11, ///< post the send of (mb, stage)'s input gradient in buffer `in` to rank `peer`
  SendGradWait = 12,  ///< wait until that send completed
  RecvGradStart = 13, ///< allocate buffer `out` (shape) and post the receive of (mb, stage)'s output gradient
  RecvGradWait = 14,  ///< wait until the gradient in buffer `in` arrived
  FreeBuf = 15,       ///< release buffer `in`
  ReduceGrad = 16,    ///< data-parallel SUM all-reduce of stage's gradients (loss weights already normalise)
  OptStep = 17,       ///< optimizer step and zeroing of the gradients of every stage of this rank
  ReduceTied = 18,    ///< SUM of the tied embedding / LM head weight's gradient between the ranks of the
                      ///< first and the last stage (`stage`: this rank's of the two); format 2
};
/// The one name table, indexed by opcode value: "ITER_BEGIN", "ITER_END", "LOAD_MB", "FWD", ...
/// (the names used by the JSON form and `plan inspect`).
inline constexpr EnumName<Opcode> kOpcodeNames[] = {
    {Opcode::IterBegin, "ITER_BEGIN"},
    {Opcode::IterEnd, "ITER_END"},
    {Opcode::LoadMb, "LOAD_MB"},
    {Opcode::Forward, "FWD"},
    {Opcode::Backward, "BWD"},
    {Opcode::BackwardInput, "BWD_I"},
    {Opcode::BackwardWeight, "BWD_W"},
    {Opcode::SendActStart, "SEND_ACT_START"},
    {Opcode::SendActWait, "SEND_ACT_WAIT"},
    {Opcode::RecvActStart, "RECV_ACT_START"},
    {Opcode::RecvActWait, "RECV_ACT_WAIT"},
    {Opcode::SendGradStart, "SEND_GRAD_START"},
    {Opcode::SendGradWait, "SEND_GRAD_WAIT"},
    {Opcode::RecvGradStart, "RECV_GRAD_START"},
    {Opcode::RecvGradWait, "RECV_GRAD_WAIT"},
    {Opcode::FreeBuf, "FREE_BUF"},
    {Opcode::ReduceGrad, "REDUCE_GRAD"},
    {Opcode::OptStep, "OPT_STEP"},
    {Opcode::ReduceTied, "REDUCE_TIED"},
};
/// Number of opcodes (one past the largest value).
constexpr int kOpcodeCount = static_cast<int>(sizeof(kOpcodeNames) / sizeof(kOpcodeNames[0]));

namespace detail {
/// Whether kOpcodeNames[i] names opcode i for every i (opcode_name indexes it).
constexpr bool opcode_names_indexed() {
  for (int i = 0; i < kOpcodeCount; ++i) {
    if (static_cast<int>(kOpcodeNames[i].value) != i) return false;
  }
  return true;
}
static_assert(opcode_names_indexed(), "kOpcodeNames must list the opcodes in value order");
}  // namespace detail

/// The opcode's name in kOpcodeNames, or "?" for a value outside it (O(1): instruction dumps call it).
constexpr const char* opcode_name(Opcode op) {
  return static_cast<int>(op) < kOpcodeCount ? kOpcodeNames[static_cast<int>(op)].name : "?";
}
/// Opcode from its name; throws InvalidArgument listing the names.
inline Opcode opcode_from_name(const std::string& name) { return enum_from_name(kOpcodeNames, name, "instruction"); }
/// True for Forward, Backward, BackwardInput and BackwardWeight.
bool is_compute(Opcode op);

/// Marks an absent field (micro-batch, stage, peer, buffer or shape).
constexpr std::uint32_t kNone = 0xFFFFFFFFu;

/// One instruction. Fields an opcode does not use hold kNone.
struct Instruction {
  Opcode op = Opcode::IterBegin;
  std::uint32_t mb = kNone;     ///< micro-batch index
  std::uint32_t stage = kNone;  ///< virtual stage that runs on this rank
  std::uint32_t peer = kNone;   ///< other rank of a communication
  std::uint32_t in = kNone;     ///< buffer read (or sent, waited on, freed)
  std::uint32_t in2 = kNone;    ///< second buffer read (Forward: loaded inputs)
  std::uint32_t out = kNone;    ///< buffer written (allocated here)
  std::uint32_t shape = kNone;  ///< index into Plan::shapes (loads, receive and send starts)
  std::uint32_t mode = kNone;   ///< FWD: the recompute mode of (mb, stage) (format 2)
  bool operator==(const Instruction& o) const {
    return op == o.op && mb == o.mb && stage == o.stage && peer == o.peer && in == o.in && in2 == o.in2 &&
           out == o.out && shape == o.shape && mode == o.mode;
  }
  bool operator!=(const Instruction& o) const { return !(*this == o); }
};

/// Which fields an opcode carries (bit i set: field i of {mb, stage, peer, in, in2, out, shape,
/// mode}). The binary format writes exactly these fields, in this order (format 1: no mode).
std::uint8_t opcode_fields(Opcode op);
enum InstructionField : std::uint8_t {
  kFieldMb = 1,
  kFieldStage = 2,
  kFieldPeer = 4,
  kFieldIn = 8,
  kFieldIn2 = 16,
  kFieldOut = 32,
  kFieldShape = 64,
  kFieldMode = 128,
};

/// "FWD mb=3 stage=1 in=b2 in2=- out=b4": one line for `plan inspect` and error messages.
std::string to_string(const Instruction& ins);

}  // namespace packpipe::plan
