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
constexpr std::ptrdiff_t kWindow = 48;

// Local search with don't-look bits: a position is examined again only after a move changed an
// edge at it, so a pass after the first costs time in proportion to the moves made, not to n.
class PathSearch {
 public:
  PathSearch(std::vector<Pt>& p, std::vector<std::uint32_t>& ids)
      : p_(p), ids_(ids), n_(static_cast<std::ptrdiff_t>(p.size())), look_(p.size(), 1) {}

  // Until no move shortens the path (every move does, by at least 1), or 50 n moves.
  void run() {
    bool any = true;
    std::int64_t budget = 50 * static_cast<std::int64_t>(n_);
    while (any && budget > 0) {
      any = false;
      for (std::ptrdiff_t i = 0; i < n_ && budget > 0; ++i) {
        if (!look_[static_cast<std::size_t>(i)]) continue;
        if (two_opt(i) || or_opt(i)) {
          any = true;
          --budget;
        } else {
          look_[static_cast<std::size_t>(i)] = 0;
        }
      }
    }
  }

 private:
  const Pt& at(std::ptrdiff_t k) const { return p_[static_cast<std::size_t>(k)]; }
  // The edges around positions [lo, hi] changed: their end points look again (classic
  // don't-look bits; points inside a reversed or shifted run keep their neighbours).
  void touched(std::ptrdiff_t lo, std::ptrdiff_t hi) {
    const std::ptrdiff_t a = std::max<std::ptrdiff_t>(0, lo), b = std::min<std::ptrdiff_t>(n_ - 1, hi);
    for (std::ptrdiff_t k = a; k <= b; ++k) look_[static_cast<std::size_t>(k)] = 1;
  }

  // 2-opt on an open path with left end i: reverse p[i..j]; the ends have no outer edge.
  bool two_opt(std::ptrdiff_t i) {
    if (i + 1 >= n_) return false;
    const std::ptrdiff_t jmax = std::min(n_ - 1, i + kWindow);
    for (std::ptrdiff_t j = i + 1; j <= jmax; ++j) {
      std::int64_t before = 0, after = 0;
      if (i > 0) {
        before += dist(at(i - 1), at(i));
        after += dist(at(i - 1), at(j));
      }
      if (j + 1 < n_) {
        before += dist(at(j), at(j + 1));
        after += dist(at(i), at(j + 1));
      }
      if (after < before) {
        std::reverse(p_.begin() + i, p_.begin() + j + 1);
        std::reverse(ids_.begin() + i, ids_.begin() + j + 1);
        touched(i - 1, i);
        touched(j, j + 1);
        return true;
      }
    }
    return false;
  }

  // Or-opt: move the segment p[i..i+len-1] (len 1-3) to between two other neighbours within
  // kWindow, in either orientation; the best such move for the first len that has one.
  bool or_opt(std::ptrdiff_t i) {
    for (std::ptrdiff_t len = 1; len <= 3 && i + len <= n_; ++len) {
      const std::ptrdiff_t e = i + len - 1;
      std::int64_t rem = 0;  // removal gain
      if (i > 0) rem += dist(at(i - 1), at(i));
      if (e + 1 < n_) rem += dist(at(e), at(e + 1));
      if (i > 0 && e + 1 < n_) rem -= dist(at(i - 1), at(e + 1));
      if (rem <= 0) continue;
      std::int64_t best_delta = 0;
      std::ptrdiff_t best_k = -2;
      bool best_rev = false;
      // Insertion between k and k+1 (k = -1: at the front; k = n-1: at the back), outside the segment.
      const std::ptrdiff_t lo = std::max<std::ptrdiff_t>(-1, i - kWindow);
      const std::ptrdiff_t hi = std::min<std::ptrdiff_t>(n_ - 1, e + kWindow);
      for (std::ptrdiff_t k = lo; k <= hi; ++k) {
        if (k >= i - 1 && k <= e) continue;
        const Pt* a = k >= 0 ? &at(k) : nullptr;
        const Pt* b = k + 1 < n_ ? &at(k + 1) : nullptr;
        const std::int64_t ab = a && b ? dist(*a, *b) : 0;
        for (int rev = 0; rev < 2; ++rev) {
          const Pt& first = rev ? at(e) : at(i);
          const Pt& last = rev ? at(i) : at(e);
          std::int64_t add = -ab;
          if (a) add += dist(*a, first);
          if (b) add += dist(last, *b);
          const std::int64_t delta = add - rem;
          if (delta < best_delta) {
            best_delta = delta;
            best_k = k;
            best_rev = rev != 0;
          }
        }
      }
      if (best_k == -2) continue;
      // Apply in place: orient the segment, then rotate it to just after best_k.
      if (best_rev) {
        std::reverse(p_.begin() + i, p_.begin() + e + 1);
        std::reverse(ids_.begin() + i, ids_.begin() + e + 1);
      }
      if (best_k < i) {  // segment moves left: [k+1, i) shifts right by len
        std::rotate(p_.begin() + best_k + 1, p_.begin() + i, p_.begin() + e + 1);
        std::rotate(ids_.begin() + best_k + 1, ids_.begin() + i, ids_.begin() + e + 1);
        touched(best_k, best_k + len + 1);
        touched(e, e + 1);
      } else {  // segment moves right: (e, k] shifts left by len
        std::rotate(p_.begin() + i, p_.begin() + e + 1, p_.begin() + best_k + 1);
        std::rotate(ids_.begin() + i, ids_.begin() + e + 1, ids_.begin() + best_k + 1);
        touched(i - 1, i);
        touched(best_k - len, best_k + 1);
      }
      return true;
    }
    return false;
  }

  std::vector<Pt>& p_;
  std::vector<std::uint32_t>& ids_;
  std::ptrdiff_t n_;
  std::vector<char> look_;
};

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
  PathSearch(p, ids).run();
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
