#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "common/errors.h"
#include "dataloader/sampler.h"
#include "tests/support/synthetic.h"

using namespace packpipe::dataloader;
using packpipe::test::SyntheticSource;

namespace {

/// Every batch of the current epoch, in order.
std::vector<GlobalBatch> drain(Sampler& s) {
  std::vector<GlobalBatch> out;
  GlobalBatch b;
  while (s.next_batch(b)) out.push_back(b);
  return out;
}

// An epoch drained whole, and the state of a second sampler after a random number of its batches.
struct Cut {
  Sampler full;
  std::vector<GlobalBatch> all;
  std::size_t cut = 0;
  SamplerState saved;
};
Cut cut_epoch(const packpipe::dataloader::SampleSource& src, const SamplerConfig& c, std::uint64_t epoch,
              std::mt19937_64& rng) {
  Cut k{Sampler(src, c), {}, 0, {}};
  k.full.set_epoch(epoch);
  k.all = drain(k.full);
  REQUIRE_FALSE(k.all.empty());
  k.cut = rng() % (k.all.size() + 1);
  Sampler first(src, c);
  first.set_epoch(epoch);
  GlobalBatch b;
  for (std::size_t i = 0; i < k.cut; ++i) REQUIRE(first.next_batch(b));
  k.saved = first.state();
  return k;
}

std::vector<SampleRef> flatten(const std::vector<GlobalBatch>& batches) {
  std::vector<SampleRef> out;
  for (const auto& b : batches) out.insert(out.end(), b.samples.begin(), b.samples.end());
  return out;
}

std::array<double, 3> random_split(std::mt19937_64& rng) {
  // Whole numbers like Megatron's "98,1,1", some zero.
  std::array<double, 3> f{};
  for (auto& x : f) x = static_cast<double>(rng() % 4 == 0 ? 0 : rng() % 100);
  if (f[0] + f[1] + f[2] == 0) f[0] = 1;
  return f;
}

SamplerConfig token_config(std::uint64_t seed, std::uint64_t budget) {
  SamplerConfig c;
  c.seed = seed;
  c.global_batch_tokens = budget;
  return c;
}

}  // namespace

// ---- Permutation ---------------------------------------------------------------

TEST_CASE("Permutation is a bijection on 0..n-1 for small and edge sizes", "[boundary]") {
  const std::uint64_t sizes[] = {1,  2,  3,   4,   5,   7,   8,    9,    15,   16,   17,    31,    63,   64,
                                 65, 99, 255, 256, 257, 1000, 1023, 1024, 1025, 4095, 4096, 4097, 65535,
                                 65536, 65537, 100003};
  for (std::uint64_t key : {0ULL, 1ULL, 0xdeadbeefULL}) {
    for (std::uint64_t n : sizes) {
      Permutation p(n, key);
      REQUIRE(p.size() == n);
      std::vector<bool> seen(n, false);
      for (std::uint64_t i = 0; i < n; ++i) {
        const std::uint64_t v = p(i);
        REQUIRE(v < n);
        REQUIRE_FALSE(seen[v]);
        seen[v] = true;
      }
    }
  }
}

TEST_CASE("Permutation of size 0 accepts no index and others reject out-of-range indices", "[boundary][negative]") {
  REQUIRE_THROWS_AS(Permutation(0, 7)(0), packpipe::OutOfRange);
  REQUIRE(Permutation(1, 7)(0) == 0);
  REQUIRE_THROWS_WITH(Permutation(10, 7)(10), Catch::Matchers::Contains("10") && Catch::Matchers::Contains("< 10"));
}

TEST_CASE("Permutation of huge n is injective on spot checks and deterministic", "[boundary]") {
  const std::uint64_t sizes[] = {(1ULL << 32) - 1, (1ULL << 32) + 1, (1ULL << 40) + 3, (1ULL << 62) + 12345,
                                 ~0ULL};
  for (std::uint64_t n : sizes) {
    Permutation p(n, 42), q(n, 42);
    std::set<std::uint64_t> images;
    for (std::uint64_t i = 0; i < 2000; ++i) {
      const std::uint64_t x = (i < 1000) ? i : n - 1 - (i - 1000);  // both ends of the range
      const std::uint64_t v = p(x);
      REQUIRE(v < n);
      REQUIRE(v == q(x));
      images.insert(v);
    }
    REQUIRE(images.size() == 2000);
  }
}

TEST_CASE("Permutation looks shuffled: not the identity, few fixed points, keys differ", "[interface]") {
  const std::uint64_t n = 10000;
  for (std::uint64_t key = 0; key < 8; ++key) {
    Permutation p(n, key), other(n, key + 1000);
    std::uint64_t fixed = 0, same_as_other = 0, ascending = 0;
    for (std::uint64_t i = 0; i < n; ++i) {
      fixed += p(i) == i;
      same_as_other += p(i) == other(i);
      if (i > 0) ascending += p(i) > p(i - 1);
    }
    // A random permutation has 1 fixed point on average and half of its neighbours ascending.
    CHECK(fixed < 15);
    CHECK(same_as_other < 15);
    CHECK(ascending > n * 45 / 100);
    CHECK(ascending < n * 55 / 100);
  }
  // Small sizes: over many keys every element reaches every position.
  for (std::uint64_t n2 : {2ULL, 3ULL, 5ULL}) {
    std::set<std::pair<std::uint64_t, std::uint64_t>> pairs;
    for (std::uint64_t key = 0; key < 200; ++key) {
      Permutation p(n2, key);
      for (std::uint64_t i = 0; i < n2; ++i) pairs.emplace(i, p(i));
    }
    CHECK(pairs.size() == n2 * n2);
  }
}

TEST_CASE("Permutation values are pinned (checkpoints depend on them)", "[regression]") {
  // Changing the Feistel network or its key schedule changes every epoch order and invalidates
  // resumed runs: this test must only change together with a format note.
  Permutation p(1000, 1234);
  std::vector<std::uint64_t> got;
  for (std::uint64_t i = 0; i < 8; ++i) got.push_back(p(i));
  const std::vector<std::uint64_t> expected = {508, 382, 678, 158, 682, 271, 397, 325};
  CHECK(got == expected);
}

// ---- splits ---------------------------------------------------------------------

TEST_CASE("train/valid/test ranges are contiguous, disjoint and cover each task", "[interface]") {
  const auto seed = GENERATE(take(20, random(0, 1000000)));
  std::mt19937_64 rng(static_cast<std::uint64_t>(seed));
  const std::size_t tasks = 1 + rng() % 6;
  auto src = SyntheticSource::random(rng, tasks, 3000, 64);
  const auto fractions = random_split(rng);
  std::vector<std::uint64_t> covered(src.num_tasks(), 0);
  for (Split split : {Split::Train, Split::Valid, Split::Test}) {
    SamplerConfig c = token_config(1, 1000);
    c.split = split;
    c.split_fractions = fractions;
    Sampler s(src, c);
    for (std::size_t t = 0; t < src.num_tasks(); ++t) {
      REQUIRE(s.split_begin(t) == covered[t]);  // this split starts where the previous ended
      REQUIRE(s.split_end(t) >= s.split_begin(t));
      covered[t] = s.split_end(t);
    }
  }
  for (std::size_t t = 0; t < src.num_tasks(); ++t) REQUIRE(covered[t] == src.task_size(t));
}

TEST_CASE("split ranges follow Megatron's round(bookend * n)", "[regression]") {
  SyntheticSource src({std::vector<std::uint32_t>(1000, 1), std::vector<std::uint32_t>(7, 1)});
  SamplerConfig c = token_config(1, 10);
  c.split_fractions = {98, 1, 1};
  c.split = Split::Valid;
  Sampler s(src, c);
  CHECK(s.split_begin(0) == 980);
  CHECK(s.split_end(0) == 990);
  CHECK(s.split_begin(1) == 7);  // round(0.98 * 7) = round(6.86)
  CHECK(s.split_end(1) == 7);    // round(0.99 * 7) = round(6.93)
  CHECK(s.task_slots(1) == 0);
  CHECK(split_from_name("valid") == Split::Valid);
  CHECK(std::string(split_name(Split::Test)) == "test");
  REQUIRE_THROWS_AS(split_from_name("dev"), packpipe::InvalidArgument);
}

// ---- epochs ---------------------------------------------------------------------

TEST_CASE("without weights every sample of the split is delivered exactly once per epoch", "[interface]") {
  const auto seed = GENERATE(take(25, random(0, 1000000)));
  std::mt19937_64 rng(static_cast<std::uint64_t>(seed));
  const std::size_t tasks = 1 + rng() % 8;
  auto src = SyntheticSource::random(rng, tasks, 2000, 512);
  const std::uint64_t sampler_seed = rng();
  SamplerConfig c = token_config(sampler_seed, 256 + rng() % 4096);
  c.split_fractions = random_split(rng);
  c.split = static_cast<Split>(rng() % 3);
  Sampler s(src, c);

  std::uint64_t expected_size = 0;
  for (std::size_t t = 0; t < src.num_tasks(); ++t) {
    REQUIRE(s.task_slots(t) == s.split_end(t) - s.split_begin(t));
    expected_size += s.task_slots(t);
  }
  REQUIRE(s.epoch_size() == expected_size);

  const auto batches = drain(s);
  auto samples = flatten(batches);
  REQUIRE(samples.size() == expected_size);
  std::sort(samples.begin(), samples.end());
  REQUIRE(std::adjacent_find(samples.begin(), samples.end()) == samples.end());
  for (const auto& r : samples) {
    REQUIRE(r.index >= s.split_begin(r.task));
    REQUIRE(r.index < s.split_end(r.task));
  }

  // Batches: in order, numbered, within budget unless a single oversize sample.
  std::uint64_t pos = 0;
  for (std::size_t i = 0; i < batches.size(); ++i) {
    const auto& b = batches[i];
    REQUIRE(b.index == i);
    REQUIRE(b.first_position == pos);
    REQUIRE_FALSE(b.samples.empty());
    std::uint64_t tokens = 0;
    for (const auto& r : b.samples) tokens += src.sample_tokens(r.task, r.index);
    REQUIRE(tokens == b.tokens);
    if (b.samples.size() > 1) REQUIRE(b.tokens <= c.global_batch_tokens);
    if (b.tokens > c.global_batch_tokens) REQUIRE(b.samples.size() == 1);
    // Greedy: the next batch's first sample would not have fitted.
    if (i + 1 < batches.size()) {
      const auto& nx = batches[i + 1].samples.front();
      REQUIRE(b.tokens + src.sample_tokens(nx.task, nx.index) > c.global_batch_tokens);
    }
    for (std::size_t k = 0; k < b.samples.size(); ++k) REQUIRE(s.at(pos + k) == b.samples[k]);
    pos += b.samples.size();
  }
  GlobalBatch after;
  REQUIRE_FALSE(s.next_batch(after));
  REQUIRE(s.position() == s.epoch_size());
}

TEST_CASE("with weights each sample appears floor or ceil of n_t / size times and the epoch is full",
          "[interface]") {
  const auto seed = GENERATE(take(25, random(0, 1000000)));
  std::mt19937_64 rng(static_cast<std::uint64_t>(seed));
  const std::size_t tasks = 1 + rng() % 6;
  auto src = SyntheticSource::random(rng, tasks, 500, 128);
  SamplerConfig c;
  c.seed = rng();
  c.global_batch_samples = 1 + rng() % 64;
  c.split_fractions = random_split(rng);
  for (std::size_t t = 0; t < src.num_tasks(); ++t) c.weights.push_back(static_cast<double>(rng() % 10));
  c.weights[rng() % c.weights.size()] += 1.0;  // at least one positive weight
  c.samples_per_epoch = rng() % 3 == 0 ? 0 : rng() % 5000;
  bool any_drawable = false;
  {
    SamplerConfig pc = token_config(1, 1);
    pc.split_fractions = c.split_fractions;
    Sampler unweighted(src, pc);
    for (std::size_t t = 0; t < src.num_tasks(); ++t) {
      any_drawable = any_drawable || (c.weights[t] > 0 && unweighted.split_end(t) > unweighted.split_begin(t));
    }
  }
  if (!any_drawable) {
    c.samples_per_epoch = 1;  // no task with a positive weight has samples in the split
    REQUIRE_THROWS_AS(Sampler(src, c), packpipe::InvalidArgument);
    return;
  }
  Sampler s(src, c);

  std::uint64_t split_total = 0, slot_total = 0;
  for (std::size_t t = 0; t < src.num_tasks(); ++t) {
    split_total += s.split_end(t) - s.split_begin(t);
    slot_total += s.task_slots(t);
  }
  const std::uint64_t E = c.samples_per_epoch ? c.samples_per_epoch : split_total;
  REQUIRE(s.epoch_size() == E);
  REQUIRE(slot_total == E);

  std::map<SampleRef, std::uint64_t> count;
  std::vector<std::uint64_t> per_task(src.num_tasks(), 0);
  for (const auto& r : flatten(drain(s))) {
    ++count[r];
    ++per_task[r.task];
  }
  for (std::size_t t = 0; t < src.num_tasks(); ++t) {
    REQUIRE(per_task[t] == s.task_slots(t));
    const std::uint64_t size = s.split_end(t) - s.split_begin(t);
    if (size == 0 || c.weights[t] == 0) {
      REQUIRE(s.task_slots(t) == 0);
      continue;
    }
    const std::uint64_t lo = s.task_slots(t) / size;
    const std::uint64_t hi = lo + (s.task_slots(t) % size != 0);
    for (std::uint64_t i = s.split_begin(t); i < s.split_end(t); ++i) {
      const auto it = count.find(SampleRef{static_cast<std::uint32_t>(t), i});
      const std::uint64_t k = it == count.end() ? 0 : it->second;
      REQUIRE(k >= lo);
      REQUIRE(k <= hi);
    }
  }
}

TEST_CASE("weighted shares use the largest remainder", "[regression]") {
  SyntheticSource src({std::vector<std::uint32_t>(10, 1), std::vector<std::uint32_t>(10, 1),
                       std::vector<std::uint32_t>(10, 1)});
  SamplerConfig c;
  c.global_batch_samples = 4;
  c.weights = {1, 1, 1};
  c.samples_per_epoch = 10;  // 3.33 each: the remainder goes to the lowest task on a tie
  Sampler s(src, c);
  CHECK(s.task_slots(0) == 4);
  CHECK(s.task_slots(1) == 3);
  CHECK(s.task_slots(2) == 3);
  c.weights = {1, 2, 7};
  c.samples_per_epoch = 25;  // 2.5, 5, 17.5
  Sampler s2(src, c);
  CHECK(s2.task_slots(0) == 3);
  CHECK(s2.task_slots(1) == 5);
  CHECK(s2.task_slots(2) == 17);
  // 17 draws from 10 samples: every sample once or twice.
}

TEST_CASE("sample-count batches are full except possibly the last", "[interface]") {
  SyntheticSource src({std::vector<std::uint32_t>(103, 5), std::vector<std::uint32_t>(50, 7)});
  SamplerConfig c;
  c.global_batch_samples = 16;
  Sampler s(src, c);
  const auto batches = drain(s);
  REQUIRE(batches.size() == 10);  // 153 = 9 * 16 + 9
  for (std::size_t i = 0; i + 1 < batches.size(); ++i) REQUIRE(batches[i].samples.size() == 16);
  REQUIRE(batches.back().samples.size() == 9);
}

TEST_CASE("a sample above the token budget forms its own batch and is never dropped", "[boundary]") {
  SyntheticSource src({{10, 10, 500, 10, 10, 10, 700, 10}});
  Sampler s(src, token_config(3, 30));
  const auto batches = drain(s);
  std::uint64_t seen = 0;
  for (const auto& b : batches) {
    seen += b.samples.size();
    if (b.tokens > 30) {
      REQUIRE(b.samples.size() == 1);
      REQUIRE((b.tokens == 500 || b.tokens == 700));
    }
  }
  REQUIRE(seen == 8);
}

TEST_CASE("under a context length the token budget counts what is trained", "[interface]") {
  SyntheticSource src({{10, 10, 500, 10, 10, 10, 700, 10, 40, 40}});
  for (const bool drops : {false, true}) {
    SamplerConfig c = token_config(3, 60);
    c.context_tokens = 30;
    c.context_drops = drops;
    Sampler s(src, c);
    const auto batches = drain(s);
    std::uint64_t seen = 0;
    for (const auto& b : batches) {
      seen += b.samples.size();
      std::uint64_t counted = 0, raw = 0;
      for (const auto& r : b.samples) {
        const std::uint64_t n = src.sample_tokens(r.task, r.index);
        counted += n > 30 ? (drops ? 0 : 30) : n;
        raw += n;
      }
      CHECK(b.tokens == raw);  // the batch's tokens as sampled; the budget counted what is trained
      CHECK(counted <= 60);    // no sample counts more than the context length: none is a batch alone
    }
    CHECK(seen == 10);  // every sample delivered (a dropped one is the planner's to leave out)
    // The setting is part of the state's identity.
    SamplerConfig other = c;
    other.context_tokens = 31;
    Sampler t(src, other);
    CHECK_THROWS(t.restore(s.state()));
  }
}

TEST_CASE("an empty split gives an empty epoch", "[boundary]") {
  SyntheticSource src({std::vector<std::uint32_t>(10, 1)});
  SamplerConfig c = token_config(1, 100);
  c.split_fractions = {1, 0, 0};
  c.split = Split::Test;
  Sampler s(src, c);
  REQUIRE(s.epoch_size() == 0);
  GlobalBatch b;
  REQUIRE_FALSE(s.next_batch(b));
  REQUIRE_THROWS_AS(s.at(0), packpipe::OutOfRange);
}

TEST_CASE("same seed gives the same order; epochs and seeds give different orders", "[interface]") {
  std::mt19937_64 rng(7);
  auto src = SyntheticSource::random(rng, 4, 3000, 256);
  Sampler a(src, token_config(11, 2048)), b(src, token_config(11, 2048)), c(src, token_config(12, 2048));
  const auto ea0 = flatten(drain(a));
  REQUIRE(ea0 == flatten(drain(b)));
  REQUIRE(ea0 != flatten(drain(c)));
  a.set_epoch(1);
  REQUIRE(a.epoch() == 1);
  const auto ea1 = flatten(drain(a));
  REQUIRE(ea1.size() == ea0.size());
  std::size_t same = 0;
  for (std::size_t i = 0; i < ea0.size(); ++i) same += ea0[i] == ea1[i];
  REQUIRE(same < ea0.size() / 100 + 5);
  a.set_epoch(0);
  REQUIRE(flatten(drain(a)) == ea0);
}

TEST_CASE("restoring a checkpoint in a fresh sampler yields exactly the remaining batches", "[interface]") {
  const auto seed = GENERATE(take(20, random(0, 1000000)));
  std::mt19937_64 rng(static_cast<std::uint64_t>(seed));
  const std::size_t tasks = 1 + rng() % 5;
  auto src = SyntheticSource::random(rng, tasks, 1500, 300);
  SamplerConfig c;
  c.seed = rng();
  if (rng() % 2) {
    c.global_batch_tokens = 200 + rng() % 3000;
  } else {
    c.global_batch_samples = 1 + rng() % 50;
  }
  if (rng() % 2) {
    for (std::size_t t = 0; t < src.num_tasks(); ++t) c.weights.push_back(1.0 + static_cast<double>(rng() % 5));
    c.samples_per_epoch = rng() % 4000;
  }
  const Cut k = cut_epoch(src, c, rng() % 3, rng);
  const auto& all = k.all;
  const std::size_t cut = k.cut;
  const Sampler& full = k.full;
  const std::string saved = k.saved.to_json();

  Sampler resumed(src, c);
  resumed.restore(SamplerState::from_json(saved));
  REQUIRE(resumed.epoch() == full.epoch());
  std::vector<GlobalBatch> rest = drain(resumed);
  REQUIRE(rest.size() == all.size() - cut);
  for (std::size_t i = 0; i < rest.size(); ++i) {
    REQUIRE(rest[i].index == all[cut + i].index);
    REQUIRE(rest[i].first_position == all[cut + i].first_position);
    REQUIRE(rest[i].tokens == all[cut + i].tokens);
    REQUIRE(rest[i].samples == all[cut + i].samples);
  }
}

TEST_CASE("restore rejects a state of another config or source", "[negative]") {
  SyntheticSource src({std::vector<std::uint32_t>(100, 3)});
  SyntheticSource other({std::vector<std::uint32_t>(101, 3)});
  Sampler s(src, token_config(5, 30));
  GlobalBatch b;
  s.next_batch(b);
  const SamplerState st = s.state();

  Sampler different_seed(src, token_config(6, 30));
  REQUIRE_THROWS_WITH(different_seed.restore(st), Catch::Matchers::Contains("fingerprint"));
  Sampler different_budget(src, token_config(5, 31));
  REQUIRE_THROWS_AS(different_budget.restore(st), packpipe::InvalidArgument);
  Sampler different_source(other, token_config(5, 30));
  REQUIRE_THROWS_AS(different_source.restore(st), packpipe::InvalidArgument);
  SamplerState past = st;
  past.position = 101;
  REQUIRE_THROWS_WITH(s.restore(past), Catch::Matchers::Contains("past the epoch size 100"));
}

TEST_CASE("restore refuses a tampered state: every position but the real one, any out-of-range field",
          "[negative][checkpoint]") {
  std::mt19937_64 rng(42);
  auto src = SyntheticSource::random(rng, 3, 400, 300);
  for (const bool by_tokens : {true, false}) {
    SamplerConfig c;
    c.seed = 9;
    if (by_tokens) {
      c.global_batch_tokens = 900;
    } else {
      c.global_batch_samples = 7;
    }
    Sampler s(src, c);
    GlobalBatch b;
    for (int i = 0; i < 5; ++i) REQUIRE(s.next_batch(b));
    const SamplerState good = s.state();
    Sampler fresh(src, c);
    REQUIRE_NOTHROW(fresh.restore(good));
    for (const std::int64_t d : {-3, -1, 1, 2}) {
      SamplerState bad = good;
      bad.position = static_cast<std::uint64_t>(static_cast<std::int64_t>(good.position) + d);
      REQUIRE_THROWS_WITH(fresh.restore(bad), Catch::Matchers::Contains("skip or repeat"));
      SamplerState idx = good;
      idx.batch_index = static_cast<std::uint64_t>(static_cast<std::int64_t>(good.batch_index) + (d > 0 ? 1 : -1));
      REQUIRE_THROWS_AS(fresh.restore(idx), packpipe::InvalidArgument);
    }
    SamplerState huge = good;
    huge.batch_index = ~std::uint64_t{0};
    REQUIRE_THROWS_AS(fresh.restore(huge), packpipe::InvalidArgument);
    huge = good;
    huge.epoch = ~std::uint64_t{0};
    REQUIRE_THROWS_WITH(fresh.restore(huge), Catch::Matchers::Contains("epoch"));
    // A state from a dataset of the same sizes but other lengths has another fingerprint.
    std::mt19937_64 rng2(43);
    auto other = SyntheticSource::random(rng2, 3, 400, 300);
    bool same_sizes = true;
    for (std::size_t t = 0; t < 3; ++t) same_sizes = same_sizes && other.task_size(t) == src.task_size(t);
    if (same_sizes) {
      Sampler o(other, c);
      REQUIRE_THROWS_WITH(o.restore(good), Catch::Matchers::Contains("fingerprint"));
    }
  }
  // A repeated key in the JSON would replay batches: refused.
  REQUIRE_THROWS_WITH(
      SamplerState::from_json(R"({"seed":1,"epoch":0,"position":9,"batch_index":1,"fingerprint":"ab","position":0})"),
      Catch::Matchers::Contains("duplicate key \"position\""));
}

namespace {
// A source that counts the sample lengths read through it.
class CountingSource : public packpipe::dataloader::SampleSource {
 public:
  explicit CountingSource(const SyntheticSource& inner) : inner_(inner) {}
  std::size_t num_tasks() const override { return inner_.num_tasks(); }
  std::uint64_t task_size(std::size_t t) const override { return inner_.task_size(t); }
  std::uint64_t sample_tokens(std::size_t t, std::uint64_t i) const override {
    ++reads;
    return inner_.sample_tokens(t, i);
  }
  mutable std::uint64_t reads = 0;

 private:
  const SyntheticSource& inner_;
};
}  // namespace

TEST_CASE("restore at random positions: O(tasks) with the state's check, the identical sequence, edits refused",
          "[checkpoint]") {
  std::mt19937_64 rng(2026);
  for (int round = 0; round < 12; ++round) {
    auto inner = SyntheticSource::random(rng, 1 + rng() % 40, 800, 500);
    CountingSource src(inner);
    SamplerConfig c;
    c.seed = rng();
    c.global_batch_tokens = 300 + rng() % 4000;
    if (rng() % 2) {
      for (std::size_t t = 0; t < src.num_tasks(); ++t) c.weights.push_back(0.5 + static_cast<double>(rng() % 4));
      c.samples_per_epoch = 100 + rng() % 5000;
    }
    const Cut k = cut_epoch(src, c, rng() % 4, rng);
    const auto& all = k.all;
    const std::size_t cut = k.cut;
    const SamplerState saved = SamplerState::from_json(k.saved.to_json());
    REQUIRE(saved.check != 0);

    Sampler resumed(src, c);
    const std::uint64_t before = src.reads;
    resumed.restore(saved);
    CHECK(src.reads == before);  // no replay: not one sample length read
    const auto rest = drain(resumed);
    REQUIRE(rest.size() == all.size() - cut);
    for (std::size_t i = 0; i < rest.size(); ++i) {
      REQUIRE(rest[i].index == all[cut + i].index);
      REQUIRE(rest[i].samples == all[cut + i].samples);
    }
    // Any edited field is refused by the check ...
    for (const std::int64_t d : {-1, 1}) {
      SamplerState bad = saved;
      bad.position = static_cast<std::uint64_t>(static_cast<std::int64_t>(saved.position) + d);
      if (bad.position <= resumed.epoch_size() && bad.position >= bad.batch_index) {
        REQUIRE_THROWS_WITH(Sampler(src, c).restore(bad), Catch::Matchers::Contains("skip or repeat"));
      }
      SamplerState idx = saved;
      idx.batch_index = static_cast<std::uint64_t>(static_cast<std::int64_t>(saved.batch_index) + d);
      if (idx.batch_index <= idx.position) REQUIRE_THROWS_AS(Sampler(src, c).restore(idx), packpipe::InvalidArgument);
    }
    // ... and a state without one (written before checks existed) is still checked, by replay.
    SamplerState legacy = saved;
    legacy.check = 0;
    REQUIRE(legacy.to_json().find("check") == std::string::npos);
    Sampler replayed(src, c);
    replayed.restore(SamplerState::from_json(legacy.to_json()));
    REQUIRE(replayed.position() == saved.position);
    if (cut > 0 && saved.position + 1 <= replayed.epoch_size()) {
      SamplerState moved = legacy;
      moved.position += 1;
      REQUIRE_THROWS_WITH(Sampler(src, c).restore(moved), Catch::Matchers::Contains("skip or repeat"));
    }
  }
  REQUIRE_THROWS_WITH(SamplerState::from_json(R"({"seed":1,"epoch":0,"position":0,"batch_index":0,"fingerprint":"ab",)"
                                              R"("check":"xyz"})"),
                      Catch::Matchers::Contains("'check'"));
}

TEST_CASE("samples_per_epoch beyond 2^48 is refused instead of hanging", "[negative]") {
  SyntheticSource src({std::vector<std::uint32_t>(10, 3), std::vector<std::uint32_t>(10, 4)});
  SamplerConfig c = token_config(1, 100);
  c.weights = {1.0, 2.0};
  c.samples_per_epoch = ~std::uint64_t{0};
  REQUIRE_THROWS_WITH(Sampler(src, c), Catch::Matchers::Contains("samples_per_epoch"));
  c.samples_per_epoch = (std::uint64_t{1} << 48) + 1;
  REQUIRE_THROWS_AS(Sampler(src, c), packpipe::InvalidArgument);
}

TEST_CASE("sampler state JSON round-trips and rejects bad fields", "[interface][negative]") {
  SamplerState st;
  st.seed = 1;
  st.epoch = 2;
  st.position = 3;
  st.batch_index = 4;
  st.fingerprint = 0xfedcba9876543210ULL;
  const SamplerState back = SamplerState::from_json(st.to_json());
  CHECK(back.seed == 1);
  CHECK(back.epoch == 2);
  CHECK(back.position == 3);
  CHECK(back.batch_index == 4);
  CHECK(back.fingerprint == st.fingerprint);
  REQUIRE_THROWS_WITH(SamplerState::from_json(R"({"seed":1,"epoch":2,"batch_index":4,"fingerprint":"ab"})"),
                      Catch::Matchers::Contains("missing field 'position'"));
  REQUIRE_THROWS_WITH(SamplerState::from_json(R"({"seed":-1,"epoch":2,"position":1,"batch_index":4,"fingerprint":"ab"})"),
                      Catch::Matchers::Contains("'seed'"));
  REQUIRE_THROWS_WITH(SamplerState::from_json(R"({"seed":1,"epoch":2,"position":1,"batch_index":4,"fingerprint":"xyz"})"),
                      Catch::Matchers::Contains("'fingerprint'"));
  REQUIRE_THROWS_AS(SamplerState::from_json("{"), packpipe::InvalidArgument);
}

TEST_CASE("invalid sampler configs are rejected with expected versus found", "[negative]") {
  SyntheticSource src({std::vector<std::uint32_t>(10, 1), std::vector<std::uint32_t>(10, 1)});
  SamplerConfig c;
  REQUIRE_THROWS_WITH(Sampler(src, c), Catch::Matchers::Contains("exactly one of global_batch_tokens"));
  c.global_batch_tokens = 10;
  c.global_batch_samples = 10;
  REQUIRE_THROWS_AS(Sampler(src, c), packpipe::InvalidArgument);
  c.global_batch_samples = 0;
  c.weights = {1.0};
  REQUIRE_THROWS_WITH(Sampler(src, c), Catch::Matchers::Contains("1 weights for 2 tasks"));
  c.weights = {1.0, -2.0};
  REQUIRE_THROWS_WITH(Sampler(src, c), Catch::Matchers::Contains("task 1 is -2"));
  c.weights = {0.0, 0.0};
  REQUIRE_THROWS_WITH(Sampler(src, c), Catch::Matchers::Contains("total weight 0"));
  c.weights.clear();
  c.samples_per_epoch = 5;
  REQUIRE_THROWS_WITH(Sampler(src, c), Catch::Matchers::Contains("needs weights"));
  c.samples_per_epoch = 0;
  c.split_fractions = {0, 0, 0};
  REQUIRE_THROWS_WITH(Sampler(src, c), Catch::Matchers::Contains("split fractions sum to 0"));
  c.split_fractions = {1, -1, 1};
  REQUIRE_THROWS_AS(Sampler(src, c), packpipe::InvalidArgument);
  SyntheticSource empty(std::vector<std::vector<std::uint32_t>>{});
  REQUIRE_THROWS_WITH(Sampler(empty, token_config(1, 1)), Catch::Matchers::Contains("no tasks"));
}

// ---- sharding -------------------------------------------------------------------

TEST_CASE("shards of a batch are disjoint, cover the batch and balance tokens greedily", "[interface]") {
  const auto seed = GENERATE(take(20, random(0, 1000000)));
  std::mt19937_64 rng(static_cast<std::uint64_t>(seed));
  auto src = SyntheticSource::random(rng, 3, 2000, 1024);
  const std::uint64_t sampler_seed = rng();
  Sampler s(src, token_config(sampler_seed, 20000 + rng() % 50000));
  const std::uint32_t world = 1 + static_cast<std::uint32_t>(rng() % 16);
  GlobalBatch b;
  REQUIRE(s.next_batch(b));
  std::vector<SampleRef> all;
  std::vector<std::uint64_t> tokens(world, 0);
  for (std::uint32_t r = 0; r < world; ++r) {
    const auto shard = shard_batch(b, src, r, world);
    REQUIRE(shard == shard_batch(b, src, r, world));  // deterministic
    for (const auto& x : shard) tokens[r] += src.sample_tokens(x.task, x.index);
    all.insert(all.end(), shard.begin(), shard.end());
  }
  auto expected = b.samples;
  std::sort(all.begin(), all.end());
  std::sort(expected.begin(), expected.end());
  REQUIRE(all == expected);
  // Greedy least-loaded: no rank exceeds another by more than the longest sample.
  std::uint64_t longest = 0;
  for (const auto& x : b.samples) longest = std::max(longest, src.sample_tokens(x.task, x.index));
  const auto [lo, hi] = std::minmax_element(tokens.begin(), tokens.end());
  REQUIRE(*hi - *lo <= longest);
}

TEST_CASE("shard_batch over a world larger than the batch: the greedy over every rank, in O(samples)", "[interface]") {
  std::mt19937_64 rng(Catch::rngSeed());
  auto src = SyntheticSource::random(rng, 2, 200, 64);
  Sampler s(src, token_config(rng(), 600));
  GlobalBatch b;
  REQUIRE(s.next_batch(b));
  const auto n = static_cast<std::uint32_t>(b.samples.size());
  // The reference: least loaded of every rank of the world, ties to the lowest.
  const std::uint32_t world = n + 7;
  std::vector<std::uint64_t> load(world, 0);
  std::vector<std::vector<SampleRef>> want(world);
  for (const auto& x : b.samples) {
    const auto r = static_cast<std::size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    want[r].push_back(x);
    load[r] += src.sample_tokens(x.task, x.index);
  }
  for (std::uint32_t r = 0; r < world; ++r) REQUIRE(shard_batch(b, src, r, world) == want[r]);
  // A world of 2^32 - 1 ranks: the same shards, at once (it built a heap of every rank: 16 GB at 2^31).
  const std::uint32_t huge = std::numeric_limits<std::uint32_t>::max();
  for (std::uint32_t r = 0; r < n; ++r) REQUIRE(shard_batch(b, src, r, huge) == want[r]);
  REQUIRE(shard_batch(b, src, huge - 1, huge).empty());
}

TEST_CASE("shard_batch rejects a bad rank or world", "[negative]") {
  SyntheticSource src({std::vector<std::uint32_t>(4, 1)});
  GlobalBatch b;
  REQUIRE_THROWS_WITH(shard_batch(b, src, 0, 0), Catch::Matchers::Contains("world size 0"));
  REQUIRE_THROWS_WITH(shard_batch(b, src, 4, 4), Catch::Matchers::Contains("rank 4"));
}
