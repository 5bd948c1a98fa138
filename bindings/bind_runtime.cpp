// packpipe._core._runtime (re-exported as packpipe.runtime): the executor with stage handlers and
// transports written in Python. Python drives the one C++ interpreter of the instruction set; it
// never re-implements it. The executor runs with the GIL released and takes it only for the calls
// into Python (a handler's method, a transport's post or wait), so several ranks' executors can run
// on threads of one process (run_local) while Python code computes.
#include <pybind11/functional.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "bindings/arrays.h"
#include "bindings/bind.h"
#include "common/errors.h"
#include "plan/plan.h"
#include "runtime/executor.h"
#include "runtime/handler.h"
#include "runtime/local.h"
#include "runtime/report.h"
#include "runtime/transport.h"

namespace py = pybind11;

namespace packpipe::bindings {

namespace {

namespace rt = ::packpipe::runtime;
namespace pl = ::packpipe::plan;
using PlanPtr = std::shared_ptr<pl::Plan>;

// ---- buffers holding Python objects --------------------------------------------------------------

// Owner of a buffer made from Python: a strong reference to the object, released under the GIL
// (buffers die on executor threads that do not hold it).
struct PyOwnerDeleter {
  void operator()(void* p) const {
    if (p == nullptr || !Py_IsInitialized()) return;
    py::gil_scoped_acquire gil;
    Py_DECREF(static_cast<PyObject*>(p));
  }
};

// The Python object a buffer holds (None for buffers made in C++).
py::object buffer_object(const rt::Buffer& b) {
  if (b.owner != nullptr && std::get_deleter<PyOwnerDeleter>(b.owner) != nullptr) {
    return py::reinterpret_borrow<py::object>(static_cast<PyObject*>(b.owner.get()));
  }
  return py::none();
}

const char* memory_name(rt::MemoryKind k) {
  switch (k) {
    case rt::MemoryKind::Host: return "host";
    case rt::MemoryKind::Device: return "device";
    case rt::MemoryKind::Opaque: return "opaque";
  }
  return "?";
}

rt::MemoryKind memory_from_name(const std::string& s) {
  if (s == "host") return rt::MemoryKind::Host;
  if (s == "device") return rt::MemoryKind::Device;
  if (s == "opaque") return rt::MemoryKind::Opaque;
  PACKPIPE_THROW(InvalidArgument, "kind: expected 'host', 'device' or 'opaque', found '{}'", s);
}

// A buffer of `nbytes` logical bytes holding `obj` (kept alive while any copy of the buffer lives),
// with its memory at `data` (host or device pointer; 0 for an object that is not addressable).
rt::Buffer make_buffer(const py::object& nbytes_arg, const py::object& obj, const py::object& data_arg,
                       const std::string& kind, const py::object& device_arg) {
  const auto nbytes = int_of<std::uint64_t>(nbytes_arg, "nbytes");
  const auto data = int_of<std::uintptr_t>(data_arg, "data");
  const auto device = int_of<int>(device_arg, "device");
  rt::Buffer b;
  b.bytes = nbytes;
  b.kind = memory_from_name(kind);
  b.data = reinterpret_cast<void*>(data);
  b.device = device;
  PACKPIPE_CHECK_ARG(b.kind != rt::MemoryKind::Host || nbytes == 0 || data != 0,
                     "a host buffer of {} bytes needs its data address (data=)", nbytes);
  b.materialized = data != 0 ? nbytes : 0;
  if (!obj.is_none()) {
    PyObject* p = obj.ptr();
    Py_INCREF(p);
    b.owner = std::shared_ptr<void>(p, PyOwnerDeleter{});
  }
  return b;
}

// A writable uint8 numpy view of a host buffer's materialised bytes, keeping the memory alive.
py::array host_view(const rt::Buffer& b) {
  PACKPIPE_CHECK_ARG(b.kind == rt::MemoryKind::Host, "host_view: the buffer is in {} memory, not host memory",
                     memory_name(b.kind));
  auto* keep = new std::shared_ptr<void>(b.owner);
  py::capsule base(keep, [](void* p) { delete static_cast<std::shared_ptr<void>*>(p); });
  static std::uint8_t empty = 0;
  void* data = b.materialized > 0 ? b.data : &empty;
  return py::array(py::dtype::of<std::uint8_t>(), {static_cast<py::ssize_t>(b.materialized)}, {}, data, base);
}

// ---- what a handler call sees --------------------------------------------------------------------

// A copy of OpContext that Python may keep (OpContext's references live for one call only).
struct PyOpContext {
  std::uint32_t rank = 0;
  std::size_t index = 0;
  pl::Instruction ins;
  std::optional<pl::TensorShape> shape, out_shape;
  Recompute recompute = Recompute::None;
  double loss_weight = 0;
  std::int64_t loss_tokens = -1;  // the micro-batch's (-1: no micro-batch)
  std::uint32_t iteration = 0;
  std::uint32_t replica = 0;
};

PyOpContext py_context(const rt::OpContext& c) {
  PyOpContext o;
  o.rank = c.rank;
  o.index = c.index;
  if (c.ins != nullptr) o.ins = *c.ins;
  if (c.shape != nullptr) o.shape = *c.shape;
  if (c.out_shape != nullptr) o.out_shape = *c.out_shape;
  o.recompute = c.recompute;
  o.loss_weight = c.loss_weight;
  if (c.mb != nullptr) o.loss_tokens = static_cast<std::int64_t>(c.mb->loss_tokens);
  if (c.plan != nullptr) {
    o.iteration = static_cast<std::uint32_t>(c.plan->iteration);
    o.replica = c.plan->replica;
  }
  return o;
}

py::object opt_index(std::uint32_t v) { return v == pl::kNone ? py::none() : py::object(py::int_(v)); }

// "TypeError: message" and, with `frames`, the last frames of the traceback of a Python exception
// (a handler's failure is the user's code: where it failed matters; a transport's message says it).
std::string describe_python_error(py::error_already_set& e, bool frames = true) {
  std::string msg = fmt::format("{}: {}", py::str(e.type().attr("__name__")).cast<std::string>(),
                                py::str(e.value()).cast<std::string>());
  if (!frames) return msg;
  try {
    py::object tb = py::module_::import("traceback");
    py::list lines = tb.attr("format_tb")(e.trace());
    const std::size_t n = lines.size(), from = n > 3 ? n - 3 : 0;
    for (std::size_t k = from; k < n; ++k) {
      std::string line = lines[k].cast<std::string>();
      while (!line.empty() && line.back() == '\n') line.pop_back();
      msg += "\n" + line;
    }
  } catch (...) {
  }
  return msg;
}

// The Python exception a handler or transport raised last on this object, for chaining.
struct LastError {
  std::mutex mu;
  std::shared_ptr<py::object> value;  // released under the GIL (see run bindings)
  void set(const py::object& v) {
    std::lock_guard<std::mutex> lock(mu);
    value = std::shared_ptr<py::object>(new py::object(v), [](py::object* p) {
      if (!Py_IsInitialized()) return;
      py::gil_scoped_acquire gil;
      delete p;
    });
  }
  py::object take() {
    std::lock_guard<std::mutex> lock(mu);
    py::object v = value ? *value : py::none();
    value.reset();
    return v;
  }
};

// ---- stage handlers written in Python ------------------------------------------------------------

// The Python object of a C++ instance of a bound polymorphic type (its type name for messages).
template <class Base>
std::string python_type_name(const Base* self) {
  py::handle h = py::detail::get_object_handle(self, py::detail::get_type_info(typeid(Base)));
  return h ? py::str(py::type::of(h).attr("__name__")).cast<std::string>() : std::string("?");
}

class PyStageHandler : public rt::StageHandler {
 public:
  // The Python Plan object run() was given, so that begin/end_iteration see that object.
  py::object plan_obj;
  const pl::Plan* plan_ptr = nullptr;
  LastError last_error;

  void begin_iteration(const pl::Plan& plan, std::uint32_t rank) override {
    call_void("begin_iteration", false, [&] { return py::make_tuple(plan_arg(plan), rank); });
  }
  void end_iteration(const pl::Plan& plan, std::uint32_t rank) override {
    call_void("end_iteration", false, [&] { return py::make_tuple(plan_arg(plan), rank); });
  }
  rt::Buffer load(const rt::OpContext& ctx) override {
    return call_buffer("load", [&] { return py::make_tuple(py_context(ctx)); });
  }
  rt::Buffer forward(const rt::OpContext& ctx, const rt::Buffer* in, const rt::Buffer* in2) override {
    return call_buffer("forward", [&] { return py::make_tuple(py_context(ctx), buffer_arg(in), buffer_arg(in2)); });
  }
  rt::Buffer backward(const rt::OpContext& ctx, const rt::Buffer* grad) override {
    return call_buffer("backward", [&] { return py::make_tuple(py_context(ctx), buffer_arg(grad)); });
  }
  void backward_weight(const rt::OpContext& ctx) override {
    call_void("backward_weight", true, [&] { return py::make_tuple(py_context(ctx)); });
  }
  void reduce_grad(const rt::OpContext& ctx) override {
    call_void("reduce_grad", true, [&] { return py::make_tuple(py_context(ctx)); });
  }
  void optimizer_step(const rt::OpContext& ctx) override {
    call_void("optimizer_step", true, [&] { return py::make_tuple(py_context(ctx)); });
  }
  void reduce_tied(const rt::OpContext& ctx) override {
    if (!call_void("reduce_tied", false, [&] { return py::make_tuple(py_context(ctx)); })) {
      rt::StageHandler::reduce_tied(ctx);
    }
  }
  rt::Buffer allocate(const rt::OpContext& ctx) override {
    return call_buffer("allocate", [&] { return py::make_tuple(py_context(ctx)); });
  }
  void received(const rt::OpContext& ctx, const rt::Buffer& buffer) override {
    call_void("received", false, [&] { return py::make_tuple(py_context(ctx), buffer_arg(&buffer)); });
  }

 private:
  py::object plan_arg(const pl::Plan& plan) {
    if (&plan == plan_ptr && plan_obj) return plan_obj;
    return py::cast(plan, py::return_value_policy::copy);
  }
  static py::object buffer_arg(const rt::Buffer* b) { return b != nullptr ? py::cast(*b) : py::none(); }

  // Calls the Python override `method` with the arguments `args()` builds and hands its result to
  // `convert`, all under the GIL (no Python object outlives it). A required method that is missing
  // raises Unsupported; a Python exception becomes packpipe::Error with its type, message and last
  // frames (the exception itself is kept for chaining). Returns convert(result, found).
  template <class Args, class Convert>
  auto call(const char* method, bool required, Args&& args, Convert&& convert) {
    py::gil_scoped_acquire gil;
    py::function f = py::get_override(static_cast<const rt::StageHandler*>(this), method);
    if (!f) {
      if (required) {
        throw Unsupported(fmt::format("the stage handler {} does not implement {}()",
                                      python_type_name<rt::StageHandler>(this), method));
      }
      return convert(py::none(), false);
    }
    try {
      return convert(f(*args()), true);
    } catch (py::error_already_set& e) {
      last_error.set(e.value());
      throw Error(fmt::format("{}(): {}", method, describe_python_error(e)));
    }
  }
  template <class Args>
  bool call_void(const char* method, bool required, Args&& args) {
    return call(method, required, std::forward<Args>(args), [](const py::object&, bool found) { return found; });
  }
  // A method whose result is a buffer (None: no buffer).
  template <class Args>
  rt::Buffer call_buffer(const char* method, Args&& args) {
    return call(method, true, std::forward<Args>(args), [method](const py::object& r, bool) {
      if (r.is_none()) return rt::Buffer{};
      try {
        return r.cast<rt::Buffer>();
      } catch (const py::cast_error&) {
        throw Error(fmt::format("{}() returned {}, expected a packpipe.runtime.Buffer or None", method,
                                py::str(py::type::of(r).attr("__name__")).cast<std::string>()));
      }
    });
  }
};

// Forwards to a handler owned elsewhere (run_local makes one handler per rank thread).
class ForwardingHandler final : public rt::StageHandler {
 public:
  explicit ForwardingHandler(rt::StageHandler& h) : h_(h) {}
  void begin_iteration(const pl::Plan& p, std::uint32_t r) override { h_.begin_iteration(p, r); }
  void end_iteration(const pl::Plan& p, std::uint32_t r) override { h_.end_iteration(p, r); }
  rt::Buffer load(const rt::OpContext& c) override { return h_.load(c); }
  rt::Buffer forward(const rt::OpContext& c, const rt::Buffer* a, const rt::Buffer* b) override {
    return h_.forward(c, a, b);
  }
  rt::Buffer backward(const rt::OpContext& c, const rt::Buffer* g) override { return h_.backward(c, g); }
  void backward_weight(const rt::OpContext& c) override { h_.backward_weight(c); }
  void reduce_grad(const rt::OpContext& c) override { h_.reduce_grad(c); }
  void optimizer_step(const rt::OpContext& c) override { h_.optimizer_step(c); }
  void reduce_tied(const rt::OpContext& c) override { h_.reduce_tied(c); }
  rt::Buffer allocate(const rt::OpContext& c) override { return h_.allocate(c); }
  void received(const rt::OpContext& c, const rt::Buffer& b) override { h_.received(c, b); }

 private:
  rt::StageHandler& h_;
};

// ---- transports written in Python ----------------------------------------------------------------

class PyTransport;

// A request a Python transport returned: any object with wait(timeout) and test().
class PyRequest final : public rt::Request {
 public:
  PyRequest(PyTransport& t, py::object obj, std::string what)
      : t_(t), obj_(new py::object(std::move(obj))), what_(std::move(what)) {}
  ~PyRequest() override {
    if (!Py_IsInitialized()) {
      obj_.release();  // leaked at interpreter exit rather than touched without a GIL
      return;
    }
    py::gil_scoped_acquire gil;
    obj_.reset();
  }
  rt::WaitStatus wait(rt::Clock::time_point deadline) override;
  bool test() override;

 private:
  PyTransport& t_;
  std::unique_ptr<py::object> obj_;
  std::string what_;
};

class PyTransport : public rt::Transport {
 public:
  PyTransport(std::uint32_t rank, std::uint32_t ranks, const std::string& memory)
      : rank_(rank), ranks_(ranks), memory_(memory_from_name(memory)) {
    PACKPIPE_CHECK_ARG(ranks >= 1 && rank < ranks, "Transport: rank {} of {} ranks is out of range", rank, ranks);
  }
  LastError last_error;

  std::uint32_t rank() const override { return rank_; }
  std::uint32_t ranks() const override { return ranks_; }
  rt::MemoryKind memory() const override { return memory_; }
  std::unique_ptr<rt::Request> send(const rt::Buffer& buffer, std::uint32_t peer, rt::Channel channel) override {
    return post("send", buffer, peer, channel);
  }
  std::unique_ptr<rt::Request> recv(const rt::Buffer& buffer, std::uint32_t peer, rt::Channel channel) override {
    return post("recv", buffer, peer, channel);
  }
  void abort(const std::string& why) noexcept override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (reason_.empty()) reason_ = why;
    }
    try {
      py::gil_scoped_acquire gil;
      py::function f = py::get_override(static_cast<const rt::Transport*>(this), "abort");
      if (f) f(why);
    } catch (...) {
      // Aborting is best effort: the other ranks still end through their timeouts.
    }
  }
  std::string abort_reason() const override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!reason_.empty()) return reason_;
    }
    py::gil_scoped_acquire gil;
    py::function f = py::get_override(static_cast<const rt::Transport*>(this), "abort_reason");
    if (!f) return {};
    try {
      py::object r = f();
      return r.is_none() ? std::string() : py::str(r).cast<std::string>();
    } catch (py::error_already_set& e) {
      return "abort_reason() failed: " + describe_python_error(e);
    }
  }
  // What the executor saw of a Python failure (kept for chaining).
  [[noreturn]] void python_failed(const std::string& where, py::error_already_set& e) {
    last_error.set(e.value());
    throw Error(fmt::format("{}: {}", where, describe_python_error(e, false)));
  }

 private:
  std::unique_ptr<rt::Request> post(const char* method, const rt::Buffer& buffer, std::uint32_t peer,
                                    rt::Channel channel) {
    py::gil_scoped_acquire gil;
    py::function f = py::get_override(static_cast<const rt::Transport*>(this), method);
    if (!f) throw Unsupported(fmt::format("the transport does not implement {}()", method));
    const std::string what = fmt::format("{} {} rank {}", channel_name(channel), method, peer);
    try {
      py::object r = f(buffer, peer, rt::channel_name(channel));
      if (!py::hasattr(r, "wait")) {
        throw Error(fmt::format("Transport.{}() returned {}, expected a request with wait(timeout) and test()", method,
                                py::str(py::type::of(r).attr("__name__")).cast<std::string>()));
      }
      return std::make_unique<PyRequest>(*this, std::move(r), what);
    } catch (py::error_already_set& e) {
      python_failed(fmt::format("{}()", method), e);
    }
  }
  std::uint32_t rank_, ranks_;
  rt::MemoryKind memory_;
  mutable std::mutex mu_;
  std::string reason_;
};

rt::WaitStatus PyRequest::wait(rt::Clock::time_point deadline) {
  {
    py::gil_scoped_acquire gil;
    py::object timeout = py::none();
    if (deadline != rt::Clock::time_point::max()) {
      const double s = std::chrono::duration<double>(deadline - rt::Clock::now()).count();
      timeout = py::float_(s > 0 ? s : 0.0);
    }
    try {
      py::object r = obj_->attr("wait")(timeout);
      if (r.is_none() || r.cast<bool>()) return rt::WaitStatus::Done;
    } catch (py::error_already_set& e) {
      t_.python_failed(fmt::format("waiting for the {}", what_), e);
    }
  }
  return t_.abort_reason().empty() ? rt::WaitStatus::TimedOut : rt::WaitStatus::Aborted;
}

bool PyRequest::test() {
  py::gil_scoped_acquire gil;
  try {
    return obj_->attr("test")().cast<bool>();
  } catch (py::error_already_set& e) {
    t_.python_failed(fmt::format("testing the {}", what_), e);
  }
}

// ---- running -------------------------------------------------------------------------------------

// An executor with the handler and transport it was made with (the bound class).
struct PyExecutor {
  std::unique_ptr<rt::Executor> ex;
  rt::StageHandler* handler = nullptr;
  rt::Transport* transport = nullptr;
};

py::handle pipeline_error_type;

// Raises packpipe.runtime.PipelineError(msg), chained to the Python exception behind it if any.
[[noreturn]] void raise_pipeline_error(const std::string& msg, const py::object& cause) {
  py::object exc = py::reinterpret_borrow<py::object>(pipeline_error_type)(msg);
  if (!cause.is_none()) exc.attr("__cause__") = cause;
  PyErr_SetObject(pipeline_error_type.ptr(), exc.ptr());
  throw py::error_already_set();
}

py::object take_cause(rt::StageHandler* h, rt::Transport* t) {
  py::object c = py::none();
  if (auto* ph = dynamic_cast<PyStageHandler*>(h)) c = ph->last_error.take();
  if (auto* pt = dynamic_cast<PyTransport*>(t); pt != nullptr && c.is_none()) c = pt->last_error.take();
  return c;
}

void set_plan(rt::StageHandler* h, const py::object& plan_obj, const pl::Plan* plan) {
  if (auto* ph = dynamic_cast<PyStageHandler*>(h)) {
    ph->plan_obj = plan_obj;
    ph->plan_ptr = plan;
  }
}

py::array record_times(const rt::RankRecord& r) {
  std::vector<std::int64_t> v;
  v.reserve(r.times.size() * 2);
  for (const auto& t : r.times) {
    v.push_back(t.start_ns);
    v.push_back(t.end_ns);
  }
  return owned_array(std::move(v), {static_cast<py::ssize_t>(r.times.size()), 2});
}

// (plan, records) pairs as the report takes them; `keep` holds the plans.
std::vector<rt::ExecutedPlan> executed(const py::list& runs, std::vector<PlanPtr>& keep) {
  std::vector<rt::ExecutedPlan> out;
  for (std::size_t k = 0; k < runs.size(); ++k) {
    py::tuple t = runs[k].cast<py::tuple>();
    PACKPIPE_CHECK_ARG(t.size() == 2, "runs[{}]: expected a (plan, records) pair, found {} items", k, t.size());
    keep.push_back(t[0].cast<PlanPtr>());
    rt::ExecutedPlan e;
    e.plan = keep.back().get();
    e.records = t[1].cast<std::vector<rt::RankRecord>>();
    PACKPIPE_CHECK_ARG(e.records.size() == e.plan->ranks, "runs[{}]: {} records for a plan of {} ranks", k,
                       e.records.size(), e.plan->ranks);
    out.push_back(std::move(e));
  }
  return out;
}

}  // namespace

void declare_runtime(py::module_& m) {
  py::module_ r = m.def_submodule("_runtime", "packpipe's executor of plans (see packpipe.runtime)");
  py::class_<rt::Buffer>(r, "Buffer", "The content of a buffer slot");
  py::class_<pl::TensorShape>(r, "TensorShape", "A tensor shape of a plan's shape table");
  py::class_<PyOpContext>(r, "OpContext", "Where a handler call is and what the plan says about it");
  py::class_<rt::StageHandler, PyStageHandler>(r, "StageHandler", "Compute, loads and memory of one rank");
  py::class_<rt::Transport, PyTransport>(r, "Transport", "How one rank moves buffers to and from its peers");
  py::class_<rt::ExecutorOptions>(r, "ExecutorOptions", "Timeouts, validation, plan agreement, recording");
  py::class_<rt::RankRecord>(r, "RankRecord", "What one rank's run of one iteration measured");
  py::class_<PyExecutor>(r, "Executor", "Runs one rank's instruction stream of plans");
}

void define_runtime(py::module_& m) {
  py::module_ r = m.attr("_runtime");
  static py::exception<Error> pipeline_error(r, "PipelineError", PyExc_RuntimeError);
  pipeline_error_type = pipeline_error;
  pipeline_error.doc() = "A plan's execution failed: the message names the rank, iteration, instruction and cause";

  auto buffer_cls = py::reinterpret_borrow<py::class_<rt::Buffer>>(r.attr("Buffer"));
  buffer_cls
      .def(py::init(&make_buffer), py::arg("nbytes"), py::arg("obj") = py::none(), py::arg("data") = 0,
           py::arg("kind") = "opaque", py::arg("device") = -1,
           "A buffer of `nbytes` logical bytes holding `obj` (kept alive), its memory at address `data` (host "
           "memory needs it; 0: not addressable), kind 'host', 'device' or 'opaque'")
      .def_static(
          "host", [](const py::object& nbytes) { return rt::host_buffer(int_of<std::uint64_t>(nbytes, "nbytes")); },
          py::arg("nbytes"),
          "A zero-filled host buffer of `nbytes` bytes")
      .def_property_readonly("nbytes", [](const rt::Buffer& b) { return b.bytes; }, "Logical size (the plan's)")
      .def_property_readonly("materialized", [](const rt::Buffer& b) { return b.materialized; },
                             "Bytes present at data (<= nbytes)")
      .def_property_readonly("kind", [](const rt::Buffer& b) { return memory_name(b.kind); },
                             "'host', 'device' or 'opaque'")
      .def_property_readonly("data", [](const rt::Buffer& b) { return reinterpret_cast<std::uintptr_t>(b.data); },
                             "Address of the first byte (0: none)")
      .def_property_readonly("device", [](const rt::Buffer& b) { return b.device; }, "CUDA device (-1: none)")
      .def_property_readonly("obj", &buffer_object, "The Python object the buffer holds (None: made in C++)")
      .def("host_view", &host_view, "The materialised bytes of a host buffer as a writable uint8 array")
      .def("__repr__", [](const rt::Buffer& b) {
        return fmt::format("Buffer(nbytes={}, kind='{}', materialized={})", b.bytes, memory_name(b.kind),
                           b.materialized);
      });

  py::reinterpret_borrow<py::class_<pl::TensorShape>>(r.attr("TensorShape"))
      .def_readonly("rows", &pl::TensorShape::rows)
      .def_readonly("seq", &pl::TensorShape::seq, "Sequence length (decoder side on decoder stages)")
      .def_readonly("hidden", &pl::TensorShape::hidden, "Hidden size (1 for loaded token ids)")
      .def_readonly("enc_seq", &pl::TensorShape::enc_seq, "Encoder positions after the decoder's (0: none)")
      .def_property_readonly("dtype", [](const pl::TensorShape& s) { return pl::dtype_name(s.dtype); })
      .def_property_readonly("nbytes", &pl::TensorShape::bytes, "rows x (seq + enc_seq) x hidden x dtype size")
      .def_property_readonly("dims",
                             [](const pl::TensorShape& s) { return py::make_tuple(s.rows, s.seq + s.enc_seq, s.hidden); },
                             "(rows, seq + enc_seq, hidden): the tensor's dimensions")
      .def("__repr__", [](const pl::TensorShape& s) { return "TensorShape(" + pl::to_string(s) + ")"; });

  py::reinterpret_borrow<py::class_<PyOpContext>>(r.attr("OpContext"))
      .def_readonly("rank", &PyOpContext::rank, "Pipeline rank running the stream")
      .def_readonly("index", &PyOpContext::index, "Instruction index in the rank's stream")
      .def_readonly("iteration", &PyOpContext::iteration, "The plan's iteration")
      .def_readonly("replica", &PyOpContext::replica, "The plan's data-parallel replica")
      .def_readonly("instruction", &PyOpContext::ins, "The instruction (a packpipe.Instruction)")
      .def_property_readonly("op", [](const PyOpContext& c) { return pl::opcode_name(c.ins.op); }, "Opcode name")
      .def_property_readonly("mb", [](const PyOpContext& c) { return opt_index(c.ins.mb); }, "Micro-batch or None")
      .def_property_readonly("stage", [](const PyOpContext& c) { return opt_index(c.ins.stage); },
                             "Virtual stage or None")
      .def_property_readonly("peer", [](const PyOpContext& c) { return opt_index(c.ins.peer); }, "Peer rank or None")
      .def_readonly("shape", &PyOpContext::shape, "The instruction's shape (loads, receives) or None")
      .def_readonly("out_shape", &PyOpContext::out_shape,
                    "Compute ops: the shape of the buffer they produce when the plan sends it, else None")
      .def_property_readonly("recompute", [](const PyOpContext& c) { return recompute_name(c.recompute); },
                             "The (micro-batch, stage)'s recompute mode: none, selective or full")
      .def_readonly("loss_weight", &PyOpContext::loss_weight, "The micro-batch's loss tokens / global loss tokens")
      .def_property_readonly(
          "loss_tokens",
          [](const PyOpContext& c) { return c.loss_tokens < 0 ? py::none() : py::object(py::int_(c.loss_tokens)); },
          "The micro-batch's loss tokens (None without a micro-batch)")
      .def("__repr__", [](const PyOpContext& c) {
        return fmt::format("OpContext(rank={}, index={}, {})", c.rank, c.index, pl::to_string(c.ins));
      });

  py::reinterpret_borrow<py::class_<rt::StageHandler, PyStageHandler>>(r.attr("StageHandler"))
      .def(py::init_alias<>(), "Subclass it and override the methods (load, forward, backward, backward_weight, "
                         "reduce_grad, optimizer_step, allocate; optionally begin_iteration, end_iteration, "
                         "reduce_tied, received)");

  auto transport_cls = py::reinterpret_borrow<py::class_<rt::Transport, PyTransport>>(r.attr("Transport"));
  transport_cls
      .def(py::init([](const py::object& rank, const py::object& ranks, const std::string& memory) {
             return std::make_unique<PyTransport>(int_of<std::uint32_t>(rank, "rank"),
                                                  int_of<std::uint32_t>(ranks, "ranks"), memory);
           }),
           py::arg("rank"), py::arg("ranks"),
           py::arg("memory") = "host",
           "Subclass it: send(buffer, peer, channel) and recv(...) return requests with wait(timeout) -> bool and "
           "test() -> bool; optionally abort(why) and abort_reason()")
      .def_property_readonly("rank", &rt::Transport::rank, "This executor's pipeline rank")
      .def_property_readonly("ranks", &rt::Transport::ranks, "The pipeline's ranks")
      .def_property_readonly(
          "aborted_because",
          [](const rt::Transport& t) {
            py::gil_scoped_release nogil;  // abort_reason() may take the GIL itself
            return t.abort_reason();
          },
          "Why the pipeline was aborted ('' if it was not)");

  auto opts = py::reinterpret_borrow<py::class_<rt::ExecutorOptions>>(r.attr("ExecutorOptions"));
  opts.def(py::init([](double timeout_s, const BoolArg& validate, const BoolArg& check_agreement,
                       const BoolArg& record) {
             PACKPIPE_CHECK_ARG(timeout_s >= 0 && timeout_s <= rt::kMaxTimeoutS, "timeout_s must be in [0, {}] (0: forever), found {}", rt::kMaxTimeoutS,
                                timeout_s);
             return rt::ExecutorOptions{timeout_s, bool_of(validate, "validate"),
                                        bool_of(check_agreement, "check_agreement"), bool_of(record, "record")};
           }),
           py::kw_only(), py::arg("timeout_s") = 300.0, py::arg("validate") = true, py::arg("check_agreement") = true,
           py::arg("record") = true, "Options; timeout_s 0 waits forever")
      .def_readwrite("timeout_s", &rt::ExecutorOptions::timeout_s, "Seconds every wait may take (0: forever)");
  def_field(opts, "validate", &rt::ExecutorOptions::validate, "Refuse an invalid plan before running it");
  def_field(opts, "check_agreement", &rt::ExecutorOptions::check_agreement,
            "Exchange plan fingerprints with the pipeline neighbours at ITER_BEGIN");
  def_field(opts, "record", &rt::ExecutorOptions::record, "Record each instruction's start and end");
  def_repr(opts, {"timeout_s", "validate", "check_agreement", "record"});

  auto rec = py::reinterpret_borrow<py::class_<rt::RankRecord>>(r.attr("RankRecord"));
  rec.def_readonly("rank", &rt::RankRecord::rank)
      .def_readonly("iteration", &rt::RankRecord::iteration)
      .def_property_readonly("times", &record_times,
                             "int64 [instructions, 2]: each instruction's start and end, ns since the epoch")
      .def_readonly("start_ns", &rt::RankRecord::start_ns, "The stream's first start")
      .def_readonly("end_ns", &rt::RankRecord::end_ns, "The stream's last end")
      .def_readonly("handler_ns", &rt::RankRecord::handler_ns, "Time inside handler calls")
      .def_readonly("wait_ns", &rt::RankRecord::wait_ns, "Time inside request waits")
      .def_readonly("transport_ns", &rt::RankRecord::transport_ns, "Time posting sends and receives")
      .def_readonly("instructions", &rt::RankRecord::instructions)
      .def_property_readonly("overhead_ns", &rt::RankRecord::overhead_ns,
                             "Stream wall time minus handler, wait and transport time: the executor's own");
  def_repr(rec, {"rank", "iteration", "instructions", "start_ns", "end_ns", "overhead_ns"});

  py::reinterpret_borrow<py::class_<PyExecutor>>(r.attr("Executor"))
      .def(py::init([](rt::StageHandler& h, rt::Transport& t, const rt::ExecutorOptions& o) {
             PyExecutor e;
             e.ex = std::make_unique<rt::Executor>(h, t, o);
             e.handler = &h;
             e.transport = &t;
             return e;
           }),
           py::arg("handler"), py::arg("transport"), py::arg("options") = rt::ExecutorOptions{},
           py::keep_alive<1, 2>(), py::keep_alive<1, 3>(), "An executor of the transport's rank (both kept alive)")
      .def(
          "run",
          [](PyExecutor& e, const py::object& plan_obj) {
            const PlanPtr plan = plan_obj.cast<PlanPtr>();
            set_plan(e.handler, plan_obj, plan.get());
            std::string failure;
            rt::RankRecord out;
            {
              py::gil_scoped_release nogil;
              try {
                out = e.ex->run(*plan);
              } catch (const std::exception& x) {
                failure = x.what();
              }
            }
            set_plan(e.handler, py::none(), nullptr);
            if (!failure.empty()) raise_pipeline_error(failure, take_cause(e.handler, e.transport));
            return out;
          },
          py::arg("plan"),
          "Runs this rank's stream of `plan`; raises PipelineError naming rank, iteration, instruction and cause")
      .def_property_readonly(
          "epoch_ns",
          [](const PyExecutor& e) {
            return std::chrono::duration_cast<std::chrono::nanoseconds>(e.ex->epoch().time_since_epoch()).count();
          },
          "The records' epoch on the steady clock, ns (time.monotonic_ns() on Linux)");

  r.def(
      "run_local",
      [](const py::object& plan_obj, const std::vector<rt::StageHandler*>& handlers, const rt::ExecutorOptions& o,
         const py::object& copy) {
        const PlanPtr plan = plan_obj.cast<PlanPtr>();
        PACKPIPE_CHECK_ARG(handlers.size() == plan->ranks, "run_local: {} handlers for a plan of {} ranks",
                           handlers.size(), plan->ranks);
        for (std::size_t k = 0; k < handlers.size(); ++k) {
          PACKPIPE_CHECK_ARG(handlers[k] != nullptr, "run_local: handlers[{}] is None", k);
          set_plan(handlers[k], plan_obj, plan.get());
        }
        rt::CopyFn copy_fn;
        std::shared_ptr<py::object> copy_obj;  // released here, under the GIL
        if (!copy.is_none()) {
          copy_obj = std::make_shared<py::object>(copy);
          copy_fn = [c = copy_obj.get()](const rt::Buffer& dst, const rt::Buffer& src) {
            py::gil_scoped_acquire gil;
            try {
              (*c)(dst, src);
            } catch (py::error_already_set& e) {
              throw Error("copy(): " + describe_python_error(e));
            }
          };
        }
        rt::LocalRun run;
        std::string failure;
        {
          py::gil_scoped_release nogil;
          try {
            run = rt::run_local(
                *plan, [&](std::uint32_t k) { return std::make_unique<ForwardingHandler>(*handlers[k]); }, o, {},
                copy_fn);
          } catch (const std::exception& x) {
            failure = x.what();
          }
        }
        for (auto* h : handlers) set_plan(h, py::none(), nullptr);
        if (!failure.empty()) {
          py::object cause = py::none();
          for (auto* h : handlers) {
            if (cause.is_none()) cause = take_cause(h, nullptr);
          }
          raise_pipeline_error(failure, cause);
        }
        return run.records;
      },
      py::arg("plan"), py::arg("handlers"), py::arg("options") = rt::ExecutorOptions{}, py::arg("copy") = py::none(),
      "Runs every rank of `plan` on its own thread with handlers[rank] and the in-process transport (host "
      "buffers; with `copy(dst, src)`, opaque buffers moved by it); returns each rank's RankRecord");

  r.def("plan_fingerprint", &rt::plan_fingerprint, py::arg("plan"),
        "64-bit fingerprint of a plan (what ranks compare at ITER_BEGIN)");
  r.def(
      "summarize",
      [](const py::list& runs, double time_scale) {
        std::vector<PlanPtr> keep;
        const rt::RunSummary s = rt::summarize(executed(runs, keep), time_scale);
        py::dict d;
        d["measured_ms"] = s.measured_ms;
        d["simulated_ms"] = s.simulated_ms;
        d["median_ratio"] = s.median_ratio;
        py::list plans;
        for (const auto& p : s.plans) {
          py::dict x;
          x["iteration"] = p.iteration;
          x["replica"] = p.replica;
          x["measured_ms"] = p.measured_ms;
          x["simulated_ms"] = p.simulated_ms;
          x["ratio"] = p.ratio();
          plans.append(x);
        }
        d["plans"] = plans;
        py::dict ops;
        for (const auto& [k, ratio, n] : s.op_ratios) ops[py::str(k)] = py::make_tuple(ratio, n);
        d["op_ratios"] = ops;
        d["instructions"] = s.instructions;
        d["overhead_ns_per_instruction"] = s.overhead_ns_per_instruction;
        d["wait_fraction"] = s.wait_fraction;
        return d;
      },
      py::arg("runs"), py::arg("time_scale") = 1.0,
      "Measured against planned for a list of (plan, [RankRecord per rank]) on one clock: makespans, per-op "
      "ratios (F, B, I, W), executor overhead per instruction, wait fraction");
  r.def(
      "trace_json",
      [](const py::list& runs, double time_scale) {
        std::vector<PlanPtr> keep;
        return rt::trace_json(executed(runs, keep), time_scale);
      },
      py::arg("runs"), py::arg("time_scale") = 1.0,
      "Chrome/Perfetto trace JSON of (plan, records) pairs: the measured timeline beside the planned one");
}

}  // namespace packpipe::bindings
