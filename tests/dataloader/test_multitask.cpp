#include <catch2/catch.hpp>

#include <atomic>
#include <thread>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/errors.h"
#include "dataloader/batch.h"
#include "dataloader/indexed_dataset.h"
#include "dataloader/multitask.h"
#include "dataloader/zstd_seekable.h"
#include "tests/support/synthetic.h"
#include "tests/support/temp_dir.h"

using namespace packpipe::dataloader;
using packpipe::test::Documents;
using packpipe::test::fixture;
using packpipe::test::TempDir;
using Catch::Matchers::Contains;

namespace {

std::vector<std::uint8_t> bytes_of(const TokenSpan& s) {
  const auto* p = static_cast<const std::uint8_t*>(s.data);
  return std::vector<std::uint8_t>(p, p + s.length * dtype_size(s.dtype));
}

std::vector<std::uint8_t> tokens_u16(const std::vector<std::int64_t>& seq) {
  std::vector<std::uint8_t> out(seq.size() * 2);
  for (std::size_t i = 0; i < seq.size(); ++i) {
    const auto v = static_cast<std::uint16_t>(seq[i]);
    std::memcpy(&out[2 * i], &v, 2);
  }
  return out;
}

TaskSpec task(const std::string& name, TaskLayout layout, std::vector<std::string> prefixes,
              std::vector<std::string> targets = {}) {
  TaskSpec t;
  t.name = name;
  t.layout = layout;
  t.prefixes = std::move(prefixes);
  t.target_prefixes = std::move(targets);
  return t;
}

Manifest manifest_of(std::vector<TaskSpec> tasks) {
  Manifest m;
  m.path = "test.json";
  m.tasks = std::move(tasks);
  return m;
}

/// Overwrites pointer[seq] in a MMIDIDX `.idx` (header 34 bytes, then S int32 sizes).
void corrupt_pointer(const std::string& idx, std::uint64_t num_sequences, std::uint64_t seq, std::int64_t value) {
  std::string bytes = packpipe::test::read_file(idx);
  const std::size_t at = 34 + 4 * num_sequences + 8 * seq;
  REQUIRE(at + 8 <= bytes.size());
  std::memcpy(&bytes[at], &value, 8);
  packpipe::test::write_file(idx, bytes);
}

SamplerConfig sample_batches(std::uint64_t n, std::uint64_t seed = 9) {
  SamplerConfig c;
  c.seed = seed;
  c.global_batch_samples = n;
  return c;
}

}  // namespace

TEST_CASE("from_prefix: one sequence task over the GPT fixture, lengths from the index", "[interface]") {
  const std::string prefix = fixture("megatron-small/wordnet_gpt2_text_document");
  const MultiTaskDataset ds = MultiTaskDataset::from_prefix(prefix);
  const IndexedDataset raw(prefix);
  REQUIRE(ds.num_tasks() == 1);
  CHECK(ds.manifest().tasks[0].name == "wordnet_gpt2_text_document");
  REQUIRE(ds.task_size(0) == 64);
  CHECK_FALSE(ds.encoder_decoder(0));
  CHECK_FALSE(ds.compressed());
  CHECK(ds.dtype(0) == DType::UInt16);
  for (std::uint64_t i = 0; i < 64; ++i) {
    const SampleRef r{0, i};
    REQUIRE(ds.sample_tokens(0, i) == raw.length(i));
    REQUIRE(ds.target_length(r) == 0);
    const SampleView v = ds.view(r);
    REQUIRE(bytes_of(v.input) == bytes_of(raw.view(i)));
    REQUIRE(v.input.data == ds.view(r).input.data);  // zero-copy: a view into the one mapping
    REQUIRE(v.input.length == raw.length(i));
    REQUIRE(v.target.length == 0);
    std::vector<std::uint8_t> in, tg{1, 2};
    ds.read_sample(r, in, tg);
    REQUIRE(in == bytes_of(v.input));
    REQUIRE(tg.empty());
  }
  REQUIRE_THROWS_AS(ds.view(SampleRef{0, 64}), packpipe::OutOfRange);
  REQUIRE_THROWS_AS(ds.view(SampleRef{1, 0}), packpipe::OutOfRange);
  REQUIRE_THROWS_AS(ds.task_size(1), packpipe::OutOfRange);
  // The errors name the sample (task and index) and the size it is out of.
  ds.check_sample(0, 63);
  REQUIRE_THROWS_WITH(ds.check_sample(0, 64),
                      Catch::Matchers::Contains("sample (task 0, index 64): index out of range (task "
                                                "'wordnet_gpt2_text_document' has 64 samples)"));
  REQUIRE_THROWS_WITH(ds.check_sample(std::size_t{1} << 32, 3),
                      Catch::Matchers::Contains("sample (task 4294967296, index 3): task out of range (the dataset "
                                                "has 1 tasks)"));
  GlobalBatch b;
  b.samples = {SampleRef{0, 1}, SampleRef{2, 5}};
  REQUIRE_THROWS_WITH(assemble_batch(ds, b), Catch::Matchers::Contains("sample (task 2, index 5): task out of range"));
}

TEST_CASE("paired prefixes pair document i of inputs with document i of targets (DynaPipe fixture)",
          "[interface]") {
  const std::string in = fixture("megatron-small/wordnet_mt_inputs_document");
  const std::string tg = fixture("megatron-small/wordnet_mt_targets_document");
  const MultiTaskDataset ds(manifest_of({task("mt", TaskLayout::PairedPrefixes, {in}, {tg})}));
  const IndexedDataset raw_in(in), raw_tg(tg);
  REQUIRE(ds.task_size(0) == 144);
  CHECK(ds.encoder_decoder(0));
  for (std::uint64_t i = 0; i < 144; ++i) {
    const SampleRef r{0, i};
    const SampleView v = ds.view(r);
    const auto a = static_cast<std::uint64_t>(raw_in.doc_idx()[i]);
    const auto b = static_cast<std::uint64_t>(raw_tg.doc_idx()[i]);
    REQUIRE(bytes_of(v.input) == raw_in.read(a));
    REQUIRE(bytes_of(v.target) == raw_tg.read(b));
    REQUIRE(ds.sample_tokens(0, i) == std::uint64_t{raw_in.length(a)} + raw_tg.length(b));
  }
}

TEST_CASE("paired sequences take the two sequences of each document (modes fixture)", "[interface]") {
  const std::string p = fixture("megatron-small/wordnet_modes_uint16");
  const MultiTaskDataset ds(manifest_of({task("mm", TaskLayout::PairedSequences, {p})}));
  const IndexedDataset raw(p);
  REQUIRE(raw.has_modes());
  REQUIRE(ds.task_size(0) == 32);
  for (std::uint64_t i = 0; i < 32; ++i) {
    const SampleView v = ds.view(SampleRef{0, i});
    REQUIRE(bytes_of(v.input) == raw.read(2 * i));
    REQUIRE(bytes_of(v.target) == raw.read(2 * i + 1));
    REQUIRE(ds.input_length(SampleRef{0, i}) == raw.length(2 * i));
    REQUIRE(ds.target_length(SampleRef{0, i}) == raw.length(2 * i + 1));
  }
}

TEST_CASE("sequence tasks concatenate shards and several tasks keep their own indices", "[interface]") {
  TempDir dir;
  std::mt19937_64 rng(3);
  const Documents a = packpipe::test::random_documents(rng, 7, 3, 20, 1000);
  const Documents b = packpipe::test::random_documents(rng, 5, 2, 20, 1000);
  const Documents c = packpipe::test::random_documents(rng, 9, 1, 20, 1000);
  packpipe::test::write_documents(dir.file("a"), DType::UInt16, a);
  packpipe::test::write_documents(dir.file("b"), DType::UInt16, b);
  packpipe::test::write_documents(dir.file("c"), DType::UInt16, c);
  const MultiTaskDataset ds(manifest_of({task("ab", TaskLayout::Sequence, {dir.file("a"), dir.file("b")}),
                                         task("c", TaskLayout::Sequence, {dir.file("c")})}));
  std::vector<std::vector<std::int64_t>> ab;
  for (const auto* docs : {&a, &b}) {
    for (const auto& d : *docs) ab.insert(ab.end(), d.begin(), d.end());
  }
  REQUIRE(ds.task_size(0) == ab.size());
  REQUIRE(ds.task_size(1) == 9);
  for (std::uint64_t i = 0; i < ab.size(); ++i) {
    REQUIRE(bytes_of(ds.view(SampleRef{0, i}).input) == tokens_u16(ab[i]));
    REQUIRE(ds.sample_tokens(0, i) == ab[i].size());
  }
  for (std::uint64_t i = 0; i < 9; ++i) REQUIRE(bytes_of(ds.view(SampleRef{1, i}).input) == tokens_u16(c[i][0]));
}

TEST_CASE("multi-task dataset errors name the task, the files and the counts", "[negative]") {
  TempDir dir;
  const Documents three = {{{1, 2}}, {{3}}, {{4, 5, 6}}};
  const Documents two = {{{1}}, {{2}}};
  const Documents multi = {{{1}}, {{2}, {3}}, {{4}}};
  const Documents triple = {{{1}, {2}}, {{3}, {4}, {5}}};
  packpipe::test::write_documents(dir.file("three"), DType::UInt16, three);
  packpipe::test::write_documents(dir.file("two"), DType::UInt16, two);
  packpipe::test::write_documents(dir.file("multi"), DType::UInt16, multi);
  packpipe::test::write_documents(dir.file("triple"), DType::UInt16, triple, /*with_modes=*/true);
  packpipe::test::write_documents(dir.file("wide"), DType::Int32, two);

  SECTION("paired prefixes with different document counts") {
    REQUIRE_THROWS_WITH(
        MultiTaskDataset(manifest_of({task("qa", TaskLayout::PairedPrefixes, {dir.file("three")}, {dir.file("two")})})),
        Contains("task 0 ('qa')") && Contains(dir.file("three") + ".idx' has 3 documents") &&
            Contains(dir.file("two") + ".idx' has 2"));
  }
  SECTION("paired prefixes with a document of two sequences fails at access") {
    const MultiTaskDataset ds(
        manifest_of({task("qa", TaskLayout::PairedPrefixes, {dir.file("multi")}, {dir.file("three")})}));
    REQUIRE(ds.task_size(0) == 3);
    REQUIRE(ds.sample_tokens(0, 0) == 3);
    REQUIRE_THROWS_MATCHES(ds.sample_tokens(0, 1), packpipe::Error,
                           Catch::Matchers::Predicate<std::exception>([&](const std::exception& e) {
                             const std::string w = e.what();
                             return w.find(dir.file("multi") + ".idx: document 1 holds 2 sequences") !=
                                        std::string::npos &&
                                    w.find("expected exactly 1") != std::string::npos;
                           }));
    REQUIRE_THROWS_AS(ds.view(SampleRef{0, 1}), packpipe::Error);
  }
  SECTION("paired sequences with a document of three sequences fails at access") {
    const MultiTaskDataset ds(manifest_of({task("mm", TaskLayout::PairedSequences, {dir.file("triple")})}));
    REQUIRE(ds.input_length(SampleRef{0, 0}) == 1);
    REQUIRE_THROWS_WITH(ds.view(SampleRef{0, 1}),
                        Contains("document 1 holds 3 sequences") && Contains("paired_sequences") &&
                            Contains("task 'mm'"));
  }
  SECTION("paired sequences with modes out of order") {
    {
      IndexedDatasetBuilder builder(dir.file("swapped"), DType::UInt16, /*with_modes=*/true);
      const std::uint16_t tok[2] = {7, 8};
      builder.add_item(tok, 1, 1);
      builder.add_item(tok + 1, 1, 0);
      builder.end_document();
      builder.finalize();
    }
    const MultiTaskDataset ds(manifest_of({task("mm", TaskLayout::PairedSequences, {dir.file("swapped")})}));
    REQUIRE_THROWS_WITH(ds.view(SampleRef{0, 0}), Contains("modes (1, 0)") && Contains("expected 0 then 1"));
  }
  SECTION("dtypes that differ within a task") {
    REQUIRE_THROWS_WITH(
        MultiTaskDataset(manifest_of({task("lm", TaskLayout::Sequence, {dir.file("two"), dir.file("wide")})})),
        Contains("task 0 ('lm')") && Contains("int32") && Contains("uint16"));
  }
  SECTION("missing prefix") {
    REQUIRE_THROWS_WITH(MultiTaskDataset::from_prefix(dir.file("nothing")), Contains(dir.file("nothing")));
  }
}

TEST_CASE("compressed tasks: view is unsupported, read_sample and assemble_batch copy", "[interface]") {
  TempDir dir;
  std::mt19937_64 rng(5);
  const Documents docs = packpipe::test::random_documents(rng, 40, 1, 300, 50000);
  packpipe::test::write_documents(dir.file("plain"), DType::UInt16, docs);
  packpipe::test::write_documents(dir.file("zipped"), DType::UInt16, docs);
  ZstdSeekableOptions opt;
  opt.frame_size = 256;  // many frames: samples span frame boundaries
  zstd_seekable_compress(dir.file("zipped.bin"), dir.file("zipped.bin.zst"), opt);
  std::filesystem::remove(dir.file("zipped.bin"));

  const MultiTaskDataset ds(manifest_of({task("plain", TaskLayout::Sequence, {dir.file("plain")}),
                                         task("zipped", TaskLayout::Sequence, {dir.file("zipped")})}));
  CHECK(ds.compressed());
  CHECK_FALSE(ds.task_compressed(0));
  CHECK(ds.task_compressed(1));
  REQUIRE_THROWS_AS(ds.view(SampleRef{1, 0}), packpipe::Unsupported);

  GlobalBatch b;
  for (std::uint64_t i = 0; i < 40; ++i) {
    b.samples.push_back(SampleRef{0, i});
    b.samples.push_back(SampleRef{1, i});
  }
  AssembledBatch ab = assemble_batch(ds, b);
  AssembledBatch moved = std::move(ab);  // views into storage survive a move
  REQUIRE(moved.samples.size() == 80);
  REQUIRE(moved.storage.size() == 160);  // input + (empty) target per sample: every sample is a copy
  for (std::uint64_t i = 0; i < 40; ++i) {
    const SampleView& p = moved.samples[2 * i];
    const SampleView& z = moved.samples[2 * i + 1];
    REQUIRE(p.ref == SampleRef{0, i});
    REQUIRE(z.ref == SampleRef{1, i});
    REQUIRE(bytes_of(p.input) == tokens_u16(docs[i][0]));
    REQUIRE(bytes_of(z.input) == tokens_u16(docs[i][0]));
    REQUIRE(z.input.dtype == DType::UInt16);
    REQUIRE(z.target.length == 0);
  }
}

TEST_CASE("assemble_batch copies plain datasets' tokens too (guarded reads, never views into the map)",
          "[interface][regression]") {
  const MultiTaskDataset ds = MultiTaskDataset::from_prefix(fixture("megatron-small/wordnet_gpt2_text_document"));
  Sampler s(ds, sample_batches(10));
  GlobalBatch b;
  REQUIRE(s.next_batch(b));
  const AssembledBatch ab = assemble_batch(ds, b);
  REQUIRE(ab.storage.size() == 2 * b.samples.size());
  REQUIRE(ab.batch.samples == b.samples);
  for (std::size_t i = 0; i < b.samples.size(); ++i) {
    REQUIRE(ab.samples[i].ref == b.samples[i]);
    REQUIRE(ab.samples[i].input.data != ds.view(b.samples[i]).input.data);  // not in the map
    REQUIRE(bytes_of(ab.samples[i].input) == bytes_of(ds.view(b.samples[i]).input));
  }
}

TEST_CASE("the dataset fingerprint names the manifest: tasks, order, names, weights, files",
          "[interface][regression]") {
  TempDir dir;
  std::mt19937_64 rng(5);
  for (const char* name : {"a", "b"}) {
    packpipe::test::write_documents(dir.file(name), DType::UInt16, packpipe::test::random_documents(rng, 9, 1, 20, 1000));
  }
  // c is a copy of b: only its file name tells them apart
  std::filesystem::copy_file(dir.file("b.idx"), dir.file("c.idx"));
  std::filesystem::copy_file(dir.file("b.bin"), dir.file("c.bin"));
  auto two = [&](const char* x, const char* y, const char* nx, const char* ny) {
    return manifest_of({task(nx, TaskLayout::Sequence, {dir.file(x)}), task(ny, TaskLayout::Sequence, {dir.file(y)})});
  };
  const MultiTaskDataset ab(two("a", "b", "ta", "tb"));
  CHECK(MultiTaskDataset(two("a", "b", "ta", "tb")).fingerprint() == ab.fingerprint());
  CHECK(MultiTaskDataset(two("b", "a", "tb", "ta")).fingerprint() != ab.fingerprint());  // reordered
  CHECK(MultiTaskDataset(two("a", "b", "tb", "ta")).fingerprint() != ab.fingerprint());  // renamed
  CHECK(MultiTaskDataset(two("a", "c", "ta", "tb")).fingerprint() != ab.fingerprint());  // another file
  Manifest weighted = two("a", "b", "ta", "tb");
  weighted.weighted = true;
  weighted.tasks[1].weight = 2;
  CHECK(MultiTaskDataset(weighted).fingerprint() != ab.fingerprint());
  // The data moved to another folder: the same identity (a resume on another machine).
  std::filesystem::create_directory(dir.file("moved"));
  for (const char* f : {"a.idx", "a.bin", "b.idx", "b.bin"}) {
    std::filesystem::copy_file(dir.file(f), dir.file(std::string("moved/") + f));
  }
  CHECK(MultiTaskDataset(manifest_of({task("ta", TaskLayout::Sequence, {dir.file("moved/a")}),
                                      task("tb", TaskLayout::Sequence, {dir.file("moved/b")})}))
            .fingerprint() == ab.fingerprint());
  // A sampler's state carries it: a state of one manifest does not restore into the reordered one.
  const MultiTaskDataset ba(two("b", "a", "tb", "ta"));
  Sampler sa(ab, sample_batches(4)), sb(ba, sample_batches(4));
  GlobalBatch g;
  REQUIRE(sa.next_batch(g));
  REQUIRE_THROWS_WITH(sb.restore(sa.state()), Contains("fingerprint"));
}

TEST_CASE("the prefetcher delivers exactly the sampler's batches, in order", "[interface]") {
  const std::string in = fixture("megatron-small/wordnet_mt_inputs_document");
  const std::string tg = fixture("megatron-small/wordnet_mt_targets_document");
  const MultiTaskDataset ds(manifest_of({task("mt", TaskLayout::PairedPrefixes, {in}, {tg}),
                                         task("lm", TaskLayout::Sequence,
                                              {fixture("megatron-small/wordnet_gpt2_text_document")})}));
  const auto depth = static_cast<std::size_t>(GENERATE(1, 2, 4));
  SamplerConfig c;
  c.seed = 77;
  c.global_batch_tokens = 200;
  Sampler reference(ds, c);
  GlobalBatch skip;
  REQUIRE(reference.next_batch(skip));  // start mid-epoch: the prefetcher continues from here

  Sampler fed(reference);  // the prefetcher advances the sampler it is given
  Prefetcher pf(ds, fed, depth);
  GlobalBatch expected;
  AssembledBatch got;
  std::size_t n = 0;
  while (reference.next_batch(expected)) {
    REQUIRE(pf.next(got));
    REQUIRE(got.batch.index == expected.index);
    REQUIRE(got.batch.samples == expected.samples);
    REQUIRE(got.batch.tokens == expected.tokens);
    REQUIRE(got.samples.size() == expected.samples.size());
    for (std::size_t i = 0; i < expected.samples.size(); ++i) {
      REQUIRE(bytes_of(got.samples[i].input) == bytes_of(ds.view(expected.samples[i]).input));
    }
    ++n;
  }
  REQUIRE(n > 3);
  REQUIRE_FALSE(pf.next(got));
  REQUIRE_FALSE(pf.next(got));
  CHECK(fed.state().position == reference.state().position);
}

TEST_CASE("a prefetching loop checkpoints what it delivered and resumes exactly once", "[interface][checkpoint]") {
  const MultiTaskDataset ds = MultiTaskDataset::from_prefix(fixture("megatron-small/wordnet_gpt2_text_document"));
  const SamplerConfig c = sample_batches(3, 5);  // 22 batches
  const auto depth = static_cast<std::size_t>(GENERATE(1, 3, 8));
  std::vector<SampleRef> seen;
  std::string checkpoint;
  {
    Sampler s(ds, c);
    Prefetcher pf(ds, s, depth);
    AssembledBatch b;
    for (int i = 0; i < 5; ++i) {
      REQUIRE(pf.next(b));
      seen.insert(seen.end(), b.batch.samples.begin(), b.batch.samples.end());
      // The sampler's state is that of the delivered batches, not of those in flight.
      REQUIRE(s.state().batch_index == b.batch.index + 1);
      REQUIRE(pf.state().position == s.state().position);
    }
    // A second prefetcher on the same sampler would deliver the same batches again: refused.
    REQUIRE_THROWS_WITH(Prefetcher(ds, s, 2), Catch::Matchers::Contains("already feeds a Prefetcher"));
    checkpoint = s.state().to_json();
  }
  Sampler resumed(ds, c);
  resumed.restore(SamplerState::from_json(checkpoint));
  Prefetcher pf(ds, resumed, depth);
  AssembledBatch b;
  while (pf.next(b)) seen.insert(seen.end(), b.batch.samples.begin(), b.batch.samples.end());
  Sampler whole(ds, c);
  std::vector<SampleRef> all;
  GlobalBatch g;
  while (whole.next_batch(g)) all.insert(all.end(), g.samples.begin(), g.samples.end());
  REQUIRE(seen == all);  // every sample exactly once, in order, across the checkpoint
}

TEST_CASE("a prefetcher refuses a second concurrent consumer instead of hanging it", "[negative]") {
  const MultiTaskDataset ds = MultiTaskDataset::from_prefix(fixture("megatron-small/wordnet_gpt2_text_document"));
  Sampler s(ds, sample_batches(4));
  Prefetcher pf(ds, s, 2);
  std::atomic<int> delivered{0}, refused{0};
  std::vector<std::thread> consumers;
  for (int t = 0; t < 4; ++t) {
    consumers.emplace_back([&] {
      AssembledBatch b;
      for (;;) {
        try {
          if (!pf.next(b)) return;
          ++delivered;
        } catch (const packpipe::InvalidArgument&) {
          ++refused;
          std::this_thread::yield();
        }
      }
    });
  }
  for (auto& t : consumers) t.join();  // every thread returns: none waits for a marker it cannot get
  Sampler count(ds, sample_batches(4));
  GlobalBatch g;
  int batches = 0;
  while (count.next_batch(g)) ++batches;
  CHECK(delivered == batches);  // each batch delivered exactly once
}

TEST_CASE("destroying a prefetcher early does not hang", "[boundary]") {
  const MultiTaskDataset ds = MultiTaskDataset::from_prefix(fixture("megatron-small/wordnet_gpt2_text_document"));
  Sampler s(ds, sample_batches(1));  // 64 batches, far more than the depth
  const auto start = std::chrono::steady_clock::now();
  for (int consumed = 0; consumed < 3; ++consumed) {
    for (int round = 0; round < 10; ++round) {
      Prefetcher pf(ds, s, 2);
      AssembledBatch b;
      for (int i = 0; i < consumed; ++i) REQUIRE(pf.next(b));
      if (round % 2) std::this_thread::sleep_for(std::chrono::milliseconds(1));  // let the queue fill
    }
  }
  REQUIRE(std::chrono::steady_clock::now() - start < std::chrono::seconds(20));
}

TEST_CASE("an error during background assembly is rethrown by next()", "[negative]") {
  TempDir dir;
  Documents docs;
  for (int i = 0; i < 50; ++i) docs.push_back({{i, i + 1, i + 2}});
  packpipe::test::write_documents(dir.file("bad"), DType::UInt16, docs);
  corrupt_pointer(dir.file("bad.idx"), 50, 10, 1 << 30);  // sizes stay intact: only reading fails
  const MultiTaskDataset ds = MultiTaskDataset::from_prefix(dir.file("bad"));
  Sampler s(ds, sample_batches(4));
  Sampler reference(s);
  const auto depth = static_cast<std::size_t>(GENERATE(1, 3, 8));
  Prefetcher pf(ds, s, depth);
  AssembledBatch b;
  bool thrown = false;
  std::size_t delivered = 0;
  try {
    while (pf.next(b)) {
      // Batches before the failure arrive complete and in order: none is skipped.
      GlobalBatch expected;
      REQUIRE(reference.next_batch(expected));
      REQUIRE(b.batch.index == expected.index);
      REQUIRE(b.batch.samples == expected.samples);
      ++delivered;
    }
  } catch (const packpipe::Error& e) {
    thrown = true;
    CHECK_THAT(std::string(e.what()), Contains("bad"));
  }
  REQUIRE(thrown);
  // The failing batch (the one holding the corrupt document) was not delivered.
  GlobalBatch failing;
  REQUIRE(reference.next_batch(failing));
  REQUIRE_THROWS_AS(assemble_batch(ds, std::move(failing)), packpipe::Error);
  REQUIRE_THROWS_AS(pf.next(b), packpipe::Error);  // stays failed
  INFO("delivered " << delivered);
}

TEST_CASE("a manifest needing more memory maps than the process may open is refused before any file is opened",
          "[negative]") {
  // The arithmetic: 2 maps a prefix, plus the headroom, against what is free.
  REQUIRE_NOTHROW(check_memory_maps("m.json", 1000, 4000, 1024));
  REQUIRE_THROWS_WITH(check_memory_maps("m.json", 32000, 65000, 1024),
                      Contains("manifest 'm.json': its 32000 dataset prefixes need 64000 memory maps") &&
                          Contains("vm.max_map_count by at least 24") && Contains("packpipe dataset merge"));
  // And the dataset: more prefixes than the free maps allow, none of them existing, is refused by
  // the map budget (not by a missing file: nothing was opened).
  const std::uint64_t free_maps = free_memory_maps();
  REQUIRE(free_maps > 0);
  const std::uint64_t prefixes = free_maps / 2 + 1;
  if (prefixes <= 4000000) {  // a host whose limit is raised to billions is not reproducible here
    Manifest m;
    m.path = "huge.json";
    TaskSpec t;
    t.name = "many";
    for (std::uint64_t i = 0; i < prefixes; ++i) t.prefixes.push_back("/nonexistent/p" + std::to_string(i));
    m.tasks.push_back(std::move(t));
    REQUIRE_THROWS_WITH(MultiTaskDataset(m), Contains("manifest 'huge.json'") && Contains("vm.max_map_count"));
  }
}
