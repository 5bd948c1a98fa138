// The compute side of one pipeline rank: what the executor calls for every instruction that is not
// communication. A trainer implements it over its model (packpipe.torch does, in Python); the
// replay implements it with timed waits and payload checks.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/recompute.h"
#include "plan/plan.h"
#include "runtime/buffer.h"

namespace packpipe::runtime {

class Transport;

/// What an instruction's handler call gets: where it is, the instruction, and the plan's tables for
/// it. References are valid for the duration of the call.
struct OpContext {
  const plan::Plan* plan = nullptr;
  std::uint32_t rank = 0;                      ///< pipeline rank running the stream
  std::size_t index = 0;                       ///< instruction index in the rank's stream
  const plan::Instruction* ins = nullptr;
  const plan::TensorShape* shape = nullptr;    ///< the instruction's shape (loads, receives), else null
  const plan::TensorShape* out_shape = nullptr;  ///< compute ops: the shape of the buffer they write when the plan sends it, else null
  const plan::PlanMicroBatch* mb = nullptr;    ///< the instruction's micro-batch, else null
  Recompute recompute = Recompute::None;       ///< the (micro-batch, stage)'s recompute mode (compute ops)
  double loss_weight = 0;                      ///< the micro-batch's loss weight (tokens / global tokens)
  /// The rank's transport: a long handler call may poll `transport->abort_reason()` and return early
  /// once another rank failed (the executor then stops with the pipeline's error). Null outside an executor.
  const Transport* transport = nullptr;
};

/// Compute, loads and memory of one rank. Every method may throw: the executor aborts the pipeline
/// and reports the error with the instruction. Buffers returned must hold the plan's sizes when
/// the plan gives one (ctx.shape / ctx.out_shape), which the executor checks.
class StageHandler {
 public:
  virtual ~StageHandler() = default;
  /// Before the first instruction of an iteration.
  virtual void begin_iteration(const plan::Plan& plan, std::uint32_t rank) {}
  /// After the last one (every communication completed).
  virtual void end_iteration(const plan::Plan& plan, std::uint32_t rank) {}
  /// LOAD_MB: the micro-batch's inputs of stage ctx.ins->stage, a buffer of ctx.shape.
  virtual Buffer load(const OpContext& ctx) = 0;
  /// FWD: `in` the previous stage's activation (null on the first stage), `in2` the loaded inputs
  /// (null if none); returns the output activation (ignored on the last stage, which adds the loss
  /// times ctx.loss_weight).
  virtual Buffer forward(const OpContext& ctx, const Buffer* in, const Buffer* in2) = 0;
  /// BWD or BWD_I (ctx.ins->op says which): `grad` the next stage's input gradient (null on the
  /// last stage); returns this stage's input gradient (ignored on the first stage).
  virtual Buffer backward(const OpContext& ctx, const Buffer* grad) = 0;
  /// BWD_W: the weight-gradient half of a split backward.
  virtual void backward_weight(const OpContext& ctx) = 0;
  /// REDUCE_GRAD: data-parallel SUM all-reduce of stage ctx.ins->stage's gradients.
  virtual void reduce_grad(const OpContext& ctx) = 0;
  /// OPT_STEP: optimizer step and zeroing of the gradients of this rank's stages.
  virtual void optimizer_step(const OpContext& ctx) = 0;
  /// REDUCE_TIED: SUM of the tied embedding / LM head weight's gradient between the ranks of the
  /// first and the last stage (plans with Plan::tied_embedding). The default refuses: a handler of
  /// a tied model must implement it.
  virtual void reduce_tied(const OpContext& ctx);
  /// A receive buffer of ctx.shape, in the transport's memory.
  virtual Buffer allocate(const OpContext& ctx) = 0;
  /// After a receive wait completed into `buffer` (the replay verifies its payload here).
  virtual void received(const OpContext& ctx, const Buffer& buffer) {}
};

}  // namespace packpipe::runtime
