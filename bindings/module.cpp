// The packpipe._core extension: registers each component's bindings in two phases (declare
// classes, then define methods) so default arguments can name any bound type.
#include <pybind11/pybind11.h>

#include "bindings/bind.h"
#include "common/config.h"
#include "common/cuda_probe.h"

namespace py = pybind11;

PYBIND11_MODULE(_core, m) {
  m.doc() = "packpipe native core";
  m.attr("__version__") = PACKPIPE_VERSION;
  m.def("cuda_device_count", &packpipe::cuda::device_count,
        "Number of usable CUDA devices (0 without CUDA or without a device).");
  m.attr("built_with_cuda") = packpipe::cuda::built_with_cuda();
  packpipe::bindings::declare_dataloader(m);
  packpipe::bindings::declare_costmodel(m);
  packpipe::bindings::declare_calibration(m);
  packpipe::bindings::declare_packing(m);
  packpipe::bindings::declare_partition(m);
  packpipe::bindings::declare_schedule(m);
  packpipe::bindings::declare_plan(m);
  packpipe::bindings::declare_planner(m);
  packpipe::bindings::declare_measure(m);
  packpipe::bindings::declare_loader(m);
  packpipe::bindings::declare_runtime(m);
  packpipe::bindings::define_dataloader(m);
  packpipe::bindings::define_costmodel(m);
  packpipe::bindings::define_calibration(m);
  packpipe::bindings::define_packing(m);
  packpipe::bindings::define_partition(m);
  packpipe::bindings::define_schedule(m);
  packpipe::bindings::define_plan(m);
  packpipe::bindings::define_planner(m);
  packpipe::bindings::define_measure(m);
  packpipe::bindings::define_loader(m);
  packpipe::bindings::define_runtime(m);
  packpipe::bindings::define_io(m);
}
