#include "tests/support/old_plan_formats.h"

#include <stdexcept>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "plan/format.h"

namespace packpipe::test {

namespace {

void put_le(std::string& b, std::uint64_t v, int n) {
  for (int i = 0; i < n; ++i) b.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}

void set_le(std::vector<std::uint8_t>& b, std::size_t at, std::uint64_t v, int n) {
  for (int i = 0; i < n; ++i) b[at + static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(v >> (8 * i));
}

}  // namespace

std::vector<std::uint8_t> plan_blob_v4(const plan::Plan& plan) {
  plan::Plan p = plan;
  p.dataset = {};
  if (p.has_slices()) throw std::runtime_error("plan_blob_v4: format 4 has no slices");
  std::vector<std::uint8_t> b = plan::encode_plan(p);
  if (b.size() < 41) throw std::runtime_error("plan_blob_v4: blob too short");
  b.resize(b.size() - 9);  // format 6's slice flag (0), then format 5's fingerprint (0)
  const std::uint64_t body = b.size() - 32;
  set_le(b, 4, 4, 2);
  set_le(b, 8, body, 8);
  set_le(b, 16, body, 8);
  set_le(b, 24, XXH64(b.data() + 32, body, 0), 8);
  return b;
}

std::string plan_file_v2(const std::vector<plan::Plan>& plans) {
  std::string f = "PPLF";
  put_le(f, 2, 2);
  put_le(f, 0, 2);
  std::string index;
  std::uint64_t distinct = 0;
  for (std::size_t i = 0; i < plans.size(); ++i) {
    const std::vector<std::uint8_t> blob = plan_blob_v4(plans[i]);
    put_le(index, plans[i].iteration, 8);
    put_le(index, f.size(), 8);
    put_le(index, blob.size(), 8);
    distinct += i == 0 || plans[i].iteration != plans[i - 1].iteration;
    f.append(blob.begin(), blob.end());
  }
  const std::uint64_t index_offset = f.size();
  std::string tail = index;
  put_le(tail, plans.size(), 8);
  put_le(tail, index_offset, 8);
  put_le(tail, plans.empty() ? 0 : plans.front().iteration, 8);
  put_le(tail, distinct, 8);
  put_le(tail, distinct, 8);  // declared: all of them
  put_le(tail, 1, 8);         // complete
  put_le(tail, XXH64(tail.data(), tail.size(), 0), 8);
  tail += "PPLI";
  put_le(tail, 2, 4);
  return f + tail;
}

}  // namespace packpipe::test
