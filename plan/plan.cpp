#include "plan/plan.h"

#include <tuple>

#include <fmt/format.h>

#include "common/errors.h"

namespace packpipe::plan {

std::uint32_t dtype_size(Dtype d) {
  switch (d) {
    case Dtype::F16: return 2;
    case Dtype::BF16: return 2;
    case Dtype::F32: return 4;
    case Dtype::I32: return 4;
    case Dtype::I64: return 8;
    case Dtype::F64: return 8;
  }
  return 0;
}

std::uint64_t TensorShape::bytes() const {
  return static_cast<std::uint64_t>(rows) * (static_cast<std::uint64_t>(seq) + enc_seq) * hidden * dtype_size(dtype);
}

bool TensorShape::operator<(const TensorShape& o) const {
  return std::make_tuple(rows, seq, hidden, enc_seq, static_cast<int>(dtype)) <
         std::make_tuple(o.rows, o.seq, o.hidden, o.enc_seq, static_cast<int>(o.dtype));
}

std::string to_string(const TensorShape& s) {
  std::string out = fmt::format("{}x{}x{} {}", s.rows, s.seq, s.hidden, dtype_name(s.dtype));
  if (s.enc_seq > 0) out += fmt::format(" (+ enc {}x{})", s.rows, s.enc_seq);
  return out;
}

const std::vector<DatasetTask>& DatasetIdentity::task_list() const {
  static const std::vector<DatasetTask> none;
  return tasks != nullptr ? *tasks : none;
}

bool PlanMicroBatch::operator==(const PlanMicroBatch& o) const {
  return samples == o.samples && refs == o.refs && row_offsets == o.row_offsets && layout == o.layout && rows == o.rows &&
         padded_len == o.padded_len && padded_dec_len == o.padded_dec_len && tokens == o.tokens &&
         loss_weight == o.loss_weight && lengths == o.lengths && target_lengths == o.target_lengths &&
         loss_tokens == o.loss_tokens && prefix == o.prefix && prev == o.prev;
}

bool Plan::has_slices() const {
  for (const auto& mb : microbatches) {
    if (mb.has_slices()) return true;
  }
  return false;
}

SliceLinks slice_links(const Plan& plan) {
  SliceLinks l;
  const std::size_t n = plan.microbatches.size();
  l.prev.resize(n);
  l.next.resize(n);
  for (std::size_t m = 0; m < n; ++m) {
    l.prev[m].assign(plan.microbatches[m].samples.size(), EntryRef{});
    l.next[m].assign(plan.microbatches[m].samples.size(), EntryRef{});
  }
  for (std::size_t m = 0; m < n; ++m) {
    const PlanMicroBatch& mb = plan.microbatches[m];
    if (!mb.has_slices() || mb.prev.size() != mb.samples.size()) continue;
    for (std::size_t i = 0; i < mb.samples.size(); ++i) {
      const std::uint32_t p = mb.prev[i];
      if (p == kNoSlice || p >= n || p == m) continue;
      const auto& ps = plan.microbatches[p].samples;
      for (std::size_t k = 0; k < ps.size(); ++k) {
        if (ps[k] != mb.samples[i]) continue;
        if (!l.next[p][k].valid()) {
          l.prev[m][i] = EntryRef{p, static_cast<std::uint32_t>(k)};
          l.next[p][k] = EntryRef{static_cast<std::uint32_t>(m), static_cast<std::uint32_t>(i)};
        }
        break;
      }
    }
  }
  return l;
}

std::size_t Plan::instruction_count() const {
  std::size_t n = 0;
  for (const auto& s : streams) n += s.size();
  return n;
}

namespace {
bool same_ops(const std::vector<std::vector<ScheduledOp>>& a, const std::vector<std::vector<ScheduledOp>>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t r = 0; r < a.size(); ++r) {
    if (a[r].size() != b[r].size()) return false;
    for (std::size_t i = 0; i < a[r].size(); ++i) {
      const auto &x = a[r][i], &y = b[r][i];
      if (x.kind != y.kind || x.mb != y.mb || x.vstage != y.vstage || x.start_ms != y.start_ms || x.end_ms != y.end_ms)
        return false;
    }
  }
  return true;
}
}  // namespace

bool Plan::operator==(const Plan& o) const {
  return iteration == o.iteration && ranks == o.ranks && vstages == o.vstages && stage_rank == o.stage_rank &&
         dp == o.dp && replica == o.replica && schedule == o.schedule && global_tokens == o.global_tokens && microbatches == o.microbatches &&
         recompute == o.recompute && stored_bytes == o.stored_bytes && peak_bytes == o.peak_bytes &&
         static_bytes == o.static_bytes && memory_limit_bytes == o.memory_limit_bytes && shapes == o.shapes &&
         buffer_slots == o.buffer_slots && streams == o.streams && makespan_ms == o.makespan_ms &&
         same_ops(timeline, o.timeline) && stages == o.stages && dtype == o.dtype && loss_mode == o.loss_mode &&
         global_loss_tokens == o.global_loss_tokens && tied_embedding == o.tied_embedding &&
         rank_layout == o.rank_layout && max_seq_len == o.max_seq_len && max_target_len == o.max_target_len &&
         dataset.fingerprint == o.dataset.fingerprint;
}

}  // namespace packpipe::plan
