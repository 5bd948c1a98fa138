// Hierarchical bitset over [0, n): set / reset / next set bit at or after x / previous set bit at
// or before x in O(log64 n). Internal to packing (rooms indexed by remaining space).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace packpipe::packing::detail {

class BitTree {
 public:
  static constexpr std::uint64_t kNone = ~std::uint64_t{0};

  explicit BitTree(std::uint64_t n) {
    std::uint64_t words = (n + 63) / 64;
    if (words == 0) words = 1;
    for (;;) {
      levels_.emplace_back(words, 0);
      if (words == 1) break;
      words = (words + 63) / 64;
    }
  }

  void set(std::uint64_t i) {
    for (auto& level : levels_) {
      const std::uint64_t before = level[i >> 6];
      level[i >> 6] = before | (std::uint64_t{1} << (i & 63));
      if (before != 0) return;  // upper levels already mark this word
      i >>= 6;
    }
  }

  void reset(std::uint64_t i) {
    for (auto& level : levels_) {
      level[i >> 6] &= ~(std::uint64_t{1} << (i & 63));
      if (level[i >> 6] != 0) return;
      i >>= 6;
    }
  }

  bool test(std::uint64_t i) const { return (levels_[0][i >> 6] >> (i & 63)) & 1; }

  /// Smallest set index >= x, or kNone.
  std::uint64_t next(std::uint64_t x) const {
    std::size_t l = 0;
    std::uint64_t i = x;
    // climb until a word holds a set bit at or after position i
    for (;;) {
      if (l == levels_.size()) return kNone;
      const std::uint64_t w = i >> 6;
      if (w < levels_[l].size()) {
        const std::uint64_t bits = levels_[l][w] & (~std::uint64_t{0} << (i & 63));
        if (bits != 0) {
          i = (w << 6) | static_cast<std::uint64_t>(__builtin_ctzll(bits));
          break;
        }
      }
      i = w + 1;
      ++l;
      if (l < levels_.size() && (i >> 6) >= levels_[l].size()) return kNone;
    }
    // descend to the lowest set bit below it
    while (l > 0) {
      --l;
      i = (i << 6) | static_cast<std::uint64_t>(__builtin_ctzll(levels_[l][i]));
    }
    return i;
  }

  /// Largest set index <= x, or kNone.
  std::uint64_t prev(std::uint64_t x) const {
    std::size_t l = 0;
    std::uint64_t i = x;
    for (;;) {
      if (l == levels_.size()) return kNone;
      const std::uint64_t w = i >> 6;
      const std::uint64_t b = i & 63;
      const std::uint64_t mask = b == 63 ? ~std::uint64_t{0} : ((std::uint64_t{1} << (b + 1)) - 1);
      const std::uint64_t bits = levels_[l][w] & mask;
      if (bits != 0) {
        i = (w << 6) | static_cast<std::uint64_t>(63 - __builtin_clzll(bits));
        break;
      }
      if (w == 0) return kNone;
      i = w - 1;
      ++l;
    }
    while (l > 0) {
      --l;
      i = (i << 6) | static_cast<std::uint64_t>(63 - __builtin_clzll(levels_[l][i]));
    }
    return i;
  }

 private:
  std::vector<std::vector<std::uint64_t>> levels_;  // level 0: the bits; level k+1: non-empty words of level k
};

}  // namespace packpipe::packing::detail
