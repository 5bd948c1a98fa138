// Private to scheduler/: a tiny deterministic generator (splitmix64) for seeded choices in the
// schedule search; no std:: distributions, so results are identical on every platform.
#pragma once

#include <cstdint>
#include <vector>

namespace packpipe::scheduler::detail {

class SplitMix64 {
 public:
  explicit SplitMix64(std::uint64_t seed) : state_(seed) {}
  std::uint64_t next() {
    std::uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  /// Uniform in [0, n) (n > 0; the modulo bias is irrelevant for the small n used here).
  std::uint64_t below(std::uint64_t n) { return next() % n; }

 private:
  std::uint64_t state_;
};

/// Fisher-Yates shuffle of v[lo, hi).
template <class T>
void shuffle_range(std::vector<T>& v, std::size_t lo, std::size_t hi, SplitMix64& rng) {
  for (std::size_t i = hi; i > lo + 1; --i) {
    const std::size_t j = lo + static_cast<std::size_t>(rng.below(i - lo));
    std::swap(v[i - 1], v[j]);
  }
}

}  // namespace packpipe::scheduler::detail
