// packpipe._testing: test-only helpers for the pytest suite (synthetic plans), built with the tests
// and never part of the packpipe module itself. Plans it returns are packpipe.Plan objects (the
// type registered by packpipe._core, shared across modules by pybind11).
#include <cstdint>
#include <memory>
#include <string>

#include <pybind11/pybind11.h>

#include "plan/plan.h"
#include "tests/support/synthetic_plans.h"

namespace py = pybind11;
namespace pl = packpipe::plan;

PYBIND11_MODULE(_testing, m) {
  py::module_::import("packpipe._core");  // registers packpipe.Plan
  m.doc() = "Test-only helpers of the packpipe test suite";
  m.def(
      "synthetic_plan",
      [](const std::string& kind, std::int64_t ranks, std::int64_t chunks, std::int64_t microbatches,
         std::uint64_t seed, bool same_shape, bool encoder_decoder) {
        std::shared_ptr<pl::Plan> p;
        {
          py::gil_scoped_release release;
          p = std::make_shared<pl::Plan>(packpipe::test::synthetic::random_plan(kind, ranks, chunks, microbatches, seed,
                                                                                same_shape, encoder_decoder));
        }
        return p;
      },
      py::arg("schedule") = "1f1b", py::arg("ranks") = 4, py::arg("chunks") = 1, py::arg("microbatches") = 8,
      py::arg("seed") = 0, py::arg("same_shape") = false, py::arg("encoder_decoder") = false,
      "A plan of random micro-batches under a textbook schedule (gpipe, 1f1b, zero-bubble)");
}
