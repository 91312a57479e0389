// Bindings of rlpar::Net (net.h): the spec types (LayerSpec, HeadSpec, NetSpec), Python layers, and
// forward / forward_train / backward with argument checks and the GIL policy (gil.h).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "bindings.h"
#include "convert.h"
#include "gil.h"
#include "rlpar/thread_pool.h"
#include "rlpar/layers.h"
#include "rlpar/amx.h"
#include "rlpar/net.h"
#include "snapshot_py.h"

namespace py = pybind11;
using rlpar::HeadKind;
using rlpar::HeadSpec;
using rlpar::LayerSpec;
using rlpar::Net;
using rlpar::NetSpec;
using rlpar::Shape;

namespace rlpar_py {
namespace {

// ---------------------------------------------------------------------------------------------
// Argument checks: every message says what was expected and what came.

std::string expected_batch_shape(const Shape& sample) {
  std::ostringstream o;
  o << "[B";
  for (int64_t d : sample) o << ", " << d;
  o << "]";
  return o.str();
}

// Observations: [B, *input_shape] of the net's input dtype; non-contiguous arrays are copied.
py::array checked_obs(const Net& net, py::handle obj, int64_t& batch) {
  py::array a = as_array(obj, "obs");
  const NetSpec& spec = net.spec();
  const bool ok_dtype = spec.input_uint8 ? same_dtype<uint8_t>(a) : same_dtype<float>(a);
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
                          shape_str(a) + (a.ndim() == static_cast<py::ssize_t>(s.size())
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
                          std::to_string(net.output_size()) + "), got " + shape_str(a));
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
    PythonScope python;  // the GIL for this call only, metered as held
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
    PythonScope python;  // the GIL for this call only, metered as held
    py::object r = layer_.attr("forward")(copy_to_numpy(x, in, batch));
    copy_result(r, y, out, batch, "forward");
  }

  void backward(const float* x, const float* y, const float* dy, float* dx, const Shape& in,
                const Shape& out, int64_t batch) override {
    PythonScope python;  // the GIL for this call only, metered as held
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
      throw py::value_error(name_ + "." + method + " returned shape " + shape_str(a) +
                            ", expected " + rlpar::shape_str(Shape(want.begin(), want.end())));
    }
    std::memcpy(dst, a.data(), sizeof(float) * a.size());
  }

  py::object layer_;
  std::string name_;
};

// A recorded forward pass: the core tape plus what keeps its parameters alive and unchanged until
// backward (the caller's array, or a share of a snapshot's pin).
struct PyTape {
  std::shared_ptr<Net> net;
  std::unique_ptr<rlpar::Tape> tape;
  py::object params;
  std::shared_ptr<SharedPin> pin;
  const float* params_data = nullptr;
};

// The recurrent part of a call: the state (and episode starts) a recurrent net needs, checked
// against the net and the batch. `update`: the state is the caller's buffer, overwritten in place
// with the state after the call (an actor's step); else it is only read (a learner's sequence).
struct SeqInput {
  rlpar::SeqArgs args;
  py::array state, resets;  // keep converted copies alive for the call
};

SeqInput checked_seq(const Net& net, py::handle state, py::handle resets, int64_t batch,
                     bool update) {
  SeqInput s;
  s.args.seqs = batch;
  if (!net.recurrent()) {
    if (!state.is_none() || !resets.is_none()) {
      throw py::value_error("this net has no recurrent core: pass no state or resets");
    }
    return s;
  }
  if (state.is_none()) {
    throw py::value_error("this net has an LSTM core: pass state, float32 [N, " +
                          std::to_string(net.state_size()) +
                          "] (zeros at the start of an episode; Net.initial_state(N))");
  }
  const py::ssize_t S = net.state_size();
  if (update) {
    s.args.state_out = output_array<float>(state, "state", {batch, S});
    s.args.state0 = s.args.state_out;
  } else {
    s.state = as_array(state, "state");
    require_float32(s.state, "state");
    if (s.state.ndim() != 2 || s.state.shape(1) != S || s.state.shape(0) < 1 ||
        batch % s.state.shape(0) != 0) {
      throw py::value_error("state must have shape (N, " + std::to_string(S) +
                            ") with N dividing the " + std::to_string(batch) +
                            " rows of obs (T = rows / N steps), got " + shape_str(s.state));
    }
    s.state = contiguous(s.state);
    s.args.seqs = s.state.shape(0);
    s.args.state0 = static_cast<const float*>(s.state.data());
  }
  s.args.steps = batch / s.args.seqs;
  if (!resets.is_none()) {
    const std::vector<py::ssize_t> dims =
        update ? std::vector<py::ssize_t>{batch}
               : std::vector<py::ssize_t>{s.args.steps, s.args.seqs};
    s.resets = input_array<uint8_t>(resets, "resets", dims);
    s.args.resets = static_cast<const uint8_t*>(s.resets.data());
  }
  return s;
}

// The optional `pool` argument: None or an rlpar ThreadPool (kept alive by the caller's reference).
rlpar::ThreadPool* pool_arg(py::handle pool) {
  if (pool.is_none()) return nullptr;
  if (!py::isinstance<rlpar::ThreadPool>(pool)) {
    throw py::type_error("pool must be an rlpar.ThreadPool or None, got " +
                         std::string(py::str(py::type::of(pool).attr("__name__"))));
  }
  return &pool.cast<rlpar::ThreadPool&>();
}

py::array_t<float> do_forward(const std::shared_ptr<Net>& net, py::handle params, py::handle obs,
                              py::object out, py::object release_gil, bool check,
                              py::handle state, py::handle resets, py::handle pool_obj,
                              std::unique_ptr<rlpar::Tape>* tape) {
  rlpar::ThreadPool* pool = pool_arg(pool_obj);
  const ParamsRef ref = params_ref(*net, params);
  const float* p = ref.data;
  int64_t batch = 0;
  py::array x = checked_obs(*net, obs, batch);
  py::array_t<float> y = output_buffer(*net, std::move(out), batch);
  SeqInput seq = checked_seq(*net, state, resets, batch, tape == nullptr);
  if (check) {
    rlpar::check_finite(p, net->num_params(), "params");
    check_obs_finite(*net, x, batch);
    if (seq.args.state0) rlpar::check_finite(seq.args.state0, seq.args.seqs * net->state_size(), "state");
  }
  const void* xp = x.data();
  float* yp = y.mutable_data();
  std::shared_ptr<const rlpar::PackedCore> packed;
  {
    const bool release = want_release(release_gil, net->flops_per_sample() * batch);
    CallScope scope(release, net->has_external());
    packed = net->core_weights(p, ref.owner(), ref.version, false);
    seq.args.packed_core = packed.get();
    if (tape) {
      *tape = net->forward_train_seq(p, xp, seq.args, yp, pool);
    } else {
      net->forward_seq(p, xp, seq.args, yp, pool);
    }
  }
  return y;
}

py::array_t<float> forward(const std::shared_ptr<Net>& net, py::handle params, py::handle obs,
                           py::object out, py::object release_gil, bool check_finite,
                           py::handle state, py::handle resets, py::handle pool) {
  return do_forward(net, params, obs, std::move(out), std::move(release_gil), check_finite, state,
                    resets, pool, nullptr);
}

py::tuple forward_train(const std::shared_ptr<Net>& net, py::handle params, py::handle obs,
                        py::object out, py::object release_gil, bool check_finite,
                        py::handle state, py::handle resets, py::handle pool) {
  PyTape t{net, nullptr, py::reinterpret_borrow<py::object>(params), nullptr, nullptr};
  const ParamsRef ref = params_ref(*net, params);
  t.pin = ref.pin;
  t.params_data = ref.data;
  auto y = do_forward(net, params, obs, std::move(out), std::move(release_gil), check_finite,
                      state, resets, pool, &t.tape);
  return py::make_tuple(y, std::move(t));
}

// dout: float32 [B, output_size] like the tape's forward output (copied when not contiguous).
py::array checked_dout(const Net& net, py::handle dout, int64_t batch) {
  py::array d = as_array(dout, "dout");
  require_float32(d, "dout");
  if (d.ndim() != 2 || d.shape(0) != batch || d.shape(1) != net.output_size()) {
    throw py::value_error("dout must have shape (" + std::to_string(batch) + ", " +
                          std::to_string(net.output_size()) + ") like the forward output, got " +
                          shape_str(d));
  }
  return contiguous(d);
}

py::array grad_buffer(const Net& net, py::object grad, bool accumulate) {
  if (!grad.is_none()) return as_array(grad, "grad");
  if (accumulate) throw py::value_error("accumulate=True needs a grad buffer to add into");
  return py::array_t<float>(net.num_params());
}

py::array backward(const std::shared_ptr<Net>& net, PyTape& tape, py::handle dout, py::object grad,
                   bool accumulate, py::object release_gil, bool check_finite,
                   py::handle pool_obj) {
  rlpar::ThreadPool* pool = pool_arg(pool_obj);
  if (!tape.tape) throw py::value_error("this tape was released; record a new one with forward_train");
  if (tape.net != net) throw py::value_error("this tape was recorded by another net");
  const int64_t batch = tape.tape->batch();
  const float* p = tape.params_data;
  py::array d = checked_dout(*net, dout, batch);
  py::array g = grad_buffer(*net, std::move(grad), accumulate);
  float* gp = writable_flat(g, net->num_params(), "grad");
  const float* dp = static_cast<const float*>(d.data());
  if (check_finite) rlpar::check_finite(dp, batch * net->output_size(), "dout");
  {
    const bool release = want_release(release_gil, 2.0 * net->flops_per_sample() * batch);
    CallScope scope(release, net->has_external());
    net->backward(p, *tape.tape, dp, gp, accumulate, pool);
  }
  return g;
}

py::list shapes_list(const std::vector<Shape>& shapes) {
  py::list out;
  for (const Shape& s : shapes) out.append(py::tuple(py::cast(s)));
  return out;
}

py::list outputs_list(const Net& n) {
  py::list out;
  for (const auto& o : n.outputs()) out.append(py::make_tuple(o.name, o.head, o.begin, o.size));
  return out;
}

py::list param_info_list(const Net& n) {
  py::list out;
  for (const auto& p : n.param_info()) {
    out.append(py::make_tuple(p.name, p.role, p.offset, py::tuple(py::cast(p.shape)), p.index,
                              p.in_head));
  }
  return out;
}

py::dict workspace_stats(const Net& n) {
  auto s = n.workspace_stats();
  py::dict d;
  d["workspaces"] = s.workspaces;
  d["idle"] = s.idle;
  d["bytes"] = s.bytes;
  d["allocations"] = s.allocations;
  return d;
}

}  // namespace

const char* layer_kind(rlpar::LayerKind k) {
  switch (k) {
    case rlpar::LayerKind::Linear: return "linear";
    case rlpar::LayerKind::Conv2d: return "conv2d";
    case rlpar::LayerKind::ReLU: return "relu";
    case rlpar::LayerKind::Tanh: return "tanh";
    case rlpar::LayerKind::Flatten: return "flatten";
    case rlpar::LayerKind::External: return "python";
    case rlpar::LayerKind::MaxPool2d: return "maxpool2d";
    case rlpar::LayerKind::LayerNorm: return "layernorm";
    case rlpar::LayerKind::Residual: return "residual";
    case rlpar::LayerKind::Concat: return "concat";
    case rlpar::LayerKind::Embedding: return "embedding";
    case rlpar::LayerKind::Slice: return "slice";
  }
  return "?";
}

const char* head_kind(HeadKind k) {
  switch (k) {
    case HeadKind::Categorical: return "categorical";
    case HeadKind::Value: return "value";
    case HeadKind::Gaussian: return "gaussian";
  }
  return "?";
}

std::string layer_repr(const LayerSpec& l) {
  const std::string kind = layer_kind(l.kind);
  switch (l.kind) {
    case rlpar::LayerKind::Linear:
      return "LayerSpec.linear(" + std::to_string(l.out_features) + ")";
    case rlpar::LayerKind::Conv2d:
      return "LayerSpec.conv2d(" + std::to_string(l.out_channels) + ", " + std::to_string(l.kernel) +
             ", " + std::to_string(l.stride) + ", " + std::to_string(l.padding) + ")";
    case rlpar::LayerKind::MaxPool2d:
      return "LayerSpec.maxpool2d(" + std::to_string(l.kernel) + ", " + std::to_string(l.stride) +
             ", " + std::to_string(l.padding) + ")";
    case rlpar::LayerKind::LayerNorm:
      return "LayerSpec.layernorm(" + std::to_string(l.out_features) + ")";
    case rlpar::LayerKind::Residual: {
      std::string r = "LayerSpec.residual([";
      for (size_t j = 0; j < l.body.size(); ++j) r += (j ? ", " : "") + layer_repr(l.body[j]);
      return r + "])";
    }
    case rlpar::LayerKind::Concat: {
      std::string r = "LayerSpec.concat([";
      for (size_t k = 0; k < l.branch_shapes.size(); ++k) {
        r += (k ? ", " : "") + rlpar::shape_str(l.branch_shapes[k]);
      }
      r += "], [";
      for (size_t k = 0; k < l.branches.size(); ++k) {
        r += k ? ", [" : "[";
        for (size_t j = 0; j < l.branches[k].size(); ++j) {
          r += (j ? ", " : "") + layer_repr(l.branches[k][j]);
        }
        r += "]";
      }
      return r + "])";
    }
    case rlpar::LayerKind::Embedding:
      return "LayerSpec.embedding(" + std::to_string(l.num_embeddings) + ", " +
             std::to_string(l.out_features) + ")";
    default:
      return "LayerSpec." + kind + "()";
  }
}

// The spec types, bound as the core defines them: rlpar.nn builds a NetSpec of these from its
// validated dataclasses, and Net's constructor takes it as is (no parsing here).
void bind_spec(py::module_& m) {
  py::class_<LayerSpec>(m, "LayerSpec", "One layer of a native NetSpec (rlpar/net.h LayerSpec).")
      .def_static("linear", &LayerSpec::linear, py::arg("out_features"))
      .def_static("conv2d", &LayerSpec::conv2d, py::arg("out_channels"), py::arg("kernel"),
                  py::arg("stride"), py::arg("padding"))
      .def_static("relu", &LayerSpec::relu)
      .def_static("tanh", &LayerSpec::tanh)
      .def_static("flatten", &LayerSpec::flatten)
      .def_static("maxpool2d", &LayerSpec::maxpool2d, py::arg("kernel"), py::arg("stride"),
                  py::arg("padding"))
      .def_static("layernorm", &LayerSpec::layernorm, py::arg("features") = 0)
      .def_static("residual", &LayerSpec::residual, py::arg("body"))
      .def_static("concat", &LayerSpec::concat, py::arg("branch_shapes"), py::arg("branches"))
      .def_static("embedding", &LayerSpec::embedding, py::arg("num_embeddings"), py::arg("dim"))
      .def_static("python",
                  [](py::object layer) {
                    return LayerSpec::external_layer(
                        std::make_shared<PyExternalLayer>(std::move(layer)));
                  },
                  py::arg("layer"), "A layer whose forward/backward are the object's methods.")
      .def_property_readonly("kind", [](const LayerSpec& l) { return layer_kind(l.kind); })
      .def_readonly("out_features", &LayerSpec::out_features)
      .def_readonly("out_channels", &LayerSpec::out_channels)
      .def_readonly("kernel", &LayerSpec::kernel)
      .def_readonly("stride", &LayerSpec::stride)
      .def_readonly("padding", &LayerSpec::padding)
      .def_readonly("body", &LayerSpec::body)
      .def_readonly("num_embeddings", &LayerSpec::num_embeddings)
      .def_readonly("branch_shapes", &LayerSpec::branch_shapes)
      .def_readonly("branches", &LayerSpec::branches)
      .def("__repr__", &layer_repr);
  py::class_<HeadSpec>(m, "HeadSpec", "One output head of a native NetSpec (rlpar/net.h HeadSpec).")
      .def_static("categorical", &HeadSpec::categorical, py::arg("n"))
      .def_static("value", &HeadSpec::value)
      .def_static("gaussian", &HeadSpec::gaussian, py::arg("n"))
      .def_property_readonly("kind", [](const HeadSpec& h) { return head_kind(h.kind); })
      .def_readonly("size", &HeadSpec::size)
      .def("__repr__", [](const HeadSpec& h) {
        return std::string("HeadSpec.") + head_kind(h.kind) + "(" +
               (h.kind == HeadKind::Value ? "" : std::to_string(h.size)) + ")";
      });
  py::class_<NetSpec>(m, "NetSpec", "A native net's architecture (rlpar/net.h NetSpec).")
      .def(py::init([](Shape input_shape, bool input_uint8, float input_scale,
                       std::vector<LayerSpec> layers, std::vector<HeadSpec> heads,
                       int64_t lstm_hidden, bool lstm_bf16x3) {
             NetSpec s;
             s.input_shape = std::move(input_shape);
             s.input_uint8 = input_uint8;
             s.input_scale = input_scale;
             s.layers = std::move(layers);
             s.heads = std::move(heads);
             s.lstm_hidden = lstm_hidden;
             s.lstm_bf16x3 = lstm_bf16x3;
             return s;
           }),
           py::arg("input_shape"), py::arg("input_uint8") = false, py::arg("input_scale") = 1.0f,
           py::arg("layers") = std::vector<LayerSpec>{}, py::arg("heads") = std::vector<HeadSpec>{},
           py::arg("lstm_hidden") = 0, py::arg("lstm_bf16x3") = false)
      .def_readonly("input_shape", &NetSpec::input_shape)
      .def_readonly("input_uint8", &NetSpec::input_uint8)
      .def_readonly("input_scale", &NetSpec::input_scale)
      .def_readonly("layers", &NetSpec::layers)
      .def_readonly("heads", &NetSpec::heads)
      .def_readonly("lstm_hidden", &NetSpec::lstm_hidden)
      .def_readonly("lstm_bf16x3", &NetSpec::lstm_bf16x3);
}

void bind_net(py::module_& m) {
  bind_spec(m);
  py::class_<PyTape>(m, "Tape", "Activations of one forward_train call, consumed by backward.")
      .def_property_readonly("batch", [](const PyTape& t) { return t.tape ? t.tape->batch() : 0; })
      .def("release", [](PyTape& t) { t.tape.reset(); },
           "Give the workspace back to the net now instead of when the tape is collected.");

  py::class_<Net, std::shared_ptr<Net>>(m, "Net", py::dynamic_attr())
      .def(py::init([](const NetSpec& spec) { return std::make_shared<Net>(spec); }),
           py::arg("spec"))
      .def_property_readonly("state_size", &Net::state_size)
      .def_property_readonly("recurrent", &Net::recurrent)
      .def_property_readonly("num_params", &Net::num_params)
      .def_property_readonly("output_size", &Net::output_size)
      .def_property_readonly("input_shape",
                             [](const Net& n) { return py::tuple(py::cast(n.spec().input_shape)); })
      .def_property_readonly("input_uint8", [](const Net& n) { return n.spec().input_uint8; })
      .def_property_readonly("native_spec", [](const Net& n) { return n.spec(); },
                             "The core's NetSpec this net was built from (a copy).")
      .def_property_readonly("flops_per_sample", &Net::flops_per_sample)
      .def_property_readonly("activation_shapes",
                             [](const Net& n) { return shapes_list(n.activation_shapes()); })
      .def_property_readonly("outputs", &outputs_list)
      .def_property_readonly("param_info", &param_info_list)
      .def("workspace_stats", &workspace_stats)
      .def("forward", &forward, py::arg("params"), py::arg("obs"), py::arg("out") = py::none(),
           py::arg("release_gil") = py::none(), py::arg("check_finite") = false,
           py::kw_only(), py::arg("state") = py::none(), py::arg("resets") = py::none(),
           py::arg("pool") = py::none())
      .def("forward_train", &forward_train, py::arg("params"), py::arg("obs"),
           py::arg("out") = py::none(), py::arg("release_gil") = py::none(),
           py::arg("check_finite") = false, py::kw_only(), py::arg("state") = py::none(),
           py::arg("resets") = py::none(), py::arg("pool") = py::none())
      .def("backward", &backward, py::arg("tape"), py::arg("dout"), py::arg("grad") = py::none(),
           py::arg("accumulate") = false, py::arg("release_gil") = py::none(),
           py::arg("check_finite") = false, py::kw_only(), py::arg("pool") = py::none())
      .def("torso_parts",
           [](const Net& n, py::handle pool, int64_t batch) {
             return n.torso_parts(pool_arg(pool), batch);
           },
           py::arg("pool"), py::arg("batch"),
           "How many parts a call with `pool` splits `batch` torso rows into (1: none; also for "
           "pool=None).");

  m.def("amx_available", &rlpar::amx::available,
        "True when this CPU and OS run Intel AMX-BF16 tiles, which LSTM(matmul='bf16x3') needs "
        "(False while RLPAR_DISABLE_AMX is set or RLPAR_MAX_ISA is below avx512).");

  py::class_<rlpar::ThreadPool>(m, "ThreadPool",
                                "Worker threads for intra-op parallelism of one caller's net calls.")
      .def(py::init([](py::handle threads) {
             if (!py::isinstance<py::int_>(threads) || py::isinstance<py::bool_>(threads)) {
               throw py::type_error("threads: expected an integer, got " +
                                    std::string(py::str(py::type::of(threads).attr("__name__"))));
             }
             const py::int_ most(rlpar::ThreadPool::kMaxThreads);
             if (threads < py::int_(1) || threads > most) {
               throw py::value_error("threads: expected an integer from 1 to " +
                                     std::to_string(rlpar::ThreadPool::kMaxThreads) + ", got " +
                                     std::string(py::str(threads)));
             }
             const auto n = threads.cast<int64_t>();
             py::gil_scoped_release release;  // starting threads needs no Python
             return new rlpar::ThreadPool(n);
           }),
           py::arg("threads"))
      .def_property_readonly("threads", &rlpar::ThreadPool::threads);
}

}  // namespace rlpar_py
