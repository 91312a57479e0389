// Bindings of rlpar::SnapshotStore: conversion and GIL handling only.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <string>

#include "gil.h"
#include "rlpar/internal/bench_snapshot.h"
#include "snapshot_py.h"

namespace py = pybind11;

namespace rlpar_py {
namespace {

py::array_t<float> snapshot_view(const PySnapshot& s) {
  if (!s.pin) throw py::value_error("this snapshot was released");
  auto* keep = new std::shared_ptr<SharedPin>(s.pin);
  py::capsule owner(keep, [](void* p) { delete static_cast<std::shared_ptr<SharedPin>*>(p); });
  const rlpar::Pin& pin = s.pin->pin;
  py::array_t<float> a({static_cast<py::ssize_t>(pin.size())}, {sizeof(float)}, pin.data(), owner);
  py::detail::array_proxy(a.ptr())->flags &= ~py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
  return a;
}

}  // namespace

void bind_snapshot(py::module_& m) {
  py::class_<PySnapshot>(m, "Snapshot",
                         "A pinned, immutable parameter snapshot. Pass it as `params` to "
                         "Net.forward, or read `params` (a zero-copy read-only float32 view).")
      .def_property_readonly("version", [](const PySnapshot& s) {
        if (!s.pin) throw py::value_error("this snapshot was released");
        return s.pin->pin.version();
      })
      .def_property_readonly("params", &snapshot_view)
      .def_property_readonly("size", [](const PySnapshot& s) { return s.pin ? s.pin->pin.size() : 0; })
      .def("release", [](PySnapshot& s) { s.pin.reset(); },
           "Drop this object's pin (views handed out keep theirs until they are collected).")
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](PySnapshot& s, py::args) { s.pin.reset(); })
      .def("__array__", [](const PySnapshot& s, py::args, py::kwargs) { return snapshot_view(s); });

  py::class_<PyStore>(m, "SnapshotStore",
                      "Lock-free versioned parameter snapshots: one writer, many readers.")
      .def(py::init([](int64_t size, int num_slots) {
             if (size <= 0) throw py::value_error("size must be >= 1, got " + std::to_string(size));
             return PyStore{std::make_shared<rlpar::SnapshotStore>(static_cast<size_t>(size), num_slots)};
           }),
           py::arg("size"), py::arg("num_slots") = rlpar::SnapshotStore::kDefaultSlots)
      .def_property_readonly("size", [](const PyStore& s) { return s.store->size(); })
      .def_property_readonly("num_slots", [](const PyStore& s) { return s.store->num_slots(); })
      .def_property_readonly("latest_version", [](const PyStore& s) { return s.store->latest_version(); })
      .def_property_readonly("publishes", [](const PyStore& s) { return s.store->publishes(); })
      .def_property_readonly("skipped", [](const PyStore& s) { return s.store->skipped(); })
      .def("pin", [](const PyStore& s) {
        return PySnapshot{std::make_shared<SharedPin>(SharedPin{s.store, s.store->pin()})};
      })
      .def("publish",
           [](PyStore& s, py::handle params, py::object version, py::object release_gil) {
             auto a = py::array::ensure(params);
             if (!a || !rlpar_py::same_dtype<float>(a)) {
               throw py::type_error("params must be a float32 numpy array");
             }
             if (a.ndim() != 1 || static_cast<size_t>(a.shape(0)) != s.store->size() ||
                 !(a.flags() & py::array::c_style)) {
               throw py::value_error("params must be a contiguous flat float32 vector of " +
                                     std::to_string(s.store->size()) + " values");
             }
             const auto* src = static_cast<const float*>(a.data());
             const size_t n = s.store->size();
             const bool explicit_version = !version.is_none();
             const uint64_t v = explicit_version ? version.cast<uint64_t>() : 0;
             if (explicit_version && v <= s.store->latest_version()) {
               throw py::value_error("version must be > latest_version (" +
                                     std::to_string(s.store->latest_version()) + "), got " +
                                     std::to_string(v));
             }
             const bool release = want_release(release_gil, static_cast<double>(n));
             CallScope scope(release, false);
             return explicit_version ? s.store->publish(src, n, v) : s.store->publish(src, n);
           },
           py::arg("params"), py::arg("version") = py::none(), py::arg("release_gil") = py::none(),
           "Copy params into a free slot and make it the latest version. Returns False (and "
           "counts a skip) when every spare slot is pinned; never waits.");

  m.def("bench_snapshot",
        [](int64_t n_floats, int iters, int repeats) {
          rlpar::SnapshotBench b;
          {
            CallScope scope(true, false);
            b = rlpar::bench_snapshot(static_cast<size_t>(n_floats), iters, repeats);
          }
          py::dict d;
          d["pin_unpin_ns"] = b.pin_unpin_ns;
          d["publish_us_per_mb"] = b.publish_us_per_mb;
          d["memcpy_us_per_mb"] = b.memcpy_us_per_mb;
          return d;
        },
        py::arg("n_floats") = 262144, py::arg("iters") = 1000000, py::arg("repeats") = 5);

  m.def("bench_snapshot_readers",
        [](int64_t n_floats, int readers, double seconds) {
          if (n_floats <= 0) {
            throw py::value_error("bench_snapshot_readers: expected n_floats > 0, got " +
                                  std::to_string(n_floats));
          }
          rlpar::SnapshotReadersBench b;
          {
            CallScope scope(true, false);
            b = rlpar::bench_snapshot_readers(static_cast<size_t>(n_floats), readers, seconds);
          }
          py::dict d;
          d["pins_per_s"] = b.pins_per_s;
          d["publishes_per_s"] = b.publishes_per_s;
          d["skipped_fraction"] = b.skipped_fraction;
          return d;
        },
        py::arg("n_floats"), py::arg("readers"), py::arg("seconds"),
        "`readers` native threads pin + unpin in a loop for `seconds` while one thread "
        "publishes: total pins/s, publishes/s and the fraction of publishes skipped.");
}

}  // namespace rlpar_py
