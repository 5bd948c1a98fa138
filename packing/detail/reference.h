// Naive reference packers: linear scans over the open rows, O(n x rows). They are the baseline
// of the packing benchmark (TRL-style first-fit decreasing) and the independent reference of the
// packing tests; never used by the library. Same placement order as pack(): decreasing length
// (max normalized length in two dimensions, then the normalized sum), ties by sample index.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <vector>

#include "packing/packer.h"

namespace packpipe::packing::detail {

enum class Fit { First, Best, Worst };

/// Naive first fit, best fit by least combined normalized room left (ties: the smaller input room
/// left, then the lowest row index) or worst fit (one dimension: most room left, ties lowest row
/// index), in one or two dimensions (b null: one).
inline Packing naive_pack(const std::uint32_t* a, const std::uint32_t* b, std::size_t n, std::uint64_t A,
                          std::uint64_t B, Fit fit) {
  __extension__ typedef unsigned __int128 u128;
  std::vector<std::uint32_t> ids(n);
  std::iota(ids.begin(), ids.end(), 0u);
  auto bl = [&](std::uint32_t i) -> std::uint64_t { return b != nullptr ? b[i] : 0; };
  const std::uint64_t Bn = b != nullptr ? B : 1;
  std::stable_sort(ids.begin(), ids.end(), [&](std::uint32_t x, std::uint32_t y) {
    // max(a/A, b/B) compared exactly: x's max > y's max
    auto maxfrac_gt = [&](std::uint64_t ax, std::uint64_t bx, std::uint64_t ay, std::uint64_t by) {
      const u128 mx_num_a = u128{ax} * Bn, mx_num_b = u128{bx} * A;  // over A*Bn
      const u128 my_num_a = u128{ay} * Bn, my_num_b = u128{by} * A;
      const u128 mx = std::max(mx_num_a, mx_num_b), my = std::max(my_num_a, my_num_b);
      if (mx != my) return mx > my ? 1 : -1;
      return 0;
    };
    const int c = maxfrac_gt(a[x], bl(x), a[y], bl(y));
    if (c != 0) return c > 0;
    const u128 sx = u128{a[x]} * Bn + u128{bl(x)} * A, sy = u128{a[y]} * Bn + u128{bl(y)} * A;
    return sx > sy;
  });
  std::vector<std::vector<std::uint32_t>> rows;
  std::vector<std::uint64_t> ua, ub;
  for (const std::uint32_t i : ids) {
    std::size_t chosen = rows.size();
    u128 best = ~u128{0};
    for (std::size_t r = 0; r < rows.size(); ++r) {
      if (ua[r] + a[i] > A || ub[r] + bl(i) > (b != nullptr ? B : 0)) continue;
      if (fit == Fit::First) {
        chosen = r;
        break;
      }
      if (fit == Fit::Worst) {
        if (chosen == rows.size() || ua[r] < ua[chosen]) chosen = r;
        continue;
      }
      const u128 score = u128{A - ua[r] - a[i]} * Bn + u128{(b != nullptr ? B : 0) - ub[r] - bl(i)} * A;
      if (score < best || (score == best && ua[r] > ua[chosen])) {
        best = score;
        chosen = r;
      }
    }
    if (chosen == rows.size()) {
      rows.emplace_back();
      ua.push_back(0);
      ub.push_back(0);
    }
    rows[chosen].push_back(i);
    ua[chosen] += a[i];
    ub[chosen] += bl(i);
  }
  Packing p;
  p.capacity = A;
  p.target_capacity = b != nullptr ? B : 0;
  p.row_offsets.push_back(0);
  for (std::size_t r = 0; r < rows.size(); ++r) {
    p.samples.insert(p.samples.end(), rows[r].begin(), rows[r].end());
    p.row_offsets.push_back(p.samples.size());
    p.row_tokens.push_back(ua[r]);
    if (b != nullptr) p.row_target_tokens.push_back(ub[r]);
  }
  return p;
}

}  // namespace packpipe::packing::detail
