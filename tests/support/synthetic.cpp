#include "tests/support/synthetic.h"

#include <algorithm>
#include <cmath>

#include "dataloader/indexed_dataset.h"

namespace packpipe::test {

SyntheticSource SyntheticSource::random(std::mt19937_64& rng, std::size_t tasks,
                                        std::uint64_t max_task_size, std::uint32_t max_len) {
  std::uniform_int_distribution<std::uint64_t> size_dist(1, max_task_size);
  std::lognormal_distribution<double> len_dist(std::log(std::max<double>(2.0, max_len / 8.0)), 1.0);
  std::vector<std::vector<std::uint32_t>> lengths(tasks);
  for (auto& task : lengths) {
    task.resize(size_dist(rng));
    for (auto& l : task) {
      l = static_cast<std::uint32_t>(std::clamp<double>(len_dist(rng), 1.0, max_len));
    }
  }
  return SyntheticSource(std::move(lengths));
}

Documents random_documents(std::mt19937_64& rng, std::size_t docs, std::size_t max_seqs,
                           std::size_t max_len, std::int64_t vocab) {
  std::uniform_int_distribution<std::size_t> nseq(1, max_seqs);
  std::uniform_int_distribution<std::size_t> len(0, max_len);
  std::uniform_int_distribution<std::int64_t> tok(0, vocab - 1);
  Documents out(docs);
  for (auto& d : out) {
    d.resize(nseq(rng));
    for (auto& s : d) {
      s.resize(len(rng));
      for (auto& t : s) t = tok(rng);
    }
  }
  return out;
}

void write_documents(const std::string& prefix, dataloader::DType dt, const Documents& docs,
                     bool with_modes) {
  dataloader::IndexedDatasetBuilder builder(prefix, dt, with_modes);
  const std::size_t item = dataloader::dtype_size(dt);
  std::vector<std::uint8_t> buf;
  for (const auto& d : docs) {
    std::int8_t mode = 0;
    for (const auto& s : d) {
      buf.resize(s.size() * item);
      dataloader::encode_tokens(s.data(), s.size(), dt, buf.data());
      builder.add_item(buf.data(), s.size(), mode);
      mode = static_cast<std::int8_t>(mode ^ 1);
    }
    builder.end_document();
  }
  builder.finalize();
}

}  // namespace packpipe::test
