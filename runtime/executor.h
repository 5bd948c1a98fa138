// The executor: the project's one interpreter of the instruction set. It runs one rank's stream of
// a plan, calling the stage handler for compute and loads and the transport for communication,
// with buffers in the plan's slots. Every wait has a deadline; a failure on any rank ends every
// rank with an error that names the rank, the iteration, the instruction and what was awaited.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "plan/plan.h"
#include "runtime/handler.h"
#include "runtime/transport.h"

namespace packpipe::runtime {

/// The longest timeout a wait may have, seconds (about 31 years; 0 means no timeout).
inline constexpr double kMaxTimeoutS = 1e9;

struct ExecutorOptions {
  /// Seconds every wait may take before the executor gives up (0: wait forever), in [0, kMaxTimeoutS].
  double timeout_s = 300;
  /// Check the plan with the validator before running it (an invalid plan is refused with its
  /// violations instead of being run).
  bool validate = true;
  /// At ITER_BEGIN, exchange plan fingerprints with the pipeline neighbours (ranks r - 1 and r + 1,
  /// cyclically) over the transport's control channel; a mismatch ends every rank.
  bool check_agreement = true;
  /// Record when each instruction started and ended.
  bool record = true;
};

/// When one instruction ran, in ns since the executor's epoch (steady clock).
struct InstructionTime {
  std::int64_t start_ns = 0;
  std::int64_t end_ns = 0;
};

/// What one rank's run of one iteration measured.
struct RankRecord {
  std::uint32_t rank = 0;
  std::uint64_t iteration = 0;
  std::vector<InstructionTime> times;  ///< [instruction index] (empty when not recorded)
  std::int64_t start_ns = 0, end_ns = 0;  ///< the stream's first start and last end
  std::int64_t handler_ns = 0;   ///< time inside handler calls
  std::int64_t wait_ns = 0;      ///< time inside request waits
  std::int64_t transport_ns = 0; ///< time posting sends and receives
  std::size_t instructions = 0;
  /// Wall time of the stream minus handler, wait and transport time: the executor's own work.
  std::int64_t overhead_ns() const { return (end_ns - start_ns) - handler_ns - wait_ns - transport_ns; }
};

/// A 64-bit fingerprint of a plan (XXH64 of its uncompressed binary form): ranks compare it to
/// check they execute the same plan.
std::uint64_t plan_fingerprint(const plan::Plan& plan);

/// Runs streams of plans for one rank. Holds references to the handler and the transport (they
/// must outlive it). Not thread-safe: one executor per rank thread or process.
class Executor {
 public:
  Executor(StageHandler& handler, Transport& transport, ExecutorOptions options = {});
  /// Runs the stream of transport.rank() in `plan` to its end. Throws packpipe::Error when the
  /// plan is invalid (with its violations), disagrees with a neighbour's, a wait times out, the
  /// handler or the transport fails, or another rank aborted: the message names this rank, the
  /// iteration, the instruction index and opcode, the peer and micro-batch, and what was awaited;
  /// on a local failure the pipeline is aborted first so that the other ranks end too. Nothing is
  /// reported as success unless every instruction ran.
  RankRecord run(const plan::Plan& plan);
  /// The epoch of the recorded times (the executor's construction).
  Clock::time_point epoch() const { return epoch_; }

 private:
  struct State;
  StageHandler& handler_;
  Transport& transport_;
  ExecutorOptions options_;
  Clock::time_point epoch_;
};

}  // namespace packpipe::runtime
