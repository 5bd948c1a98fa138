#include "schedule/schedules.h"

#include <algorithm>
#include <functional>
#include <limits>
#include <queue>

#include "common/errors.h"
#include "schedule/detail/order_builder.h"

namespace packpipe::schedule {

namespace pl = ::packpipe::plan;

namespace {

pl::ScheduledOp make_op(pl::OpKind k, std::uint32_t mb, std::int64_t v) {
  pl::ScheduledOp op;
  op.kind = k;
  op.mb = mb;
  op.vstage = static_cast<std::uint32_t>(v);
  return op;
}

void reset(RankOrder& out, std::size_t S, bool cycles) {
  out.ops.resize(S);
  for (auto& r : out.ops) r.clear();
  if (cycles) {
    out.cycle.resize(S);
    for (auto& r : out.cycle) r.clear();
  } else {
    out.cycle.clear();
  }
}

void build_gpipe(const SimProblem& p, const std::vector<std::uint32_t>& order, const std::vector<std::uint32_t>& back,
                 RankOrder& out) {
  const std::int64_t S = p.ranks, c = p.vstages() / p.ranks;
  for (std::int64_t r = 0; r < S; ++r) {
    auto& ops = out.ops[static_cast<std::size_t>(r)];
    for (std::int64_t k = 0; k < c; ++k) {
      for (std::uint32_t mb : order) ops.push_back(make_op(pl::OpKind::Forward, mb, k * S + r));
    }
    for (std::int64_t k = c - 1; k >= 0; --k) {
      for (std::uint32_t mb : back) ops.push_back(make_op(pl::OpKind::Backward, mb, k * S + r));
    }
  }
}

// Megatron's 1F1B: min(S - r - 1, m) warm-up forwards, then a forward and a backward, then the
// remaining backwards. Backwards follow `back` (the backward sequence: the order without slices);
// with slices each backward comes after one more forward and the forwards up to w past it (Seq1F1B:
// a sample's slices all go forward, and the warm-up's count after them, before its last slice goes
// back; then one forward per backward).
void build_1f1b(const SimProblem& p, const std::vector<std::uint32_t>& order, const std::vector<std::uint32_t>& back,
                std::vector<std::int64_t>& pos, RankOrder& out) {
  const std::int64_t S = p.ranks, m = p.microbatches();
  const bool slices = p.has_slices();
  if (slices) {
    pos.assign(static_cast<std::size_t>(m), 0);
    for (std::int64_t k = 0; k < m; ++k) pos[order[static_cast<std::size_t>(k)]] = k;
  }
  for (std::int64_t r = 0; r < S; ++r) {
    auto& ops = out.ops[static_cast<std::size_t>(r)];
    const std::int64_t w = warmup_forwards(ScheduleKind::OneFOneB, S, r, 1, m, 0);
    if (!slices) {
      for (std::int64_t k = 0; k < w; ++k) ops.push_back(make_op(pl::OpKind::Forward, order[k], r));
      for (std::int64_t k = 0; k < m - w; ++k) {
        ops.push_back(make_op(pl::OpKind::Forward, order[w + k], r));
        ops.push_back(make_op(pl::OpKind::Backward, order[k], r));
      }
      for (std::int64_t k = m - w; k < m; ++k) ops.push_back(make_op(pl::OpKind::Backward, order[k], r));
      continue;
    }
    // Before each backward, one more forward and every forward up to w past its micro-batch: 1F1B
    // itself without slices (B(k) after F(k + w)); with them, a sample's slices all go forward and
    // w more while its last slice's gradient comes back, then one forward per backward as ever.
    std::int64_t f = 0;
    for (std::int64_t b = 0; b < m; ++b) {
      const std::uint32_t mb = back[static_cast<std::size_t>(b)];
      const std::int64_t until = std::min(m - 1, std::max(pos[mb] + w, f));
      while (f <= until) {
        ops.push_back(make_op(pl::OpKind::Forward, order[static_cast<std::size_t>(f)], r));
        ++f;
      }
      ops.push_back(make_op(pl::OpKind::Backward, mb, r));
    }
  }
}

void build_interleaved(const SimProblem& p, const std::vector<std::uint32_t>& order, std::int64_t group,
                       RankOrder& out) {
  const std::int64_t S = p.ranks, c = p.vstages() / p.ranks, m = p.microbatches();
  const auto table = interleaved_table(m, c, group);
  const std::int64_t total = m * c;
  for (std::int64_t r = 0; r < S; ++r) {
    auto& ops = out.ops[static_cast<std::size_t>(r)];
    const std::int64_t w = warmup_forwards(ScheduleKind::Interleaved1F1B, S, r, c, m, group);
    auto fwd = [&](std::int64_t k) {
      const auto& e = table[static_cast<std::size_t>(k)];
      ops.push_back(make_op(pl::OpKind::Forward, order[e.first], static_cast<std::int64_t>(e.second) * S + r));
    };
    auto bwd = [&](std::int64_t k) {
      const auto& e = table[static_cast<std::size_t>(k)];
      ops.push_back(make_op(pl::OpKind::Backward, order[e.first], (c - 1 - static_cast<std::int64_t>(e.second)) * S + r));
    };
    for (std::int64_t k = 0; k < w; ++k) fwd(k);
    for (std::int64_t k = 0; k < total - w; ++k) {
      fwd(w + k);
      bwd(k);
    }
    for (std::int64_t k = total - w; k < total; ++k) bwd(k);
  }
}

}  // namespace

namespace detail {

OrderBuilder::OrderBuilder(const SimProblem& problem)
    : p_(problem), S_(problem.ranks), V_(problem.vstages()), m_(problem.microbatches()), c_(V_ / S_) {
  const StageCostTable& t = p_.costs;
  const auto Su = static_cast<std::size_t>(S_);
  mb_stored_.assign(static_cast<std::size_t>(m_) * Su, 0.0);
  mb_peak_.assign(static_cast<std::size_t>(m_) * Su, 0.0);
  rank_work_.assign(Su, 0.0);
  for (std::int64_t mb = 0; mb < m_; ++mb) {
    for (std::int64_t v = 0; v < V_; ++v) {
      const std::size_t i = t.at(mb, v), k = static_cast<std::size_t>(mb) * Su + static_cast<std::size_t>(v % S_);
      mb_stored_[k] += t.stored_bytes[i];
      mb_peak_[k] = std::max(mb_peak_[k], t.peak_bytes[i]);
      const double f = t.op_ms(pl::OpKind::Forward, i), in = t.op_ms(pl::OpKind::BackwardInput, i),
                   w = t.op_ms(pl::OpKind::BackwardWeight, i);
      rank_work_[static_cast<std::size_t>(v % S_)] += f + in + w;
      if (!(f > 0) || !(in > 0) || !(w > 0)) exact_ = false;
    }
  }
  if (p_.has_slices()) {
    slice_prev_.assign(static_cast<std::size_t>(m_), {});
    slice_next_.assign(static_cast<std::size_t>(m_), {});
    for (const auto& [a, b] : p_.slice_edges) {
      PACKPIPE_CHECK_ARG(a < m_ && b < m_ && a != b, "slice edge ({}, {}): expected two micro-batches below {}", a, b, m_);
      slice_next_[a].push_back(b);
      slice_prev_[b].push_back(a);
    }
  }
  // Zero-bubble admission caps: 1F1B's in-flight count S - r; interleaved: Megatron's warm-up + 1
  // over c.
  cap_.resize(Su);
  for (std::size_t r = 0; r < Su; ++r) {
    const auto rr = static_cast<std::int64_t>(r);
    cap_[r] = c_ == 1 ? S_ - rr : std::max<std::int64_t>(1, (2 * (S_ - rr - 1) + (c_ - 1) * S_ + c_) / c_);
  }
}

void OrderBuilder::check(ScheduleKind kind, const std::vector<std::uint32_t>& order) {
  std::string why;
  PACKPIPE_CHECK_ARG(schedule_supports(kind, p_, &why), "{}", why);
  const auto m = static_cast<std::size_t>(m_);
  PACKPIPE_CHECK_ARG(order.size() == m, "order must list {} micro-batches, found {}", m, order.size());
  seen_.assign(m, 0);
  for (std::size_t i = 0; i < m; ++i) {
    PACKPIPE_CHECK_ARG(order[i] < m && !seen_[order[i]], "order is not a permutation of 0..{}: entry {} is {}", m - 1,
                       i, order[i]);
    seen_[order[i]] = 1;
  }
  PACKPIPE_CHECK_ARG(!p_.has_slices() || respects_slices(p_, order),
                     "order puts a micro-batch before the one holding the previous slice of one of its samples (slices "
                     "go forward in order; slice_order repairs an order)");
}

void OrderBuilder::reset_emitted() {
  if (!p_.has_slices()) return;
  f_emitted_.assign(static_cast<std::size_t>(m_ * V_), 0);
  b_emitted_.assign(static_cast<std::size_t>(m_ * V_), 0);
}

bool OrderBuilder::forward_free(std::uint32_t mb, std::int64_t v) const {
  if (slice_prev_.empty()) return true;
  for (const std::uint32_t a : slice_prev_[mb]) {
    if (!f_emitted_[static_cast<std::size_t>(a) * static_cast<std::size_t>(V_) + static_cast<std::size_t>(v)]) return false;
  }
  return true;
}

bool OrderBuilder::backward_free(std::uint32_t mb, std::int64_t v) const {
  if (slice_next_.empty()) return true;
  for (const std::uint32_t b : slice_next_[mb]) {
    if (!b_emitted_[static_cast<std::size_t>(b) * static_cast<std::size_t>(V_) + static_cast<std::size_t>(v)]) return false;
  }
  return true;
}

void OrderBuilder::build(ScheduleKind kind, const std::vector<std::uint32_t>& order, const ScheduleOptions& options,
                         RankOrder& out) {
  check(kind, order);
  reset_emitted();
  const auto Su = static_cast<std::size_t>(S_);
  reset(out, Su, kind == ScheduleKind::Cyclic || kind == ScheduleKind::WaitFreeCyclic);
  const std::vector<std::uint32_t>& back = p_.has_slices() ? (back_ = backward_sequence(p_, order)) : order;
  switch (kind) {
    case ScheduleKind::GPipe: build_gpipe(p_, order, back, out); break;
    case ScheduleKind::OneFOneB: build_1f1b(p_, order, back, pos_, out); break;
    case ScheduleKind::Interleaved1F1B: {
      const std::int64_t g = options.group_size > 0 ? options.group_size : S_;
      PACKPIPE_CHECK_ARG(g >= S_ && m_ % g == 0,
                         "interleaved-1f1b group size {} must be at least {} ranks and divide {} micro-batches", g, S_,
                         m_);
      build_interleaved(p_, order, g, out);
      break;
    }
    case ScheduleKind::Cyclic:
    case ScheduleKind::WaitFreeCyclic:
      build_cyclic(order, options, out);
      if (kind == ScheduleKind::WaitFreeCyclic) out.cycle.clear();
      break;
    case ScheduleKind::ZeroBubble: {
      std::vector<double> peak;
      zero_bubble(order, options, out, peak);
      break;
    }
  }
}

// DynaPipe's cyclic order: synchronous cycles; in each cycle every rank runs, for each of its
// virtual stages in ascending order, the head backward then the head forward of that stage's ready
// queues (queues ordered by micro-batch position). An op becomes ready in the cycle after its
// input was produced. New micro-batches enter stage 0 only while every rank's memory bound (static
// + stored of the micro-batches in flight there + the newcomer's + the largest transient peak)
// stays within the limit, and while fewer than max_in_flight are in flight.
void OrderBuilder::build_cyclic(const std::vector<std::uint32_t>& order, const ScheduleOptions& opt, RankOrder& out) {
  const std::int64_t S = S_, V = V_, m = m_;
  const auto Su = static_cast<std::size_t>(S);
  const StageCostTable& t = p_.costs;
  // Ready queues per virtual stage and direction, entries are micro-batch positions; kept sorted
  // descending so the head (smallest position) is back().
  fq_.resize(static_cast<std::size_t>(V));
  bq_.resize(static_cast<std::size_t>(V));
  for (auto& q : fq_) q.clear();
  for (auto& q : bq_) q.clear();
  auto push_sorted = [](std::vector<std::uint32_t>& q, std::uint32_t pos) {
    q.insert(std::upper_bound(q.begin(), q.end(), pos, std::greater<std::uint32_t>()), pos);
  };
  // Per-rank memory bound of the micro-batches in flight.
  stored_sum_.assign(Su, 0.0);
  peak_max_.assign(Su, 0.0);
  const bool mem = opt.memory_aware && p_.memory_limit_bytes > 0;
  std::int64_t injected = 0, in_flight = 0, finished = 0;
  const std::int64_t total_ops = 2 * m * V;
  std::int64_t done = 0;
  auto can_inject = [&]() {
    if (injected >= m) return false;
    if (in_flight == 0) return true;
    if (opt.max_in_flight > 0 && in_flight >= opt.max_in_flight) return false;
    if (!mem) return true;
    const std::size_t base = static_cast<std::size_t>(order[static_cast<std::size_t>(injected)]) * Su;
    for (std::size_t r = 0; r < Su; ++r) {
      const double bound =
          t.static_bytes[r] + stored_sum_[r] + mb_stored_[base + r] + std::max(peak_max_[r], mb_peak_[base + r]);
      if (bound > p_.memory_limit_bytes) return false;
    }
    return true;
  };
  auto inject = [&]() {
    const std::uint32_t mb = order[static_cast<std::size_t>(injected)];
    for (std::int64_t v = 0; v < V; ++v) {
      const std::size_t i = t.at(mb, v), r = static_cast<std::size_t>(v % S);
      stored_sum_[r] += t.stored_bytes[i];
      peak_max_[r] = std::max(peak_max_[r], t.peak_bytes[i]);
    }
    push_sorted(fq_[0], static_cast<std::uint32_t>(injected));
    ++injected;
    ++in_flight;
  };
  const bool slices = p_.has_slices();
  std::uint32_t cycle = 0;
  while (done < total_ops) {
    if (fq_[0].empty() && can_inject()) inject();
    produced_.clear();
    for (std::int64_t r = 0; r < S; ++r) {
      auto& ops = out.ops[static_cast<std::size_t>(r)];
      auto& cyc = out.cycle[static_cast<std::size_t>(r)];
      for (std::int64_t v = r; v < V; v += S) {
        // The head of each queue (smallest position) or, with slices, the first free one.
        auto take = [&](std::vector<std::uint32_t>& q, bool forward) -> std::int64_t {
          for (std::size_t k = q.size(); k-- > 0;) {
            const std::uint32_t pos = q[k];
            if (slices && !(forward ? forward_free(order[pos], v) : backward_free(order[pos], v))) continue;
            q.erase(q.begin() + static_cast<std::ptrdiff_t>(k));
            return pos;
          }
          return -1;
        };
        const std::int64_t bpos = take(bq_[static_cast<std::size_t>(v)], false);
        if (bpos >= 0) {
          const auto pos = static_cast<std::uint32_t>(bpos);
          ops.push_back(make_op(pl::OpKind::Backward, order[pos], v));
          cyc.push_back(cycle);
          produced_.push_back({1, pos, v});
        }
        const std::int64_t fpos = take(fq_[static_cast<std::size_t>(v)], true);
        if (fpos >= 0) {
          const auto pos = static_cast<std::uint32_t>(fpos);
          ops.push_back(make_op(pl::OpKind::Forward, order[pos], v));
          cyc.push_back(cycle);
          produced_.push_back({0, pos, v});
        }
      }
    }
    if (produced_.empty()) {
      // Slices: every queued op waits for a slice that has not entered yet (held back by the
      // memory rule); let the next micro-batch in.
      PACKPIPE_ASSERT(slices && injected < m);
      inject();
      continue;
    }
    for (const auto& e : produced_) {
      const std::size_t at = static_cast<std::size_t>(order[e.pos]) * static_cast<std::size_t>(V) +
                             static_cast<std::size_t>(e.v);
      if (slices) (e.backward ? b_emitted_ : f_emitted_)[at] = 1;
    }
    for (const auto& e : produced_) {
      const std::uint32_t pos = e.pos;
      const std::int64_t v = e.v;
      ++done;
      if (e.backward == 0) {
        if (v + 1 < V) {
          push_sorted(fq_[static_cast<std::size_t>(v + 1)], pos);
        } else {
          push_sorted(bq_[static_cast<std::size_t>(v)], pos);
        }
      } else {
        const std::size_t i = t.at(order[pos], v);
        stored_sum_[static_cast<std::size_t>(v % S)] -= t.stored_bytes[i];
        if (v > 0) {
          push_sorted(bq_[static_cast<std::size_t>(v - 1)], pos);
        } else {
          --in_flight;
          ++finished;
        }
      }
    }
    ++cycle;
  }
  PACKPIPE_ASSERT(finished == m);
}

// ZB-H1-like greedy: time-driven list scheduling. A free rank runs, in priority order, a ready
// input-gradient op (I, it unblocks the previous stage), else a ready forward, else the oldest
// deferred weight-gradient op (W) to fill what would be a bubble. A micro-batch is admitted to a
// rank at its first-chunk forward only while fewer than `cap` admitted micro-batches still hold
// activations there (cap = S - rank, 1F1B's in-flight count; interleaved: Megatron's warm-up + 1
// over c) and, with a memory limit, while the rank's reservation (static + stored of every chunk
// of the admitted micro-batches + the largest transient peak among them) fits; later chunks of
// admitted micro-batches are always allowed (no deadlock). Activations are released at W.
//
// Events: completions (processed in (time, rank) order, as the simulator does, so transfers queue
// on the send and receive streams in the same order) and decisions of an idle rank (after every
// completion of the same instant). A rank keeps at most one pending decision: a request at or
// after a pending one is redundant (that decision either starts an op, whose completion asks
// again, or leaves the rank idle and asks again at the next known arrival).
double OrderBuilder::zero_bubble(const std::vector<std::uint32_t>& order, const ScheduleOptions& opt, RankOrder& out,
                                 std::vector<double>& peak_bytes, double abort_above_ms, bool abort_on_memory) {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  const std::int64_t S = S_, V = V_, m = m_, c = c_;
  const StageCostTable& t = p_.costs;
  const auto Su = static_cast<std::size_t>(S);
  reset(out, Su, false);
  reset_emitted();
  open_.assign(Su, 0);
  fcand_.resize(Su);
  fcand_later_.resize(Su);
  icand_.resize(Su);
  wq_.resize(Su);
  for (std::size_t r = 0; r < Su; ++r) {
    fcand_[r].clear();
    fcand_later_[r].clear();
    icand_[r].clear();
    wq_[r].clear();
  }
  whead_.assign(Su, 0);
  send_free_.assign(Su, 0.0);
  recv_free_.assign(Su, 0.0);
  holding_.assign(Su, 0);
  max_peak_.assign(Su, 0.0);
  decide_at_.assign(Su, kInf);
  busy_.assign(Su, 0);
  running_.resize(Su);
  w_left_.assign(static_cast<std::size_t>(m) * Su, c);
  mem_.assign(t.static_bytes.begin(), t.static_bytes.end());
  reserved_.assign(t.static_bytes.begin(), t.static_bytes.end());
  peak_bytes.assign(t.static_bytes.begin(), t.static_bytes.end());
  done_at_.assign(Su, kInf);
  left_.assign(rank_work_.begin(), rank_work_.end());
  // Early exit: a rank with `left` work not yet started at time `now` ends no earlier than
  // now + left (its ops run one at a time); the margin covers the rounding of the running sums.
  const double abort_at = abort_above_ms * (1 + 1e-9);
  const double limit = p_.memory_limit_bytes;
  const bool memcap = opt.memory_aware && limit > 0;
  const bool memabort = abort_on_memory && limit > 0;
  std::int64_t next_inject = 0;  // only rank 0 injects, at v = 0
  double makespan = 0;
  bool over_memory = false;

  auto request = [&](std::size_t r, double time) { decide_at_[r] = std::min(decide_at_[r], time); };
  auto deliver = [&](std::size_t from, std::size_t to, double now, double xfer) {
    if (from == to) return now;
    const double s = std::max(now, std::max(send_free_[from], recv_free_[to]));
    send_free_[from] = recv_free_[to] = s + xfer;
    return s + xfer;
  };
  // Same arithmetic as Simulator::run: duration, end = start + duration, memory while running.
  auto start = [&](std::size_t r, double now, pl::OpKind k, std::uint32_t pos, std::uint32_t v) {
    const std::uint32_t mb = order[pos];
    const std::size_t i = t.at(mb, v);
    const double dur = t.op_ms(k, i);
    if (k == pl::OpKind::Forward && !f_emitted_.empty()) f_emitted_[i] = 1;
    if (k == pl::OpKind::BackwardInput && !b_emitted_.empty()) b_emitted_[i] = 1;
    double during = mem_[r] + t.peak_bytes[i];
    if (k == pl::OpKind::Forward) {
      during += t.stored_bytes[i];
      if (static_cast<std::int64_t>(v) < S) {  // admission on the rank's first chunk
        if (!slice_prev_.empty()) {
          open_[r] += static_cast<std::int64_t>(slice_next_[mb].size()) - static_cast<std::int64_t>(slice_prev_[mb].size());
        }
        const std::size_t key = static_cast<std::size_t>(mb) * Su + r;
        ++holding_[r];
        reserved_[r] += mb_stored_[key];
        max_peak_[r] = std::max(max_peak_[r], mb_peak_[key]);
      }
    }
    left_[r] -= dur;
    peak_bytes[r] = std::max(peak_bytes[r], during);
    if (memabort && peak_bytes[r] > limit) over_memory = true;
    // Fields written in place (a stack temporary copied whole stalls store forwarding).
    pl::ScheduledOp& op = out.ops[r].emplace_back();
    op.kind = k;
    op.mb = mb;
    op.vstage = v;
    op.start_ms = now;
    op.end_ms = now + dur;
    busy_[r] = 1;
    Running& run = running_[r];
    run.kind = k;
    run.pos = pos;
    run.v = v;
    done_at_[r] = op.end_ms;
  };
  auto admissible = [&](std::size_t r, std::uint32_t pos, std::uint32_t v) {
    if (static_cast<std::int64_t>(v) >= S) return true;  // a later chunk of an admitted micro-batch
    // While a slice on this rank waits for its next slice (its activations stay until that one has
    // gone back), anything is admitted: holding the next slice, or a micro-batch before it, back
    // would deadlock.
    if (!slice_prev_.empty() && open_[r] > 0) return true;
    if (holding_[r] == 0) return true;
    if (holding_[r] >= cap_[r]) return false;
    if (!memcap) return true;
    const std::size_t k = static_cast<std::size_t>(order[pos]) * Su + r;
    return reserved_[r] + mb_stored_[k] + std::max(max_peak_[r], mb_peak_[k]) <= limit;
  };
  // Candidate lists are kept sorted by priority, so a decision takes the first ready (and, for
  // forwards, admissible) entry: input gradients by (position, last virtual stage first), forwards
  // by (position, first virtual stage first), split into first-chunk forwards (subject to
  // admission) and later chunks (always admissible).
  auto i_before = [](const Cand& a, const Cand& b) { return a.pos < b.pos || (a.pos == b.pos && a.v > b.v); };
  auto f_before = [](const Cand& a, const Cand& b) { return a.pos < b.pos || (a.pos == b.pos && a.v < b.v); };
  const bool slices = p_.has_slices();
  auto first_ready = [&](const std::vector<Cand>& l, double now, bool forward) {
    std::size_t k = 0;
    while (k < l.size() &&
           (l[k].arrive > now || (slices && !(forward ? forward_free(order[l[k].pos], l[k].v)
                                                      : backward_free(order[l[k].pos], l[k].v))))) {
      ++k;
    }
    return k;
  };
  auto take = [](std::vector<Cand>& l, std::size_t k) {
    const Cand cd = l[k];
    l.erase(l.begin() + static_cast<std::ptrdiff_t>(k));
    return cd;
  };
  auto decide = [&](std::size_t r, double now) {
    if (busy_[r]) return;
    // 1. a ready input-gradient op
    auto& ic = icand_[r];
    const std::size_t bi = first_ready(ic, now, false);
    if (bi < ic.size()) {
      const Cand cd = take(ic, bi);
      start(r, now, pl::OpKind::BackwardInput, cd.pos, cd.v);
      return;
    }
    // 2. a ready forward within the caps: the later-chunk head, or the first admissible first-chunk
    // forward before it; rank 0 injects the next micro-batch when it comes first.
    auto& f1 = fcand_later_[r];
    auto& f0 = fcand_[r];
    const std::size_t b1 = first_ready(f1, now, true);
    std::size_t b0 = f0.size();
    const bool admit = holding_[r] == 0 || holding_[r] < cap_[r];
    if (admit || slices) {  // a later slice is admitted over the cap (admissible)
      for (std::size_t k = 0; k < f0.size(); ++k) {
        if (b1 < f1.size() && !f_before(f0[k], f1[b1])) break;
        if (f0[k].arrive <= now && admissible(r, f0[k].pos, f0[k].v) &&
            (!slices || forward_free(order[f0[k].pos], f0[k].v))) {
          b0 = k;
          break;
        }
      }
    }
    const Cand* best = b0 < f0.size() ? &f0[b0] : (b1 < f1.size() ? &f1[b1] : nullptr);
    const bool inject = r == 0 && next_inject < m &&
                        (best == nullptr || static_cast<std::uint32_t>(next_inject) < best->pos) &&
                        admissible(0, static_cast<std::uint32_t>(next_inject), 0);
    if (inject) {
      start(r, now, pl::OpKind::Forward, static_cast<std::uint32_t>(next_inject++), 0);
      return;
    }
    if (best != nullptr) {
      const Cand cd = b0 < f0.size() ? take(f0, b0) : take(f1, b1);
      start(r, now, pl::OpKind::Forward, cd.pos, cd.v);
      return;
    }
    // 3. a deferred weight-gradient op
    if (whead_[r] < wq_[r].size()) {
      const auto w = wq_[r][whead_[r]++];
      start(r, now, pl::OpKind::BackwardWeight, w.first, w.second);
      return;
    }
    // Idle: wake up at the next arrival already known (later ones ask when they are sent).
    double wake = kInf;
    for (const auto* l : {&f0, &f1, &ic}) {
      for (const auto& cd : *l) {
        if (cd.arrive > now) wake = std::min(wake, cd.arrive);
      }
    }
    if (wake < kInf) request(r, wake);
  };
  auto insert = [](std::vector<Cand>& l, const Cand& cd, auto before) {
    l.insert(std::upper_bound(l.begin(), l.end(), cd, before), cd);
  };
  for (std::size_t r = 0; r < Su; ++r) request(r, 0.0);
  // The next event: the earliest completion (least rank on ties), else, when strictly earlier, the
  // earliest decision (least rank on ties). Per rank at most one of each is pending, so a scan over
  // the ranks replaces a heap.
  for (;;) {
    if (over_memory) return kInf;
    std::size_t rc = 0, rd = 0;
    double tc = done_at_[0], td = decide_at_[0];
    for (std::size_t q = 1; q < Su; ++q) {  // branch-free minimum (conditional moves)
      const double a = done_at_[q], b = decide_at_[q];
      rc = a < tc ? q : rc;
      tc = a < tc ? a : tc;
      rd = b < td ? q : rd;
      td = b < td ? b : td;
    }
    if (td < tc) {
      const double now = td;
      decide_at_[rd] = kInf;
      if (now + left_[rd] > abort_at) return kInf;
      decide(rd, now);
      continue;
    }
    if (tc == kInf) break;
    const std::size_t r = rc;
    const double now = tc;
    done_at_[r] = kInf;
    if (now > abort_above_ms || now + left_[r] > abort_at) return kInf;
    makespan = now;
    const Running& run = running_[r];  // (read in place: nothing below starts an op on r)
    busy_[r] = 0;
    const std::size_t i = t.at(order[run.pos], run.v);
    if (run.kind == pl::OpKind::Forward) {
      mem_[r] += t.stored_bytes[i];
      if (run.v + 1 == static_cast<std::uint32_t>(V)) {
        insert(icand_[r], Cand{now, run.pos, run.v}, i_before);
      } else {
        const auto to = static_cast<std::size_t>((run.v + 1) % static_cast<std::uint32_t>(S));
        const double a = deliver(r, to, now, p_.transfer_ms[i]);
        const Cand cd{a, run.pos, run.v + 1};
        if (cd.v < static_cast<std::uint32_t>(S)) {
          insert(fcand_[to], cd, f_before);
        } else {
          insert(fcand_later_[to], cd, f_before);
        }
        if (to != r && !busy_[to]) request(to, std::max(a, now));
      }
    } else if (run.kind == pl::OpKind::BackwardInput) {
      wq_[r].push_back({run.pos, run.v});
      if (run.v > 0) {
        const auto to = static_cast<std::size_t>((run.v - 1) % static_cast<std::uint32_t>(S));
        const double a = deliver(r, to, now, p_.transfer_ms[t.at(order[run.pos], run.v - 1)]);
        insert(icand_[to], Cand{a, run.pos, run.v - 1}, i_before);
        if (to != r && !busy_[to]) request(to, std::max(a, now));
      }
    } else {
      mem_[r] -= t.stored_bytes[i];
      reserved_[r] -= t.stored_bytes[i];
      if (--w_left_[static_cast<std::size_t>(order[run.pos]) * Su + r] == 0) --holding_[r];
    }
    request(r, now);
  }
  if (over_memory) return kInf;
  for (std::size_t r = 0; r < Su; ++r) {
    PACKPIPE_ASSERT(whead_[r] == wq_[r].size() && fcand_[r].empty() && fcand_later_[r].empty() && icand_[r].empty());
  }
  PACKPIPE_ASSERT(next_inject == m);
  return makespan;
}

}  // namespace detail

const std::vector<ScheduleKind>& all_schedule_kinds() {
  static const std::vector<ScheduleKind> kinds = [] {
    std::vector<ScheduleKind> v;
    for (const auto& x : kScheduleKindNames) v.push_back(x.value);
    return v;
  }();
  return kinds;
}

bool schedule_runs_slices(ScheduleKind k) { return k != ScheduleKind::Interleaved1F1B; }

bool schedule_supports(ScheduleKind k, const SimProblem& problem, std::string* why) {
  if (!schedule_supports(k, problem.ranks, problem.vstages() / std::max<std::int64_t>(problem.ranks, 1),
                         problem.microbatches(), why)) {
    return false;
  }
  if (!schedule_runs_slices(k) && problem.has_slices()) {
    if (why) {
      *why = fmt::format("interleaved-1f1b is not offered for micro-batches holding slices (its fixed table cannot "
                         "run a slice's backward before the previous slice's); use {}gpipe, cyclic or zero-bubble",
                         problem.vstages() > problem.ranks ? "" : "1f1b, ");
    }
    return false;
  }
  return true;
}

namespace {

// A stable topological sort of micro-batches 0..m-1 under `edges` (before, after), ties by `rank`
// (smaller first). Throws when the edges form a cycle.
std::vector<std::uint32_t> topo_sort(std::int64_t m, const std::vector<std::pair<std::uint32_t, std::uint32_t>>& edges,
                                     bool reversed, const std::vector<std::int64_t>& rank) {
  const auto M = static_cast<std::size_t>(m);
  std::vector<std::int64_t> indeg(M, 0);
  std::vector<std::vector<std::uint32_t>> after(M);
  for (auto [a, b] : edges) {
    PACKPIPE_CHECK_ARG(a < M && b < M && a != b, "slice edge ({}, {}): expected two micro-batches below {}", a, b, m);
    if (reversed) std::swap(a, b);
    after[a].push_back(b);
    ++indeg[b];
  }
  using Item = std::pair<std::int64_t, std::uint32_t>;
  std::priority_queue<Item, std::vector<Item>, std::greater<>> ready;
  for (std::size_t i = 0; i < M; ++i) {
    if (indeg[i] == 0) ready.emplace(rank[i], static_cast<std::uint32_t>(i));
  }
  std::vector<std::uint32_t> out;
  out.reserve(M);
  while (!ready.empty()) {
    const std::uint32_t x = ready.top().second;
    ready.pop();
    out.push_back(x);
    for (const std::uint32_t y : after[x]) {
      if (--indeg[y] == 0) ready.emplace(rank[y], y);
    }
  }
  PACKPIPE_CHECK_ARG(out.size() == M, "the slice edges form a cycle among the micro-batches: no order runs them");
  return out;
}

std::vector<std::int64_t> positions(std::int64_t m, const std::vector<std::uint32_t>& order) {
  PACKPIPE_CHECK_ARG(order.size() == static_cast<std::size_t>(m), "order must list {} micro-batches, found {}", m,
                     order.size());
  std::vector<std::int64_t> pos(static_cast<std::size_t>(m), -1);
  for (std::size_t k = 0; k < order.size(); ++k) {
    PACKPIPE_CHECK_ARG(order[k] < static_cast<std::size_t>(m) && pos[order[k]] < 0,
                       "order is not a permutation of 0..{}: entry {} is {}", m - 1, k, order[k]);
    pos[order[k]] = static_cast<std::int64_t>(k);
  }
  return pos;
}

}  // namespace

bool respects_slices(const SimProblem& problem, const std::vector<std::uint32_t>& order) {
  if (!problem.has_slices()) return true;
  const std::vector<std::int64_t> pos = positions(problem.microbatches(), order);
  for (const auto& [a, b] : problem.slice_edges) {
    if (a >= pos.size() || b >= pos.size() || pos[a] >= pos[b]) return false;
  }
  return true;
}

std::vector<std::uint32_t> slice_order(const SimProblem& problem, const std::vector<std::uint32_t>& order) {
  if (!problem.has_slices() || respects_slices(problem, order)) return order;
  return topo_sort(problem.microbatches(), problem.slice_edges, false, positions(problem.microbatches(), order));
}

std::vector<std::uint32_t> backward_sequence(const SimProblem& problem, const std::vector<std::uint32_t>& order) {
  if (!problem.has_slices()) return order;
  return topo_sort(problem.microbatches(), problem.slice_edges, true, positions(problem.microbatches(), order));
}

bool schedule_supports(ScheduleKind k, std::int64_t ranks, std::int64_t chunks, std::int64_t microbatches,
                       std::string* why) {
  auto no = [&](std::string w) {
    if (why) *why = std::move(w);
    return false;
  };
  if (ranks < 1 || chunks < 1 || microbatches < 1) return no("ranks, chunks and micro-batches must be positive");
  if (k == ScheduleKind::OneFOneB && chunks != 1) {
    return no(fmt::format("1f1b needs one virtual stage per rank (chunks 1, found {}); use interleaved-1f1b", chunks));
  }
  if (k == ScheduleKind::Interleaved1F1B) {
    if (chunks < 2) return no("interleaved-1f1b needs chunks > 1; use 1f1b");
    if (microbatches % ranks != 0) {
      return no(fmt::format("interleaved-1f1b needs a multiple of {} micro-batches (Megatron's groups of one per "
                            "rank; a partial last group deadlocks), found {}",
                            ranks, microbatches));
    }
  }
  return true;
}

std::vector<std::pair<std::uint32_t, std::uint32_t>> interleaved_table(std::int64_t microbatches, std::int64_t chunks,
                                                                       std::int64_t group_size) {
  PACKPIPE_CHECK_ARG(group_size >= 1, "interleaved group size must be at least 1, found {}", group_size);
  std::vector<std::pair<std::uint32_t, std::uint32_t>> table;
  table.reserve(static_cast<std::size_t>(microbatches * chunks));
  for (std::int64_t lo = 0; lo < microbatches; lo += group_size) {
    const std::int64_t hi = lo + group_size >= microbatches ? microbatches : lo + group_size;
    for (std::int64_t k = 0; k < chunks; ++k) {
      for (std::int64_t mb = lo; mb < hi; ++mb) {
        table.emplace_back(static_cast<std::uint32_t>(mb), static_cast<std::uint32_t>(k));
      }
    }
  }
  return table;
}

std::int64_t warmup_forwards(ScheduleKind kind, std::int64_t ranks, std::int64_t rank, std::int64_t chunks,
                             std::int64_t microbatches, std::int64_t group_size) {
  if (kind == ScheduleKind::Interleaved1F1B) {
    const std::int64_t total = microbatches * chunks;
    if (microbatches == ranks) return total;
    const std::int64_t g = group_size > 0 ? group_size : ranks;
    return std::min(total, 2 * (ranks - rank - 1) + (chunks - 1) * g);
  }
  return std::min(ranks - rank - 1, microbatches);
}

void build_order(ScheduleKind kind, const SimProblem& problem, const std::vector<std::uint32_t>& order,
                 const ScheduleOptions& options, RankOrder& out) {
  detail::OrderBuilder(problem).build(kind, order, options, out);
}

RankOrder build_order(ScheduleKind kind, const SimProblem& problem, const std::vector<std::uint32_t>& order,
                      const ScheduleOptions& options) {
  RankOrder out;
  build_order(kind, problem, order, options, out);
  return out;
}

pl::Schedule make_schedule(ScheduleKind kind, const SimProblem& problem, std::vector<std::uint32_t> order,
                       const ScheduleOptions& options) {
  if (order.empty()) {
    order.resize(static_cast<std::size_t>(problem.microbatches()));
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = static_cast<std::uint32_t>(i);
  }
  return simulate(problem, build_order(kind, problem, order, options), schedule_kind_name(kind), order);
}

}  // namespace packpipe::schedule
