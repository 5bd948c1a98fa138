#include "dataloader/batch.h"

#include <atomic>
#include <cstdint>
#include <exception>
#include <limits>
#include <mutex>
#include <thread>

#include <tbb/concurrent_queue.h>
#include <tbb/parallel_pipeline.h>

#include "common/errors.h"

namespace packpipe::dataloader {

AssembledBatch assemble_batch(const MultiTaskDataset& dataset, GlobalBatch batch) {
  AssembledBatch out;
  out.batch = std::move(batch);
  const auto& refs = out.batch.samples;
  out.samples.reserve(refs.size());
  for (const auto& r : refs) dataset.check_sample(r.task, r.index);  // an error names the sample, not only its task
  // Every sample is copied through the guarded reads (MultiTaskDataset::read_sample), never viewed
  // in the memory map: a `.bin` truncated while a trainer holds the batch is an Error here, not a
  // SIGBUS when the trainer touches a token. Copies live in `storage`; the reserve keeps every
  // inner buffer in place, so SampleView pointers stay valid as long as the AssembledBatch.
  out.storage.reserve(2 * refs.size());
  for (const auto& r : refs) {
    const DType dtype = dataset.dtype(r.task);
    std::vector<std::uint8_t> input, target;
    dataset.read_sample(r, input, target);
    const std::size_t item = dtype_size(dtype);
    SampleView v;
    v.ref = r;
    out.storage.push_back(std::move(input));
    v.input = TokenSpan{out.storage.back().data(), out.storage.back().size() / item, dtype};
    out.storage.push_back(std::move(target));
    v.target = TokenSpan{out.storage.back().data(), out.storage.back().size() / item, dtype};
    out.samples.push_back(v);
  }
  return out;
}

struct Prefetcher::Impl {
  // An assembled batch and the sampler state right after it; nullptr marks the end of the epoch
  // (or an error).
  struct Ready {
    AssembledBatch batch;
    SamplerState after;
  };
  using Item = std::shared_ptr<Ready>;
  struct Sampled {
    GlobalBatch batch;
    SamplerState after;
  };

  const MultiTaskDataset& dataset;
  Sampler sampler;  // a copy that runs ahead; the caller's sampler advances on delivery only
  SamplerState delivered;
  std::atomic<bool> consuming{false};
  std::size_t depth;
  tbb::concurrent_bounded_queue<Item> queue;
  std::atomic<bool> stop{false};
  static constexpr std::uint64_t kNoFailure = std::numeric_limits<std::uint64_t>::max();
  std::mutex error_mutex;
  std::atomic<std::uint64_t> fail_at{kNoFailure};  // index of the earliest failing batch
  std::exception_ptr error;  // written before the end marker is pushed, read after it is popped
  bool finished = false;
  std::thread thread;

  Impl(const MultiTaskDataset& d, const Sampler& s, std::size_t n)
      : dataset(d), sampler(s), delivered(s.state()), depth(n) {
    queue.set_capacity(static_cast<std::ptrdiff_t>(depth));
    thread = std::thread([this] { run(); });
  }

  // Errors are caught inside the filters: an exception leaving a filter cancels the pipeline, and
  // a batch assembled in flight was then never freed (LeakSanitizer saw it). The earliest
  // failing batch in batch order wins: every batch before it is still assembled and delivered,
  // it reaches the last filter as null, and nothing after it is delivered.
  void fail(std::exception_ptr e, std::uint64_t index) {
    std::lock_guard<std::mutex> lock(error_mutex);
    if (index < fail_at.load()) {
      fail_at.store(index);
      error = std::move(e);
    }
  }

  void run() {
    bool ended = false;  // a null item passed the last filter: the epoch ends there
    try {
      tbb::parallel_pipeline(
          depth,
          tbb::make_filter<void, std::shared_ptr<Sampled>>(
              tbb::filter_mode::serial_in_order,
              [this](tbb::flow_control& fc) -> std::shared_ptr<Sampled> {
                auto b = std::make_shared<Sampled>();
                try {
                  if (stop.load(std::memory_order_relaxed) || fail_at.load() != kNoFailure ||
                      !sampler.next_batch(b->batch)) {
                    fc.stop();
                    return nullptr;
                  }
                  b->after = sampler.state();
                } catch (...) {
                  fail(std::current_exception(), kNoFailure - 1);  // after every batch already read
                  fc.stop();
                  return nullptr;
                }
                return b;
              }) &
              tbb::make_filter<std::shared_ptr<Sampled>, Item>(
                  tbb::filter_mode::parallel,
                  [this](std::shared_ptr<Sampled> b) -> Item {
                    // Being destroyed, or after a batch that failed: skip the work.
                    if (stop.load(std::memory_order_relaxed) || b->batch.index > fail_at.load()) return nullptr;
                    const std::uint64_t index = b->batch.index;
                    try {
                      return std::make_shared<Ready>(Ready{assemble_batch(dataset, std::move(b->batch)), b->after});
                    } catch (...) {
                      fail(std::current_exception(), index);
                      return nullptr;
                    }
                  }) &
              tbb::make_filter<Item, void>(tbb::filter_mode::serial_in_order, [this, &ended](Item a) {
                // Blocks while `depth` batches wait; the destructor drains the queue, so this returns.
                if (!a) ended = true;
                if (!ended) queue.push(std::move(a));
              }));
    } catch (...) {  // not expected (the filters catch); kept so that next() never hangs
      fail(std::current_exception(), 0);
    }
    queue.push(nullptr);
  }

  ~Impl() {
    stop.store(true);
    // Drain until the end marker: the pipeline finishes its in-flight batches (assembly is skipped
    // once `stop` is set), pushes the marker and exits, whatever the consumer did before.
    Item item;
    while (!finished) {
      queue.pop(item);
      if (!item) finished = true;
    }
    if (thread.joinable()) thread.join();
  }
};

Prefetcher::Prefetcher(const MultiTaskDataset& dataset, Sampler& sampler, std::size_t depth) : owner_(&sampler) {
  PACKPIPE_CHECK_ARG(depth > 0 && depth <= kMaxPrefetchDepth, "prefetch depth {} (expected in [1, {}])", depth,
                     kMaxPrefetchDepth);
  PACKPIPE_CHECK_ARG(sampler.attached_.by == nullptr,
                     "this sampler already feeds a Prefetcher; two would each deliver the same batches. Finish or "
                     "destroy the first, or give each its own sampler");
  impl_ = std::make_unique<Impl>(dataset, sampler, depth);
  sampler.attached_.by = this;
}

Prefetcher::~Prefetcher() {
  impl_.reset();
  if (owner_->attached_.by == this) owner_->attached_.by = nullptr;
}

SamplerState Prefetcher::state() const { return impl_->delivered; }

bool Prefetcher::next(AssembledBatch& out) {
  Impl& im = *impl_;
  bool idle = false;
  PACKPIPE_CHECK_ARG(im.consuming.compare_exchange_strong(idle, true),
                     "Prefetcher::next called from two threads at once: a Prefetcher has one consumer (share the "
                     "batches it delivers, or give each thread its own sampler and Prefetcher)");
  struct Release {
    std::atomic<bool>& f;
    ~Release() { f.store(false); }
  } release{im.consuming};
  if (!im.finished) {
    Impl::Item item;
    im.queue.pop(item);
    if (item) {
      out = std::move(item->batch);
      im.delivered = item->after;
      // The caller's sampler follows what was delivered (same config: a plain position update).
      owner_->position_ = item->after.position;
      owner_->batch_index_ = item->after.batch_index;
      return true;
    }
    im.finished = true;
    im.thread.join();
  }
  if (im.error) std::rethrow_exception(im.error);
  return false;
}

}  // namespace packpipe::dataloader
