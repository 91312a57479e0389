// The one set of conversion helpers shared by every binding file: numpy arrays in, raw pointers
// out, and error messages that say what was expected and what came (TypeError for a wrong type or
// dtype, ValueError for a wrong shape or layout). Call them with the GIL held.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "gil.h"
#include "rlpar/net.h"
#include "snapshot_py.h"

namespace rlpar_py {

namespace py = pybind11;

// The Python type's name of `obj`, e.g. "list".
inline std::string type_name(py::handle obj) {
  return py::str(py::type::of(obj).attr("__name__")).cast<std::string>();
}

// An array's shape as Python writes a tuple: "(4,)", "(2, 3)".
inline std::string shape_str(const py::array& a) {
  return rlpar::shape_str(rlpar::Shape(a.shape(), a.shape() + a.ndim()));
}

inline std::string dims_str(const std::vector<py::ssize_t>& dims) {
  return rlpar::shape_str(rlpar::Shape(dims.begin(), dims.end()));
}

inline std::string dtype_str(const py::array& a) { return py::str(a.dtype()).cast<std::string>(); }

template <typename T>
std::string dtype_name() {
  return py::str(py::dtype::of<T>()).cast<std::string>();
}

// `obj` as an array: an ndarray as is, anything with the buffer protocol or __array__ through
// np.asarray; Python sequences only when `allow_sequence` (e.g. a list of actions). Else TypeError.
inline py::array as_array(py::handle obj, const char* what, bool allow_sequence = false) {
  if (py::isinstance<py::array>(obj)) return py::reinterpret_borrow<py::array>(obj);
  if (PyObject_CheckBuffer(obj.ptr()) || py::hasattr(obj, "__array__") ||
      (allow_sequence && py::isinstance<py::sequence>(obj))) {
    return py::module_::import("numpy").attr("asarray")(obj).cast<py::array>();
  }
  throw py::type_error(std::string(what) + " must be a numpy array, got " + type_name(obj));
}

inline py::array contiguous(const py::array& a) {
  if (a.flags() & py::array::c_style) return a;
  return py::module_::import("numpy").attr("ascontiguousarray")(a).cast<py::array>();
}

inline bool has_dims(const py::array& a, const std::vector<py::ssize_t>& dims) {
  bool ok = a.ndim() == static_cast<py::ssize_t>(dims.size());
  for (size_t i = 0; ok && i < dims.size(); ++i) ok = a.shape(i) == dims[i];
  return ok;
}

inline void require_dims(const py::array& a, const char* what,
                         const std::vector<py::ssize_t>& dims) {
  if (!has_dims(a, dims)) {
    throw py::value_error(std::string(what) + " must have shape " + dims_str(dims) + ", got " +
                          shape_str(a));
  }
}

// dtype T, else TypeError; `also_bool` accepts bool where uint8 is asked (same bytes).
template <typename T>
void require_dtype(const py::array& a, const char* what, bool also_bool = false) {
  if (same_dtype<T>(a) || (also_bool && std::is_same_v<T, uint8_t> && same_dtype<bool>(a))) return;
  throw py::type_error(std::string(what) + " must be " + dtype_name<T>() + ", got " +
                       dtype_str(a));
}

// An input array of dtype T with exactly `dims`, C-contiguous (copied when it was not).
template <typename T>
py::array input_array(py::handle obj, const char* what, const std::vector<py::ssize_t>& dims) {
  py::array a = as_array(obj, what, true);
  require_dtype<T>(a, what, true);
  require_dims(a, what, dims);
  return contiguous(a);
}

// An output array the caller owns: the caller's own ndarray of dtype T and exactly `dims`,
// C-contiguous and writable. A converted copy would die on return, with the writes.
template <typename T>
T* output_array(py::handle obj, const char* what, const std::vector<py::ssize_t>& dims) {
  if (!py::isinstance<py::array>(obj)) {
    throw py::type_error(std::string(what) + " must be a numpy array, got " + type_name(obj));
  }
  auto a = py::reinterpret_borrow<py::array>(obj);
  require_dtype<T>(a, what);
  require_dims(a, what, dims);
  if (!(a.flags() & py::array::c_style) || !a.writeable()) {
    throw py::value_error(std::string(what) + " must be a C-contiguous, writable array");
  }
  return static_cast<T*>(a.mutable_data());
}

inline void require_float32(const py::array& a, const char* what) {
  if (!same_dtype<float>(a)) {
    throw py::type_error(std::string(what) + " must be float32, got " + dtype_str(a) +
                         " (convert with .astype(np.float32))");
  }
}

// A flat, contiguous float32 vector of n values (n < 0: any length, stored back into n).
inline float* flat_f32(py::handle obj, int64_t& n, const char* what, bool writable) {
  py::array a = as_array(obj, what);
  require_float32(a, what);
  const std::string want = n < 0 ? std::string("a flat float32 vector")
                                 : "a flat float32 vector of " + std::to_string(n) + " values";
  if (a.ndim() != 1 || (n >= 0 && a.shape(0) != n)) {
    throw py::value_error(std::string(what) + " must be " + want + ", got shape " + shape_str(a));
  }
  if (!(a.flags() & py::array::c_style)) {
    throw py::value_error(std::string(what) + " must be contiguous (a view with strides was given)");
  }
  if (writable && !a.writeable()) throw py::value_error(std::string(what) + " must be writable");
  n = a.shape(0);
  // The array is the caller's (borrowed) or a view on a buffer the caller owns.
  return const_cast<float*>(static_cast<const float*>(a.data()));
}

inline float* writable_flat(py::handle obj, int64_t n, const char* what) {
  return flat_f32(obj, n, what, true);
}

inline const float* readonly_flat(py::handle obj, int64_t n, const char* what) {
  return flat_f32(obj, n, what, false);
}

// A call's parameters: a pinned Snapshot (its version is the call's) or a flat, contiguous
// float32 array of net.num_params() values (version 0). The one check of that argument for every
// binding; the ref keeps what `data` points into alive for as long as it lives.
struct ParamsRef {
  const float* data = nullptr;
  uint64_t version = 0;
  std::shared_ptr<SharedPin> pin;  // keeps the snapshot pinned
  py::array array;                 // or keeps the parameter array alive

  // What the net's per-snapshot caches key on (Net::core_weights): the snapshot's store, or
  // null for an array (nothing to share it with).
  std::shared_ptr<const void> owner() const { return pin ? pin->store : nullptr; }
};

inline ParamsRef params_ref(const rlpar::Net& net, py::handle obj) {
  ParamsRef p;
  if (py::isinstance<PySnapshot>(obj)) {
    p.pin = obj.cast<const PySnapshot&>().pin;
    if (!p.pin) throw py::value_error("params: this snapshot was released");
    if (static_cast<int64_t>(p.pin->pin.size()) != net.num_params()) {
      throw py::value_error("params: the snapshot holds " + std::to_string(p.pin->pin.size()) +
                            " values, the net expects " + std::to_string(net.num_params()));
    }
    p.data = p.pin->pin.data();
    p.version = p.pin->pin.version();
    return p;
  }
  if (!py::isinstance<py::array>(obj) && !PyObject_CheckBuffer(obj.ptr())) {
    throw py::type_error("params must be a Snapshot or a float32 array, got " + type_name(obj));
  }
  p.array = as_array(obj, "params");
  if (!same_dtype<float>(p.array)) {
    throw py::type_error("params must be a Snapshot or a float32 array, got dtype " +
                         dtype_str(p.array) + " (convert with .astype(np.float32))");
  }
  p.data = readonly_flat(p.array, net.num_params(), "params");
  return p;
}

}  // namespace rlpar_py
