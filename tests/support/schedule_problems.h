// Hand-computable simulation problems for the schedule and simulator tests.
#pragma once

#include <cstdint>
#include <utility>

#include "schedule/simulator.h"

namespace packpipe::test {

/// `m` micro-batches on `S` ranks x `c` chunks, every op with the same forward `f`, backward `b`
/// (of which `w` is weight-gradient work) and stored bytes; `xfer` ms between virtual stages on
/// different ranks; no static memory, no memory limit.
inline schedule::SimProblem uniform_problem(std::int64_t m, std::int64_t S, std::int64_t c, double f = 1.0,
                                             double b = 2.0, double w = 0.0, double stored = 0.0,
                                             double xfer = 0.0) {
  schedule::StageCostTable t;
  t.microbatches = m;
  t.vstages = S * c;
  const auto n = static_cast<std::size_t>(m * S * c);
  t.forward_ms.assign(n, f);
  t.backward_ms.assign(n, b);
  t.backward_weight_ms.assign(n, w);
  t.stored_bytes.assign(n, stored);
  t.peak_bytes.assign(n, 0.0);
  t.send_bytes.assign(n, 0.0);
  t.static_bytes.assign(static_cast<std::size_t>(S), 0.0);
  schedule::SimProblem p = schedule::make_sim_problem(std::move(t), S, costmodel::CommModel{}, 1, 0.0);
  for (std::int64_t mb = 0; mb < m; ++mb) {
    for (std::int64_t v = 0; v + 1 < S * c; ++v) {
      if (v % S != (v + 1) % S) p.transfer_ms[static_cast<std::size_t>(mb * S * c + v)] = xfer;
    }
  }
  return p;
}

}  // namespace packpipe::test
