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
  /// one dimension (b = 0 everywhere) it never backtracks: O(log rows). Rows met on the way with
  /// room below (min_a, min_b), the smallest lengths still to place, are closed: they can take
  /// nothing more, and closing them keeps the two-dimensional search from revisiting them.
  std::uint64_t first_fit(std::int64_t a, std::int64_t b, std::int64_t min_a = 0, std::int64_t min_b = 0) {
    a_ = a;
    b_ = b;
    min_a_ = min_a;
    min_b_ = min_b;
    return find(1);
  }

 private:
  std::uint64_t find(std::uint64_t node) {
    if (ra_[node] < a_ || rb_[node] < b_) {
      if (node >= size_ && ra_[node] >= 0 && (ra_[node] < min_a_ || rb_[node] < min_b_)) set(node - size_, -1, -1);
      return kNone;
    }
    if (node >= size_) return node - size_;
    const std::uint64_t left = find(2 * node);
    return left != kNone ? left : find(2 * node + 1);
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
  std::int64_t a_ = 0, b_ = 0, min_a_ = 0, min_b_ = 0;
};

}  // namespace packpipe::packing::detail
