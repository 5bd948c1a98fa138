// Order statistics of small samples: the one median and quantile of packpipe's reports and fits.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

namespace packpipe {

/// Median of `v` (the mean of the two middle values for an even count); 0 when empty.
inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/// Quantile `q` in [0, 1] of the ascending `v`, linear between order statistics; 0 when empty.
inline double quantile_sorted(const std::vector<double>& v, double q) {
  if (v.empty()) return 0;
  const double h = q * static_cast<double>(v.size() - 1);
  const auto lo = static_cast<std::size_t>(std::floor(h));
  if (lo + 1 >= v.size()) return v.back();
  return v[lo] + (h - static_cast<double>(lo)) * (v[lo + 1] - v[lo]);
}

/// quantile_sorted of `v` in any order.
inline double quantile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return quantile_sorted(v, q);
}

}  // namespace packpipe
