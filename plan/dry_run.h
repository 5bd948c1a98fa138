// The dry run: every rank's stream of a plan executed in one thread without compute or data, under
// the communication model the validator checks: a receive wait blocks until the matching send was
// posted, a send wait until the matching receive was posted (a rendezvous, the stricter NCCL case);
// everything else proceeds. One handler per opcode tracks what each buffer slot holds, the messages
// of every channel, the compute counts and the memory in flight. The validator reports the problems
// it finds; the runtime's tests use it as the reference executor (which send every receive gets,
// what every buffer holds, where a plan deadlocks).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "plan/plan.h"

namespace packpipe::plan {

/// What a buffer slot holds.
enum class Content : std::uint8_t { Load, Activation, Gradient };
/// "loaded inputs", "activation", "input gradient".
const char* content_name(Content c);
/// "activation of micro-batch 3 stage 1".
std::string describe_content(Content c, std::uint32_t mb, std::uint32_t stage);

/// One buffer slot of one rank during the dry run.
struct SlotState {
  bool live = false;
  Content content = Content::Load;
  std::uint32_t mb = 0, stage = 0;  ///< Activation: output of `stage`; Gradient: input gradient of `stage`; Load: of `stage`
  bool ready = false;               ///< data present (a receive's after its wait)
  bool read = false;                ///< read by a compute op or a send
  std::int64_t alloc_index = -1;    ///< instruction that allocated it
  std::uint64_t bytes = 0;
  bool recv_pending = false;
  std::int64_t recv_channel = -1, recv_k = -1;  ///< the receive posted into it: channel, message number
  bool send_pending = false;
  std::int64_t send_channel = -1, send_k = -1;  ///< the last send posted from it, not yet waited
};

/// One message endpoint: the instruction that posts it.
struct MessageEnd {
  std::int64_t rank = 0, index = 0;
  std::uint32_t mb = 0, stage = 0, shape = 0;
};

/// A point-to-point channel (sender, receiver, activation or gradient) and its messages in stream
/// order: the i-th send matches the i-th receive.
struct ChannelState {
  std::int64_t src = 0, dst = 0, dir = 0;  ///< dir 0: activation, 1: gradient
  std::vector<MessageEnd> sends, recvs;
  std::size_t sends_posted = 0, recvs_posted = 0;
};

struct DryRunOptions {
  /// Count live communication buffers (shape bytes) towards memory, on top of static memory,
  /// stored activations and the running op's transient peak.
  bool count_buffers = false;
};

/// Executes a plan's streams (see the file comment). The plan's tables must have their declared
/// sizes (the validator's header check); instructions whose fields are out of range must be
/// masked by `skip` ([rank][index] != 0: passed over). Problems are passed to `report` (kind, rank,
/// index, message; the kinds are the validator's: "buffer", "dataflow", "count", "order",
/// "memory", "deadlock"); `report` returns false to stop the run. Never throws on a malformed
/// plan; deterministic.
class DryRun {
 public:
  using Reporter = std::function<bool(const char* kind, std::int64_t rank, std::int64_t index, std::string message)>;
  DryRun(const Plan& plan, Reporter report = {}, const std::vector<std::vector<std::uint8_t>>* skip = nullptr,
         DryRunOptions options = {});

  /// Runs every rank round-robin until all finished or none can move (a deadlock, reported with
  /// the wait each stuck rank blocks on, or a stop asked by the reporter). Reports buffers never
  /// freed. Returns true when every rank finished its stream. Call once.
  bool run();

  /// Channels in order of first appearance, with their static messages.
  const std::vector<ChannelState>& channels() const { return channels_; }
  /// Instructions rank r executed (its stream's size when it finished).
  std::size_t position(std::size_t r) const { return pc_[r]; }
  /// The send a receive wait got: for the wait at (rank, index), the (rank, index) of the matching
  /// SEND_*_START; (-1, -1) for other instructions and waits that did not complete.
  std::pair<std::int64_t, std::int64_t> matched_send(std::size_t rank, std::size_t index) const;
  /// Per rank: static + stored + running op's peak (+ buffers when counted), bytes.
  const std::vector<std::uint64_t>& peak_bytes() const { return peak_bytes_; }
  /// Per rank: live communication buffers' bytes at most, and live slots at most.
  const std::vector<std::uint64_t>& peak_buffer_bytes() const { return peak_buffer_bytes_; }
  const std::vector<std::uint32_t>& peak_buffers() const { return peak_buffers_; }
  /// Per (mb, v): forwards, full backwards, input- and weight-gradient halves executed.
  const std::vector<std::uint32_t>& forwards() const { return nf_; }
  const std::vector<std::uint32_t>& backwards() const { return nb_; }
  const std::vector<std::uint32_t>& input_grads() const { return ni_; }
  const std::vector<std::uint32_t>& weight_grads() const { return nw_; }
  /// Per virtual stage: REDUCE_GRADs executed.
  const std::vector<std::uint8_t>& reduced() const { return reduced_; }
  /// Whether rank r's stream holds a REDUCE_GRAD.
  bool has_reduce(std::size_t r) const { return has_reduce_[r] != 0; }

 private:
  // One handler per opcode: each returns false when the instruction must wait (a blocked wait).
  bool on_marker(std::size_t r, std::size_t i, const Instruction& ins);
  bool on_load(std::size_t r, std::size_t i, const Instruction& ins);
  bool on_forward(std::size_t r, std::size_t i, const Instruction& ins);
  bool on_backward(std::size_t r, std::size_t i, const Instruction& ins);
  bool on_backward_weight(std::size_t r, std::size_t i, const Instruction& ins);
  bool on_send_start(std::size_t r, std::size_t i, const Instruction& ins);
  bool on_recv_start(std::size_t r, std::size_t i, const Instruction& ins);
  bool on_recv_wait(std::size_t r, std::size_t i, const Instruction& ins);
  bool on_send_wait(std::size_t r, std::size_t i, const Instruction& ins);
  bool on_free(std::size_t r, std::size_t i, const Instruction& ins);
  bool on_reduce(std::size_t r, std::size_t i, const Instruction& ins);
  bool on_opt_step(std::size_t r, std::size_t i, const Instruction& ins);
  bool on_reduce_tied(std::size_t r, std::size_t i, const Instruction& ins);
  bool execute(std::size_t r, std::size_t i, const Instruction& ins);

  void problem(const char* kind, std::size_t r, std::size_t i, std::string message);
  std::int64_t channel_of(std::int64_t src, std::int64_t dst, std::int64_t dir);
  void alloc(std::size_t r, std::size_t i, std::uint32_t b, Content c, std::uint32_t mb, std::uint32_t stage, bool ready,
             std::uint64_t bytes);
  bool read(std::size_t r, std::size_t i, std::uint32_t b, Content c, std::uint32_t mb, std::uint32_t stage,
            const char* role);
  void charge(std::size_t r, std::size_t i, double transient);
  std::uint64_t out_bytes(std::size_t r, std::size_t i) const;
  std::size_t key(const Instruction& ins) const;
  void report_unfinished();

  const Plan& p_;
  Reporter report_;
  const std::vector<std::vector<std::uint8_t>>* skip_;
  DryRunOptions o_;
  bool stopped_ = false;
  std::size_t N_ = 0, V_ = 0, S_ = 0;
  std::map<std::tuple<std::int64_t, std::int64_t, std::int64_t>, std::size_t> channel_index_;
  std::vector<ChannelState> channels_;
  std::vector<std::vector<SlotState>> slots_;
  std::vector<std::size_t> pc_;
  std::vector<double> stored_, buffers_;
  std::vector<std::uint32_t> live_;
  std::vector<std::uint64_t> peak_bytes_, peak_buffer_bytes_;
  std::vector<std::uint32_t> peak_buffers_;
  std::vector<std::uint8_t> mem_reported_;
  std::vector<std::uint32_t> nf_, nb_, ni_, nw_;
  std::vector<std::uint32_t> done_bwd_stage_;  // backward completions (B or W) per stage
  std::vector<std::uint8_t> reduced_, stepped_, has_reduce_;
  std::vector<std::int64_t> blocked_channel_, blocked_k_;
  std::vector<std::uint8_t> tied_reached_;  // per rank: reached its REDUCE_TIED (a two-rank collective)
  std::vector<std::vector<std::pair<std::int64_t, std::int64_t>>> matched_;  // [rank][index]
};

}  // namespace packpipe::plan
