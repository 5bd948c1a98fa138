// Sampler throughput and memory: 100 M samples in 10 tasks (1 M with PACKPIPE_BENCH_SMALL=1),
// token-budget batches of 64 Ki tokens. The sampler's own state is O(tasks); the lengths array is
// data and is reported separately.
#include <benchmark/benchmark.h>

#include <sys/resource.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "dataloader/sampler.h"

namespace {

using namespace packpipe::dataloader;

/// In-memory lengths, uint16 per sample, log-normal-like in [1, 4096] (mean about 400).
class InMemorySource : public SampleSource {
 public:
  InMemorySource(std::size_t tasks, std::uint64_t total) {
    lengths_.resize(tasks);
    std::uint64_t state = 0x853c49e6748fea9bULL;
    for (std::size_t t = 0; t < tasks; ++t) {
      // Uneven task sizes: task t gets a share proportional to t + 1.
      const std::uint64_t n = total * (t + 1) * 2 / (tasks * (tasks + 1));
      lengths_[t].resize(t + 1 == tasks ? total - assigned_ : n);
      assigned_ += lengths_[t].size();
      for (auto& l : lengths_[t]) {
        state = state * 6364136223846793005ULL + 1442695040888963407ULL;
        // Product of two uniforms in (0, 64]: skewed towards short samples like real data.
        const std::uint32_t a = static_cast<std::uint32_t>(state >> 58) + 1;
        const std::uint32_t b = static_cast<std::uint32_t>((state >> 52) & 63) + 1;
        l = static_cast<std::uint16_t>(a * b);
      }
    }
  }
  std::size_t num_tasks() const override { return lengths_.size(); }
  std::uint64_t task_size(std::size_t t) const override { return lengths_[t].size(); }
  std::uint64_t sample_tokens(std::size_t t, std::uint64_t i) const override { return lengths_[t][i]; }
  std::uint64_t bytes() const { return assigned_ * sizeof(std::uint16_t); }

 private:
  std::vector<std::vector<std::uint16_t>> lengths_;
  std::uint64_t assigned_ = 0;
};

bool small() {
  const char* v = std::getenv("PACKPIPE_BENCH_SMALL");
  return v != nullptr && std::strcmp(v, "0") != 0 && v[0] != '\0';
}

std::uint64_t num_samples() { return small() ? 1000000ULL : 100000000ULL; }

const InMemorySource& source() {
  static const InMemorySource src(10, num_samples());
  return src;
}

double peak_rss_mib() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_maxrss) / 1024.0;  // Linux: KiB
}

double current_rss_mib() {
  long pages = 0, resident = 0;
  if (FILE* f = std::fopen("/proc/self/statm", "r")) {
    if (std::fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
    std::fclose(f);
  }
  return static_cast<double>(resident) * static_cast<double>(sysconf(_SC_PAGESIZE)) / (1024.0 * 1024.0);
}

SamplerConfig config(bool weighted) {
  SamplerConfig c;
  c.seed = 1234;
  c.global_batch_tokens = 64 * 1024;
  if (weighted) c.weights = {1, 2, 3, 4, 5, 5, 4, 3, 2, 1};
  return c;
}

// Samples per second through next_batch, wrapping to the next epoch when one ends.
void BM_SamplerNextBatch(benchmark::State& state) {
  const auto& src = source();
  Sampler sampler(src, config(state.range(0) != 0));
  GlobalBatch batch;
  std::uint64_t samples = 0, tokens = 0;
  for (auto _ : state) {
    if (!sampler.next_batch(batch)) {
      sampler.set_epoch(sampler.epoch() + 1);
      sampler.next_batch(batch);
    }
    samples += batch.samples.size();
    tokens += batch.tokens;
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(samples));
  state.counters["samples/s"] = benchmark::Counter(static_cast<double>(samples), benchmark::Counter::kIsRate);
  state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(tokens), benchmark::Counter::kIsRate);
  state.counters["samples/batch"] = static_cast<double>(samples) / static_cast<double>(state.iterations());
}
BENCHMARK(BM_SamplerNextBatch)->Arg(0)->Arg(1)->ArgName("weighted");

// One full epoch; peak RSS of the process afterwards and its growth during the epoch.
void BM_SamplerFullEpoch(benchmark::State& state) {
  const auto& src = source();
  const double rss_before = current_rss_mib();
  const double peak_before = peak_rss_mib();
  std::uint64_t samples = 0, batches = 0;
  for (auto _ : state) {
    Sampler sampler(src, config(false));
    GlobalBatch batch;
    while (sampler.next_batch(batch)) {
      samples += batch.samples.size();
      ++batches;
    }
    benchmark::DoNotOptimize(batch);
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(samples));
  state.counters["samples/s"] = benchmark::Counter(static_cast<double>(samples), benchmark::Counter::kIsRate);
  state.counters["epoch_samples"] = static_cast<double>(num_samples());
  state.counters["batches"] = static_cast<double>(batches) / static_cast<double>(state.iterations());
  state.counters["lengths_MiB"] = static_cast<double>(src.bytes()) / (1024.0 * 1024.0);
  state.counters["peak_rss_MiB"] = peak_rss_mib();
  state.counters["peak_rss_growth_MiB"] = peak_rss_mib() - peak_before;
  state.counters["rss_growth_MiB"] = current_rss_mib() - rss_before;
}
BENCHMARK(BM_SamplerFullEpoch)->Iterations(1)->Unit(benchmark::kMillisecond);

// Random access: the sample at an arbitrary epoch position (checkpoint resume, inspection).
void BM_SamplerAt(benchmark::State& state) {
  const auto& src = source();
  Sampler sampler(src, config(true));
  std::uint64_t pos = 0;
  const std::uint64_t n = sampler.epoch_size();
  for (auto _ : state) {
    benchmark::DoNotOptimize(sampler.at(pos));
    pos += 0x9e3779b9ULL;
    if (pos >= n) pos %= n;
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations()));
}
BENCHMARK(BM_SamplerAt);

// Raw permutation evaluations.
void BM_Permutation(benchmark::State& state) {
  const Permutation p(static_cast<std::uint64_t>(state.range(0)), 42);
  std::uint64_t i = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(p(i));
    if (++i == p.size()) i = 0;
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations()));
}
// Worst case (just above a power of 4: about 4 Feistel passes per call) and best case.
BENCHMARK(BM_Permutation)->Arg((1 << 20) + 1)->Arg(1 << 20);

}  // namespace
