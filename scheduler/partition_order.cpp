// Encoder-decoder sample order: sort, then 2-opt and Or-opt local search on the open L1 path.
#include <algorithm>
#include <cstdlib>
#include <numeric>

#include "common/errors.h"
#include "scheduler/partition.h"

namespace packpipe::scheduler {

namespace {

struct Pt {
  std::int64_t x, y;
};
inline std::int64_t dist(const Pt& a, const Pt& b) { return std::llabs(a.x - b.x) + std::llabs(a.y - b.y); }

// Neighbourhood of the moves: positions within this distance of each other (bounded work on
// large batches; the sorted start already places near points near each other).
constexpr std::size_t kWindow = 48;
constexpr int kMaxPasses = 50;

// 2-opt on an open path: reverse p[i..j]; the ends have no outer edge.
bool two_opt_pass(std::vector<Pt>& p, std::vector<std::uint32_t>& ids) {
  const std::size_t n = p.size();
  bool improved = false;
  for (std::size_t i = 0; i + 1 < n; ++i) {
    const std::size_t jmax = std::min(n - 1, i + kWindow);
    for (std::size_t j = i + 1; j <= jmax; ++j) {
      std::int64_t before = 0, after = 0;
      if (i > 0) {
        before += dist(p[i - 1], p[i]);
        after += dist(p[i - 1], p[j]);
      }
      if (j + 1 < n) {
        before += dist(p[j], p[j + 1]);
        after += dist(p[i], p[j + 1]);
      }
      if (after < before) {
        std::reverse(p.begin() + static_cast<std::ptrdiff_t>(i), p.begin() + static_cast<std::ptrdiff_t>(j) + 1);
        std::reverse(ids.begin() + static_cast<std::ptrdiff_t>(i), ids.begin() + static_cast<std::ptrdiff_t>(j) + 1);
        improved = true;
      }
    }
  }
  return improved;
}

// Or-opt: move a segment of 1-3 points to between two other neighbours (either orientation).
bool or_opt_pass(std::vector<Pt>& p, std::vector<std::uint32_t>& ids) {
  const std::size_t n = p.size();
  bool improved = false;
  for (std::size_t len = 1; len <= 3; ++len) {
    for (std::size_t i = 0; i + len <= n; ++i) {
      const std::size_t e = i + len - 1;  // segment p[i..e]
      // Removal gain.
      std::int64_t rem = 0;
      if (i > 0) rem += dist(p[i - 1], p[i]);
      if (e + 1 < n) rem += dist(p[e], p[e + 1]);
      if (i > 0 && e + 1 < n) rem -= dist(p[i - 1], p[e + 1]);
      if (rem <= 0) continue;
      // Insertion between k and k+1 (k = -1: at the front; k = n-1: at the back), outside the segment.
      std::int64_t best_delta = 0;
      std::ptrdiff_t best_k = -2;
      bool best_rev = false;
      const std::ptrdiff_t lo = std::max<std::ptrdiff_t>(-1, static_cast<std::ptrdiff_t>(i) - static_cast<std::ptrdiff_t>(kWindow));
      const std::ptrdiff_t hi = std::min<std::ptrdiff_t>(static_cast<std::ptrdiff_t>(n) - 1,
                                                         static_cast<std::ptrdiff_t>(e + kWindow));
      for (std::ptrdiff_t k = lo; k <= hi; ++k) {
        if (k >= static_cast<std::ptrdiff_t>(i) - 1 && k <= static_cast<std::ptrdiff_t>(e)) continue;
        const Pt* a = k >= 0 ? &p[static_cast<std::size_t>(k)] : nullptr;
        const Pt* b = k + 1 < static_cast<std::ptrdiff_t>(n) ? &p[static_cast<std::size_t>(k + 1)] : nullptr;
        for (int rev = 0; rev < 2; ++rev) {
          const Pt& first = rev ? p[e] : p[i];
          const Pt& last = rev ? p[i] : p[e];
          std::int64_t add = 0;
          if (a) add += dist(*a, first);
          if (b) add += dist(last, *b);
          if (a && b) add -= dist(*a, *b);
          const std::int64_t delta = add - rem;
          if (delta < best_delta) {
            best_delta = delta;
            best_k = k;
            best_rev = rev != 0;
          }
        }
      }
      if (best_k == -2) continue;
      // Apply: take the segment out and insert it after position best_k (in original indexing).
      std::vector<Pt> seg(p.begin() + static_cast<std::ptrdiff_t>(i), p.begin() + static_cast<std::ptrdiff_t>(e) + 1);
      std::vector<std::uint32_t> sid(ids.begin() + static_cast<std::ptrdiff_t>(i),
                                     ids.begin() + static_cast<std::ptrdiff_t>(e) + 1);
      if (best_rev) {
        std::reverse(seg.begin(), seg.end());
        std::reverse(sid.begin(), sid.end());
      }
      p.erase(p.begin() + static_cast<std::ptrdiff_t>(i), p.begin() + static_cast<std::ptrdiff_t>(e) + 1);
      ids.erase(ids.begin() + static_cast<std::ptrdiff_t>(i), ids.begin() + static_cast<std::ptrdiff_t>(e) + 1);
      std::ptrdiff_t pos = best_k + 1;  // insertion index in the original array
      if (pos > static_cast<std::ptrdiff_t>(e)) pos -= static_cast<std::ptrdiff_t>(len);
      p.insert(p.begin() + pos, seg.begin(), seg.end());
      ids.insert(ids.begin() + pos, sid.begin(), sid.end());
      improved = true;
    }
  }
  return improved;
}

}  // namespace

std::vector<std::uint32_t> encdec_order(const std::vector<std::uint32_t>& input, const std::vector<std::uint32_t>& target,
                                        bool improve) {
  PACKPIPE_CHECK_ARG(input.size() == target.size(), "input has {} lengths but target has {}", input.size(),
                     target.size());
  std::vector<std::uint32_t> ids(input.size());
  std::iota(ids.begin(), ids.end(), 0u);
  std::stable_sort(ids.begin(), ids.end(), [&](std::uint32_t a, std::uint32_t b) {
    if (input[a] != input[b]) return input[a] > input[b];
    return target[a] > target[b];
  });
  if (!improve || ids.size() < 3) return ids;
  std::vector<Pt> p(ids.size());
  for (std::size_t k = 0; k < ids.size(); ++k) p[k] = {input[ids[k]], target[ids[k]]};
  for (int pass = 0; pass < kMaxPasses; ++pass) {
    const bool a = two_opt_pass(p, ids);
    const bool b = or_opt_pass(p, ids);
    if (!a && !b) break;
  }
  return ids;
}

std::uint64_t path_length(const std::vector<std::uint32_t>& input, const std::vector<std::uint32_t>& target,
                          const std::vector<std::uint32_t>& order) {
  std::uint64_t total = 0;
  for (std::size_t k = 1; k < order.size(); ++k) {
    const auto a = order[k - 1], b = order[k];
    PACKPIPE_CHECK_RANGE(a < input.size() && b < input.size(), "order entry {} out of range", k);
    const std::int64_t dt = target.empty() ? 0 : static_cast<std::int64_t>(target[a]) - target[b];
    total += static_cast<std::uint64_t>(std::llabs(static_cast<std::int64_t>(input[a]) - input[b]) + std::llabs(dt));
  }
  return total;
}

}  // namespace packpipe::scheduler
