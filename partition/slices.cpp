// Slices (docs/design/015-long-context.md): the links between micro-batches that hold consecutive
// slices of a sample, the data-parallel split that keeps them together, the chains' memory, and the
// fixed-length slicing baseline (Seq1F1B-like).
#include <algorithm>
#include <functional>
#include <map>
#include <numeric>
#include <queue>

#include "common/errors.h"
#include "packing/packer.h"
#include "partition/detail/work.h"

namespace packpipe::partition {

std::vector<std::pair<std::uint32_t, std::uint32_t>> slice_edges(const std::vector<MicroBatch>& mbs,
                                                                 const std::vector<std::uint32_t>& lengths) {
  // Per sliced sample, its (begin, micro-batch, length) pieces.
  std::map<std::uint32_t, std::vector<std::tuple<std::uint32_t, std::uint32_t, std::uint32_t>>> pieces;
  for (std::size_t m = 0; m < mbs.size(); ++m) {
    const MicroBatch& mb = mbs[m];
    if (!mb.has_slices()) continue;
    PACKPIPE_CHECK_ARG(mb.spans.size() == mb.samples.size(), "micro-batch {}: {} spans for {} samples", m,
                       mb.spans.size(), mb.samples.size());
    for (std::size_t i = 0; i < mb.samples.size(); ++i) {
      const std::uint32_t s = mb.samples[i];
      PACKPIPE_CHECK_ARG(s < lengths.size(), "micro-batch {} names sample {}, the batch has {}", m, s, lengths.size());
      const Span& sp = mb.spans[i];
      if (sp.begin == 0 && sp.length == lengths[s]) continue;  // whole
      pieces[s].emplace_back(sp.begin, static_cast<std::uint32_t>(m), sp.length);
    }
  }
  std::vector<std::pair<std::uint32_t, std::uint32_t>> edges;
  for (auto& [s, v] : pieces) {
    std::sort(v.begin(), v.end());
    std::uint64_t at = 0;
    for (std::size_t k = 0; k < v.size(); ++k) {
      const auto [begin, m, len] = v[k];
      PACKPIPE_CHECK_ARG(begin == at && len >= 1,
                         "sample {}: its slices must cover its {} tokens back to back from token 0; micro-batch {} holds "
                         "tokens [{}, {}) where token {} was expected",
                         s, lengths[s], m, begin, std::uint64_t{begin} + len, at);
      if (k > 0) {
        const std::uint32_t prev = std::get<1>(v[k - 1]);
        PACKPIPE_CHECK_ARG(prev < m, "sample {}: its slice from token {} is in micro-batch {}, not after micro-batch {} "
                           "which holds the slice before it (slices go forward in micro-batch order)",
                           s, begin, m, prev);
        edges.emplace_back(prev, m);
      }
      at += len;
    }
    PACKPIPE_CHECK_ARG(at == lengths[s], "sample {}: its slices cover {} of its {} tokens", s, at, lengths[s]);
  }
  std::sort(edges.begin(), edges.end());
  edges.erase(std::unique(edges.begin(), edges.end()), edges.end());
  return edges;
}

std::vector<std::vector<std::uint32_t>> assign_ranks(const std::vector<double>& time_ms, std::int64_t dp,
                                                     const std::vector<std::pair<std::uint32_t, std::uint32_t>>& edges,
                                                     std::size_t per_rank) {
  if (edges.empty()) return assign_ranks(time_ms, dp, per_rank);
  PACKPIPE_CHECK_ARG(dp >= 1, "dp must be at least 1, found {}", dp);
  const std::size_t n = time_ms.size();
  // Groups of micro-batches joined by slice links (union-find, the least index as the root).
  std::vector<std::size_t> root(n);
  std::iota(root.begin(), root.end(), std::size_t{0});
  auto find = [&](std::size_t x) {
    while (root[x] != x) x = root[x] = root[root[x]];
    return x;
  };
  for (const auto& [a, b] : edges) {
    PACKPIPE_CHECK_ARG(a < n && b < n, "slice edge ({}, {}): micro-batches are below {}", a, b, n);
    const std::size_t ra = find(a), rb = find(b);
    if (ra != rb) root[std::max(ra, rb)] = std::min(ra, rb);
  }
  std::vector<double> group_time(n, 0.0);
  std::vector<std::vector<std::uint32_t>> members(n);
  for (std::size_t m = 0; m < n; ++m) {
    const std::size_t g = find(m);
    group_time[g] += time_ms[m];
    members[g].push_back(static_cast<std::uint32_t>(m));
  }
  std::vector<std::size_t> groups;
  for (std::size_t g = 0; g < n; ++g) {
    if (!members[g].empty()) groups.push_back(g);
  }
  // LPT over the groups: largest first (ties by index) onto the least-loaded rank (ties lower).
  std::stable_sort(groups.begin(), groups.end(),
                   [&](std::size_t a, std::size_t b) { return group_time[a] > group_time[b]; });
  const auto D = static_cast<std::size_t>(dp);
  std::vector<std::vector<std::uint32_t>> out(D);
  std::vector<double> load(D, 0.0);
  for (const std::size_t g : groups) {
    // the least-loaded rank with room for the whole group (every rank has room without a count)
    std::size_t r = D;
    for (std::size_t k = 0; k < D; ++k) {
      if (per_rank != 0 && out[k].size() + members[g].size() > per_rank) continue;
      if (r == D || load[k] < load[r]) r = k;
    }
    if (r == D) return assign_ranks(time_ms, dp, edges, 0);  // the groups do not split evenly this way
    load[r] += group_time[g];
    out[r].insert(out[r].end(), members[g].begin(), members[g].end());
  }
  for (auto& v : out) std::sort(v.begin(), v.end());
  return out;
}

namespace detail {

bool chains_fit(const std::vector<MicroBatch>& mbs, const Coster& coster) { return chains_over(mbs, coster).empty(); }

namespace {

// The samples of sliced micro-batches, ascending, with the indices of the micro-batches holding
// each, ascending, as often as a micro-batch lists the sample (compressed rows: chain i's members
// are members[first[i], first[i + 1])).
struct Chains {
  std::vector<std::uint32_t> samples;
  std::vector<std::size_t> first;
  std::vector<std::size_t> members;
  std::size_t size() const { return samples.size(); }
  const std::size_t* begin(std::size_t i) const { return members.data() + first[i]; }
  const std::size_t* end(std::size_t i) const { return members.data() + first[i + 1]; }
};

Chains chains_of(const std::vector<MicroBatch>& mbs) {
  Chains c;
  std::uint32_t most = 0;
  bool any = false;
  for (const MicroBatch& mb : mbs) {
    if (!mb.has_slices()) continue;
    for (const std::uint32_t s : mb.samples) most = std::max(most, s);
    any = any || !mb.samples.empty();
  }
  if (!any) {
    c.first.push_back(0);
    return c;
  }
  std::vector<std::size_t> count(static_cast<std::size_t>(most) + 2, 0);  // a counting sort by sample
  for (const MicroBatch& mb : mbs) {
    if (!mb.has_slices()) continue;
    for (const std::uint32_t s : mb.samples) ++count[s + 1];
  }
  for (std::size_t s = 0; s <= most; ++s) {
    if (count[s + 1] > 0) c.samples.push_back(static_cast<std::uint32_t>(s));
    count[s + 1] += count[s];
  }
  c.members.resize(count.back());
  std::vector<std::size_t> at(count.begin(), count.end() - 1);
  for (std::size_t b = 0; b < mbs.size(); ++b) {
    if (!mbs[b].has_slices()) continue;
    for (const std::uint32_t s : mbs[b].samples) c.members[at[s]++] = b;
  }
  for (const std::uint32_t s : c.samples) c.first.push_back(count[s]);
  c.first.push_back(c.members.size());
  return c;
}

// A chain's stored activations and largest peak: what each stage holds until its backward.
double chain_total(const std::vector<MicroBatch>& mbs, const std::size_t* begin, const std::size_t* end) {
  double stored = 0, peak = 0;
  for (const std::size_t* b = begin; b != end; ++b) {
    stored += mbs[*b].stored_mb;
    peak = std::max(peak, mbs[*b].peak_mb);
  }
  return stored + peak;
}

}  // namespace

std::vector<std::uint32_t> chains_over(const std::vector<MicroBatch>& mbs, const Coster& coster, double room_fraction) {
  std::vector<std::uint32_t> over;
  if (coster.basis() != CostBasis::Stages) return over;
  const double room = (coster.limit_mb() - coster.max_static_mb()) * room_fraction;
  const Chains c = chains_of(mbs);
  for (std::size_t i = 0; i < c.size(); ++i) {
    if (chain_total(mbs, c.begin(i), c.end(i)) > room) over.push_back(c.samples[i]);
  }
  return over;
}

std::vector<std::uint32_t> relieve_chains(std::vector<MicroBatch>& mbs, const Coster& coster,
                                          const std::function<Choice(std::size_t)>& full, double room_fraction) {
  if (coster.basis() != CostBasis::Stages) return {};
  const double room = (coster.limit_mb() - coster.max_static_mb()) * room_fraction;
  const Chains chains = chains_of(mbs);  // (relieving changes modes, never which micro-batches hold a sample)
  // The chains over before any relief (chains_over's), relieved in ascending sample order.
  std::vector<char> over(chains.size(), 0);
  bool any = false;
  for (std::size_t i = 0; i < chains.size(); ++i) {
    over[i] = chain_total(mbs, chains.begin(i), chains.end(i)) > room;
    any = any || over[i];
  }
  if (!any) return {};
  std::vector<std::size_t> members;
  for (std::size_t i = 0; i < chains.size(); ++i) {
    if (!over[i]) continue;
    members.assign(chains.begin(i), chains.end(i));
    members.erase(std::unique(members.begin(), members.end()), members.end());  // each micro-batch once
    // Candidates by added time per MB freed (ties by index): the cheapest relief first.
    struct Cand {
      double rate;
      std::size_t b;
      Choice c;
    };
    std::vector<Cand> cands;
    for (const std::size_t b : members) {
      if (mbs[b].recompute == Recompute::Full) continue;
      const Choice c = full(b);
      const double freed = mbs[b].stored_mb - c.stored_mb;
      if (!c.fits || !(freed > 0)) continue;
      cands.push_back({std::max(0.0, c.time_ms - mbs[b].time_ms) / freed, b, c});
    }
    std::sort(cands.begin(), cands.end(),
              [](const Cand& x, const Cand& y) { return x.rate != y.rate ? x.rate < y.rate : x.b < y.b; });
    for (const Cand& x : cands) {
      if (chain_total(mbs, members.data(), members.data() + members.size()) <= room) break;
      MicroBatch& mb = mbs[x.b];
      mb.recompute = x.c.rc;
      mb.time_ms = x.c.time_ms;
      mb.stored_mb = x.c.stored_mb;
      mb.peak_mb = x.c.peak_mb;
    }
  }
  return chains_over(mbs, coster);
}

std::vector<MicroBatch> slicing_baseline(const Work& w, const std::vector<std::uint32_t>& ids, std::uint64_t slice) {
  PACKPIPE_CHECK_ARG(!w.encdec(), "method 'slicing' cuts decoder-only samples; an encoder-decoder model's encoder "
                     "attends both ways and its decoder to the whole encoder output");
  PACKPIPE_CHECK_ARG(slice >= 1 && slice <= (std::uint64_t{1} << 32),
                     "method 'slicing': the slice length (capacity / --capacity) must be in [1, 2^32], found {}", slice);
  struct Piece {
    std::uint32_t sample, begin, length;
  };
  std::vector<Piece> pieces;
  for (const std::uint32_t s : ids) {
    const std::uint32_t len = w.input[s];
    for (std::uint64_t b = 0; b < len; b += slice) {
      pieces.push_back({s, static_cast<std::uint32_t>(b), static_cast<std::uint32_t>(std::min<std::uint64_t>(slice, len - b))});
    }
  }
  std::vector<std::uint32_t> lens(pieces.size());
  for (std::size_t k = 0; k < pieces.size(); ++k) lens[k] = pieces[k].length;
  packing::PackOptions po;
  po.algorithm = packing::Algorithm::BestFitDecreasing;
  po.capacity = slice;
  const packing::Packing p = packing::pack(lens.data(), lens.size(), po, nullptr);
  const std::size_t rows = p.rows();
  // The rows in an order where every sample's slices come in order and, as Seq1F1B runs them, one
  // after another: a topological sort of the rows under the links between each sample's
  // consecutive pieces that takes a row the last one unlocked first, else the lowest ready index.
  std::vector<std::size_t> row_of(pieces.size());
  for (std::size_t r = 0; r < rows; ++r) {
    for (std::uint64_t k = p.row_offsets[r]; k < p.row_offsets[r + 1]; ++k) row_of[p.samples[k]] = r;
  }
  std::vector<std::vector<std::size_t>> after(rows);
  std::vector<std::size_t> indeg(rows, 0);
  for (std::size_t k = 1; k < pieces.size(); ++k) {
    if (pieces[k].sample != pieces[k - 1].sample) continue;
    const std::size_t a = row_of[k - 1], b = row_of[k];
    PACKPIPE_ASSERT(a != b);  // a full slice fills its row
    after[a].push_back(b);
    ++indeg[b];
  }
  std::priority_queue<std::size_t, std::vector<std::size_t>, std::greater<>> ready;
  for (std::size_t r = 0; r < rows; ++r) {
    if (indeg[r] == 0) ready.push(r);
  }
  std::vector<MicroBatch> out;
  out.reserve(rows);
  bool sliced = false;
  std::vector<char> emitted(rows, 0);
  std::vector<std::size_t> unlocked;  // rows the last emitted row made ready
  while (!ready.empty()) {
    std::size_t r;
    if (!unlocked.empty()) {
      r = *std::min_element(unlocked.begin(), unlocked.end());
    } else {
      r = ready.top();
    }
    if (!ready.empty() && ready.top() == r) ready.pop();
    if (emitted[r]) continue;  // taken through `unlocked` while still queued
    emitted[r] = 1;
    unlocked.clear();
    MicroBatch mb;
    mb.layout = Layout::Packed;
    for (std::uint64_t k = p.row_offsets[r]; k < p.row_offsets[r + 1]; ++k) {
      const Piece& pc = pieces[p.samples[k]];
      mb.samples.push_back(pc.sample);
      mb.spans.push_back({pc.begin, pc.length});
      sliced = sliced || pc.length != w.input[pc.sample];
    }
    out.push_back(std::move(mb));
    for (const std::size_t b : after[r]) {
      if (--indeg[b] == 0) {
        ready.push(b);
        unlocked.push_back(b);
      }
    }
  }
  PACKPIPE_ASSERT(out.size() == rows);
  if (!sliced) {
    for (auto& mb : out) mb.spans.clear();
  }
  return out;
}

}  // namespace detail

}  // namespace packpipe::partition
