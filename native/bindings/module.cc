// rlpar._native — thin bindings: convert arguments, check them, decide about the GIL, call the core.
//
// GIL rules kept in every binding file (see docs/design.md, "The GIL policy"):
//  * Every py::array/py::object is inspected while the GIL is held; only raw pointers and sizes
//    cross into a GIL-released region.
//  * The GIL is released with RAII (CallScope, gil.h), never with hand-written pairs, and only when
//    the call's work is above a measured threshold (release_gil=None), or when asked (True/False).
//  * Python layers re-take the GIL with PythonScope (gil.h) around their own call only; the GIL
//    meter counts that time as held, not native.
//  * At interpreter exit an atexit hook stops releasing the GIL and waits for the calls that could
//    let other threads run to finish (CallScope), so no thread is ever inside native code when
//    the interpreter finalizes.
// Conversion helpers live in convert.h; each binding file binds one core header.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdlib>
#include <string>

#include "bindings.h"
#include "envs_py.h"
#include "gil.h"
#include "snapshot_py.h"

namespace py = pybind11;

namespace {

void bind_gil_policy(py::module_& m) {
  m.def(
      "set_gil_release_threshold",
      [](double flops) {
        if (!(flops >= 0)) {
          throw py::value_error("threshold must be >= 0 flops, got " + std::to_string(flops));
        }
        rlpar_py::g_release_threshold.store(flops);
      },
      py::arg("flops"));
  m.def("gil_release_threshold", [] { return rlpar_py::g_release_threshold.load(); });
  m.def("_stop_releasing_gil", &rlpar_py::stop_releasing_gil, py::arg("timeout_s") = 5.0);
  m.def(
      "gil_meter",
      [] {
        const rlpar_py::GilMeter& meter = rlpar_py::thread_gil_meter();
        return py::make_tuple(meter.released_ns * 1e-9, meter.wait_ns * 1e-9, meter.calls,
                              meter.released_cpu_ns * 1e-9);
      },
      "The calling thread's GIL meter since it started: (seconds rlpar's calls ran with the GIL "
      "released, seconds they then waited to take it back, number of such calls, the thread's "
      "CPU seconds inside those calls).");
}

}  // namespace

PYBIND11_MODULE(_native, m) {
  m.doc() = "rlpar native core: shared nets, optimizers and snapshots (GIL released for work)";
  // A bad RLPAR_MAX_ISA fails the import with its message, before any kernel runs.
  rlpar_py::check_isa_setting();
  bind_gil_policy(m);
  rlpar_py::bind_net(m);
  rlpar_py::bind_optim(m);
  // pybind11 looks numpy's C API up lazily and releases the GIL while doing so the first time.
  // Do it now, at import: a thread whose first call parked there at interpreter exit would be
  // unwound through a noexcept destructor (std::terminate).
  (void)py::dtype::of<float>();
  rlpar_py::bind_snapshot(m);
  rlpar_py::bind_ticket_queue(m);  // before bind_envs: FusedActorLoop takes its queues
  rlpar_py::bind_envs(m);
  rlpar_py::bind_losses(m);
  rlpar_py::bind_train_step(m);
  rlpar_py::bind_step_loop(m);
  rlpar_py::bind_gil_calibration(m);
  rlpar_py::bind_isa(m);
  // Before any call decides about the GIL: hand-off cost x kernel speed (gil_calibration.cc).
  rlpar_py::calibrate_release_threshold();
  py::module_::import("atexit").attr("register")(m.attr("_stop_releasing_gil"));
}
