// rlpar._native — thin bindings: convert arguments, check them, decide about the GIL, call the core.
//
// GIL rules kept here (see README "Design"):
//  * Every py::array/py::object is inspected while the GIL is held; only raw pointers and sizes
//    cross into a GIL-released region.
//  * The GIL is released with RAII (CallScope below), never with hand-written pairs, and only when
//    the call's work is above a measured threshold (release_gil=None), or when asked (True/False).
//  * Python layers re-take the GIL with py::gil_scoped_acquire around their own call only.
//  * At interpreter exit an atexit hook stops releasing the GIL and waits for the calls that could
//    let other threads run to finish (CallScope), so no thread is ever inside native code when
//    the interpreter finalizes.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <optional>
#include <sstream>
#include <string>
#include <thread>

#include "gil.h"
#include "rlpar/net.h"
#include "rlpar/optim.h"
#include "envs_py.h"
#include "snapshot_py.h"

namespace rlpar_py {
void bind_losses(pybind11::module_& m);
}

namespace py = pybind11;
using rlpar::HeadKind;
using rlpar::HeadSpec;
using rlpar::LayerSpec;
using rlpar::Net;
using rlpar::NetSpec;
using rlpar::Shape;

using rlpar_py::CallScope;
using rlpar_py::want_release;

namespace {

// ---------------------------------------------------------------------------------------------
// Argument checks: every message says what was expected and what came.

std::string dims_str(const py::array& a) {
  Shape s(a.shape(), a.shape() + a.ndim());
  return rlpar::shape_str(s);
}

std::string dtype_str(const py::array& a) { return py::str(a.dtype()).cast<std::string>(); }

std::string expected_batch_shape(const Shape& sample) {
  std::ostringstream o;
  o << "[B";
  for (int64_t d : sample) o << ", " << d;
  o << "]";
  return o.str();
}

py::array as_array(py::handle obj, const char* what) {
  if (py::isinstance<py::array>(obj)) return py::reinterpret_borrow<py::array>(obj);
  if (PyObject_CheckBuffer(obj.ptr()) || py::hasattr(obj, "__array__")) {
    return py::module_::import("numpy").attr("asarray")(obj).cast<py::array>();
  }
  throw py::type_error(std::string(what) + " must be a numpy array, got " +
                       py::str(py::type::of(obj).attr("__name__")).cast<std::string>());
}

template <typename T>
bool has_dtype(const py::array& a) {
  return rlpar_py::same_dtype<T>(a);
}

void require_float32(const py::array& a, const char* what) {
  if (!has_dtype<float>(a)) {
    throw py::type_error(std::string(what) + " must be float32, got " + dtype_str(a) +
                         " (convert with .astype(np.float32))");
  }
}

py::array contiguous(const py::array& a) {
  if (a.flags() & py::array::c_style) return a;
  return py::module_::import("numpy").attr("ascontiguousarray")(a).cast<py::array>();
}

// A flat, contiguous float32 vector of n values (n < 0: any length, stored back into n).
float* flat_f32(py::handle obj, int64_t& n, const char* what, bool writable) {
  py::array a = as_array(obj, what);
  require_float32(a, what);
  const std::string want = n < 0 ? std::string("a flat float32 vector")
                                 : "a flat float32 vector of " + std::to_string(n) + " values";
  if (a.ndim() != 1 || (n >= 0 && a.shape(0) != n)) {
    throw py::value_error(std::string(what) + " must be " + want + ", got shape " + dims_str(a));
  }
  if (!(a.flags() & py::array::c_style)) {
    throw py::value_error(std::string(what) + " must be contiguous (a view with strides was given)");
  }
  if (writable && !a.writeable()) throw py::value_error(std::string(what) + " must be writable");
  n = a.shape(0);
  // The array is the caller's (borrowed) or a view on a buffer the caller owns.
  return const_cast<float*>(static_cast<const float*>(a.data()));
}

float* writable_flat(py::handle obj, int64_t n, const char* what) {
  return flat_f32(obj, n, what, true);
}

const float* readonly_flat(py::handle obj, int64_t n, const char* what) {
  return flat_f32(obj, n, what, false);
}

// params: a flat float32 vector, or a pinned Snapshot (read in place, kept alive by the caller).
const float* flat_params(const Net& net, py::handle obj) {
  if (py::isinstance<rlpar_py::PySnapshot>(obj)) {
    const auto& snap = obj.cast<const rlpar_py::PySnapshot&>();
    if (!snap.pin) throw py::value_error("params: this snapshot was released");
    const rlpar::Pin& pin = snap.pin->pin;
    if (static_cast<int64_t>(pin.size()) != net.num_params()) {
      throw py::value_error("params: the snapshot holds " + std::to_string(pin.size()) +
                            " values, the net expects " + std::to_string(net.num_params()));
    }
    return pin.data();
  }
  return readonly_flat(obj, net.num_params(), "params");
}

// Observations: [B, *input_shape] of the net's input dtype; non-contiguous arrays are copied.
py::array checked_obs(const Net& net, py::handle obj, int64_t& batch) {
  py::array a = as_array(obj, "obs");
  const NetSpec& spec = net.spec();
  const bool ok_dtype = spec.input_uint8 ? has_dtype<uint8_t>(a) : has_dtype<float>(a);
  if (!ok_dtype) {
    const char* want = spec.input_uint8 ? "uint8" : "float32";
    throw py::type_error(std::string("obs must be ") + want + " (the net's input dtype), got " +
                         dtype_str(a) + " (convert with .astype(np." + want + "))");
  }
  const Shape& s = spec.input_shape;
  bool ok = a.ndim() == static_cast<py::ssize_t>(s.size() + 1) && a.shape(0) >= 1;
  for (size_t i = 0; ok && i < s.size(); ++i) ok = a.shape(i + 1) == s[i];
  if (!ok) {
    throw py::value_error("obs must have shape " + expected_batch_shape(s) + " with B >= 1, got " +
                          dims_str(a) + (a.ndim() == static_cast<py::ssize_t>(s.size())
                                             ? " (add a batch axis: obs[None])"
                                             : ""));
  }
  batch = a.shape(0);
  return contiguous(a);
}

py::array_t<float> output_buffer(const Net& net, py::object out, int64_t batch) {
  if (out.is_none()) return py::array_t<float>({batch, net.output_size()});
  py::array a = as_array(out, "out");
  require_float32(a, "out");
  if (a.ndim() != 2 || a.shape(0) != batch || a.shape(1) != net.output_size()) {
    throw py::value_error("out must have shape (" + std::to_string(batch) + ", " +
                          std::to_string(net.output_size()) + "), got " + dims_str(a));
  }
  if (!(a.flags() & py::array::c_style) || !a.writeable()) {
    throw py::value_error("out must be a contiguous, writable float32 array");
  }
  return py::reinterpret_borrow<py::array_t<float>>(a);
}

void check_obs_finite(const Net& net, const py::array& obs, int64_t batch) {
  if (!net.spec().input_uint8) {
    rlpar::check_finite(static_cast<const float*>(obs.data()), batch * net.input_size(), "obs");
  }
}

// ---------------------------------------------------------------------------------------------
// Python layers

std::vector<py::ssize_t> batch_dims(const Shape& s, int64_t batch) {
  std::vector<py::ssize_t> d{static_cast<py::ssize_t>(batch)};
  d.insert(d.end(), s.begin(), s.end());
  return d;
}

py::array_t<float> copy_to_numpy(const float* src, const Shape& s, int64_t batch) {
  py::array_t<float> a(batch_dims(s, batch));
  std::memcpy(a.mutable_data(), src, sizeof(float) * batch * rlpar::shape_numel(s));
  return a;
}

class PyExternalLayer final : public rlpar::ExternalLayer {
 public:
  explicit PyExternalLayer(py::object layer) : layer_(std::move(layer)) {
    name_ = py::str(py::type::of(layer_).attr("__name__")).cast<std::string>();
  }
  ~PyExternalLayer() override {
    if (Py_IsInitialized()) {
      py::gil_scoped_acquire gil;
      layer_ = py::object();
    } else {
      layer_.release();  // the interpreter is gone: nothing left to decrement
    }
  }

  Shape output_shape(const Shape& in) override {
    py::gil_scoped_acquire gil;
    py::object r = layer_.attr("output_shape")(py::tuple(py::cast(in)));
    auto not_ints = [&] {
      return py::type_error(name_ + ".output_shape must return a tuple of ints, got " +
                            py::repr(r).cast<std::string>());
    };
    if (!py::isinstance<py::iterable>(r)) throw not_ints();
    Shape s;
    try {
      for (py::handle d : r) s.push_back(d.cast<int64_t>());
    } catch (const py::cast_error&) {
      throw not_ints();
    }
    return s;
  }

  void forward(const float* x, const Shape& in, float* y, const Shape& out, int64_t batch) override {
    py::gil_scoped_acquire gil;
    py::object r = layer_.attr("forward")(copy_to_numpy(x, in, batch));
    copy_result(r, y, out, batch, "forward");
  }

  void backward(const float* x, const float* y, const float* dy, float* dx, const Shape& in,
                const Shape& out, int64_t batch) override {
    py::gil_scoped_acquire gil;
    py::object r = layer_.attr("backward")(copy_to_numpy(x, in, batch),
                                           copy_to_numpy(y, out, batch),
                                           copy_to_numpy(dy, out, batch));
    copy_result(r, dx, in, batch, "backward");
  }

 private:
  void copy_result(const py::object& r, float* dst, const Shape& s, int64_t batch,
                   const char* method) const {
    auto not_array = [&] {
      return py::type_error(name_ + "." + method + " must return a numpy array, got " +
                            py::str(py::type::of(r).attr("__name__")).cast<std::string>());
    };
    // None, scalars and lists would convert to arrays of another shape: name their type instead.
    if (!PyObject_CheckBuffer(r.ptr()) && !py::hasattr(r, "__array__")) throw not_array();
    auto a = py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(r);
    if (!a) {
      PyErr_Clear();
      throw not_array();
    }
    const auto want = batch_dims(s, batch);
    bool ok = a.ndim() == static_cast<py::ssize_t>(want.size());
    for (size_t i = 0; ok && i < want.size(); ++i) ok = a.shape(i) == want[i];
    if (!ok) {
      throw py::value_error(name_ + "." + method + " returned shape " + dims_str(a) +
                            ", expected " + rlpar::shape_str(Shape(want.begin(), want.end())));
    }
    std::memcpy(dst, a.data(), sizeof(float) * a.size());
  }

  py::object layer_;
  std::string name_;
};

// layers: tuples ("linear", out) | ("conv2d", oc, k, stride, pad) | ("relu",) | ("tanh",) |
// ("flatten",) | ("python", layer); heads: (kind, size).
std::shared_ptr<Net> make_net(const Shape& input_shape, bool input_uint8, float input_scale,
                              const py::list& layers, const py::list& heads) {
  NetSpec spec;
  spec.input_shape = input_shape;
  spec.input_uint8 = input_uint8;
  spec.input_scale = input_scale;
  for (py::handle item : layers) {
    auto t = item.cast<py::tuple>();
    const auto kind = t[0].cast<std::string>();
    if (kind == "linear") {
      spec.layers.push_back(LayerSpec::linear(t[1].cast<int64_t>()));
    } else if (kind == "conv2d") {
      spec.layers.push_back(LayerSpec::conv2d(t[1].cast<int64_t>(), t[2].cast<int64_t>(),
                                              t[3].cast<int64_t>(), t[4].cast<int64_t>()));
    } else if (kind == "relu") {
      spec.layers.push_back(LayerSpec::relu());
    } else if (kind == "tanh") {
      spec.layers.push_back(LayerSpec::tanh());
    } else if (kind == "flatten") {
      spec.layers.push_back(LayerSpec::flatten());
    } else if (kind == "python") {
      spec.layers.push_back(LayerSpec::external_layer(
          std::make_shared<PyExternalLayer>(py::reinterpret_borrow<py::object>(t[1]))));
    } else {
      throw py::value_error("unknown layer kind '" + kind +
                            "', expected one of linear, conv2d, relu, tanh, flatten, python");
    }
  }
  for (py::handle item : heads) {
    auto t = item.cast<py::tuple>();
    const auto kind = t[0].cast<std::string>();
    HeadSpec h;
    h.size = t[1].cast<int64_t>();
    if (kind == "categorical") h.kind = HeadKind::Categorical;
    else if (kind == "value") h.kind = HeadKind::Value;
    else if (kind == "gaussian") h.kind = HeadKind::Gaussian;
    else throw py::value_error("unknown head kind '" + kind + "', expected categorical, value or gaussian");
    spec.heads.push_back(h);
  }
  return std::make_shared<Net>(std::move(spec));
}

// A recorded forward pass: the core tape plus what keeps its parameters alive and unchanged until
// backward (the caller's array, or a share of a snapshot's pin).
struct PyTape {
  std::shared_ptr<Net> net;
  std::unique_ptr<rlpar::Tape> tape;
  py::object params;
  std::shared_ptr<rlpar_py::SharedPin> pin;
  const float* params_data = nullptr;
};

py::array_t<float> do_forward(const std::shared_ptr<Net>& net, py::handle params, py::handle obs,
                              py::object out, py::object release_gil, bool check,
                              std::unique_ptr<rlpar::Tape>* tape) {
  const float* p = flat_params(*net, params);
  int64_t batch = 0;
  py::array x = checked_obs(*net, obs, batch);
  py::array_t<float> y = output_buffer(*net, std::move(out), batch);
  if (check) {
    rlpar::check_finite(p, net->num_params(), "params");
    check_obs_finite(*net, x, batch);
  }
  const void* xp = x.data();
  float* yp = y.mutable_data();
  {
    const bool release = want_release(release_gil, net->flops_per_sample() * batch);
    CallScope scope(release, net->has_external());
    if (tape) {
      *tape = net->forward_train(p, xp, batch, yp);
    } else {
      net->forward(p, xp, batch, yp);
    }
  }
  return y;
}

// ---------------------------------------------------------------------------------------------
// Optimizer helpers

float* optional_state(py::object a, int64_t n, const char* what) {
  if (a.is_none()) return nullptr;
  return writable_flat(as_array(a, what), n, what);
}

bool release_for_elements(py::handle release_gil, int64_t n) {
  return want_release(release_gil, 8.0 * static_cast<double>(n));
}

}  // namespace

PYBIND11_MODULE(_native, m) {
  m.doc() = "rlpar native core: shared nets, optimizers and snapshots (GIL released for work)";

  m.def("set_gil_release_threshold", [](double flops) {
        if (!(flops >= 0)) throw py::value_error("threshold must be >= 0 flops, got " + std::to_string(flops));
        rlpar_py::g_release_threshold.store(flops);
      }, py::arg("flops"));
  m.def("gil_release_threshold", [] { return rlpar_py::g_release_threshold.load(); });
  m.def("_stop_releasing_gil", &rlpar_py::stop_releasing_gil, py::arg("timeout_s") = 5.0);

  py::class_<PyTape>(m, "Tape", "Activations of one forward_train call, consumed by backward.")
      .def_property_readonly("batch", [](const PyTape& t) { return t.tape ? t.tape->batch() : 0; })
      .def("release", [](PyTape& t) { t.tape.reset(); },
           "Give the workspace back to the net now instead of when the tape is collected.");

  py::class_<Net, std::shared_ptr<Net>>(m, "Net", py::dynamic_attr())
      .def(py::init(&make_net), py::arg("input_shape"), py::arg("input_uint8"),
           py::arg("input_scale"), py::arg("layers"), py::arg("heads"))
      .def_property_readonly("num_params", &Net::num_params)
      .def_property_readonly("output_size", &Net::output_size)
      .def_property_readonly("input_shape", [](const Net& n) { return py::tuple(py::cast(n.spec().input_shape)); })
      .def_property_readonly("input_uint8", [](const Net& n) { return n.spec().input_uint8; })
      .def_property_readonly("flops_per_sample", &Net::flops_per_sample)
      .def_property_readonly("activation_shapes", [](const Net& n) {
        py::list out;
        for (const Shape& s : n.activation_shapes()) out.append(py::tuple(py::cast(s)));
        return out;
      })
      .def_property_readonly("outputs", [](const Net& n) {
        py::list out;
        for (const auto& o : n.outputs()) out.append(py::make_tuple(o.name, o.head, o.begin, o.size));
        return out;
      })
      .def_property_readonly("param_info", [](const Net& n) {
        py::list out;
        for (const auto& p : n.param_info()) {
          out.append(py::make_tuple(p.name, p.role, p.offset, py::tuple(py::cast(p.shape)), p.index,
                                    p.in_head));
        }
        return out;
      })
      .def("workspace_stats", [](const Net& n) {
        auto s = n.workspace_stats();
        py::dict d;
        d["workspaces"] = s.workspaces;
        d["idle"] = s.idle;
        d["bytes"] = s.bytes;
        d["allocations"] = s.allocations;
        return d;
      })
      .def("forward",
           [](const std::shared_ptr<Net>& net, py::handle params, py::handle obs, py::object out,
              py::object release_gil, bool check_finite) {
             return do_forward(net, params, obs, std::move(out), std::move(release_gil),
                               check_finite, nullptr);
           },
           py::arg("params"), py::arg("obs"), py::arg("out") = py::none(),
           py::arg("release_gil") = py::none(), py::arg("check_finite") = false)
      .def("forward_train",
           [](const std::shared_ptr<Net>& net, py::handle params, py::handle obs, py::object out,
              py::object release_gil, bool check_finite) {
             PyTape t{net, nullptr, py::reinterpret_borrow<py::object>(params), nullptr, nullptr};
             if (py::isinstance<rlpar_py::PySnapshot>(params)) {
               t.pin = params.cast<const rlpar_py::PySnapshot&>().pin;
             }
             t.params_data = flat_params(*net, params);
             auto y = do_forward(net, params, obs, std::move(out), std::move(release_gil),
                                 check_finite, &t.tape);
             return py::make_tuple(y, std::move(t));
           },
           py::arg("params"), py::arg("obs"), py::arg("out") = py::none(),
           py::arg("release_gil") = py::none(), py::arg("check_finite") = false)
      .def("backward",
           [](const std::shared_ptr<Net>& net, PyTape& tape, py::handle dout, py::object grad,
              bool accumulate, py::object release_gil, bool check_finite) {
             if (!tape.tape) throw py::value_error("this tape was released; record a new one with forward_train");
             if (tape.net != net) throw py::value_error("this tape was recorded by another net");
             const int64_t batch = tape.tape->batch();
             const float* p = tape.params_data;
             py::array d = as_array(dout, "dout");
             require_float32(d, "dout");
             if (d.ndim() != 2 || d.shape(0) != batch || d.shape(1) != net->output_size()) {
               throw py::value_error("dout must have shape (" + std::to_string(batch) + ", " +
                                     std::to_string(net->output_size()) + ") like the forward output, got " +
                                     dims_str(d));
             }
             d = contiguous(d);
             py::array g;
             if (grad.is_none()) {
               if (accumulate) throw py::value_error("accumulate=True needs a grad buffer to add into");
               g = py::array_t<float>(net->num_params());
             } else {
               g = as_array(grad, "grad");
             }
             float* gp = writable_flat(g, net->num_params(), "grad");
             const float* dp = static_cast<const float*>(d.data());
             if (check_finite) rlpar::check_finite(dp, batch * net->output_size(), "dout");
             {
               const bool release = want_release(release_gil, 2.0 * net->flops_per_sample() * batch);
               CallScope scope(release, net->has_external());
               net->backward(p, *tape.tape, dp, gp, accumulate);
             }
             return g;
           },
           py::arg("tape"), py::arg("dout"), py::arg("grad") = py::none(),
           py::arg("accumulate") = false, py::arg("release_gil") = py::none(),
           py::arg("check_finite") = false);

  m.def("sgd_step",
        [](py::handle params, py::handle grad, py::object buf, float lr, float momentum,
           float weight_decay, bool nesterov, py::object release_gil) {
          int64_t n = -1;
          float* p = flat_f32(params, n, "params", true);
          const float* g = readonly_flat(grad, n, "grad");
          float* b = optional_state(buf, n, "momentum_buffer");
          if (momentum != 0.0f && b == nullptr) throw py::value_error("momentum > 0 needs a momentum_buffer");
          const bool release = release_for_elements(release_gil, n);
          CallScope scope(release, false);
          rlpar::optim::sgd_step(p, g, b, n, lr, momentum, weight_decay, nesterov);
        },
        py::arg("params"), py::arg("grad"), py::arg("momentum_buffer"), py::arg("lr"),
        py::arg("momentum"), py::arg("weight_decay"), py::arg("nesterov"),
        py::arg("release_gil") = py::none());
  m.def("rmsprop_step",
        [](py::handle params, py::handle grad, py::handle square_avg, py::object grad_avg,
           py::object buf, float lr, float alpha, float eps, float momentum, float weight_decay,
           py::object release_gil) {
          int64_t n = -1;
          float* p = flat_f32(params, n, "params", true);
          const float* g = readonly_flat(grad, n, "grad");
          float* sq = writable_flat(square_avg, n, "square_avg");
          float* ga = optional_state(grad_avg, n, "grad_avg");
          float* b = optional_state(buf, n, "momentum_buffer");
          if (momentum != 0.0f && b == nullptr) throw py::value_error("momentum > 0 needs a momentum_buffer");
          const bool release = release_for_elements(release_gil, n);
          CallScope scope(release, false);
          rlpar::optim::rmsprop_step(p, g, sq, ga, momentum != 0.0f ? b : nullptr, n, lr, alpha,
                                     eps, momentum, weight_decay);
        },
        py::arg("params"), py::arg("grad"), py::arg("square_avg"), py::arg("grad_avg"),
        py::arg("momentum_buffer"), py::arg("lr"), py::arg("alpha"), py::arg("eps"),
        py::arg("momentum"), py::arg("weight_decay"), py::arg("release_gil") = py::none());
  m.def("adam_step",
        [](py::handle params, py::handle grad, py::handle m1, py::handle m2, int64_t step, float lr,
           float beta1, float beta2, float eps, float weight_decay, py::object release_gil) {
          int64_t n = -1;
          float* p = flat_f32(params, n, "params", true);
          const float* g = readonly_flat(grad, n, "grad");
          float* a = writable_flat(m1, n, "exp_avg");
          float* b = writable_flat(m2, n, "exp_avg_sq");
          if (step < 1) throw py::value_error("adam step count must be >= 1, got " + std::to_string(step));
          const bool release = release_for_elements(release_gil, n);
          CallScope scope(release, false);
          rlpar::optim::adam_step(p, g, a, b, n, step, lr, beta1, beta2, eps, weight_decay);
        },
        py::arg("params"), py::arg("grad"), py::arg("exp_avg"), py::arg("exp_avg_sq"),
        py::arg("step"), py::arg("lr"), py::arg("beta1"), py::arg("beta2"), py::arg("eps"),
        py::arg("weight_decay"), py::arg("release_gil") = py::none());
  m.def("global_norm",
        [](py::handle grad) {
          int64_t n = -1;
          const float* g = flat_f32(grad, n, "grad", false);
          const bool release = release_for_elements(py::none(), n);
          CallScope scope(release, false);
          return rlpar::optim::global_norm(g, static_cast<size_t>(n));
        },
        py::arg("grad"));
  m.def("clip_by_global_norm",
        [](py::handle grad, double max_norm) {
          if (!(max_norm > 0)) throw py::value_error("max_norm must be > 0, got " + std::to_string(max_norm));
          int64_t n = -1;
          float* g = flat_f32(grad, n, "grad", true);
          const bool release = release_for_elements(py::none(), n);
          CallScope scope(release, false);
          return rlpar::optim::clip_by_global_norm(g, static_cast<size_t>(n), max_norm);
        },
        py::arg("grad"), py::arg("max_norm"));

  // pybind11 looks numpy's C API up lazily and releases the GIL while doing so the first time.
  // Do it now, at import: a thread whose first call parked there at interpreter exit would be
  // unwound through a noexcept destructor (std::terminate).
  (void)py::dtype::of<float>();
  rlpar_py::bind_snapshot(m);
  rlpar_py::bind_envs(m);
  rlpar_py::bind_losses(m);
  py::module_::import("atexit").attr("register")(m.attr("_stop_releasing_gil"));
}
