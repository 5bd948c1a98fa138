// Packing speed and efficiency: every algorithm at 100 k / 1 M / 10 M samples on long-tailed
// (log-normal) lengths at capacities 2048 and 4096 and on the real length distribution of the
// embedded demo data (data/demo, resampled with replacement); two-dimensional packing on demo
// (input, target) pairs. Baseline in the same run: naive first-fit decreasing scanning the rows
// linearly (what TRL does) at 100 k. Counters: samples_per_s, efficiency, rows, lower_bound_rows.
// PACKPIPE_BENCH_SMALL=1: 2 k samples only (CTest smoke run).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include <benchmark/benchmark.h>

#include "dataloader/indexed_dataset.h"
#include "dataloader/manifest.h"
#include "packing/detail/reference.h"
#include "packing/packer.h"

namespace pk = packpipe::packing;
namespace dl = packpipe::dataloader;

namespace {

bool small_mode() { return std::getenv("PACKPIPE_BENCH_SMALL") != nullptr; }

enum Dist { LogNormal2048 = 0, LogNormal4096 = 1, Demo2048 = 2 };
const char* const kDistNames[] = {"lognormal_2048", "lognormal_4096", "demo_2048"};
std::uint64_t dist_capacity(int d) { return d == LogNormal4096 ? 4096 : 2048; }

std::string demo_dir() {
  if (const char* env = std::getenv("PACKPIPE_DEMO_DIR")) return env;
  return std::string(PACKPIPE_SOURCE_DIR) + "/data/demo";
}

/// (input, target) lengths of every demo sample: multitask pairs, and the text dataset (target 0).
const std::vector<std::pair<std::uint32_t, std::uint32_t>>& demo_pairs() {
  static const auto pairs = [] {
    std::vector<std::pair<std::uint32_t, std::uint32_t>> v;
    const std::string dir = demo_dir();
    const dl::Manifest m = dl::load_manifest(dir + "/manifest.json");
    for (const auto& t : m.tasks) {
      for (std::size_t s = 0; s < t.prefixes.size(); ++s) {
        const dl::IndexedDataset in(t.prefixes[s]);
        if (t.target_prefixes.empty()) {
          for (std::uint64_t i = 0; i < in.size(); ++i) v.emplace_back(in.length(i), 0);
        } else {
          const dl::IndexedDataset tg(t.target_prefixes[s]);
          for (std::uint64_t i = 0; i < std::min(in.size(), tg.size()); ++i) v.emplace_back(in.length(i), tg.length(i));
        }
      }
    }
    return v;
  }();
  return pairs;
}

std::uint32_t lognormal(std::mt19937_64& rng, double mu, double sigma, std::uint64_t cap) {
  const double u1 = (static_cast<double>(rng() >> 11) + 1.0) / 9007199254740993.0;
  const double u2 = static_cast<double>(rng() >> 11) / 9007199254740992.0;
  const double z = std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  return static_cast<std::uint32_t>(
      std::min<double>(static_cast<double>(cap), std::max(1.0, std::round(std::exp(mu + sigma * z)))));
}

struct Lengths {
  std::vector<std::uint32_t> a, b;  // b: targets (two-dimensional sets only)
};

/// Lengths of distribution d, n samples; cached. Log-normal: median capacity / 12, sigma 1
/// (mean about 14% of the capacity, long tail clipped at the capacity). Demo 1-D: input + target
/// concatenated (decoder-only), clipped at 2048; demo 2-D: input clipped at 2048, target at 512.
const Lengths& lengths(int d, std::size_t n, bool two_d) {
  static std::map<std::tuple<int, std::size_t, bool>, Lengths> cache;
  auto it = cache.find({d, n, two_d});
  if (it != cache.end()) return it->second;
  Lengths L;
  std::mt19937_64 rng(1234 + static_cast<std::uint64_t>(d));
  L.a.resize(n);
  if (d == Demo2048) {
    const auto& pairs = demo_pairs();
    if (two_d) L.b.resize(n);
    for (std::size_t i = 0; i < n; ++i) {
      const auto& p = pairs[rng() % pairs.size()];
      if (two_d) {
        L.a[i] = std::min<std::uint32_t>(p.first, 2048);
        L.b[i] = std::min<std::uint32_t>(p.second, 512);
      } else {
        L.a[i] = std::min<std::uint32_t>(p.first + p.second, 2048);
      }
    }
  } else {
    const double cap = static_cast<double>(dist_capacity(d));
    for (auto& x : L.a) x = lognormal(rng, std::log(cap / 12.0), 1.0, dist_capacity(d));
  }
  return cache.emplace(std::make_tuple(d, n, two_d), std::move(L)).first->second;
}

void report(benchmark::State& state, const pk::Packing& p, const std::vector<std::uint32_t>& a) {
  std::uint64_t sum = 0;
  for (const auto x : a) sum += x;
  state.counters["samples_per_s"] =
      benchmark::Counter(static_cast<double>(a.size()) * static_cast<double>(state.iterations()),
                         benchmark::Counter::kIsRate);
  state.counters["efficiency"] = p.efficiency();
  state.counters["rows"] = static_cast<double>(p.rows());
  state.counters["lower_bound_rows"] = static_cast<double>((sum + p.capacity - 1) / p.capacity);
}

std::size_t scaled(std::int64_t n) { return static_cast<std::size_t>(small_mode() ? std::min<std::int64_t>(n, 2000) : n); }
std::int64_t k100() { return small_mode() ? 2000 : 100000; }

void BM_Pack(benchmark::State& state) {
  const auto alg = static_cast<pk::Algorithm>(state.range(0));
  const int d = static_cast<int>(state.range(1));
  const Lengths& L = lengths(d, scaled(state.range(2)), false);
  pk::PackOptions o;
  o.algorithm = alg;
  o.capacity = dist_capacity(d);
  state.SetLabel(std::string(pk::algorithm_name(alg)) + "/" + kDistNames[d]);
  pk::Packing p;
  for (auto _ : state) {
    p = pk::pack(L.a.data(), L.a.size(), o);
    benchmark::DoNotOptimize(p.samples.data());
  }
  report(state, p, L.a);
}

void BM_Pack2D(benchmark::State& state) {
  const auto alg = static_cast<pk::Algorithm>(state.range(0));
  const Lengths& L = lengths(Demo2048, scaled(state.range(1)), true);
  pk::PackOptions o;
  o.algorithm = alg;
  o.capacity = 2048;
  o.target_capacity = 512;
  state.SetLabel(std::string(pk::algorithm_name(alg)) + "/demo_2048x512");
  pk::Packing p;
  for (auto _ : state) {
    p = pk::pack(L.a.data(), L.a.size(), o, L.b.data());
    benchmark::DoNotOptimize(p.samples.data());
  }
  report(state, p, L.a);
  std::uint64_t target_sum = 0;
  for (const auto x : L.b) target_sum += x;
  state.counters["target_lower_bound_rows"] = static_cast<double>((target_sum + 511) / 512);
  state.counters["target_efficiency"] = [&] {
    double t = 0;
    for (const auto x : p.row_target_tokens) t += static_cast<double>(x);
    return p.rows() ? t / (static_cast<double>(p.rows()) * 512.0) : 0.0;
  }();
}

/// Baseline: first-fit decreasing scanning every open row (TRL's packing), same sort.
void BM_NaiveFFD(benchmark::State& state) {
  const int d = static_cast<int>(state.range(0));
  const Lengths& L = lengths(d, scaled(state.range(1)), false);
  state.SetLabel(std::string("naive_ffd/") + kDistNames[d]);
  pk::Packing p;
  for (auto _ : state) {
    p = pk::detail::naive_pack(L.a.data(), nullptr, L.a.size(), dist_capacity(d), 0, pk::detail::Fit::First);
    benchmark::DoNotOptimize(p.samples.data());
  }
  report(state, p, L.a);
}

void pack_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"alg", "dist", "n"});
  const std::vector<std::int64_t> sizes = small_mode() ? std::vector<std::int64_t>{2000}
                                                       : std::vector<std::int64_t>{100000, 1000000, 10000000};
  for (int d = 0; d < 3; ++d) {
    for (const auto n : sizes) {
      for (int alg = 0; alg < 3; ++alg) b->Args({alg, d, n});
    }
  }
  b->Unit(benchmark::kMillisecond);
}

}  // namespace

BENCHMARK(BM_NaiveFFD)->ArgNames({"dist", "n"})->Args({0, k100()})->Args({1, k100()})->Args({2, k100()})->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Pack)->Apply(pack_args);
BENCHMARK(BM_Pack2D)
    ->ArgNames({"alg", "n"})
    ->Args({0, k100()})
    ->Args({1, k100()})
    ->Args({0, 10 * k100()})
    ->Args({1, 10 * k100()})
    ->Unit(benchmark::kMillisecond);
