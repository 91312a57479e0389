// Bindings of rlpar::optim (flat-buffer optimizers, gradient norms): conversion and the GIL only;
// the core checks the hyper-parameters' domain (std::invalid_argument -> ValueError).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>

#include "bindings.h"
#include "convert.h"
#include "gil.h"
#include "rlpar/optim.h"

namespace py = pybind11;

namespace rlpar_py {
namespace {

float* optional_state(py::object a, int64_t n, const char* what) {
  if (a.is_none()) return nullptr;
  return writable_flat(as_array(a, what), n, what);
}

bool release_for_elements(py::handle release_gil, int64_t n) {
  return want_release(release_gil, 8.0 * static_cast<double>(n));
}

void sgd_step(py::handle params, py::handle grad, py::object buf, float lr, float momentum,
              float weight_decay, bool nesterov, py::object release_gil) {
  int64_t n = -1;
  float* p = flat_f32(params, n, "params", true);
  const float* g = readonly_flat(grad, n, "grad");
  float* b = optional_state(buf, n, "momentum_buffer");
  const bool release = release_for_elements(release_gil, n);
  CallScope scope(release, false);
  rlpar::optim::sgd_step(p, g, b, n, lr, momentum, weight_decay, nesterov);
}

void rmsprop_step(py::handle params, py::handle grad, py::handle square_avg, py::object grad_avg,
                  py::object buf, float lr, float alpha, float eps, float momentum,
                  float weight_decay, py::object release_gil) {
  int64_t n = -1;
  float* p = flat_f32(params, n, "params", true);
  const float* g = readonly_flat(grad, n, "grad");
  float* sq = writable_flat(square_avg, n, "square_avg");
  float* ga = optional_state(grad_avg, n, "grad_avg");
  float* b = optional_state(buf, n, "momentum_buffer");
  const bool release = release_for_elements(release_gil, n);
  CallScope scope(release, false);
  rlpar::optim::rmsprop_step(p, g, sq, ga, b, n, lr, alpha, eps, momentum, weight_decay);
}

void adam_step(py::handle params, py::handle grad, py::handle m1, py::handle m2, int64_t step,
               float lr, float beta1, float beta2, float eps, float weight_decay,
               py::object release_gil) {
  int64_t n = -1;
  float* p = flat_f32(params, n, "params", true);
  const float* g = readonly_flat(grad, n, "grad");
  float* a = writable_flat(m1, n, "exp_avg");
  float* b = writable_flat(m2, n, "exp_avg_sq");
  const bool release = release_for_elements(release_gil, n);
  CallScope scope(release, false);
  rlpar::optim::adam_step(p, g, a, b, n, step, lr, beta1, beta2, eps, weight_decay);
}

double global_norm(py::handle grad) {
  int64_t n = -1;
  const float* g = flat_f32(grad, n, "grad", false);
  const bool release = release_for_elements(py::none(), n);
  CallScope scope(release, false);
  return rlpar::optim::global_norm(g, static_cast<size_t>(n));
}

double clip_by_global_norm(py::handle grad, double max_norm) {
  int64_t n = -1;
  float* g = flat_f32(grad, n, "grad", true);
  const bool release = release_for_elements(py::none(), n);
  CallScope scope(release, false);
  return rlpar::optim::clip_by_global_norm(g, static_cast<size_t>(n), max_norm);
}

}  // namespace

void bind_optim(py::module_& m) {
  m.def("sgd_step", &sgd_step, py::arg("params"), py::arg("grad"), py::arg("momentum_buffer"),
        py::arg("lr"), py::arg("momentum"), py::arg("weight_decay"), py::arg("nesterov"),
        py::arg("release_gil") = py::none());
  m.def("rmsprop_step", &rmsprop_step, py::arg("params"), py::arg("grad"),
        py::arg("square_avg"), py::arg("grad_avg"), py::arg("momentum_buffer"), py::arg("lr"),
        py::arg("alpha"), py::arg("eps"), py::arg("momentum"), py::arg("weight_decay"),
        py::arg("release_gil") = py::none());
  m.def("adam_step", &adam_step, py::arg("params"), py::arg("grad"), py::arg("exp_avg"),
        py::arg("exp_avg_sq"), py::arg("step"), py::arg("lr"), py::arg("beta1"), py::arg("beta2"),
        py::arg("eps"), py::arg("weight_decay"), py::arg("release_gil") = py::none());
  m.def("global_norm", &global_norm, py::arg("grad"));
  m.def("clip_by_global_norm", &clip_by_global_norm, py::arg("grad"), py::arg("max_norm"));
}

}  // namespace rlpar_py
