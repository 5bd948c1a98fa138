#include "scheduler/schedules.h"

#include <algorithm>
#include <functional>
#include <limits>

#include "common/errors.h"

namespace packpipe::scheduler {

namespace {

ScheduledOp make_op(OpKind k, std::uint32_t mb, std::int64_t v) {
  ScheduledOp op;
  op.kind = k;
  op.mb = mb;
  op.vstage = static_cast<std::uint32_t>(v);
  return op;
}

void check_order(const SimProblem& p, const std::vector<std::uint32_t>& order) {
  const auto m = static_cast<std::size_t>(p.microbatches());
  PACKPIPE_CHECK_ARG(order.size() == m, "order must list {} micro-batches, found {}", m, order.size());
  std::vector<std::uint8_t> seen(m, 0);
  for (std::size_t i = 0; i < m; ++i) {
    PACKPIPE_CHECK_ARG(order[i] < m && !seen[order[i]], "order is not a permutation of 0..{}: entry {} is {}", m - 1,
                       i, order[i]);
    seen[order[i]] = 1;
  }
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

void build_gpipe(const SimProblem& p, const std::vector<std::uint32_t>& order, RankOrder& out) {
  const std::int64_t S = p.ranks, c = p.vstages() / p.ranks;
  for (std::int64_t r = 0; r < S; ++r) {
    auto& ops = out.ops[static_cast<std::size_t>(r)];
    for (std::int64_t k = 0; k < c; ++k) {
      for (std::uint32_t mb : order) ops.push_back(make_op(OpKind::Forward, mb, k * S + r));
    }
    for (std::int64_t k = c - 1; k >= 0; --k) {
      for (std::uint32_t mb : order) ops.push_back(make_op(OpKind::Backward, mb, k * S + r));
    }
  }
}

void build_1f1b(const SimProblem& p, const std::vector<std::uint32_t>& order, RankOrder& out) {
  const std::int64_t S = p.ranks, m = p.microbatches();
  for (std::int64_t r = 0; r < S; ++r) {
    auto& ops = out.ops[static_cast<std::size_t>(r)];
    const std::int64_t w = warmup_forwards(ScheduleKind::OneFOneB, S, r, 1, m, 0);
    for (std::int64_t k = 0; k < w; ++k) ops.push_back(make_op(OpKind::Forward, order[k], r));
    for (std::int64_t k = 0; k < m - w; ++k) {
      ops.push_back(make_op(OpKind::Forward, order[w + k], r));
      ops.push_back(make_op(OpKind::Backward, order[k], r));
    }
    for (std::int64_t k = m - w; k < m; ++k) ops.push_back(make_op(OpKind::Backward, order[k], r));
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
      ops.push_back(make_op(OpKind::Forward, order[e.first], static_cast<std::int64_t>(e.second) * S + r));
    };
    auto bwd = [&](std::int64_t k) {
      const auto& e = table[static_cast<std::size_t>(k)];
      ops.push_back(make_op(OpKind::Backward, order[e.first], (c - 1 - static_cast<std::int64_t>(e.second)) * S + r));
    };
    for (std::int64_t k = 0; k < w; ++k) fwd(k);
    for (std::int64_t k = 0; k < total - w; ++k) {
      fwd(w + k);
      bwd(k);
    }
    for (std::int64_t k = total - w; k < total; ++k) bwd(k);
  }
}

// DynaPipe's cyclic order: synchronous cycles; in each cycle every rank runs, for each of its
// virtual stages in ascending order, the head backward then the head forward of that stage's ready
// queues (queues ordered by micro-batch position). An op becomes ready in the cycle after its
// input was produced. New micro-batches enter stage 0 only while every rank's memory bound (static
// + stored of the micro-batches in flight there + the newcomer's + the largest transient peak)
// stays within the limit, and while fewer than max_in_flight are in flight.
void build_cyclic(const SimProblem& p, const std::vector<std::uint32_t>& order, const ScheduleOptions& opt,
                  RankOrder& out) {
  const std::int64_t S = p.ranks, V = p.vstages(), m = p.microbatches();
  const StageCostTable& t = p.costs;
  // Ready queues per virtual stage and direction, entries are micro-batch positions; kept sorted
  // descending so the head (smallest position) is back().
  std::vector<std::vector<std::uint32_t>> fq(static_cast<std::size_t>(V)), bq(static_cast<std::size_t>(V));
  std::vector<std::pair<std::uint8_t, std::pair<std::uint32_t, std::int64_t>>> produced;  // (dir, (pos, v))
  auto push_sorted = [](std::vector<std::uint32_t>& q, std::uint32_t pos) {
    q.insert(std::upper_bound(q.begin(), q.end(), pos, std::greater<std::uint32_t>()), pos);
  };
  // Per-rank memory bound of the micro-batches in flight.
  std::vector<double> stored_sum(static_cast<std::size_t>(S), 0.0), peak_max(static_cast<std::size_t>(S), 0.0);
  std::vector<double> new_stored(static_cast<std::size_t>(S)), new_peak(static_cast<std::size_t>(S));
  const bool mem = opt.memory_aware && p.memory_limit_bytes > 0;
  std::int64_t injected = 0, in_flight = 0, finished = 0;
  const std::int64_t total_ops = 2 * m * V;
  std::int64_t done = 0;
  auto can_inject = [&]() {
    if (injected >= m) return false;
    if (in_flight == 0) return true;
    if (opt.max_in_flight > 0 && in_flight >= opt.max_in_flight) return false;
    if (!mem) return true;
    const std::uint32_t mb = order[static_cast<std::size_t>(injected)];
    std::fill(new_stored.begin(), new_stored.end(), 0.0);
    std::fill(new_peak.begin(), new_peak.end(), 0.0);
    for (std::int64_t v = 0; v < V; ++v) {
      const std::size_t i = t.at(mb, v), r = static_cast<std::size_t>(v % S);
      new_stored[r] += t.stored_bytes[i];
      new_peak[r] = std::max(new_peak[r], std::max(t.peak_bytes[i], t.stored_bytes[i]));
    }
    for (std::size_t r = 0; r < static_cast<std::size_t>(S); ++r) {
      const double bound = t.static_bytes[r] + stored_sum[r] + new_stored[r] + std::max(peak_max[r], new_peak[r]);
      if (bound > p.memory_limit_bytes) return false;
    }
    return true;
  };
  auto inject = [&]() {
    const std::uint32_t mb = order[static_cast<std::size_t>(injected)];
    for (std::int64_t v = 0; v < V; ++v) {
      const std::size_t i = t.at(mb, v), r = static_cast<std::size_t>(v % S);
      stored_sum[r] += t.stored_bytes[i];
      peak_max[r] = std::max(peak_max[r], std::max(t.peak_bytes[i], t.stored_bytes[i]));
    }
    push_sorted(fq[0], static_cast<std::uint32_t>(injected));
    ++injected;
    ++in_flight;
  };
  std::uint32_t cycle = 0;
  while (done < total_ops) {
    if (fq[0].empty() && can_inject()) inject();
    produced.clear();
    for (std::int64_t r = 0; r < S; ++r) {
      auto& ops = out.ops[static_cast<std::size_t>(r)];
      auto& cyc = out.cycle[static_cast<std::size_t>(r)];
      for (std::int64_t v = r; v < V; v += S) {
        auto& b = bq[static_cast<std::size_t>(v)];
        if (!b.empty()) {
          const std::uint32_t pos = b.back();
          b.pop_back();
          ops.push_back(make_op(OpKind::Backward, order[pos], v));
          cyc.push_back(cycle);
          produced.push_back({1, {pos, v}});
        }
        auto& f = fq[static_cast<std::size_t>(v)];
        if (!f.empty()) {
          const std::uint32_t pos = f.back();
          f.pop_back();
          ops.push_back(make_op(OpKind::Forward, order[pos], v));
          cyc.push_back(cycle);
          produced.push_back({0, {pos, v}});
        }
      }
    }
    PACKPIPE_ASSERT(!produced.empty());
    for (const auto& e : produced) {
      const std::uint32_t pos = e.second.first;
      const std::int64_t v = e.second.second;
      ++done;
      if (e.first == 0) {
        if (v + 1 < V) {
          push_sorted(fq[static_cast<std::size_t>(v + 1)], pos);
        } else {
          push_sorted(bq[static_cast<std::size_t>(v)], pos);
        }
      } else {
        const std::size_t i = t.at(order[pos], v);
        stored_sum[static_cast<std::size_t>(v % S)] -= t.stored_bytes[i];
        if (v > 0) {
          push_sorted(bq[static_cast<std::size_t>(v - 1)], pos);
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
void build_zero_bubble(const SimProblem& p, const std::vector<std::uint32_t>& order, const ScheduleOptions& opt,
                       RankOrder& out) {
  const std::int64_t S = p.ranks, V = p.vstages(), m = p.microbatches(), c = V / S;
  const StageCostTable& t = p.costs;
  const auto Su = static_cast<std::size_t>(S);
  struct Cand {
    double arrive;
    std::uint32_t pos;
    std::uint32_t v;
  };
  std::vector<std::vector<Cand>> fcand(Su), icand(Su);
  std::vector<std::vector<std::pair<std::uint32_t, std::uint32_t>>> wq(Su);  // (pos, v) FIFO
  std::vector<std::size_t> whead(Su, 0);
  std::vector<double> free_at(Su, 0.0), send_free(Su, 0.0), recv_free(Su, 0.0), mem(Su);
  std::vector<std::int64_t> holding(Su, 0), cap(Su);
  std::vector<double> reserved(Su), max_peak(Su, 0.0), mb_stored(static_cast<std::size_t>(m) * Su, 0.0),
      mb_peak(static_cast<std::size_t>(m) * Su, 0.0);
  std::vector<std::int64_t> w_left(static_cast<std::size_t>(m) * Su, c);
  for (std::int64_t mb = 0; mb < m; ++mb) {
    for (std::int64_t v = 0; v < V; ++v) {
      const std::size_t i = t.at(mb, v), k = static_cast<std::size_t>(mb) * Su + static_cast<std::size_t>(v % S);
      mb_stored[k] += t.stored_bytes[i];
      mb_peak[k] = std::max(mb_peak[k], std::max(t.peak_bytes[i], t.stored_bytes[i]));
    }
  }
  std::vector<std::uint8_t> busy(Su, 0);
  std::vector<std::int64_t> next_inject(Su, 0);  // only rank 0 injects at v = 0
  for (std::size_t r = 0; r < Su; ++r) {
    mem[r] = t.static_bytes[r];
    reserved[r] = t.static_bytes[r];
    const auto rr = static_cast<std::int64_t>(r);
    cap[r] = c == 1 ? S - rr : std::max<std::int64_t>(1, (2 * (S - rr - 1) + (c - 1) * S + c) / c);
  }
  const bool memcap = opt.memory_aware && p.memory_limit_bytes > 0;
  struct Ev {
    double time;
    std::uint32_t rank;
    std::uint8_t kind;  // 0 completion, 1 decision
    bool operator>(const Ev& o) const {
      if (time != o.time) return time > o.time;
      if (kind != o.kind) return kind > o.kind;  // completions first
      return rank > o.rank;
    }
  };
  std::vector<Ev> heap;
  auto push = [&](Ev e) {
    heap.push_back(e);
    std::push_heap(heap.begin(), heap.end(), std::greater<Ev>());
  };
  struct Running {
    OpKind kind;
    std::uint32_t pos, v;
  };
  std::vector<Running> running(Su);
  auto deliver = [&](std::size_t from, std::size_t to, double now, double xfer) {
    if (from == to) return now;
    const double s = std::max(now, std::max(send_free[from], recv_free[to]));
    send_free[from] = recv_free[to] = s + xfer;
    return s + xfer;
  };
  auto start = [&](std::size_t r, double now, OpKind k, std::uint32_t pos, std::uint32_t v) {
    const std::size_t i = t.at(order[pos], v);
    double dur = 0;
    if (k == OpKind::Forward) {
      dur = t.forward_ms[i];
      mem[r] += t.stored_bytes[i];
      if (static_cast<std::int64_t>(v) < S) {  // admission on the rank's first chunk
        const std::size_t k = static_cast<std::size_t>(order[pos]) * Su + r;
        ++holding[r];
        reserved[r] += mb_stored[k];
        max_peak[r] = std::max(max_peak[r], mb_peak[k]);
      }
    } else if (k == OpKind::BackwardInput) {
      dur = t.backward_ms[i] - t.backward_weight_ms[i];
    } else {
      dur = t.backward_weight_ms[i];
    }
    out.ops[r].push_back(make_op(k, order[pos], v));
    busy[r] = 1;
    running[r] = Running{k, pos, v};
    free_at[r] = now + dur;
    push(Ev{now + dur, static_cast<std::uint32_t>(r), 0});
  };
  auto decide = [&](std::size_t r, double now) {
    if (busy[r]) return;
    // 1. a ready input-gradient op
    auto& ic = icand[r];
    std::size_t best = ic.size();
    for (std::size_t k = 0; k < ic.size(); ++k) {
      if (ic[k].arrive > now) continue;
      if (best == ic.size() || ic[k].pos < ic[best].pos || (ic[k].pos == ic[best].pos && ic[k].v > ic[best].v)) best = k;
    }
    if (best < ic.size()) {
      const Cand cd = ic[best];
      ic.erase(ic.begin() + static_cast<std::ptrdiff_t>(best));
      start(r, now, OpKind::BackwardInput, cd.pos, cd.v);
      return;
    }
    // 2. a ready forward within the caps
    auto& fc = fcand[r];
    auto admissible = [&](std::uint32_t pos, std::uint32_t v) {
      if (static_cast<std::int64_t>(v) >= S) return true;  // a later chunk of an admitted micro-batch
      if (holding[r] == 0) return true;
      if (holding[r] >= cap[r]) return false;
      if (!memcap) return true;
      const std::size_t k = static_cast<std::size_t>(order[pos]) * Su + r;
      return reserved[r] + mb_stored[k] + std::max(max_peak[r], mb_peak[k]) <= p.memory_limit_bytes;
    };
    best = fc.size();
    for (std::size_t k = 0; k < fc.size(); ++k) {
      if (fc[k].arrive > now) continue;
      if (best < fc.size() && !(fc[k].pos < fc[best].pos || (fc[k].pos == fc[best].pos && fc[k].v < fc[best].v))) {
        continue;
      }
      if (admissible(fc[k].pos, fc[k].v)) best = k;
    }
    const bool inject = r == 0 && next_inject[0] < m &&
                        (best == fc.size() || static_cast<std::uint32_t>(next_inject[0]) < fc[best].pos) &&
                        admissible(static_cast<std::uint32_t>(next_inject[0]), 0);
    if (best < fc.size() || inject) {
      const std::uint32_t pos = inject ? static_cast<std::uint32_t>(next_inject[0]) : fc[best].pos;
      const std::uint32_t v = inject ? 0u : fc[best].v;
      if (inject) {
        ++next_inject[0];
      } else {
        fc.erase(fc.begin() + static_cast<std::ptrdiff_t>(best));
      }
      start(r, now, OpKind::Forward, pos, v);
      return;
    }
    // 3. a deferred weight-gradient op
    if (whead[r] < wq[r].size()) {
      const auto w = wq[r][whead[r]++];
      start(r, now, OpKind::BackwardWeight, w.first, w.second);
    }
  };
  for (std::size_t r = 0; r < Su; ++r) push(Ev{0.0, static_cast<std::uint32_t>(r), 1});
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), std::greater<Ev>());
    const Ev e = heap.back();
    heap.pop_back();
    const std::size_t r = e.rank;
    if (e.kind == 1) {
      decide(r, e.time);
      continue;
    }
    const Running run = running[r];
    busy[r] = 0;
    const std::size_t i = t.at(order[run.pos], run.v);
    if (run.kind == OpKind::Forward) {
      if (run.v + 1 == static_cast<std::uint32_t>(V)) {
        icand[r].push_back(Cand{e.time, run.pos, run.v});
      } else {
        const auto to = static_cast<std::size_t>((run.v + 1) % static_cast<std::uint32_t>(S));
        const double a = deliver(r, to, e.time, p.transfer_ms[i]);
        fcand[to].push_back(Cand{a, run.pos, run.v + 1});
        if (to != r) push(Ev{std::max(a, e.time), static_cast<std::uint32_t>(to), 1});
      }
    } else if (run.kind == OpKind::BackwardInput) {
      wq[r].push_back({run.pos, run.v});
      if (run.v > 0) {
        const auto to = static_cast<std::size_t>((run.v - 1) % static_cast<std::uint32_t>(S));
        const double a = deliver(r, to, e.time, p.transfer_ms[t.at(order[run.pos], run.v - 1)]);
        icand[to].push_back(Cand{a, run.pos, run.v - 1});
        if (to != r) push(Ev{std::max(a, e.time), static_cast<std::uint32_t>(to), 1});
      }
    } else {
      mem[r] -= t.stored_bytes[i];
      reserved[r] -= t.stored_bytes[i];
      if (--w_left[static_cast<std::size_t>(order[run.pos]) * Su + r] == 0) --holding[r];
    }
    // Arrivals on other ranks pushed their own decision at the arrival time.
    push(Ev{e.time, static_cast<std::uint32_t>(r), 1});
  }
  for (std::size_t r = 0; r < Su; ++r) {
    PACKPIPE_ASSERT(whead[r] == wq[r].size() && fcand[r].empty() && icand[r].empty());
  }
  PACKPIPE_ASSERT(next_inject[0] == m);
}

}  // namespace

const char* schedule_kind_name(ScheduleKind k) {
  switch (k) {
    case ScheduleKind::GPipe: return "gpipe";
    case ScheduleKind::OneFOneB: return "1f1b";
    case ScheduleKind::Interleaved1F1B: return "interleaved-1f1b";
    case ScheduleKind::Cyclic: return "cyclic";
    case ScheduleKind::WaitFreeCyclic: return "wait-free-cyclic";
    case ScheduleKind::ZeroBubble: return "zero-bubble";
  }
  return "?";
}

ScheduleKind schedule_kind_from_name(const std::string& name) {
  for (ScheduleKind k : all_schedule_kinds()) {
    if (name == schedule_kind_name(k)) return k;
  }
  PACKPIPE_THROW(::packpipe::InvalidArgument,
                 "unknown schedule '{}': expected gpipe, 1f1b, interleaved-1f1b, cyclic, wait-free-cyclic or "
                 "zero-bubble",
                 name);
}

const std::vector<ScheduleKind>& all_schedule_kinds() {
  static const std::vector<ScheduleKind> kinds = {ScheduleKind::GPipe,          ScheduleKind::OneFOneB,
                                                  ScheduleKind::Interleaved1F1B, ScheduleKind::Cyclic,
                                                  ScheduleKind::WaitFreeCyclic, ScheduleKind::ZeroBubble};
  return kinds;
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
  const std::int64_t S = problem.ranks, c = problem.vstages() / problem.ranks, m = problem.microbatches();
  std::string why;
  PACKPIPE_CHECK_ARG(schedule_supports(kind, S, c, m, &why), "{}", why);
  check_order(problem, order);
  reset(out, static_cast<std::size_t>(S), kind == ScheduleKind::Cyclic || kind == ScheduleKind::WaitFreeCyclic);
  switch (kind) {
    case ScheduleKind::GPipe: build_gpipe(problem, order, out); break;
    case ScheduleKind::OneFOneB: build_1f1b(problem, order, out); break;
    case ScheduleKind::Interleaved1F1B: {
      const std::int64_t g = options.group_size > 0 ? options.group_size : S;
      PACKPIPE_CHECK_ARG(g >= S && m % g == 0,
                         "interleaved-1f1b group size {} must be at least {} ranks and divide {} micro-batches", g, S,
                         m);
      build_interleaved(problem, order, g, out);
      break;
    }
    case ScheduleKind::Cyclic:
    case ScheduleKind::WaitFreeCyclic:
      build_cyclic(problem, order, options, out);
      if (kind == ScheduleKind::WaitFreeCyclic) out.cycle.clear();
      break;
    case ScheduleKind::ZeroBubble: build_zero_bubble(problem, order, options, out); break;
  }
}

RankOrder build_order(ScheduleKind kind, const SimProblem& problem, const std::vector<std::uint32_t>& order,
                      const ScheduleOptions& options) {
  RankOrder out;
  build_order(kind, problem, order, options, out);
  return out;
}

Schedule make_schedule(ScheduleKind kind, const SimProblem& problem, std::vector<std::uint32_t> order,
                       const ScheduleOptions& options) {
  if (order.empty()) {
    order.resize(static_cast<std::size_t>(problem.microbatches()));
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = static_cast<std::uint32_t>(i);
  }
  return simulate(problem, build_order(kind, problem, order, options), schedule_kind_name(kind), order);
}

}  // namespace packpipe::scheduler
