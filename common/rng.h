// splitmix64: the one deterministic generator and 64-bit mixer of packpipe (seeded choices in the
// schedule search, the sampler's keyed permutations, synthetic test data). No std:: distributions,
// so results are identical on every platform and standard library.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace packpipe {

/// splitmix64's increment (the golden ratio in 64 bits).
constexpr std::uint64_t kSplitMixGamma = 0x9E3779B97F4A7C15ull;

/// splitmix64's finaliser: a bijective 64-bit mixer with full avalanche.
constexpr std::uint64_t mix64(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/// Two words into one: mix64(a ^ mix64(b + gamma)); order-sensitive.
constexpr std::uint64_t mix_combine(std::uint64_t a, std::uint64_t b) { return mix64(a ^ mix64(b + kSplitMixGamma)); }

/// The splitmix64 stream: state += gamma, output mix64(state). Not thread-safe; cheap to copy.
class SplitMix64 {
 public:
  explicit SplitMix64(std::uint64_t seed) : state_(seed) {}
  /// Next 64 random bits.
  std::uint64_t next() { return mix64(state_ += kSplitMixGamma); }
  /// Uniform in [0, n) (n > 0; the modulo bias is irrelevant for the small n used here).
  std::uint64_t below(std::uint64_t n) { return next() % n; }
  /// Uniform in [lo, hi] (lo <= hi).
  std::int64_t uniform(std::int64_t lo, std::int64_t hi) {
    return lo + static_cast<std::int64_t>(below(static_cast<std::uint64_t>(hi - lo) + 1));
  }

 private:
  std::uint64_t state_;
};

/// Fisher-Yates shuffle of v[lo, hi) drawing from `rng`.
template <class T>
void shuffle_range(std::vector<T>& v, std::size_t lo, std::size_t hi, SplitMix64& rng) {
  for (std::size_t i = hi; i > lo + 1; --i) {
    const std::size_t j = lo + static_cast<std::size_t>(rng.below(i - lo));
    std::swap(v[i - 1], v[j]);
  }
}

}  // namespace packpipe
