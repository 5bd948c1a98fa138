// The instruction set of packpipe's per-rank pipeline streams: a superset of DeepSpeed's,
// PyTorch's and DynaPipe's instructions (see docs/design/007-instructions.md).
//
// Every instruction is one fixed-size record in memory; its binary form (plan_format.h) is an
// opcode byte followed by the opcode's fields as varints, a few bytes in all. Tensor shapes live in
// the plan's shape table and are referenced by index; buffers are per-rank slot ids.
#pragma once

#include <cstdint>
#include <string>

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
};
/// Number of opcodes (one past the largest value).
constexpr int kOpcodeCount = 18;

/// "FWD", "RECV_ACT_START", ... (the names used by the JSON form and `plan inspect`).
const char* opcode_name(Opcode op);
/// Opcode from its name; throws InvalidArgument naming the unknown name.
Opcode opcode_from_name(const std::string& name);
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
  bool operator==(const Instruction& o) const {
    return op == o.op && mb == o.mb && stage == o.stage && peer == o.peer && in == o.in && in2 == o.in2 &&
           out == o.out && shape == o.shape;
  }
  bool operator!=(const Instruction& o) const { return !(*this == o); }
};

/// Which fields an opcode carries (bit i set: field i of {mb, stage, peer, in, in2, out, shape}).
/// The binary format writes exactly these fields, in this order.
std::uint8_t opcode_fields(Opcode op);
enum InstructionField : std::uint8_t {
  kFieldMb = 1,
  kFieldStage = 2,
  kFieldPeer = 4,
  kFieldIn = 8,
  kFieldIn2 = 16,
  kFieldOut = 32,
  kFieldShape = 64,
};

/// "FWD mb=3 stage=1 in=b2 in2=- out=b4": one line for `plan inspect` and error messages.
std::string to_string(const Instruction& ins);

}  // namespace packpipe::plan
