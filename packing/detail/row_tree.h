// Segment tree over rows holding each row's remaining room in both dimensions; finds the
// leftmost row where a sample fits (first fit). Internal to packing.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace packpipe::packing::detail {

class RowTree {
 public:
  static constexpr std::uint64_t kNone = ~std::uint64_t{0};

  RowTree() { resize(1024); }

  /// Sets row `row`'s remaining room (a, b); -1 closes the row. Grows the tree as rows appear.
  void set(std::uint64_t row, std::int64_t a, std::int64_t b) {
    if (row >= size_) resize(std::max<std::uint64_t>(size_ * 2, row + 1));
    std::uint64_t i = row + size_;
    ra_[i] = a;
    rb_[i] = b;
    for (i >>= 1; i >= 1; i >>= 1) {
      const std::int64_t na = std::max(ra_[2 * i], ra_[2 * i + 1]);
      const std::int64_t nb = std::max(rb_[2 * i], rb_[2 * i + 1]);
      if (na == ra_[i] && nb == rb_[i]) break;  // nothing above changes
      ra_[i] = na;
      rb_[i] = nb;
    }
  }

  /// Leftmost row with room >= (a, b) in both dimensions, or kNone. Exact in both dimensions; in
  /// one dimension (b = 0 everywhere) it never backtracks: O(log rows).
  std::uint64_t first_fit(std::int64_t a, std::int64_t b) const { return find(1, a, b); }

 private:
  std::uint64_t find(std::uint64_t node, std::int64_t a, std::int64_t b) const {
    if (ra_[node] < a || rb_[node] < b) return kNone;
    if (node >= size_) return node - size_;
    const std::uint64_t left = find(2 * node, a, b);
    return left != kNone ? left : find(2 * node + 1, a, b);
  }

  void resize(std::uint64_t leaves) {
    std::uint64_t size = 1;
    while (size < leaves) size *= 2;
    std::vector<std::int64_t> ra(2 * size, -1), rb(2 * size, -1);
    for (std::uint64_t r = 0; r < size_; ++r) {
      ra[size + r] = ra_[size_ + r];
      rb[size + r] = rb_[size_ + r];
    }
    for (std::uint64_t i = size - 1; i >= 1; --i) {
      ra[i] = std::max(ra[2 * i], ra[2 * i + 1]);
      rb[i] = std::max(rb[2 * i], rb[2 * i + 1]);
    }
    ra_.swap(ra);
    rb_.swap(rb);
    size_ = size;
  }

  std::uint64_t size_ = 0;
  std::vector<std::int64_t> ra_, rb_;
};

}  // namespace packpipe::packing::detail
