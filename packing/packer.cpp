// Packing: first-fit decreasing, best-fit decreasing and histogram (SPFHP) packing, in one or two
// dimensions. Design and figures: docs/design/004-packing.md.
#include "packing/packer.h"

#include <algorithm>
#include <limits>
#include <numeric>
#include <set>
#include <utility>

#include "common/errors.h"
#include "packing/detail/bit_tree.h"
#include "packing/detail/row_tree.h"

namespace packpipe::packing {

namespace {

using detail::BitTree;
using detail::RowTree;

/// Room values up to this index dense arrays (counting sort, buckets by remaining room).
constexpr std::uint64_t kDenseLimit = std::uint64_t{1} << 22;
constexpr std::uint32_t kNil = std::numeric_limits<std::uint32_t>::max();
__extension__ typedef unsigned __int128 u128;

/// Samples in placement order: decreasing length, ties by increasing sample index.
struct Sorted {
  std::vector<std::uint32_t> ids;
  std::vector<std::uint32_t> len;          ///< len[k] = lengths[ids[k]]
  std::vector<std::uint64_t> class_start;  ///< dense only: first position of length L (size max + 2)
  std::uint32_t max_len = 0;
};

Sorted sort_decreasing(const std::uint32_t* lengths, std::size_t n, std::uint64_t capacity) {
  Sorted s;
  s.ids.resize(n);
  s.len.resize(n);
  for (std::size_t i = 0; i < n; ++i) s.max_len = std::max(s.max_len, lengths[i]);
  if (s.max_len <= kDenseLimit) {
    // counting sort: class L starts after every longer class, indices ascending within it
    std::vector<std::uint64_t> pos(static_cast<std::size_t>(s.max_len) + 2, 0);
    for (std::size_t i = 0; i < n; ++i) ++pos[lengths[i]];
    s.class_start.assign(pos.size(), 0);
    std::uint64_t at = 0;
    for (std::uint64_t L = s.max_len + 1; L-- > 0;) {
      s.class_start[L] = at;
      at += pos[L];
      std::fill(s.len.begin() + static_cast<std::ptrdiff_t>(s.class_start[L]),
                s.len.begin() + static_cast<std::ptrdiff_t>(at), static_cast<std::uint32_t>(L));
    }
    s.class_start[s.max_len + 1] = 0;  // unused sentinel
    std::copy(s.class_start.begin(), s.class_start.end(), pos.begin());
    for (std::size_t i = 0; i < n; ++i) s.ids[pos[lengths[i]]++] = static_cast<std::uint32_t>(i);
  } else {
    std::iota(s.ids.begin(), s.ids.end(), 0u);
    std::sort(s.ids.begin(), s.ids.end(), [lengths](std::uint32_t x, std::uint32_t y) {
      return lengths[x] != lengths[y] ? lengths[x] > lengths[y] : x < y;
    });
    for (std::size_t k = 0; k < n; ++k) s.len[k] = lengths[s.ids[k]];
  }
  return s;
}

/// CSR rows from the row of every placed sample (placement order kept within a row).
Packing to_csr(const std::vector<std::uint32_t>& ids, const std::vector<std::uint32_t>& row_of,
               std::vector<std::uint64_t> used, std::vector<std::uint64_t> used_target) {
  Packing p;
  const std::size_t rows = used.size();
  p.row_offsets.assign(rows + 1, 0);
  for (const std::uint32_t r : row_of) ++p.row_offsets[r + 1];
  for (std::size_t r = 0; r < rows; ++r) p.row_offsets[r + 1] += p.row_offsets[r];
  std::vector<std::uint64_t> fill(p.row_offsets.begin(), p.row_offsets.end() - 1);
  p.samples.resize(ids.size());
  for (std::size_t k = 0; k < ids.size(); ++k) p.samples[fill[row_of[k]]++] = ids[k];
  p.row_tokens = std::move(used);
  p.row_target_tokens = std::move(used_target);
  return p;
}

bool row_full(std::uint64_t samples_in_row, std::uint64_t limit) { return limit != 0 && samples_in_row >= limit; }

// ---------------------------------------------------------------------------------------------
// One dimension

/// Best fit: the row with the least remaining room that still fits; ties go to the row that
/// reached that room last (LIFO). Dense: buckets of rows per remaining room plus a bitset over
/// rooms; sparse (huge capacities): an ordered set keyed the same way.
Packing bfd_1d(const Sorted& s, std::uint64_t capacity, std::uint64_t limit) {
  const std::size_t n = s.ids.size();
  std::vector<std::uint32_t> row_of(n);
  std::vector<std::uint64_t> used;
  std::vector<std::uint32_t> count;
  const std::uint64_t max_room = std::min<std::uint64_t>(capacity, std::numeric_limits<std::uint64_t>::max() - 1);
  if (capacity <= kDenseLimit) {
    BitTree rooms(capacity + 1);
    std::vector<std::uint32_t> head(capacity + 1, kNil);
    std::vector<std::uint32_t> next;
    for (std::size_t k = 0; k < n; ++k) {
      const std::uint32_t L = s.len[k];
      const std::uint64_t r = rooms.next(L);
      std::uint32_t row;
      std::uint64_t room;
      if (r == BitTree::kNone) {
        row = static_cast<std::uint32_t>(used.size());
        used.push_back(L);
        count.push_back(1);
        next.push_back(kNil);
        room = capacity - L;
      } else {
        row = head[r];
        head[r] = next[row];
        if (head[r] == kNil) rooms.reset(r);
        used[row] += L;
        ++count[row];
        room = r - L;
      }
      row_of[k] = row;
      if (!row_full(count[row], limit)) {
        next[row] = head[room];
        if (head[room] == kNil) rooms.set(room);
        head[room] = row;
      }
    }
  } else {
    // key (room, -stamp): lower_bound finds the least room, then the latest entry (LIFO as above)
    std::set<std::pair<std::uint64_t, std::uint64_t>> open;
    std::uint64_t stamp = std::numeric_limits<std::uint64_t>::max();
    std::vector<std::uint32_t> row_at;  // row of each stamp, by ~stamp
    for (std::size_t k = 0; k < n; ++k) {
      const std::uint32_t L = s.len[k];
      auto it = open.lower_bound({L, 0});
      std::uint32_t row;
      std::uint64_t room;
      if (it == open.end()) {
        row = static_cast<std::uint32_t>(used.size());
        used.push_back(L);
        count.push_back(1);
        room = max_room - L;
      } else {
        room = it->first - L;
        row = row_at[~it->second];
        open.erase(it);
        used[row] += L;
        ++count[row];
      }
      row_of[k] = row;
      if (!row_full(count[row], limit)) {
        row_at.push_back(row);
        open.emplace(room, stamp--);
      }
    }
  }
  return to_csr(s.ids, row_of, std::move(used), {});
}

/// First fit: the lowest-numbered row that fits (segment tree over rows, O(log rows)).
Packing ffd_1d(const Sorted& s, std::uint64_t capacity, std::uint64_t limit) {
  const std::size_t n = s.ids.size();
  std::vector<std::uint32_t> row_of(n);
  std::vector<std::uint64_t> used;
  std::vector<std::uint32_t> count;
  const auto cap = static_cast<std::int64_t>(std::min<std::uint64_t>(capacity, std::numeric_limits<std::int64_t>::max()));
  RowTree tree;
  for (std::size_t k = 0; k < n; ++k) {
    const std::uint32_t L = s.len[k];
    std::uint64_t row = tree.first_fit(L, 0);
    if (row == RowTree::kNone) {
      row = used.size();
      used.push_back(0);
      count.push_back(0);
    }
    used[row] += L;
    ++count[row];
    row_of[k] = static_cast<std::uint32_t>(row);
    tree.set(row, row_full(count[row], limit) ? -1 : cap - static_cast<std::int64_t>(used[row]), 0);
  }
  return to_csr(s.ids, row_of, std::move(used), {});
}

/// SPFHP (Graphcore, "shortest-pack-first histogram packing"): lengths from longest to shortest;
/// each length class goes, group by group, into the packs with the most remaining room that
/// still fit (worst fit on groups of identical packs), new packs when none fits. Works on the
/// histogram: the cost depends on the capacity and the number of groups, not on n; sample ids
/// are dealt out at the end.
Packing histogram_1d(const Sorted& s, std::uint64_t capacity, std::uint64_t limit) {
  struct Group {
    std::uint64_t count;     // identical packs
    std::uint32_t node;      // last length of the strategy (chain to the first)
    std::uint32_t samples;   // samples per pack
    std::uint32_t next;      // next group in the same room bucket
  };
  struct Node {
    std::uint32_t len;
    std::uint32_t parent;
  };
  std::vector<Group> groups;
  std::vector<Node> nodes;
  std::vector<std::uint64_t> room_of;  // per group
  std::vector<std::uint32_t> head(capacity + 1, kNil);
  BitTree rooms(capacity + 1);
  auto push = [&](std::uint32_t g, std::uint64_t room) {
    room_of[g] = room;
    if (row_full(groups[g].samples, limit)) return;
    groups[g].next = head[room];
    if (head[room] == kNil) rooms.set(room);
    head[room] = g;
  };
  auto add_group = [&](std::uint64_t count, std::uint32_t node, std::uint32_t samples) {
    groups.push_back(Group{count, node, samples, kNil});
    room_of.push_back(0);
    return static_cast<std::uint32_t>(groups.size() - 1);
  };
  const std::size_t n = s.ids.size();
  for (std::uint64_t L = s.max_len + 1; L-- > 0 && n > 0;) {
    // class L occupies [class_start[L], where the next shorter class starts)
    std::uint64_t need = (L == 0 ? n : s.class_start[L - 1]) - s.class_start[L];
    std::uint64_t top = capacity;
    while (need > 0) {
      const std::uint64_t r = rooms.prev(top);
      if (r == BitTree::kNone || r < L) {
        // New packs, each taking as many copies of L as fit (as worst fit would, since no other
        // pack has room for L); SPFHP proper opens one pack per sample here.
        std::uint64_t per_pack = L == 0 ? need : std::min<std::uint64_t>(capacity / L, need);
        if (limit != 0) per_pack = std::min(per_pack, limit);
        const std::uint64_t full = need / per_pack, rest = need % per_pack;
        std::uint32_t node = kNil;
        for (std::uint64_t c = 1; c <= per_pack; ++c) {
          nodes.push_back(Node{static_cast<std::uint32_t>(L), node});
          node = static_cast<std::uint32_t>(nodes.size() - 1);
          if (c == rest || c == per_pack) {
            const std::uint32_t g = add_group(c == per_pack ? full : 1, node, static_cast<std::uint32_t>(c));
            push(g, capacity - c * L);
          }
        }
        break;
      }
      const std::uint32_t g = head[r];
      head[r] = groups[g].next;
      if (head[r] == kNil) rooms.reset(r);
      const std::uint64_t take = std::min(groups[g].count, need);
      groups[g].count -= take;
      need -= take;
      const std::uint32_t parent_node = groups[g].node;
      const std::uint32_t samples = groups[g].samples + 1;
      if (groups[g].count > 0) push(g, r);
      nodes.push_back(Node{static_cast<std::uint32_t>(L), parent_node});
      const std::uint32_t ng = add_group(take, static_cast<std::uint32_t>(nodes.size() - 1), samples);
      push(ng, r - L);
      top = r;
    }
  }
  // deal sample ids out: groups in creation order, each strategy longest first
  Packing p;
  p.samples.resize(n);
  p.row_offsets.push_back(0);
  std::vector<std::uint64_t> cursor(s.class_start.begin(), s.class_start.end());
  std::vector<std::uint32_t> strategy;
  std::uint64_t at = 0;
  for (const Group& g : groups) {
    if (g.count == 0) continue;
    strategy.clear();
    std::uint64_t tokens = 0;
    for (std::uint32_t v = g.node; v != kNil; v = nodes[v].parent) {
      strategy.push_back(nodes[v].len);
      tokens += nodes[v].len;
    }
    std::reverse(strategy.begin(), strategy.end());
    for (std::uint64_t c = 0; c < g.count; ++c) {
      for (const std::uint32_t L : strategy) p.samples[at++] = s.ids[cursor[L]++];
      p.row_offsets.push_back(at);
      p.row_tokens.push_back(tokens);
    }
  }
  PACKPIPE_ASSERT(at == n);
  return p;
}

// ---------------------------------------------------------------------------------------------
// Two dimensions

/// Placement order in two dimensions: decreasing max(a / A, b / B), then decreasing a / A + b / B,
/// then increasing sample index. Exact integer comparisons.
std::vector<std::uint32_t> sort_2d(const std::uint32_t* a, const std::uint32_t* b, std::size_t n, std::uint64_t A,
                                   std::uint64_t B) {
  std::vector<std::uint32_t> ids(n);
  std::iota(ids.begin(), ids.end(), 0u);
  // max fraction of sample i as (num, den)
  auto frac = [&](std::uint32_t i) {
    return u128{a[i]} * B >= u128{b[i]} * A ? std::make_pair(std::uint64_t{a[i]}, A) : std::make_pair(std::uint64_t{b[i]}, B);
  };
  std::sort(ids.begin(), ids.end(), [&](std::uint32_t x, std::uint32_t y) {
    const auto fx = frac(x);
    const auto fy = frac(y);
    const u128 lx = u128{fx.first} * fy.second;
    const u128 ly = u128{fy.first} * fx.second;
    if (lx != ly) return lx > ly;
    const u128 sx = u128{a[x]} * B + u128{b[x]} * A;
    const u128 sy = u128{a[y]} * B + u128{b[y]} * A;
    if (sx != sy) return sx > sy;
    return x < y;
  });
  return ids;
}

/// Smallest input and target length among ids[k..n) for every k (n + 1 entries; the last is max).
std::pair<std::vector<std::uint32_t>, std::vector<std::uint32_t>> suffix_minima(const std::vector<std::uint32_t>& ids,
                                                                                const std::uint32_t* a,
                                                                                const std::uint32_t* b) {
  const std::size_t n = ids.size();
  std::vector<std::uint32_t> min_a(n + 1, std::numeric_limits<std::uint32_t>::max());
  std::vector<std::uint32_t> min_b(n + 1, std::numeric_limits<std::uint32_t>::max());
  for (std::size_t k = n; k-- > 0;) {
    min_a[k] = std::min(min_a[k + 1], a[ids[k]]);
    min_b[k] = std::min(min_b[k + 1], b[ids[k]]);
  }
  return {std::move(min_a), std::move(min_b)};
}

/// Two-dimensional first fit: the lowest-numbered row with room in both dimensions.
Packing ffd_2d(const std::vector<std::uint32_t>& ids, const std::uint32_t* a, const std::uint32_t* b,
               std::uint64_t A, std::uint64_t B, std::uint64_t limit) {
  const std::size_t n = ids.size();
  // suffix minima of the lengths still to place: rows with less room can be closed
  const auto [min_a, min_b] = suffix_minima(ids, a, b);
  std::vector<std::uint32_t> row_of(n);
  std::vector<std::uint64_t> used, used_b;
  std::vector<std::uint32_t> count;
  RowTree tree;
  for (std::size_t k = 0; k < n; ++k) {
    const std::uint32_t i = ids[k];
    std::uint64_t row = tree.first_fit(a[i], b[i], min_a[k], min_b[k]);
    if (row == RowTree::kNone) {
      row = used.size();
      used.push_back(0);
      used_b.push_back(0);
      count.push_back(0);
    }
    used[row] += a[i];
    used_b[row] += b[i];
    ++count[row];
    row_of[k] = static_cast<std::uint32_t>(row);
    if (row_full(count[row], limit)) {
      tree.set(row, -1, -1);
    } else {
      tree.set(row, static_cast<std::int64_t>(A - used[row]), static_cast<std::int64_t>(B - used_b[row]));
    }
  }
  return to_csr(ids, row_of, std::move(used), std::move(used_b));
}

/// Two-dimensional best fit: among rows with room in both dimensions, the one left with the
/// least combined normalized room (ra - a) / A + (rb - b) / B. Rows sit in buckets by input room;
/// the scan goes up from room a and stops once (ra - a) / A alone reaches the best score, so it
/// is exact; rows that can take no remaining sample are dropped on the way. After kScanCap rows
/// the best so far wins (the first that fits if none did yet).
Packing bfd_2d(const std::vector<std::uint32_t>& ids, const std::uint32_t* a, const std::uint32_t* b,
               std::uint64_t A, std::uint64_t B, std::uint64_t limit) {
  PACKPIPE_CHECK_ARG(A <= kDenseLimit, "two-dimensional best fit supports capacities up to {}, found {}", kDenseLimit,
                     A);
  constexpr std::uint64_t kScanCap = 4096;
  const std::size_t n = ids.size();
  // suffix minima of the remaining samples' lengths: rows with less room are dead
  const auto [min_a, min_b] = suffix_minima(ids, a, b);
  std::vector<std::uint32_t> row_of(n);
  std::vector<std::uint64_t> used, used_b;
  std::vector<std::uint32_t> count, next, prev;
  std::vector<std::uint32_t> head(A + 1, kNil);
  BitTree rooms(A + 1);
  auto unlink = [&](std::uint32_t row, std::uint64_t room) {
    if (prev[row] != kNil) next[prev[row]] = next[row]; else head[room] = next[row];
    if (next[row] != kNil) prev[next[row]] = prev[row];
    if (head[room] == kNil) rooms.reset(room);
  };
  auto link = [&](std::uint32_t row, std::uint64_t room) {
    prev[row] = kNil;
    next[row] = head[room];
    if (head[room] != kNil) prev[head[room]] = row; else rooms.set(room);
    head[room] = row;
  };
  for (std::size_t k = 0; k < n; ++k) {
    const std::uint32_t i = ids[k];
    const std::uint64_t ai = a[i], bi = b[i];
    std::uint32_t best = kNil;
    std::uint64_t best_room = 0;
    u128 best_score = ~u128{0};
    std::uint64_t scanned = 0;
    for (std::uint64_t r = rooms.next(ai); r != BitTree::kNone; r = r + 1 <= A ? rooms.next(r + 1) : BitTree::kNone) {
      if (u128{r - ai} * B >= best_score) break;
      if (scanned >= kScanCap && best != kNil) break;
      for (std::uint32_t row = head[r]; row != kNil;) {
        const std::uint32_t after = next[row];
        const std::uint64_t rb = B - used_b[row];
        if (rb < min_b[k]) {
          unlink(row, r);  // no remaining sample fits its target room
        } else if (rb >= bi) {
          const u128 score = u128{r - ai} * B + u128{rb - bi} * A;
          if (score < best_score) {
            best = row;
            best_room = r;
            best_score = score;
          }
        }
        ++scanned;
        row = after;
      }
      if (scanned >= kScanCap && best != kNil) break;
    }
    std::uint32_t row;
    if (best == kNil) {
      row = static_cast<std::uint32_t>(used.size());
      used.push_back(0);
      used_b.push_back(0);
      count.push_back(0);
      next.push_back(kNil);
      prev.push_back(kNil);
    } else {
      row = best;
      unlink(row, best_room);
    }
    used[row] += ai;
    used_b[row] += bi;
    ++count[row];
    row_of[k] = row;
    if (!row_full(count[row], limit)) link(row, A - used[row]);
  }
  return to_csr(ids, row_of, std::move(used), std::move(used_b));
}

}  // namespace

double Packing::efficiency() const {
  if (rows() == 0) return 0.0;
  double tokens = 0;
  for (const auto t : row_tokens) tokens += static_cast<double>(t);
  for (const auto t : row_target_tokens) tokens += static_cast<double>(t);
  const double cap = static_cast<double>(capacity) + static_cast<double>(target_capacity);
  return tokens / (static_cast<double>(rows()) * cap);
}

Packing pack(const std::uint32_t* lengths, std::size_t n, const PackOptions& options,
             const std::uint32_t* target_lengths) {
  PACKPIPE_CHECK_ARG(options.capacity > 0, "capacity must be positive, found 0");
  PACKPIPE_CHECK_ARG(n <= std::numeric_limits<std::uint32_t>::max() - 1, "at most {} samples can be packed, found {}",
                     std::numeric_limits<std::uint32_t>::max() - 1, n);
  PACKPIPE_CHECK_ARG(n == 0 || lengths != nullptr, "lengths is null for {} samples", n);
  const bool two_d = target_lengths != nullptr || options.target_capacity > 0;
  if (two_d) {
    PACKPIPE_CHECK_ARG(options.target_capacity > 0,
                       "target lengths given but the target capacity is 0; two-dimensional packing needs a positive "
                       "target capacity");
    PACKPIPE_CHECK_ARG(target_lengths != nullptr || n == 0,
                       "target capacity {} given without target lengths", options.target_capacity);
    PACKPIPE_CHECK_ARG(options.algorithm != Algorithm::Histogram,
                       "histogram packing is one-dimensional; use ffd or bfd for target lengths");
    PACKPIPE_CHECK_ARG(options.capacity <= std::numeric_limits<std::uint32_t>::max() &&
                           options.target_capacity <= std::numeric_limits<std::uint32_t>::max(),
                       "two-dimensional capacities must be below 2^32, found {} and {}", options.capacity,
                       options.target_capacity);
  }
  PACKPIPE_CHECK_ARG(options.algorithm != Algorithm::Histogram || options.capacity <= kDenseLimit,
                     "histogram packing supports capacities up to {}, found {}", kDenseLimit, options.capacity);
  std::uint32_t longest = 0;
  for (std::size_t i = 0; i < n; ++i) longest = std::max(longest, lengths[i]);
  if (longest > options.capacity) {
    for (std::size_t i = 0; i < n; ++i) {
      PACKPIPE_CHECK_ARG(lengths[i] <= options.capacity, "sample {} has {} tokens, more than the capacity {}", i,
                         lengths[i], options.capacity);
    }
  }
  if (two_d && n > 0) {
    for (std::size_t i = 0; i < n; ++i) {
      PACKPIPE_CHECK_ARG(target_lengths[i] <= options.target_capacity,
                         "sample {} has {} target tokens, more than the target capacity {}", i, target_lengths[i],
                         options.target_capacity);
    }
  }

  Packing p;
  if (two_d) {
    const auto ids = sort_2d(lengths, target_lengths, n, options.capacity, options.target_capacity);
    p = options.algorithm == Algorithm::FirstFitDecreasing
            ? ffd_2d(ids, lengths, target_lengths, options.capacity, options.target_capacity,
                     options.max_samples_per_row)
            : bfd_2d(ids, lengths, target_lengths, options.capacity, options.target_capacity,
                     options.max_samples_per_row);
  } else {
    const Sorted s = sort_decreasing(lengths, n, options.capacity);
    switch (options.algorithm) {
      case Algorithm::FirstFitDecreasing: p = ffd_1d(s, options.capacity, options.max_samples_per_row); break;
      case Algorithm::BestFitDecreasing: p = bfd_1d(s, options.capacity, options.max_samples_per_row); break;
      case Algorithm::Histogram: p = histogram_1d(s, options.capacity, options.max_samples_per_row); break;
    }
  }
  if (p.row_offsets.empty()) p.row_offsets.push_back(0);
  p.capacity = options.capacity;
  p.target_capacity = two_d ? options.target_capacity : 0;
  return p;
}

}  // namespace packpipe::packing
