// Open a multi-task manifest, form 64K-token global batches and prefetch them in the background.
//   build/examples/sample_batches data/demo/manifest.json
#include <cstdio>

#include "dataloader/batch.h"
#include "dataloader/manifest.h"
#include "dataloader/multitask.h"
#include "dataloader/sampler.h"

int main(int argc, char** argv) {
  namespace dl = packpipe::dataloader;
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s MANIFEST.json\n", argv[0]);
    return 2;
  }
  try {
    const dl::MultiTaskDataset data(dl::load_manifest(argv[1]));
    // The manifest's sampling (its split, task weights, samples_per_epoch), then this run's batches.
    dl::SamplerConfig cfg = dl::sampler_config(data.manifest());
    cfg.seed = 1234;
    cfg.global_batch_tokens = 65536;
    dl::Sampler sampler(data, cfg);
    dl::Prefetcher prefetch(data, sampler, /*depth=*/4);
    dl::AssembledBatch batch;
    std::uint64_t batches = 0, tokens = 0;
    while (prefetch.next(batch)) {
      ++batches;
      tokens += batch.batch.tokens;
    }
    std::printf("%llu global batches, %llu tokens in epoch 0\n", static_cast<unsigned long long>(batches),
                static_cast<unsigned long long>(tokens));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
