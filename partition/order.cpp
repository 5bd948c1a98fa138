// Encoder-decoder sample order: sort, then 2-opt and Or-opt local search on the open L1 path.
#include <algorithm>
#include <cstdlib>
#include <limits>
#include <numeric>

#include "common/errors.h"
#include "common/target_clones.h"
#include "partition/partition.h"

namespace packpipe::partition {


namespace {

// Neighbourhood of the moves: positions within this distance of each other (bounded work on
// large batches; the sorted start already places near points near each other).
constexpr std::ptrdiff_t kWindow = 48;
// Lengths from here on are not searched (the sums of the kernels would overflow int32).
constexpr std::uint32_t kMaxCoordinate = 1u << 28;

// Coordinates are integers below 2^28, held in int32 (no sum below overflows). Branch-free so
// that the kernels vectorise (AVX2 clone where available: eight lanes).
inline std::int32_t iabs(std::int32_t v) { return v < 0 ? -v : v; }

// Smallest Or-opt insertion cost over the interior gaps k in [k0, k1] (between points k and
// k + 1) of the segment with end points (fx, fy) and (lx, ly), in either orientation:
// min over k of d(a, first) + d(last, b) - d(a, b).
PACKPIPE_TARGET_CLONES
std::int32_t min_insertion(const std::int32_t* x, const std::int32_t* y, std::ptrdiff_t k0, std::ptrdiff_t k1,
                           std::int32_t fx, std::int32_t fy, std::int32_t lx, std::int32_t ly) {
  std::int32_t best = std::numeric_limits<std::int32_t>::max();
  for (std::ptrdiff_t k = k0; k <= k1; ++k) {
    const std::int32_t ax = x[k], ay = y[k], bx = x[k + 1], by = y[k + 1];
    const std::int32_t ab = iabs(ax - bx) + iabs(ay - by);
    const std::int32_t fwd = iabs(ax - fx) + iabs(ay - fy) + iabs(lx - bx) + iabs(ly - by);
    const std::int32_t rev = iabs(ax - lx) + iabs(ay - ly) + iabs(fx - bx) + iabs(fy - by);
    const std::int32_t v = (fwd < rev ? fwd : rev) - ab;
    best = v < best ? v : best;
  }
  return best;
}

// Least 2-opt gain term over j in [j0, j1] (all with a point j + 1): reversing [i, j] replaces
// edges (i-1, i) and (j, j+1) by (i-1, j) and (i, j+1); the edge at i - 1 counts only when
// `prev` (i > 0). Returns min over j of after - before.
PACKPIPE_TARGET_CLONES
std::int32_t min_two_opt(const std::int32_t* x, const std::int32_t* y, std::ptrdiff_t i, std::ptrdiff_t j0,
                         std::ptrdiff_t j1, bool prev) {
  const std::int32_t px = prev ? x[i - 1] : 0, py = prev ? y[i - 1] : 0, w = prev ? 1 : 0;
  const std::int32_t ix = x[i], iy = y[i];
  const std::int32_t before_i = prev ? iabs(px - ix) + iabs(py - iy) : 0;
  std::int32_t best = std::numeric_limits<std::int32_t>::max();
  for (std::ptrdiff_t j = j0; j <= j1; ++j) {
    const std::int32_t jx = x[j], jy = y[j], nx = x[j + 1], ny = y[j + 1];
    const std::int32_t before = before_i + (iabs(jx - nx) + iabs(jy - ny));
    const std::int32_t after = w * (iabs(px - jx) + iabs(py - jy)) + (iabs(ix - nx) + iabs(iy - ny));
    const std::int32_t v = after - before;
    best = v < best ? v : best;
  }
  return best;
}

// Local search with don't-look bits: a position is examined again only after a move changed an
// edge at it, so a pass after the first costs time in proportion to the moves made, not to n.
// Points are kept as coordinate arrays beside the sample ids.
class PathSearch {
 public:
  using T = std::int32_t;
  PathSearch(std::vector<T>& x, std::vector<T>& y, std::vector<std::uint32_t>& ids)
      : x_(x), y_(y), ids_(ids), n_(static_cast<std::ptrdiff_t>(ids.size())), look_(ids.size(), 1) {}

  // Until no position is flagged (each move shortens the path by at least 1), or 50 n moves.
  // Don't-look bits come back only to the ends of a changed edge, so a move that a change enables
  // from further left can be missed: the result is not always a full 2-opt / Or-opt local optimum
  // (a final full pass until nothing moves finds those, at twice the time, for a 2% shorter path
  // and partition objectives within about 1% either way: not worth it).
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
  T d(std::ptrdiff_t a, std::ptrdiff_t b) const {
    return iabs(x_[static_cast<std::size_t>(a)] - x_[static_cast<std::size_t>(b)]) +
           iabs(y_[static_cast<std::size_t>(a)] - y_[static_cast<std::size_t>(b)]);
  }
  static constexpr T kNone = std::numeric_limits<T>::max();
  // The edges around positions [lo, hi] changed: their end points look again (classic
  // don't-look bits; points inside a reversed or shifted run keep their neighbours).
  void touched(std::ptrdiff_t lo, std::ptrdiff_t hi) {
    const std::ptrdiff_t a = std::max<std::ptrdiff_t>(0, lo), b = std::min<std::ptrdiff_t>(n_ - 1, hi);
    for (std::ptrdiff_t k = a; k <= b; ++k) look_[static_cast<std::size_t>(k)] = 1;
  }
  void reverse(std::ptrdiff_t a, std::ptrdiff_t b) {  // positions [a, b]
    std::reverse(x_.begin() + a, x_.begin() + b + 1);
    std::reverse(y_.begin() + a, y_.begin() + b + 1);
    std::reverse(ids_.begin() + a, ids_.begin() + b + 1);
  }
  void rotate(std::ptrdiff_t first, std::ptrdiff_t middle, std::ptrdiff_t last) {  // std::rotate on [first, last)
    std::rotate(x_.begin() + first, x_.begin() + middle, x_.begin() + last);
    std::rotate(y_.begin() + first, y_.begin() + middle, y_.begin() + last);
    std::rotate(ids_.begin() + first, ids_.begin() + middle, ids_.begin() + last);
  }

  // 2-opt on an open path with left end i: reverse p[i..j]; the ends have no outer edge.
  bool two_opt(std::ptrdiff_t i) {
    if (i + 1 >= n_) return false;
    const std::ptrdiff_t jmax = std::min(n_ - 1, i + kWindow);
    // Skip the scan when no j improves (the usual case): the interior j by a vectorised minimum,
    // the path's end (j = n - 1) below.
    const std::ptrdiff_t j1 = std::min(jmax, n_ - 2);
    const bool end_in_reach = jmax == n_ - 1;
    if (!end_in_reach && !(i + 1 <= j1 && min_two_opt(x_.data(), y_.data(), i, i + 1, j1, i > 0) < 0)) return false;
    for (std::ptrdiff_t j = i + 1; j <= jmax; ++j) {
      T before = 0, after = 0;
      if (i > 0) {
        before += d(i - 1, i);
        after += d(i - 1, j);
      }
      if (j + 1 < n_) {
        before += d(j, j + 1);
        after += d(i, j + 1);
      }
      if (after < before) {
        reverse(i, j);
        touched(i - 1, i);
        touched(j, j + 1);
        return true;
      }
    }
    return false;
  }

  // Cost of inserting the segment [i, e] between k and k + 1 (k = -1: at the front; k = n - 1: at
  // the back), reversed or not.
  T insertion(std::ptrdiff_t k, std::ptrdiff_t i, std::ptrdiff_t e, bool rev) const {
    const std::ptrdiff_t first = rev ? e : i, last = rev ? i : e;
    T add = 0;
    if (k >= 0) add += d(k, first);
    if (k + 1 < n_) add += d(last, k + 1);
    if (k >= 0 && k + 1 < n_) add -= d(k, k + 1);
    return add;
  }

  // Or-opt: move the segment p[i..i+len-1] (len 1-3) to between two other neighbours within
  // kWindow, in either orientation; the best such move (the first in (k, orientation) order among
  // equals) for the first len that has one.
  bool or_opt(std::ptrdiff_t i) {
    for (std::ptrdiff_t len = 1; len <= 3 && i + len <= n_; ++len) {
      const std::ptrdiff_t e = i + len - 1;
      T rem = 0;  // removal gain
      if (i > 0) rem += d(i - 1, i);
      if (e + 1 < n_) rem += d(e, e + 1);
      if (i > 0 && e + 1 < n_) rem -= d(i - 1, e + 1);
      if (rem <= 0) continue;
      const std::ptrdiff_t lo = std::max<std::ptrdiff_t>(-1, i - kWindow);
      const std::ptrdiff_t hi = std::min<std::ptrdiff_t>(n_ - 1, e + kWindow);
      // The least insertion cost: interior gaps left and right of the segment (vectorised), and
      // the two path ends when in reach.
      const T fx = x_[static_cast<std::size_t>(i)], fy = y_[static_cast<std::size_t>(i)];
      const T lx = x_[static_cast<std::size_t>(e)], ly = y_[static_cast<std::size_t>(e)];
      T best = kNone;
      const std::ptrdiff_t l0 = std::max<std::ptrdiff_t>(0, lo), l1 = std::min(i - 2, n_ - 2);
      if (l0 <= l1) best = std::min(best, min_insertion(x_.data(), y_.data(), l0, l1, fx, fy, lx, ly));
      const std::ptrdiff_t r0 = e + 1, r1 = std::min(hi, n_ - 2);
      if (r0 <= r1) best = std::min(best, min_insertion(x_.data(), y_.data(), r0, r1, fx, fy, lx, ly));
      if (lo == -1 && i > 0) best = std::min({best, insertion(-1, i, e, false), insertion(-1, i, e, true)});
      if (hi == n_ - 1 && hi > e) best = std::min({best, insertion(hi, i, e, false), insertion(hi, i, e, true)});
      if (!(best - rem < 0)) continue;
      // The first (k, orientation) that reaches it.
      std::ptrdiff_t best_k = -2;
      bool best_rev = false;
      for (std::ptrdiff_t k = lo; k <= hi && best_k == -2; ++k) {
        if (k >= i - 1 && k <= e) continue;
        for (int rev = 0; rev < 2; ++rev) {
          if (insertion(k, i, e, rev != 0) == best) {
            best_k = k;
            best_rev = rev != 0;
            break;
          }
        }
      }
      PACKPIPE_ASSERT(best_k != -2);
      // Apply in place: orient the segment, then rotate it to just after best_k.
      if (best_rev) reverse(i, e);
      if (best_k < i) {  // segment moves left: [k+1, i) shifts right by len
        rotate(best_k + 1, i, e + 1);
        touched(best_k, best_k + len + 1);
        touched(e, e + 1);
      } else {  // segment moves right: (e, k] shifts left by len
        rotate(i, e + 1, best_k + 1);
        touched(i - 1, i);
        touched(best_k - len, best_k + 1);
      }
      return true;
    }
    return false;
  }

  std::vector<T>& x_;
  std::vector<T>& y_;
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
  const std::uint32_t top = std::max(*std::max_element(input.begin(), input.end()),
                                     *std::max_element(target.begin(), target.end()));
  if (top >= kMaxCoordinate) return ids;  // beyond the kernels' exact range: the sorted order
  std::vector<std::int32_t> x(ids.size()), y(ids.size());
  for (std::size_t k = 0; k < ids.size(); ++k) {
    x[k] = static_cast<std::int32_t>(input[ids[k]]);
    y[k] = static_cast<std::int32_t>(target[ids[k]]);
  }
  PathSearch(x, y, ids).run();
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

}  // namespace packpipe::partition
