#include "plan/dry_run.h"

#include <algorithm>

#include <fmt/format.h>

namespace packpipe::plan {

const char* content_name(Content c) {
  switch (c) {
    case Content::Load: return "loaded inputs";
    case Content::Activation: return "activation";
    case Content::Gradient: return "input gradient";
  }
  return "?";
}

std::string describe_content(Content c, std::uint32_t mb, std::uint32_t stage) {
  return fmt::format("{} of micro-batch {} stage {}", content_name(c), mb, stage);
}

DryRun::DryRun(const Plan& plan, Reporter report, const std::vector<std::vector<std::uint8_t>>* skip,
               DryRunOptions options)
    : p_(plan), report_(std::move(report)), skip_(skip), o_(options) {
  N_ = p_.microbatches.size();
  V_ = p_.vstages;
  S_ = p_.ranks;
  const auto nv = N_ * V_;
  nf_.assign(nv, 0);
  nb_.assign(nv, 0);
  ni_.assign(nv, 0);
  nw_.assign(nv, 0);
  slots_.resize(S_);
  matched_.resize(S_);
  has_reduce_.assign(S_, 0);
  for (std::size_t r = 0; r < S_; ++r) {
    slots_[r].resize(p_.buffer_slots[r]);
    matched_[r].assign(p_.streams[r].size(), {-1, -1});
    for (const auto& ins : p_.streams[r]) has_reduce_[r] = has_reduce_[r] || ins.op == Opcode::ReduceGrad;
  }
  pc_.assign(S_, 0);
  stored_.assign(S_, 0);
  buffers_.assign(S_, 0);
  live_.assign(S_, 0);
  peak_bytes_.assign(S_, 0);
  peak_buffer_bytes_.assign(S_, 0);
  peak_buffers_.assign(S_, 0);
  mem_reported_.assign(S_, 0);
  done_bwd_stage_.assign(V_, 0);
  reduced_.assign(V_, 0);
  stepped_.assign(S_, 0);
  blocked_channel_.assign(S_, -1);
  tied_reached_.assign(S_, 0);
  blocked_k_.assign(S_, -1);
  // The channels and their messages in stream order.
  for (std::size_t r = 0; r < S_; ++r) {
    for (std::size_t i = 0; i < p_.streams[r].size(); ++i) {
      if (skip_ != nullptr && (*skip_)[r][i]) continue;
      const Instruction& ins = p_.streams[r][i];
      const auto R = static_cast<std::int64_t>(r);
      MessageEnd rec{R, static_cast<std::int64_t>(i), ins.mb, ins.stage, ins.shape};
      switch (ins.op) {
        case Opcode::SendActStart: channels_[channel_of(R, ins.peer, 0)].sends.push_back(rec); break;
        case Opcode::SendGradStart: channels_[channel_of(R, ins.peer, 1)].sends.push_back(rec); break;
        case Opcode::RecvActStart: channels_[channel_of(ins.peer, R, 0)].recvs.push_back(rec); break;
        case Opcode::RecvGradStart: channels_[channel_of(ins.peer, R, 1)].recvs.push_back(rec); break;
        default: break;
      }
    }
  }
}

std::int64_t DryRun::channel_of(std::int64_t src, std::int64_t dst, std::int64_t dir) {
  const auto key = std::make_tuple(src, dst, dir);
  auto it = channel_index_.find(key);
  if (it != channel_index_.end()) return static_cast<std::int64_t>(it->second);
  channel_index_.emplace(key, channels_.size());
  channels_.push_back(ChannelState{src, dst, dir, {}, {}, 0, 0});
  return static_cast<std::int64_t>(channels_.size() - 1);
}

std::pair<std::int64_t, std::int64_t> DryRun::matched_send(std::size_t rank, std::size_t index) const {
  if (rank >= matched_.size() || index >= matched_[rank].size()) return {-1, -1};
  return matched_[rank][index];
}

void DryRun::problem(const char* kind, std::size_t r, std::size_t i, std::string message) {
  if (stopped_ || !report_) return;
  if (!report_(kind, static_cast<std::int64_t>(r), static_cast<std::int64_t>(i), std::move(message))) stopped_ = true;
}

std::size_t DryRun::key(const Instruction& ins) const {
  return ins.mb != kNone && ins.stage != kNone ? static_cast<std::size_t>(ins.mb) * V_ + ins.stage : 0;
}

void DryRun::charge(std::size_t r, std::size_t i, double transient) {
  const double total = static_cast<double>(p_.static_bytes[r]) + stored_[r] + transient +
                       (o_.count_buffers ? buffers_[r] : 0.0);
  const auto t = total > 0 ? static_cast<std::uint64_t>(total) : 0;
  peak_bytes_[r] = std::max(peak_bytes_[r], t);
  if (p_.memory_limit_bytes > 0 && t > p_.memory_limit_bytes && !mem_reported_[r]) {
    mem_reported_[r] = 1;
    problem("memory", r, i,
            fmt::format("memory: expected at most the limit {} bytes, found {} (static {} + stored {} + transient {}{})",
                        p_.memory_limit_bytes, t, p_.static_bytes[r], static_cast<std::uint64_t>(stored_[r]),
                        static_cast<std::uint64_t>(transient),
                        o_.count_buffers ? fmt::format(" + buffers {}", static_cast<std::uint64_t>(buffers_[r])) : ""));
  }
}

void DryRun::alloc(std::size_t r, std::size_t i, std::uint32_t b, Content c, std::uint32_t mb, std::uint32_t stage,
                   bool ready, std::uint64_t bytes) {
  SlotState& s = slots_[r][b];
  if (s.live) {
    problem("buffer", r, i,
            fmt::format("buffer b{}: expected a free slot, found it holding the {} (allocated at instruction {})", b,
                        describe_content(s.content, s.mb, s.stage), s.alloc_index));
  }
  s = SlotState{};
  s.live = true;
  s.content = c;
  s.mb = mb;
  s.stage = stage;
  s.ready = ready;
  s.alloc_index = static_cast<std::int64_t>(i);
  s.bytes = bytes;
  buffers_[r] += static_cast<double>(bytes);
  ++live_[r];
  peak_buffers_[r] = std::max(peak_buffers_[r], live_[r]);
  peak_buffer_bytes_[r] = std::max(peak_buffer_bytes_[r], static_cast<std::uint64_t>(buffers_[r]));
}

// Checks that buffer b holds ready data `c` of (mb, stage).
bool DryRun::read(std::size_t r, std::size_t i, std::uint32_t b, Content c, std::uint32_t mb, std::uint32_t stage,
                  const char* role) {
  SlotState& s = slots_[r][b];
  if (!s.live) {
    problem("buffer", r, i, fmt::format("{} b{}: expected the {}, found a free slot", role, b, describe_content(c, mb, stage)));
    return false;
  }
  if (s.content != c || s.mb != mb || s.stage != stage) {
    problem("dataflow", r, i,
            fmt::format("{} b{}: expected the {}, found the {}", role, b, describe_content(c, mb, stage),
                        describe_content(s.content, s.mb, s.stage)));
    return false;
  }
  if (!s.ready) {
    problem("dataflow", r, i, fmt::format("{} b{}: the {} is read before its receive wait", role, b, describe_content(c, mb, stage)));
    return false;
  }
  s.read = true;
  return true;
}

// Bytes of the output buffer of a compute instruction: the matching send's shape if any, else 0
// (same-rank hand-over; its size is counted by the consumer's stored activations).
std::uint64_t DryRun::out_bytes(std::size_t r, std::size_t i) const {
  const auto& st = p_.streams[r];
  const Instruction& c = st[i];
  for (std::size_t j = i + 1; j < st.size() && j < i + 16; ++j) {
    const Instruction& s = st[j];
    if ((s.op == Opcode::SendActStart || s.op == Opcode::SendGradStart) && s.in == c.out && s.shape < p_.shapes.size())
      return p_.shapes[s.shape].bytes();
  }
  return 0;
}

bool DryRun::on_marker(std::size_t, std::size_t, const Instruction&) { return true; }

bool DryRun::on_load(std::size_t r, std::size_t i, const Instruction& ins) {
  alloc(r, i, ins.out, Content::Load, ins.mb, ins.stage, true, p_.shapes[ins.shape].bytes());
  return true;
}

bool DryRun::on_forward(std::size_t r, std::size_t i, const Instruction& ins) {
  const std::size_t k = key(ins);
  if (nf_[k]++ > 0) problem("count", r, i, fmt::format("forward of micro-batch {} stage {}: expected once, found again", ins.mb, ins.stage));
  if (ins.stage > 0) read(r, i, ins.in, Content::Activation, ins.mb, ins.stage - 1, "in");
  if (ins.in2 != kNone) read(r, i, ins.in2, Content::Load, ins.mb, ins.stage, "in2");
  charge(r, i, static_cast<double>(p_.peak_bytes[k]));
  stored_[r] += static_cast<double>(p_.stored_bytes[k]);
  if (ins.out != kNone) alloc(r, i, ins.out, Content::Activation, ins.mb, ins.stage, true, out_bytes(r, i));
  return true;
}

bool DryRun::on_backward(std::size_t r, std::size_t i, const Instruction& ins) {
  const std::size_t k = key(ins);
  const bool full_bwd = ins.op == Opcode::Backward;
  if (nf_[k] == 0) {
    problem("order", r, i, fmt::format("backward of micro-batch {} stage {}: expected after its forward, found before", ins.mb, ins.stage));
  }
  if ((full_bwd ? nb_[k] : ni_[k]) > 0 || (full_bwd ? ni_[k] : nb_[k]) > 0) {
    problem("count", r, i, fmt::format("backward of micro-batch {} stage {}: expected one B or one I, found another", ins.mb, ins.stage));
  }
  ++(full_bwd ? nb_[k] : ni_[k]);
  if (ins.stage + 1 < V_) read(r, i, ins.in, Content::Gradient, ins.mb, ins.stage + 1, "in");
  charge(r, i, static_cast<double>(p_.peak_bytes[k]));
  if (full_bwd) {
    if (nf_[k] > 0) stored_[r] = std::max(0.0, stored_[r] - static_cast<double>(p_.stored_bytes[k]));
    ++done_bwd_stage_[ins.stage];
  }
  if (ins.out != kNone) alloc(r, i, ins.out, Content::Gradient, ins.mb, ins.stage, true, out_bytes(r, i));
  return true;
}

bool DryRun::on_backward_weight(std::size_t r, std::size_t i, const Instruction& ins) {
  const std::size_t k = key(ins);
  if (ni_[k] == 0) {
    problem("order", r, i, fmt::format("weight gradient of micro-batch {} stage {}: expected after its input gradient (BWD_I), found before", ins.mb, ins.stage));
  }
  if (nw_[k]++ > 0) problem("count", r, i, fmt::format("weight gradient of micro-batch {} stage {}: expected once, found again", ins.mb, ins.stage));
  charge(r, i, static_cast<double>(p_.peak_bytes[k]));
  if (nf_[k] > 0) stored_[r] = std::max(0.0, stored_[r] - static_cast<double>(p_.stored_bytes[k]));
  ++done_bwd_stage_[ins.stage];
  return true;
}

bool DryRun::on_send_start(std::size_t r, std::size_t i, const Instruction& ins) {
  const bool act = ins.op == Opcode::SendActStart;
  read(r, i, ins.in, act ? Content::Activation : Content::Gradient, ins.mb, ins.stage, "in");
  const std::int64_t ch = channel_of(static_cast<std::int64_t>(r), ins.peer, act ? 0 : 1);
  SlotState& s = slots_[r][ins.in];
  if (s.send_pending) {
    problem("buffer", r, i, fmt::format("in b{}: a send from it is already pending (instruction {})", ins.in, s.alloc_index));
  }
  s.send_pending = true;
  s.send_channel = ch;
  s.send_k = static_cast<std::int64_t>(channels_[ch].sends_posted++);
  return true;
}

bool DryRun::on_recv_start(std::size_t r, std::size_t i, const Instruction& ins) {
  const bool act = ins.op == Opcode::RecvActStart;
  alloc(r, i, ins.out, act ? Content::Activation : Content::Gradient, ins.mb, act ? ins.stage - 1 : ins.stage + 1, false,
        p_.shapes[ins.shape].bytes());
  const std::int64_t ch = channel_of(ins.peer, static_cast<std::int64_t>(r), act ? 0 : 1);
  SlotState& s = slots_[r][ins.out];
  s.recv_pending = true;
  s.recv_channel = ch;
  s.recv_k = static_cast<std::int64_t>(channels_[ch].recvs_posted++);
  return true;
}

bool DryRun::on_recv_wait(std::size_t r, std::size_t i, const Instruction& ins) {
  SlotState& s = slots_[r][ins.in];
  const bool act = ins.op == Opcode::RecvActWait;
  if (!s.live || !s.recv_pending) {
    problem("buffer", r, i, fmt::format("in b{}: expected a posted {} receive, found {}", ins.in,
                                        act ? "activation" : "gradient", s.live ? "none pending" : "a free slot"));
    return true;
  }
  const ChannelState& c = channels_[s.recv_channel];
  if (c.sends_posted <= static_cast<std::size_t>(s.recv_k)) {
    blocked_channel_[r] = s.recv_channel;
    blocked_k_[r] = s.recv_k;
    return false;
  }
  if (s.mb != ins.mb || s.stage != (act ? ins.stage - 1 : ins.stage + 1) || c.src != ins.peer || c.dir != (act ? 0 : 1)) {
    problem("dataflow", r, i, fmt::format("in b{}: the wait names micro-batch {} stage {} from rank {}, the receive "
                                          "posted into it is the {} from rank {}", ins.in, ins.mb, ins.stage, ins.peer,
                                          describe_content(s.content, s.mb, s.stage), c.src));
  }
  if (static_cast<std::size_t>(s.recv_k) < c.sends.size()) {
    const MessageEnd& m = c.sends[static_cast<std::size_t>(s.recv_k)];
    matched_[r][i] = {m.rank, m.index};
  }
  s.recv_pending = false;
  s.ready = true;
  return true;
}

bool DryRun::on_send_wait(std::size_t r, std::size_t i, const Instruction& ins) {
  SlotState& s = slots_[r][ins.in];
  if (!s.live || !s.send_pending) {
    problem("buffer", r, i, fmt::format("in b{}: expected a pending send, found {}", ins.in, s.live ? "none" : "a free slot"));
    return true;
  }
  const ChannelState& c = channels_[s.send_channel];
  if (c.recvs_posted <= static_cast<std::size_t>(s.send_k)) {
    blocked_channel_[r] = s.send_channel;
    blocked_k_[r] = s.send_k;
    return false;
  }
  if (s.mb != ins.mb || s.stage != ins.stage || c.dst != ins.peer) {
    problem("dataflow", r, i, fmt::format("in b{}: the wait names micro-batch {} stage {} to rank {}, the send "
                                          "pending on it is the {} to rank {}", ins.in, ins.mb, ins.stage, ins.peer,
                                          describe_content(s.content, s.mb, s.stage), c.dst));
  }
  s.send_pending = false;
  return true;
}

bool DryRun::on_free(std::size_t r, std::size_t i, const Instruction& ins) {
  SlotState& s = slots_[r][ins.in];
  if (!s.live) {
    problem("buffer", r, i, fmt::format("b{}: expected a live buffer, found a free slot (freed twice or never allocated)", ins.in));
    return true;
  }
  if (s.send_pending) problem("buffer", r, i, fmt::format("b{}: freed while a send from it is pending (no SEND_*_WAIT)", ins.in));
  if (s.recv_pending) problem("buffer", r, i, fmt::format("b{}: freed while a receive into it is pending (no RECV_*_WAIT)", ins.in));
  if (s.content == Content::Load && !s.read) {
    problem("dataflow", r, i, fmt::format("b{}: the {} is freed without being read (its forward has no in2)", ins.in,
                                          describe_content(s.content, s.mb, s.stage)));
  }
  buffers_[r] -= static_cast<double>(s.bytes);
  --live_[r];
  s = SlotState{};
  return true;
}

bool DryRun::on_reduce(std::size_t r, std::size_t i, const Instruction& ins) {
  if (reduced_[ins.stage]++) problem("count", r, i, fmt::format("REDUCE_GRAD of stage {}: expected once, found again", ins.stage));
  if (done_bwd_stage_[ins.stage] < N_) {
    problem("order", r, i, fmt::format("REDUCE_GRAD of stage {}: expected after its {} backward passes, found after {}",
                                       ins.stage, N_, done_bwd_stage_[ins.stage]));
  }
  return true;
}

bool DryRun::on_opt_step(std::size_t r, std::size_t i, const Instruction&) {
  if (stepped_[r]++) problem("count", r, i, "OPT_STEP: expected at most once, found again");
  for (std::size_t v = 0; v < V_; ++v) {
    if (p_.stage_rank[v] != r) continue;
    if (done_bwd_stage_[v] < N_) {
      problem("order", r, i, fmt::format("OPT_STEP: expected after the {} backward passes of stage {}, found after {}", N_, v,
                                         done_bwd_stage_[v]));
    }
    if (has_reduce_[r] && !reduced_[v]) problem("order", r, i, fmt::format("OPT_STEP: expected after REDUCE_GRAD of stage {}", v));
  }
  return true;
}

// A collective of the first and the last stage's ranks: it completes when both have reached it.
bool DryRun::on_reduce_tied(std::size_t r, std::size_t i, const Instruction& ins) {
  if (!tied_reached_[r]) {
    tied_reached_[r] = 1;
    if (ins.stage < V_ && done_bwd_stage_[ins.stage] < N_) {
      problem("order", r, i, fmt::format("REDUCE_TIED of stage {}: expected after its {} backward passes, found after {}",
                                         ins.stage, N_, done_bwd_stage_[ins.stage]));
    }
  }
  const std::size_t first = p_.stage_rank.front(), last = p_.stage_rank.back();
  const std::size_t partner = r == first ? last : first;
  if (partner < S_ && partner != r && !tied_reached_[partner]) {
    blocked_channel_[r] = -2;  // waits for the partner's REDUCE_TIED
    return false;
  }
  return true;
}

bool DryRun::execute(std::size_t r, std::size_t i, const Instruction& ins) {
  switch (ins.op) {
    case Opcode::IterBegin:
    case Opcode::IterEnd: return on_marker(r, i, ins);
    case Opcode::LoadMb: return on_load(r, i, ins);
    case Opcode::Forward: return on_forward(r, i, ins);
    case Opcode::Backward:
    case Opcode::BackwardInput: return on_backward(r, i, ins);
    case Opcode::BackwardWeight: return on_backward_weight(r, i, ins);
    case Opcode::SendActStart:
    case Opcode::SendGradStart: return on_send_start(r, i, ins);
    case Opcode::RecvActStart:
    case Opcode::RecvGradStart: return on_recv_start(r, i, ins);
    case Opcode::RecvActWait:
    case Opcode::RecvGradWait: return on_recv_wait(r, i, ins);
    case Opcode::SendActWait:
    case Opcode::SendGradWait: return on_send_wait(r, i, ins);
    case Opcode::FreeBuf: return on_free(r, i, ins);
    case Opcode::ReduceGrad: return on_reduce(r, i, ins);
    case Opcode::OptStep: return on_opt_step(r, i, ins);
    case Opcode::ReduceTied: return on_reduce_tied(r, i, ins);
  }
  return true;
}

bool DryRun::run() {
  bool progress = true;
  while (progress && !stopped_) {
    progress = false;
    for (std::size_t r = 0; r < S_; ++r) {
      const auto& st = p_.streams[r];
      while (pc_[r] < st.size() && !stopped_) {
        const std::size_t i = pc_[r];
        if (skip_ == nullptr || !(*skip_)[r][i]) {
          if (!execute(r, i, st[i])) break;
        }
        blocked_channel_[r] = -1;
        ++pc_[r];
        progress = true;
      }
    }
  }
  if (stopped_) return false;
  report_unfinished();
  for (std::size_t r = 0; r < S_; ++r) {
    if (pc_[r] < p_.streams[r].size()) return false;
  }
  return true;
}

// Ranks stuck forever, with the wait they block on; buffers never freed.
void DryRun::report_unfinished() {
  for (std::size_t r = 0; r < S_; ++r) {
    const auto R = static_cast<std::int64_t>(r);
    if (pc_[r] < p_.streams[r].size()) {
      const std::int64_t ch = blocked_channel_[r];
      std::string why = "blocked";
      if (ch == -2) {
        const std::size_t partner = r == p_.stage_rank.front() ? p_.stage_rank.back() : p_.stage_rank.front();
        why = fmt::format("blocked in REDUCE_TIED waiting for rank {}, which never reaches its REDUCE_TIED", partner);
      } else if (ch >= 0) {
        const ChannelState& c = channels_[ch];
        const bool recv = c.dst == R;
        const std::int64_t other = recv ? c.src : c.dst;
        why = fmt::format("blocked waiting for rank {} to post {} #{} on the {} channel rank {} -> rank {} ({} posted); rank "
                          "{} is {}", other, recv ? "send" : "receive", blocked_k_[r], c.dir == 0 ? "activation" : "gradient",
                          c.src, c.dst, recv ? c.sends_posted : c.recvs_posted, other,
                          pc_[other] < p_.streams[other].size()
                              ? fmt::format("at instruction {} ({})", pc_[other], to_string(p_.streams[other][pc_[other]]))
                              : std::string("finished"));
      }
      problem("deadlock", r, pc_[r], fmt::format("deadlock: {} ({})", why, to_string(p_.streams[r][pc_[r]])));
      continue;
    }
    for (std::size_t b = 0; b < slots_[r].size(); ++b) {
      const SlotState& s = slots_[r][b];
      if (s.live) {
        problem("buffer", r, static_cast<std::size_t>(s.alloc_index),
                fmt::format("b{} holding the {} is never freed", b, describe_content(s.content, s.mb, s.stage)));
      }
    }
  }
}

}  // namespace packpipe::plan
