// The data path from a plan to token tensors: assemble_microbatch against a reference built here
// from the synthetic dataset's tokens (packed and padded rows, both loss modes, decoder-only and
// encoder-decoder, empty sides, a compressed task), the layouts of packing::row_tensors, and the
// RankLoader over a planner and over a plan file (resumption, every rank, errors in order).
#include <catch2/catch.hpp>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "common/errors.h"
#include "costmodel/analytic.h"
#include "dataloader/batch.h"
#include "dataloader/manifest.h"
#include "dataloader/multitask.h"
#include "dataloader/zstd_seekable.h"
#include "packing/rows.h"
#include "plan/format.h"
#include "planner/context.h"
#include "planner/epoch.h"
#include "planner/loader.h"
#include "tests/support/old_plan_formats.h"
#include "tests/support/synthetic.h"
#include "tests/support/temp_dir.h"

using namespace packpipe::planner;
namespace cm = packpipe::costmodel;
namespace dl = packpipe::dataloader;
namespace part = packpipe::partition;
namespace pl = packpipe::plan;
using Catch::Matchers::Contains;
using packpipe::test::Documents;

namespace {

using Tokens = std::vector<std::int64_t>;

/// A dataset on disk and, for the reference, every sample's tokens: task 0 "qa" (paired prefixes,
/// uint16, some empty inputs or targets), task 1 "text" (one sequence per sample, int32 ids above
/// 2^16), task 2 "ztext" (one sequence per sample, stored .bin.zst), task 3 "long" (paired
/// prefixes of thousands of tokens, for truncation; sampled only where a test asks).
struct Synthetic {
  packpipe::test::TempDir dir;
  std::vector<std::vector<std::pair<Tokens, Tokens>>> samples;  ///< [task][index] = (input, target)
  std::unique_ptr<dl::MultiTaskDataset> data;

  Synthetic() {
    std::mt19937_64 rng(2026);
    auto tokens = [&](std::size_t n, std::int64_t lo, std::int64_t hi) {
      std::uniform_int_distribution<std::int64_t> d(lo, hi);
      Tokens t(n);
      for (auto& x : t) x = d(rng);
      return t;
    };
    auto length = [&](std::size_t lo, std::size_t hi) { return std::uniform_int_distribution<std::size_t>(lo, hi)(rng); };
    samples.resize(4);
    Documents qa_in, qa_tg, text, ztext;
    for (int i = 0; i < 48; ++i) {
      std::size_t a = length(1, 30), b = length(1, 20);
      if (i % 7 == 3) a = 0;  // an empty input
      if (i % 7 == 5) b = 0;  // an empty target
      samples[0].emplace_back(tokens(a, 1, 60000), tokens(b, 1, 60000));
      qa_in.push_back({samples[0].back().first});
      qa_tg.push_back({samples[0].back().second});
    }
    for (int i = 0; i < 30; ++i) {
      samples[1].emplace_back(tokens(length(1, 60), 70000, 900000), Tokens{});
      text.push_back({samples[1].back().first});
    }
    for (int i = 0; i < 20; ++i) {
      samples[2].emplace_back(tokens(length(1, 40), 1, 60000), Tokens{});
      ztext.push_back({samples[2].back().first});
    }
    Documents long_in, long_tg;
    for (const auto& [a, b] : {std::pair<std::size_t, std::size_t>{3000, 5000}, {500, 7500}, {6000, 2000}}) {
      samples[3].emplace_back(tokens(a, 1, 60000), tokens(b, 1, 60000));
      long_in.push_back({samples[3].back().first});
      long_tg.push_back({samples[3].back().second});
    }
    packpipe::test::write_documents(dir.file("long_in"), dl::DType::UInt16, long_in);
    packpipe::test::write_documents(dir.file("long_tg"), dl::DType::UInt16, long_tg);
    packpipe::test::write_documents(dir.file("qa_in"), dl::DType::UInt16, qa_in);
    packpipe::test::write_documents(dir.file("qa_tg"), dl::DType::UInt16, qa_tg);
    packpipe::test::write_documents(dir.file("text"), dl::DType::Int32, text);
    packpipe::test::write_documents(dir.file("ztext"), dl::DType::UInt16, ztext);
    dl::zstd_seekable_compress(dir.file("ztext.bin"), dir.file("ztext.bin.zst"));
    std::filesystem::remove(dir.file("ztext.bin"));
    dl::Manifest m;
    m.path = "loader-test.json";
    m.tasks.resize(4);
    m.tasks[0].name = "qa";
    m.tasks[0].layout = dl::TaskLayout::PairedPrefixes;
    m.tasks[0].prefixes = {dir.file("qa_in")};
    m.tasks[0].target_prefixes = {dir.file("qa_tg")};
    m.tasks[1].name = "text";
    m.tasks[1].prefixes = {dir.file("text")};
    m.tasks[2].name = "ztext";
    m.tasks[2].prefixes = {dir.file("ztext")};
    m.tasks[3].name = "long";
    m.tasks[3].layout = dl::TaskLayout::PairedPrefixes;
    m.tasks[3].prefixes = {dir.file("long_in")};
    m.tasks[3].target_prefixes = {dir.file("long_tg")};
    data = std::make_unique<dl::MultiTaskDataset>(m);
  }
};

const Synthetic& synthetic() {
  static const Synthetic s;
  return s;
}

const cm::AnalyticCostModel& gpt() {
  static const cm::AnalyticCostModel c(cm::load_model("gpt-350m"), cm::load_device("A100-40GB"));
  return c;
}

const cm::AnalyticCostModel& t5() {
  static const cm::AnalyticCostModel c(cm::load_model("t5-770m"), cm::load_device("A100-40GB"));
  return c;
}

/// Batches of `batch_tokens` of the short tasks (`with_long`: of every task), each sample once an
/// epoch (weights in proportion to the task sizes: a sample drawn twice in one batch would appear
/// twice in a plan, which the validator refuses).
EpochSpec spec(std::uint64_t batch_tokens = 500, bool with_long = false) {
  EpochSpec s;
  s.sampler = dl::sampler_config(synthetic().data->manifest());
  s.sampler.seed = 3;
  s.sampler.global_batch_tokens = batch_tokens;
  s.sampler.weights = {48, 30, 20, with_long ? 3.0 : 0.0};
  s.sampler.samples_per_epoch = with_long ? 101 : 98;
  return s;
}

enum class Rows { Padded, Packing, PackWindows };

PlannerOptions options(Rows rows, pl::LossMode loss, std::int64_t dp = 1) {
  PlannerOptions o;
  o.shape.stages = 2;
  o.shape.dp = dp;
  o.baselines = false;
  o.validate = true;
  o.loss_mode = loss;
  if (rows == Rows::Packing) {
    o.partition.method = part::PartitionMethod::Packing;
    o.partition.microbatch_size = 2;
  }
  o.partition.pack_windows = rows == Rows::PackWindows;
  return o;
}

std::vector<PlannedIteration> drain(EpochPlanner& p) {
  std::vector<PlannedIteration> out;
  PlannedIteration it;
  while (p.next(it)) out.push_back(std::move(it));
  return out;
}

/// Rows of a micro-batch as CSR offsets (one row per sample when the plan gives none).
std::vector<std::uint64_t> rows_of(const pl::PlanMicroBatch& mb) {
  std::vector<std::uint64_t> r;
  if (mb.row_offsets.empty()) {
    for (std::size_t i = 0; i <= mb.samples.size(); ++i) r.push_back(i);
  } else {
    r.assign(mb.row_offsets.begin(), mb.row_offsets.end());
  }
  return r;
}

/// Every tensor of a micro-batch by the written rule, from the samples' tokens.
struct Reference {
  Tokens input_ids, position_ids, labels, decoder_input_ids, decoder_labels;
  std::uint64_t loss_tokens = 0;
};

Reference reference(const pl::Plan& plan, std::size_t m, const TokenOptions& t) {
  const pl::PlanMicroBatch& mb = plan.microbatches[m];
  const bool encdec = !mb.target_lengths.empty();
  const std::size_t W = mb.padded_len, D = mb.padded_dec_len, R = mb.rows;
  Reference x;
  x.input_ids.assign(R * W, t.pad_id);
  x.position_ids.assign(R * W, 0);
  x.labels.assign(R * W, t.ignore_index);
  if (encdec) {
    x.decoder_input_ids.assign(R * D, t.pad_id);
    x.decoder_labels.assign(R * D, t.ignore_index);
  }
  const auto rows = rows_of(mb);
  for (std::size_t r = 0; r < R; ++r) {
    std::size_t pos = r * W, dpos = r * D;
    for (auto k = rows[r]; k < rows[r + 1]; ++k) {
      const auto& [in, tg] = synthetic().samples[mb.refs[k].task][mb.refs[k].index];
      const std::uint32_t len = mb.lengths[k];
      if (!encdec) {
        // tokens [o, o + len) of input then target (o > 0: a chunk of a sample split at the context length)
        const std::size_t o = mb.refs[k].offset;
        Tokens whole = in;
        whole.insert(whole.end(), tg.begin(), tg.end());
        REQUIRE(o + len <= whole.size());
        for (std::uint32_t p = 0; p < len; ++p) {
          x.input_ids[pos + p] = whole[o + p];
          x.position_ids[pos + p] = p;
          const bool labelled = p + 1 < len && (plan.loss_mode == pl::LossMode::AllTokens || o + p + 1 >= in.size());
          if (labelled) {
            x.labels[pos + p] = whole[o + p + 1];
            ++x.loss_tokens;
          }
        }
        pos += len;
        continue;
      }
      REQUIRE(mb.refs[k].offset == 0);
      const Tokens encoder = in.empty() ? Tokens{t.pad_id} : in;
      REQUIRE(len <= encoder.size());
      for (std::uint32_t p = 0; p < len; ++p) {
        x.input_ids[pos + p] = encoder[p];
        x.position_ids[pos + p] = p;
      }
      const std::uint32_t tl = mb.target_lengths[k];
      for (std::uint32_t j = 0; j < tl; ++j) {
        x.decoder_input_ids[dpos + j] = j == 0 ? t.decoder_start_id : tg[j - 1];
        if (j < tg.size()) {
          x.decoder_labels[dpos + j] = tg[j];
          ++x.loss_tokens;
        }
      }
      pos += len;
      dpos += tl;
    }
  }
  return x;
}

/// Checks what `got` (one LOAD_MB of `plan`) holds against the reference: the tensors its stage
/// loads, and no other.
void check_loaded(const pl::Plan& plan, const LoadedTensors& got, const TokenOptions& t) {
  const pl::PlanMicroBatch& mb = plan.microbatches[got.mb];
  INFO("iteration " << plan.iteration << ", micro-batch " << got.mb << ", stage " << got.stage);
  const Reference x = reference(plan, got.mb, t);
  CHECK(got.rows == mb.rows);
  CHECK(got.seq == mb.padded_len);
  CHECK(got.dec_seq == mb.padded_dec_len);
  CHECK(got.loads == plan.stages[got.stage].loads);
  CHECK(got.loss_tokens == x.loss_tokens);
  CHECK(got.loss_tokens == mb.loss_tokens);
  auto expect = [&](std::uint8_t bit, const Tokens& have, const Tokens& want) {
    if (got.loads & bit) {
      CHECK(have == want);
    } else {
      CHECK(have.empty());
    }
  };
  expect(pl::kLoadInputIds, got.input_ids, x.input_ids);
  expect(pl::kLoadPositionIds, got.position_ids, x.position_ids);
  expect(pl::kLoadLabels, got.labels, x.labels);
  expect(pl::kLoadDecoderInputIds, got.decoder_input_ids, x.decoder_input_ids);
  expect(pl::kLoadDecoderLabels, got.decoder_labels, x.decoder_labels);
}

/// The layouts of micro-batch m against packing::row_tensors on the same rows and lengths.
void check_layout(const pl::Plan& plan, std::size_t m, bool decoder) {
  const pl::PlanMicroBatch& mb = plan.microbatches[m];
  packpipe::packing::Packing p;
  for (std::uint32_t i = 0; i < mb.samples.size(); ++i) p.samples.push_back(i);
  p.row_offsets = rows_of(mb);
  const auto& lengths = decoder ? mb.target_lengths : mb.lengths;
  const std::uint32_t width = decoder ? mb.padded_dec_len : mb.padded_len;
  p.capacity = width;
  const packpipe::packing::RowTensors want = packpipe::packing::row_tensors(p, lengths.data(), width);
  const RowLayout got = microbatch_layout(plan, m, decoder);
  CHECK(got.rows == mb.rows);
  CHECK(got.seq == width);
  CHECK(got.cu_seqlens == want.cu_seqlens);
  CHECK(got.position_ids == want.position_ids);
  CHECK(got.segment_ids == want.segment_ids);
  CHECK(got.max_seqlen == want.max_seqlen);
}

/// Every micro-batch of every plan of `its`, at the stages that load and with every tensor forced
/// on stage 0; returns (micro-batches with a row of two samples or more, samples with an empty side).
std::pair<int, int> check_iterations(const std::vector<PlannedIteration>& its, const TokenOptions& t) {
  int packed = 0, empty_sides = 0;
  for (const auto& it : its) {
    for (const pl::Plan& plan : it.result.plans) {
      const bool encdec = plan.stages.back().decoder_layers > 0;
      pl::Plan all = plan;  // stage 0 loading every tensor of the model's kind
      all.stages[0].loads = pl::kLoadInputIds | pl::kLoadPositionIds |
                            (encdec ? pl::kLoadDecoderInputIds | pl::kLoadDecoderLabels : pl::kLoadLabels);
      for (std::size_t m = 0; m < plan.microbatches.size(); ++m) {
        const auto& mb = plan.microbatches[m];
        const auto rows = rows_of(mb);
        for (std::size_t r = 0; r + 1 < rows.size(); ++r) packed += rows[r + 1] - rows[r] >= 2 ? 1 : 0;
        for (const auto& ref : mb.refs) {
          const auto& [in, tg] = synthetic().samples[ref.task][ref.index];
          empty_sides += (in.empty() || (ref.task == 0 && tg.empty())) ? 1 : 0;
        }
        for (std::uint32_t v = 0; v < plan.vstages; ++v) {
          if (plan.stages[v].loads != 0) check_loaded(plan, assemble_microbatch(*synthetic().data, plan, m, v, t), t);
        }
        check_loaded(all, assemble_microbatch(*synthetic().data, all, m, 0, t), t);
        check_layout(plan, m, false);
        if (encdec) check_layout(plan, m, true);
      }
    }
  }
  return {packed, empty_sides};
}

void check_same(const LoadedTensors& a, const LoadedTensors& b) {
  CHECK(a.mb == b.mb);
  CHECK(a.stage == b.stage);
  CHECK(a.rows == b.rows);
  CHECK(a.seq == b.seq);
  CHECK(a.dec_seq == b.dec_seq);
  CHECK(a.loads == b.loads);
  CHECK(a.loss_tokens == b.loss_tokens);
  CHECK(a.input_ids == b.input_ids);
  CHECK(a.position_ids == b.position_ids);
  CHECK(a.labels == b.labels);
  CHECK(a.decoder_input_ids == b.decoder_input_ids);
  CHECK(a.decoder_labels == b.decoder_labels);
}

/// The loads of `rank` (every rank for -1) of `plan`, assembled directly from `data`.
std::vector<LoadedTensors> direct_loads(const pl::Plan& plan, std::int64_t rank, const TokenOptions& t = {},
                                        const dl::MultiTaskDataset& data = *synthetic().data) {
  std::vector<LoadedTensors> out;
  for (std::size_t r = 0; r < plan.streams.size(); ++r) {
    if (rank >= 0 && r != static_cast<std::size_t>(rank)) continue;
    for (const auto& ins : plan.streams[r]) {
      if (ins.op == pl::Opcode::LoadMb) out.push_back(assemble_microbatch(data, plan, ins.mb, ins.stage, t));
    }
  }
  return out;
}

std::vector<RankIteration> drain(RankLoader& l) {
  std::vector<RankIteration> out;
  RankIteration it;
  while (l.next(it)) out.push_back(std::move(it));
  return out;
}

/// A plan file of every replica of every iteration of `its`.
void write_plans(const std::string& path, const std::vector<PlannedIteration>& its) {
  pl::PlanFileWriter w(path);
  w.expect_iterations(its.front().iteration, its.size());
  for (const auto& it : its) {
    for (const auto& p : it.result.plans) w.append(p);
  }
  w.close();
}

}  // namespace

TEST_CASE("loader: decoder-only tensors follow the token rule, packed and padded, both loss modes", "[interface]") {
  const TokenOptions t{-100, 7, 0};
  int packed = 0, empty_sides = 0;
  for (const Rows rows : {Rows::Padded, Rows::Packing, Rows::PackWindows}) {
    for (const pl::LossMode loss : {pl::LossMode::AllTokens, pl::LossMode::Targets}) {
      INFO("rows " << static_cast<int>(rows) << ", loss " << pl::loss_mode_name(loss));
      EpochPlanner p(*synthetic().data, gpt(), options(rows, loss), spec());
      const auto its = drain(p);
      REQUIRE(its.size() >= 3);
      const auto [k, e] = check_iterations(its, t);
      packed += rows == Rows::Padded ? 0 : k;
      empty_sides += e;
    }
  }
  CHECK(packed > 0);       // packed rows were exercised
  CHECK(empty_sides > 0);  // empty inputs and targets too
}

TEST_CASE("loader: encoder-decoder tensors shift the targets behind the start token; empty sides are one token",
          "[interface]") {
  const TokenOptions t{-1, 3, 5};
  int packed = 0, empty_sides = 0;
  for (const Rows rows : {Rows::Padded, Rows::Packing}) {
    EpochPlanner p(*synthetic().data, t5(), options(rows, pl::LossMode::AllTokens), spec());
    const auto its = drain(p);
    REQUIRE(its.size() >= 3);
    const auto [k, e] = check_iterations(its, t);
    packed += rows == Rows::Padded ? 0 : k;
    empty_sides += e;
  }
  CHECK(packed > 0);
  CHECK(empty_sides > 0);
}

TEST_CASE("loader: a truncated decoder-only sample keeps its first tokens and the plan's loss tokens",
          "[interface][regression]") {
  // A memory limit that cuts the longest samples: the plan's loss tokens (trained_lengths) must match
  // what the kept tokens label, in both loss modes.
  for (const pl::LossMode loss : {pl::LossMode::AllTokens, pl::LossMode::Targets}) {
    for (const Rows rows : {Rows::Padded, Rows::Packing}) {
      PlannerOptions o = options(rows, loss);
      o.partition.oversize = part::OversizePolicy::Truncate;
      o.shape.memory_limit_mb = 6000;  // the model state fits; about 4000 tokens of a sample do
      o.partition.microbatch_size = 1;  // packing: one row of the longest (truncated) length
      EpochPlanner p(*synthetic().data, gpt(), o, spec(10000, true));
      const auto its = drain(p);
      std::uint64_t truncated = 0;
      for (const auto& it : its) truncated += it.result.truncated;
      CHECK(truncated == 3);  // the three long samples, each once
      check_iterations(its, TokenOptions{});
    }
  }
}

TEST_CASE("loader: the context length's chunks, truncations and drops follow the token rule", "[interface]") {
  // The long task's samples (8,000 tokens, the input ending at 3,000, 500 and 6,000) over a context
  // length of 700: chunks that start inside the input, straddle the boundary and start inside the
  // target; every position below 700; the loss tokens the plan counts are the labels assembled.
  for (const SeqPolicy policy : {SeqPolicy::Split, SeqPolicy::Truncate, SeqPolicy::Drop}) {
    for (const pl::LossMode loss : {pl::LossMode::AllTokens, pl::LossMode::Targets}) {
      for (const Rows rows : {Rows::Padded, Rows::Packing}) {
        INFO(seq_policy_name(policy) << ", loss " << pl::loss_mode_name(loss) << ", rows " << static_cast<int>(rows));
        PlannerOptions o = options(rows, loss);
        o.context.max_seq_len = 700;
        o.context.policy = policy;
        EpochPlanner p(*synthetic().data, gpt(), o, spec(10000, true));
        const auto its = drain(p);
        ContextReport total;
        std::uint64_t chunks_seen = 0;
        for (const auto& it : its) {
          total.truncated += it.context.truncated;
          total.dropped += it.context.dropped;
          total.split += it.context.split;
          total.chunks += it.context.chunks;
          CHECK(it.result.context == it.context);
          for (const auto& plan : it.result.plans) {
            CHECK(plan.max_seq_len == 700);
            for (const auto& mb : plan.microbatches) {
              for (std::size_t i = 0; i < mb.samples.size(); ++i) {
                CHECK(mb.lengths[i] <= 700);
                chunks_seen += mb.refs[i].offset > 0 ? 1 : 0;
              }
            }
          }
        }
        const std::uint64_t long_samples = 3;  // 8,000 tokens each; every other sample is under 100
        CHECK(total.truncated == (policy == SeqPolicy::Truncate ? long_samples : 0));
        CHECK(total.dropped == (policy == SeqPolicy::Drop ? long_samples : 0));
        CHECK(total.split == (policy == SeqPolicy::Split ? long_samples : 0));
        CHECK(total.chunks == (policy == SeqPolicy::Split ? long_samples * 12 : 0));  // ceil(8000 / 700)
        CHECK(chunks_seen == (policy == SeqPolicy::Split ? long_samples * 11 : 0));
        check_iterations(its, TokenOptions{});
        for (const auto& it : its) {
          for (const auto& plan : it.result.plans) {
            for (std::size_t m = 0; m < plan.microbatches.size(); ++m) {
              const RowLayout layout = microbatch_layout(plan, m);
              for (const auto pos : layout.position_ids) CHECK(pos < 700);
            }
          }
        }
      }
    }
  }
}

TEST_CASE("loader: assembly errors name the iteration, the micro-batch and the sample", "[negative]") {
  EpochPlanner p(*synthetic().data, gpt(), options(Rows::Packing, pl::LossMode::AllTokens), spec());
  PlannedIteration it;
  REQUIRE(p.next(it));
  const pl::Plan& plan = it.result.plans.front();
  const auto& data = *synthetic().data;
  REQUIRE_NOTHROW(assemble_microbatch(data, plan, 0, 0));
  const std::string where = "iteration 0, micro-batch 0";

  REQUIRE_THROWS_AS(assemble_microbatch(data, plan, plan.microbatches.size(), 0), packpipe::OutOfRange);
  REQUIRE_THROWS_AS(microbatch_layout(plan, plan.microbatches.size()), packpipe::OutOfRange);
  REQUIRE_THROWS_AS(assemble_microbatch(data, plan, 0, plan.vstages), packpipe::OutOfRange);
  REQUIRE_THROWS_WITH(microbatch_layout(plan, 0, true), Contains("a decoder-only plan has no decoder side"));

  pl::Plan x = plan;
  x.stages.clear();  // as a format-1 plan reads
  REQUIRE_THROWS_WITH(assemble_microbatch(data, x, 0, 0), Contains("iteration 0") && Contains("format-1 plan"));
  REQUIRE_THROWS_WITH(microbatch_layout(x, 0), Contains("format-1 plan"));

  x = plan;
  x.microbatches[0].refs.clear();
  REQUIRE_THROWS_WITH(assemble_microbatch(data, x, 0, 0),
                      Contains(where + ": the plan has no sample refs; plan it with plan_epoch or plan_batch(refs=...)"));

  x = plan;
  x.microbatches[0].refs[0] = packpipe::SampleRef{1, 1000};
  REQUIRE_THROWS_WITH(assemble_microbatch(data, x, 0, 0),
                      Contains(where + ", sample 0 (task 'text', dataset sample 1000): the dataset does not hold it") &&
                          Contains("task 1 has 30 samples"));
  x.microbatches[0].refs[0] = packpipe::SampleRef{9, 0};
  REQUIRE_THROWS_WITH(assemble_microbatch(data, x, 0, 0), Contains("sample 0 (task 9, dataset sample 0)"));

  x = plan;
  x.microbatches[0].padded_len += 2000;
  x.microbatches[0].lengths[0] += 1000;
  REQUIRE_THROWS_WITH(assemble_microbatch(data, x, 0, 0),
                      Contains(where + ", sample 0") && Contains(") run past the sample's"));

  x = plan;  // a chunk whose tokens end past its sample
  x.microbatches[0].refs[0].offset = 100000;
  REQUIRE_THROWS_WITH(assemble_microbatch(data, x, 0, 0),
                      Contains(where + ", sample 0") && Contains("its chunk from token 100000") &&
                          Contains("planned tokens [100000, ") && Contains("run past the sample's"));

  x = plan;
  x.microbatches[0].padded_len = 1;
  REQUIRE_THROWS_WITH(assemble_microbatch(data, x, 0, 0), Contains(where + ": row 0 holds") &&
                                                              Contains("more than its padded length 1"));
  x = plan;
  x.microbatches[0].lengths.pop_back();
  REQUIRE_THROWS_WITH(assemble_microbatch(data, x, 0, 0), Contains("sample lengths for"));

  x = plan;
  x.microbatches[0].loss_tokens += 1;
  const std::uint64_t n = plan.microbatches[0].loss_tokens;
  REQUIRE_THROWS_AS(assemble_microbatch(data, x, 0, 0), packpipe::Error);
  REQUIRE_THROWS_WITH(assemble_microbatch(data, x, 0, 1),  // whatever the stage loads
                      Contains(where + ": the plan counts " + std::to_string(n + 1) + " loss tokens, the assembled " +
                               "labels " + std::to_string(n)));
}

TEST_CASE("rank loader: a rank's loads in stream order, from a planner or a plan file, resumable", "[interface]") {
  const TokenOptions t{-100, 0, 0};
  PlannerOptions o = options(Rows::Packing, pl::LossMode::Targets, 2);
  o.partition.microbatch_size = 1;  // a row a micro-batch: enough micro-batches for both replicas
  EpochPlanner reference_planner(*synthetic().data, gpt(), o, spec(600));
  const auto its = drain(reference_planner);
  REQUIRE(its.size() >= 4);
  packpipe::test::TempDir dir;
  const std::string file = dir.file("epoch.plans");
  write_plans(file, its);

  auto check = [&](std::vector<RankIteration> got, std::uint64_t first, std::uint32_t replica, std::int64_t rank) {
    REQUIRE(got.size() == its.size() - first);
    for (std::size_t i = 0; i < got.size(); ++i) {
      const pl::Plan& want = its[first + i].result.plans[replica];
      CHECK(got[i].iteration == first + i);
      CHECK(got[i].plan == want);
      const auto loads = direct_loads(want, rank, t);
      REQUIRE(got[i].loads.size() == loads.size());
      for (std::size_t k = 0; k < loads.size(); ++k) check_same(got[i].loads[k], loads[k]);
    }
  };
  for (const std::int64_t rank : {0, 1, -1}) {
    for (const std::uint32_t replica : {0u, 1u}) {
      RankLoaderOptions lo;
      lo.replica = replica;
      lo.rank = rank;
      lo.depth = rank == 1 ? 1 : 3;
      RankLoader a(*synthetic().data, std::make_unique<EpochPlanner>(*synthetic().data, gpt(), o, spec(600)), lo);
      CHECK(a.iterations() == its.size());
      CHECK(a.position() == 0);
      check(drain(a), 0, replica, rank);
      CHECK(a.position() == its.size());
      RankLoader b(*synthetic().data, file, 0, 0, lo);
      CHECK(b.iterations() == its.size());
      check(drain(b), 0, replica, rank);
    }
  }
  // rank -1 is rank 0's loads, then rank 1's
  const auto every = direct_loads(its[0].result.plans[0], -1);
  const auto r0 = direct_loads(its[0].result.plans[0], 0), r1 = direct_loads(its[0].result.plans[0], 1);
  REQUIRE(every.size() == r0.size() + r1.size());
  for (std::size_t k = 0; k < r0.size(); ++k) CHECK(every[k].stage == 0);
  for (std::size_t k = 0; k < r1.size(); ++k) CHECK(every[r0.size() + k].stage == 1);

  // Resumed at iteration 2: the same as the uninterrupted run from there.
  EpochSpec resumed = spec(600);
  resumed.first_iteration = 2;
  RankLoaderOptions lo;
  RankLoader c(*synthetic().data, std::make_unique<EpochPlanner>(*synthetic().data, gpt(), o, resumed), lo);
  CHECK(c.position() == 2);
  CHECK(c.iterations() == its.size() - 2);
  check(drain(c), 2, 0, 0);
  RankLoader d(*synthetic().data, file, 2, 0, lo);
  CHECK(d.position() == 2);
  check(drain(d), 2, 0, 0);
  RankLoader e(*synthetic().data, file, 1, 2, lo);  // two iterations from 1
  const auto two = drain(e);
  REQUIRE(two.size() == 2);
  CHECK(two[1].iteration == 2);
  CHECK(e.position() == 3);
  RankIteration after;
  CHECK_FALSE(e.next(after));
  CHECK_FALSE(e.next(after));
  // A planner already partly consumed goes on from where it is.
  auto partly = std::make_unique<EpochPlanner>(*synthetic().data, gpt(), o, spec(600));
  PlannedIteration first;
  REQUIRE(partly->next(first));
  RankLoader f(*synthetic().data, std::move(partly), lo);
  CHECK(f.position() == 1);
  CHECK(f.iterations() == its.size() - 1);
  check(drain(f), 1, 0, 0);
  // Resumed at the end of the file: nothing left.
  RankLoader g(*synthetic().data, file, its.size(), 0, lo);
  CHECK(g.iterations() == 0);
  CHECK_FALSE(g.next(after));
}

TEST_CASE("rank loader: bad settings are refused, errors come in order, an early stop never hangs", "[negative]") {
  PlannerOptions o = options(Rows::Packing, pl::LossMode::AllTokens, 2);
  o.partition.microbatch_size = 1;
  const auto& data = *synthetic().data;
  auto planner = [&] { return std::make_unique<EpochPlanner>(data, gpt(), o, spec(600)); };
  RankLoaderOptions lo;
  lo.replica = 2;
  REQUIRE_THROWS_WITH(RankLoader(data, planner(), lo), Contains("replica 2 is out of range: the plans have 2"));
  lo.replica = 0;
  lo.rank = 2;
  REQUIRE_THROWS_WITH(RankLoader(data, planner(), lo), Contains("rank 2 is out of range: the plans have 2 pipeline"));
  lo.rank = -2;
  REQUIRE_THROWS_AS(RankLoader(data, planner(), lo), packpipe::InvalidArgument);
  lo.rank = 0;
  lo.depth = 0;
  REQUIRE_THROWS_WITH(RankLoader(data, planner(), lo), Contains("depth must be at least 1"));
  lo.depth = kMaxLoaderDepth + 1;
  REQUIRE_THROWS_WITH(RankLoader(data, planner(), lo), Contains("at most 1024"));
  lo.depth = 2;
  REQUIRE_THROWS_WITH(RankLoader(data, nullptr, lo), Contains("no planner"));
  const dl::MultiTaskDataset other(synthetic().data->manifest());
  REQUIRE_THROWS_WITH(RankLoader(other, planner(), lo), Contains("another dataset"));

  EpochPlanner source(data, gpt(), o, spec(600));
  auto its = drain(source);
  REQUIRE(its.size() >= 4);
  packpipe::test::TempDir dir;
  REQUIRE_THROWS_AS(RankLoader(data, dir.file("missing.plans"), 0, 0, lo), packpipe::Error);
  // Iteration 2 of this file does not match the dataset: 0 and 1 come, then its error, again later.
  its[2].result.plans[0].microbatches[0].loss_tokens += 1;
  write_plans(dir.file("bad.plans"), its);
  REQUIRE_THROWS_WITH(RankLoader(data, dir.file("bad.plans"), its.size() + 1, 0, lo),
                      Contains("first iteration " + std::to_string(its.size() + 1) + " is not in plan file") &&
                          Contains("iterations 0 to " + std::to_string(its.size() - 1)));
  lo.rank = 2;
  REQUIRE_THROWS_WITH(RankLoader(data, dir.file("bad.plans"), 0, 0, lo), Contains("rank 2 is out of range"));
  lo.rank = -1;
  RankLoader bad(data, dir.file("bad.plans"), 0, 0, lo);
  RankIteration it;
  REQUIRE(bad.next(it));
  CHECK(it.iteration == 0);
  REQUIRE(bad.next(it));
  CHECK(it.iteration == 1);
  REQUIRE_THROWS_AS(bad.next(it), packpipe::Error);
  REQUIRE_THROWS_WITH(bad.next(it), Contains("iteration 2, micro-batch 0: the plan counts"));
  CHECK(bad.position() == 2);

  // A planning error is delivered the same way, naming its iteration.
  PlannerOptions tiny = o;
  tiny.shape.memory_limit_mb = 1;
  RankLoader failing(data, std::make_unique<EpochPlanner>(data, gpt(), tiny, spec(600)), lo);
  REQUIRE_THROWS_WITH(failing.next(it), Contains("iteration 0"));

  const auto t0 = std::chrono::steady_clock::now();
  {
    lo.depth = 1;
    RankLoader early(data, planner(), lo);
    REQUIRE(early.next(it));
  }  // destroyed with iterations in flight
  {
    RankLoader unused(data, planner(), lo);
  }  // destroyed before any next()
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(60));
}

namespace {

/// A one-task dataset of its own (a test may truncate its files): `docs` sequences of 20 to 60
/// tokens, stored plain or as .bin.zst; and the spec of batches of 300 tokens over it.
struct OwnData {
  packpipe::test::TempDir dir;
  std::unique_ptr<dl::MultiTaskDataset> data;
  std::string bin;  ///< the token file: text.bin or text.bin.zst

  explicit OwnData(bool compressed, std::size_t docs = 120) {
    std::mt19937_64 rng(7);
    Documents d;
    for (std::size_t i = 0; i < docs; ++i) {
      Tokens t(20 + rng() % 41);
      for (auto& x : t) x = static_cast<std::int64_t>(1 + rng() % 30000);
      d.push_back({t});
    }
    packpipe::test::write_documents(dir.file("text"), dl::DType::UInt16, d);
    bin = dir.file("text.bin");
    if (compressed) {
      dl::ZstdSeekableOptions z;
      z.frame_size = 1024;  // many frames: a truncation leaves some whole
      dl::zstd_seekable_compress(bin, dir.file("text.bin.zst"), z);
      std::filesystem::remove(bin);
      bin = dir.file("text.bin.zst");
    }
    data = std::make_unique<dl::MultiTaskDataset>(dl::MultiTaskDataset::from_prefix(dir.file("text")));
  }
  EpochSpec spec() const {
    EpochSpec s;
    s.sampler = dl::sampler_config(data->manifest());
    s.sampler.global_batch_tokens = 300;
    return s;
  }
};

}  // namespace

TEST_CASE("rank loader: a token or index file truncated under a live loader is an Error naming it, never SIGBUS",
          "[negative][regression]") {
  const PlannerOptions o = options(Rows::Packing, pl::LossMode::AllTokens);
  for (int c = 0; c < 8; ++c) {
    const bool compressed = (c & 1) != 0, from_file = (c & 2) != 0, index = (c & 4) != 0;
    CAPTURE(compressed, from_file, index);
    OwnData own(compressed);
    EpochPlanner reference(*own.data, gpt(), o, own.spec());
    const auto its = drain(reference);
    REQUIRE(its.size() >= 8);
    write_plans(own.dir.file("epoch.plans"), its);
    RankLoaderOptions lo;
    lo.depth = 1;
    auto loader = from_file ? std::make_unique<RankLoader>(*own.data, own.dir.file("epoch.plans"), 0, 0, lo)
                            : std::make_unique<RankLoader>(
                                  *own.data, std::make_unique<EpochPlanner>(*own.data, gpt(), o, own.spec()), lo);
    RankIteration it;
    REQUIRE(loader->next(it));  // training has started
    REQUIRE(std::filesystem::file_size(own.bin) > 4096);
    // Another process truncates the tokens (past their first page), or the index (to nothing: all of
    // it is on one page).
    const std::string victim = index ? own.dir.file("text.idx") : own.bin;
    std::filesystem::resize_file(victim, index ? 0 : 100);
    // Iterations assembled before the truncation may still come; then the error, naming the file.
    std::string error;
    try {
      while (loader->next(it)) {
      }
    } catch (const packpipe::Error& e) {
      error = e.what();
    }
    CHECK_THAT(error, Contains(victim) && Contains("truncated"));
  }
}

TEST_CASE("global batches are copies: a .bin truncated under a Prefetcher is an Error, not SIGBUS",
          "[negative][regression]") {
  OwnData own(false);
  dl::SamplerConfig c = dl::sampler_config(own.data->manifest());
  c.global_batch_tokens = 300;
  dl::Sampler sampler(*own.data, c);
  dl::AssembledBatch b;
  {
    dl::Prefetcher pf(*own.data, sampler, 1);
    REQUIRE(pf.next(b));
    const std::vector<std::uint8_t> before(static_cast<const std::uint8_t*>(b.samples[0].input.data),
                                           static_cast<const std::uint8_t*>(b.samples[0].input.data) +
                                               2 * b.samples[0].input.length);
    std::filesystem::resize_file(own.bin, 0);
    // The delivered batch owns its tokens: reading them after the truncation is no SIGBUS.
    CHECK(std::equal(before.begin(), before.end(), static_cast<const std::uint8_t*>(b.samples[0].input.data)));
    std::string error;
    try {
      while (pf.next(b)) {
      }
    } catch (const packpipe::Error& e) {
      error = e.what();
    }
    CHECK_THAT(error, Contains(own.bin) && Contains("truncated"));
  }
  // assemble_microbatch reads through the same guard.
  REQUIRE_THROWS_WITH(dl::assemble_batch(*own.data, dl::GlobalBatch{0, 0, 0, 0, {{0, 3}}}),
                      Contains(own.bin) && Contains("truncated"));
}

TEST_CASE("rank loader: an incomplete plan file is refused unless its prefix is asked for", "[negative][regression]") {
  PlannerOptions o = options(Rows::Packing, pl::LossMode::AllTokens);
  const auto& data = *synthetic().data;
  EpochPlanner source(data, gpt(), o, spec(600));
  const auto its = drain(source);
  REQUIRE(its.size() >= 4);
  packpipe::test::TempDir dir;
  const std::string file = dir.file("part.plans");
  {
    pl::PlanFileWriter w(file);
    w.expect_iterations(0, its.size());  // declares the epoch, holds two iterations: a run stopped early
    for (std::size_t i = 0; i < 2; ++i) w.append(its[i].result.plans[0]);
    w.close();
  }
  RankLoaderOptions lo;
  REQUIRE_THROWS_WITH(RankLoader(data, file, 0, 0, lo),
                      Contains(file) && Contains("incomplete plan file") &&
                          Contains(fmt::format("holds 2 of the {} iterations", its.size())) &&
                          Contains("allow_incomplete=True"));
  lo.allow_incomplete = true;
  RankLoader prefix(data, file, 0, 0, lo);
  CHECK(prefix.iterations() == 2);
  CHECK(drain(prefix).size() == 2);
}

TEST_CASE("rank loader: a plan file is refused over another dataset than it was planned from, naming what differs",
          "[negative][regression]") {
  const dl::Manifest demo = dl::load_manifest(std::string(PACKPIPE_SOURCE_DIR) + "/data/demo/manifest.json");
  const dl::MultiTaskDataset planned(demo);
  EpochSpec s;
  s.sampler = dl::sampler_config(demo);
  s.sampler.global_batch_tokens = 2000;
  s.iterations = 3;
  EpochPlanner source(planned, gpt(), options(Rows::Packing, pl::LossMode::AllTokens), s);
  const auto its = drain(source);
  REQUIRE(its.size() == 3);
  packpipe::test::TempDir dir;
  const std::string file = dir.file("demo.plans");
  write_plans(file, its);
  CHECK(pl::PlanFileReader(file).dataset().fingerprint == planned.fingerprint());
  RankLoaderOptions lo;
  lo.rank = -1;

  // The manifest it was planned from, opened again as a trainer opens it: loads.
  const dl::MultiTaskDataset same(demo);
  RankLoader ok(same, file, 0, 0, lo);
  CHECK(drain(ok).size() == its.size());

  // The error of a loader of the file over `m`, named `name`.
  auto refusal = [&](dl::Manifest m, const std::string& name) {
    m.path = name;
    const dl::MultiTaskDataset other(m);
    try {
      RankLoader l(other, file, 0, 0, lo);
    } catch (const packpipe::InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  const std::string head = "plan file '" + file + "' was planned from another dataset than '";
  dl::Manifest reordered = demo;
  std::swap(reordered.tasks[0], reordered.tasks[1]);
  CHECK_THAT(refusal(reordered, "reordered.json"),
             Contains(head + "reordered.json'") && Contains("the tasks are in another order") &&
                 Contains("planned 6 tasks ['define', 'synonyms', 'translate'") &&
                 Contains("found 6 tasks ['synonyms', 'define', 'translate'") &&
                 Contains(fmt::format("planned {:016x}", planned.fingerprint())));
  dl::Manifest dropped = demo;
  dropped.tasks.pop_back();
  CHECK_THAT(refusal(dropped, "dropped.json"), Contains(head + "dropped.json'") &&
                                                  Contains("planned task 'man_text' is missing") &&
                                                  Contains("found 5 tasks"));
  dl::Manifest replaced = demo;  // task 'translate' over another dataset, of other lengths and another count
  replaced.tasks[2].prefixes = demo.tasks[1].prefixes;
  replaced.tasks[2].target_prefixes = demo.tasks[1].target_prefixes;
  REQUIRE(planned.task_size(2) != planned.task_size(1));
  CHECK_THAT(refusal(replaced, "replaced.json"),
             Contains(head + "replaced.json'") &&
                 Contains(fmt::format("task 2 ('translate') held {} samples when planned, found {}",
                                      planned.task_size(2), planned.task_size(1))));
  dl::Manifest rebuilt = demo;  // 'man_explain' rebuilt with other lengths: the same names and counts
  std::swap(rebuilt.tasks[4].prefixes, rebuilt.tasks[4].target_prefixes);
  CHECK_THAT(refusal(rebuilt, "rebuilt.json"),
             Contains(head + "rebuilt.json'") && Contains("with the same sample counts, but other data"));

  // Every plan names its dataset: one assembled by hand against another is refused too.
  const dl::MultiTaskDataset other(reordered);
  const pl::Plan first = pl::PlanFileReader(file).read(0);
  REQUIRE_THROWS_AS(assemble_microbatch(other, first, 0, 0), packpipe::InvalidArgument);
  REQUIRE_THROWS_WITH(assemble_microbatch(other, first, 0, 0),
                      Contains("iteration 0: the plan was planned from another dataset") &&
                          Contains("the tasks are in another order"));

  // An older file (format 2 of format-4 plans: no dataset recorded) loads unchecked, as before.
  std::vector<pl::Plan> plans;
  for (const auto& it : its) plans.push_back(it.result.plans[0]);
  packpipe::test::write_file(dir.file("old.plans"), packpipe::test::plan_file_v2(plans));
  REQUIRE_FALSE(pl::PlanFileReader(dir.file("old.plans")).dataset().known());
  RankLoader old(same, dir.file("old.plans"), 0, 0, lo);
  const auto got = drain(old);
  REQUIRE(got.size() == its.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    const auto want = direct_loads(plans[i], -1, {}, same);
    REQUIRE(got[i].loads.size() == want.size());
    for (std::size_t k = 0; k < want.size(); ++k) check_same(got[i].loads[k], want[k]);
  }
}
