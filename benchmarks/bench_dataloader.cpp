// Dataloader throughput: random sequence reads and GPT-style sample assembly (2,049-token samples
// crossing document boundaries), from `.bin` and from `.bin.zst`, one thread; and the time to open a
// dataset of millions of sequences.
//
// Data: log-normal document lengths (median ~245 tokens, as in the Megatron reader anchor), Zipf
// token ids over a GPT-2-sized vocabulary (so zstd sees text-like redundancy), uint16. Built once
// per process in a temporary folder. PACKPIPE_BENCH_SMALL=1 shrinks it for the CTest smoke run.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <unistd.h>

#include "dataloader/gpt_samples.h"
#include "dataloader/indexed_dataset.h"
#include "dataloader/zstd_seekable.h"

namespace dl = packpipe::dataloader;
namespace fs = std::filesystem;

namespace {

bool small_mode() { return std::getenv("PACKPIPE_BENCH_SMALL") != nullptr; }

struct BenchData {
  fs::path dir;
  std::string prefix_bin;
  std::string prefix_zst;
  std::unique_ptr<dl::IndexedDataset> bin;
  std::unique_ptr<dl::IndexedDataset> zst;

  BenchData() {
    dir = fs::temp_directory_path() / ("packpipe-bench-" + std::to_string(::getpid()));
    fs::create_directories(dir);
    prefix_bin = (dir / "plain").string();
    prefix_zst = (dir / "packed").string();
    const std::size_t docs = small_mode() ? 20000 : 400000;
    std::mt19937_64 rng(7);
    std::lognormal_distribution<double> len(std::log(245.0), 0.9);
    // Zipf(1.1) over 50257 ids via an inverse-CDF table.
    const int vocab = 50257;
    std::vector<double> cdf(vocab);
    double acc = 0;
    for (int r = 0; r < vocab; ++r) cdf[r] = (acc += 1.0 / std::pow(r + 1.0, 1.1));
    for (auto& c : cdf) c /= acc;
    std::uniform_real_distribution<double> u(0, 1);
    dl::IndexedDatasetBuilder b(prefix_bin, dl::DType::UInt16);
    std::vector<std::uint16_t> toks;
    for (std::size_t d = 0; d < docs; ++d) {
      const auto n = static_cast<std::size_t>(std::clamp(len(rng), 8.0, 8192.0));
      toks.resize(n);
      for (auto& t : toks) {
        t = static_cast<std::uint16_t>(std::lower_bound(cdf.begin(), cdf.end(), u(rng)) - cdf.begin());
      }
      b.add_item(toks.data(), n);
      b.end_document();
    }
    b.finalize();
    fs::copy_file(prefix_bin + ".idx", prefix_zst + ".idx");
    dl::zstd_seekable_compress(prefix_bin + ".bin", prefix_zst + ".bin.zst");
    bin = std::make_unique<dl::IndexedDataset>(prefix_bin);
    zst = std::make_unique<dl::IndexedDataset>(prefix_zst);
    // Warm the page cache so the first benchmark does not pay for disk reads.
    std::vector<std::uint8_t> buf;
    for (std::uint64_t i = 0; i < bin->size(); ++i) {
      buf.resize(bin->length(i) * 2);
      bin->read(i, 0, bin->length(i), buf.data());
    }
  }
  ~BenchData() {
    bin.reset();
    zst.reset();
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
  const dl::IndexedDataset& get(bool compressed) const { return compressed ? *zst : *bin; }
};

BenchData& data() {
  static BenchData d;
  return d;
}

// args: {compressed 0/1, random 0/1}
void BM_SequenceRead(benchmark::State& state) {
  const auto& ds = data().get(state.range(0) != 0);
  const bool random = state.range(1) != 0;
  std::mt19937_64 rng(1);
  std::uniform_int_distribution<std::uint64_t> pick(0, ds.size() - 1);
  std::vector<std::uint8_t> buf(8192 * 2);
  std::uint64_t i = 0, tokens = 0;
  for (auto _ : state) {
    const std::uint64_t k = random ? pick(rng) : (i++ % ds.size());
    const std::uint64_t n = ds.length(k);
    ds.read(k, 0, n, buf.data());
    benchmark::DoNotOptimize(buf.data());
    tokens += n;
  }
  state.counters["tokens_per_s"] = benchmark::Counter(static_cast<double>(tokens), benchmark::Counter::kIsRate);
  state.SetBytesProcessed(static_cast<std::int64_t>(tokens * 2));
}
BENCHMARK(BM_SequenceRead)
    ->ArgNames({"zst", "random"})
    ->Args({0, 1})
    ->Args({1, 1})
    ->Args({0, 0})
    ->Args({1, 0});

// GPT-style assembly of 2,049-token samples over a shuffled (random=1) or natural document order;
// samples visited in order (the training loop's access pattern over a shuffled document index).
void BM_GptSampleAssembly(benchmark::State& state) {
  const auto& ds = data().get(state.range(0) != 0);
  const bool shuffled = state.range(1) != 0;
  std::vector<std::int64_t> order(ds.size());
  std::iota(order.begin(), order.end(), 0);
  if (shuffled) std::shuffle(order.begin(), order.end(), std::mt19937_64(3));
  const dl::GptSampleIndex index(ds, std::move(order), 2048);
  std::vector<std::uint16_t> buf(2049);
  std::uint64_t k = 0, tokens = 0;
  for (auto _ : state) {
    index.assemble(k, buf.data());
    benchmark::DoNotOptimize(buf.data());
    k = (k + 1) % index.size();
    tokens += 2049;
  }
  state.counters["tokens_per_s"] = benchmark::Counter(static_cast<double>(tokens), benchmark::Counter::kIsRate);
  state.SetBytesProcessed(static_cast<std::int64_t>(tokens * 2));
}
BENCHMARK(BM_GptSampleAssembly)
    ->ArgNames({"zst", "shuffled"})
    ->Args({0, 1})
    ->Args({0, 0})
    ->Args({1, 1})
    ->Args({1, 0});

// Whole-file decompression speed of the seekable reader (the zstd frames themselves).
void BM_ZstdSequentialScan(benchmark::State& state) {
  const auto& bin = data().get(true).bin();
  const std::uint64_t chunk = 1 << 20;
  std::vector<std::uint8_t> buf(chunk);
  std::uint64_t off = 0, bytes = 0;
  for (auto _ : state) {
    const std::uint64_t n = std::min(chunk, bin.size() - off);
    bin.read(off, n, buf.data());
    benchmark::DoNotOptimize(buf.data());
    bytes += n;
    off = (off + n) % bin.size();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(bytes));
}
BENCHMARK(BM_ZstdSequentialScan);

// A dataset of many short sequences for BM_OpenDataset: the `.idx` written directly (MMIDIDX v1,
// uint16, one sequence per document), the `.bin` a sparse file of the right size (opening reads
// none of it).
struct OpenData {
  fs::path dir;
  std::string prefix;
  std::uint64_t sequences = small_mode() ? 100000 : 4000000;

  OpenData() {
    dir = fs::temp_directory_path() / ("packpipe-bench-open-" + std::to_string(::getpid()));
    fs::create_directories(dir);
    prefix = (dir / "many").string();
    std::mt19937_64 rng(5);
    std::vector<std::int32_t> sizes(sequences);
    std::vector<std::int64_t> pointers(sequences), doc_idx(sequences + 1);
    std::int64_t bytes = 0;
    for (std::uint64_t i = 0; i < sequences; ++i) {
      sizes[i] = static_cast<std::int32_t>(1 + rng() % 2048);
      pointers[i] = bytes;
      bytes += 2 * sizes[i];
      doc_idx[i] = static_cast<std::int64_t>(i);
    }
    doc_idx[sequences] = static_cast<std::int64_t>(sequences);
    std::ofstream idx(prefix + ".idx", std::ios::binary);
    const char magic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0};
    const std::uint64_t version = 1, count = sequences, docs = sequences + 1;
    const std::uint8_t dtype = 8;  // uint16
    idx.write(magic, sizeof magic);
    idx.write(reinterpret_cast<const char*>(&version), 8);
    idx.write(reinterpret_cast<const char*>(&dtype), 1);
    idx.write(reinterpret_cast<const char*>(&count), 8);
    idx.write(reinterpret_cast<const char*>(&docs), 8);
    idx.write(reinterpret_cast<const char*>(sizes.data()), static_cast<std::streamsize>(4 * sizes.size()));
    idx.write(reinterpret_cast<const char*>(pointers.data()), static_cast<std::streamsize>(8 * pointers.size()));
    idx.write(reinterpret_cast<const char*>(doc_idx.data()), static_cast<std::streamsize>(8 * doc_idx.size()));
    idx.close();
    std::ofstream(prefix + ".bin", std::ios::binary).close();
    fs::resize_file(prefix + ".bin", static_cast<std::uintmax_t>(bytes));
  }
  ~OpenData() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
};

// Opening: map both files, parse the header, and copy and check the sizes (one pass over 4 bytes a
// sequence); the index is in the page cache after the first iteration.
void BM_OpenDataset(benchmark::State& state) {
  static OpenData d;
  for (auto _ : state) {
    const dl::IndexedDataset ds(d.prefix);
    benchmark::DoNotOptimize(ds.size());
  }
  state.counters["sequences"] = static_cast<double>(d.sequences);
  state.counters["sequences_per_s"] = benchmark::Counter(static_cast<double>(state.iterations() * d.sequences),
                                                         benchmark::Counter::kIsRate);
}
BENCHMARK(BM_OpenDataset)->Unit(benchmark::kMillisecond);

}  // namespace
