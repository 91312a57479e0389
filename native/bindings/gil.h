// GIL policy shared by the binding files: when a call releases the GIL, and how the interpreter's
// exit waits for calls that could let other threads run.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <ctime>
#include <optional>
#include <stdexcept>
#include <thread>
#include <type_traits>

namespace rlpar_py {

namespace py = pybind11;

// ---------------------------------------------------------------------------------------------
// GIL policy

// Work (floating point operations) above which a call releases the GIL when release_gil=None.
// Set when the module is imported from what a hand-off of the GIL costs on this machine and the
// kernels' speed (gil_calibration.cc); 70 kflop until then, the crossover `rlpar bench gil`
// measured on a 2-vCPU AMD EPYC (the small MLP at batch 8).
inline std::atomic<double> g_release_threshold{70000.0};
inline std::atomic<bool> g_closing{false};
inline std::atomic<int64_t> g_released_calls{0};

// Call it in its own statement, before CallScope: a temporary py::object in the full-expression
// that constructs a CallScope is destroyed at its end, after the GIL was released.
inline bool want_release(py::handle release_gil, double flops) {
  if (release_gil.is_none()) return flops >= g_release_threshold.load(std::memory_order_relaxed);
  try {
    return release_gil.cast<bool>();
  } catch (const py::cast_error&) {
    throw py::type_error("release_gil must be True, False or None, got " +
                         py::str(py::type::of(release_gil).attr("__name__")).cast<std::string>());
  }
}

// ---------------------------------------------------------------------------------------------
// GIL meter: per thread, the time rlpar's calls ran with the GIL released (native work), the
// thread's CPU time in them, and the time they then waited to take the GIL back (a convoy shows
// up here). Only the thread itself reads its meter (gil_meter() in Python), so plain
// thread-local integers suffice.
//
// The CPU time is what tells the GIL-held time apart: a thread's CPU time outside released calls
// is the time it ran holding the GIL. Subtracting the calls' wall time instead reads too little
// whenever a call is off the CPU (blocked on its thread pool's workers with learner_threads > 1,
// or preempted on a machine with more busy threads than cores): the learner read 0 % held.
// Reading the thread's CPU clock is a system call (the two reads added 0.7-0.9 us to a released
// call on a 2-vCPU Intel Xeon), too much for the shortest released calls (a few us), so a call
// reads it only when the thread's previous released call took longer than kCpuClockAfterNs,
// where it costs under 1 %; a shorter call counts its wall time as CPU time, as a call that
// short is rarely off the CPU.
inline constexpr int64_t kCpuClockAfterNs = 100000;

struct GilMeter {
  int64_t released_ns = 0;      // from the release to the request to re-take the GIL
  int64_t released_cpu_ns = 0;  // the thread's CPU time over the same spans (see above), and
                                // in blocking scopes (a queue's waits: see CallScope)
  int64_t wait_ns = 0;          // inside the re-take: another thread held the GIL
  int64_t calls = 0;            // calls that released the GIL
  bool last_was_long = false;   // the previous released call took over kCpuClockAfterNs
  bool call_reads_cpu = false;  // the released call in progress read the CPU clock at its start
};

inline GilMeter& thread_gil_meter() {
  thread_local GilMeter meter;
  return meter;
}

inline int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// The calling thread's CPU time (what Python's time.thread_time reads).
inline int64_t thread_cpu_ns() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

// The scope of one native call that may let other Python threads run while it is inside native
// code: it releases the GIL (when asked), or it calls a Python layer (whose bytecode hands the GIL
// around). Such calls are counted, so that the exit hook can wait for them: once the interpreter
// finalizes, a thread that takes the GIL back is terminated by unwinding, which must never run
// through our frames. The counter is raised before the flag is read (both sequentially
// consistent), so the exit hook either sees this call in flight or this call sees the flag.
// After the hook, calls keep the GIL, and calls that would run Python layers raise.
// Construct it in a statement of its own that creates no Python temporaries (see want_release).
//
// A scope made with `blocking` (a queue's wait, a wake-up: TicketQueue) releases the GIL to wait
// rather than to work: its CPU time (the kernel's, blocking and waking) counts as spent outside
// the GIL, like a native call's, but its wall time is not native work, so it adds to neither
// released_ns nor the long-call rule; the re-take's wait counts as for any call.
class CallScope {
 public:
  CallScope(bool release, bool runs_python, bool blocking = false) : blocking_(blocking) {
    if (!release && !runs_python) return;
    g_released_calls.fetch_add(1);
    if (g_closing.load()) {
      g_released_calls.fetch_sub(1);
      if (runs_python) {
        throw std::runtime_error("the interpreter is shutting down: nets with Python layers no longer run");
      }
      return;
    }
    counted_ = true;
    if (release) {
      released_.emplace();
      released_at_ = now_ns();
      // A call that runs Python layers reads the clock: their CPU time is told apart from the
      // call's (PythonScope), and such a call is long anyway.
      GilMeter& meter = thread_gil_meter();
      if (blocking || runs_python || meter.last_was_long) released_cpu_at_ = thread_cpu_ns();
      meter.call_reads_cpu = released_cpu_at_ >= 0;
    }
  }
  ~CallScope() {
    if (released_) {
      GilMeter& meter = thread_gil_meter();
      const int64_t cpu = released_cpu_at_ >= 0 ? thread_cpu_ns() - released_cpu_at_ : -1;
      const int64_t done = now_ns();
      released_.reset();  // re-takes the GIL
      const int64_t wall = done - released_at_;
      meter.released_cpu_ns += cpu >= 0 ? cpu : wall;
      if (!blocking_) {
        meter.released_ns += wall;
        meter.last_was_long = wall > kCpuClockAfterNs;
      }
      meter.wait_ns += now_ns() - done;
      meter.calls += 1;
    }
    if (counted_) g_released_calls.fetch_sub(1);
  }
  bool released() const { return released_.has_value(); }  // false once the exit hook ran
  CallScope(const CallScope&) = delete;
  CallScope& operator=(const CallScope&) = delete;

 private:
  bool counted_ = false;
  bool blocking_ = false;
  int64_t released_at_ = 0;
  int64_t released_cpu_at_ = -1;  // -1: the CPU clock was not read for this call
  std::optional<py::gil_scoped_release> released_;
};

// The scope of Python code that a native call runs (a Python layer's forward or backward): it
// takes the GIL for its own duration only (RAII). Inside a call that released the GIL, that
// time is not native work: its wall time comes off the thread's released time and its CPU time
// off the released CPU time (the enclosing CallScope then adds the whole call's), so the meter
// counts it as held, and the time spent waiting to take the GIL counts as wait. Inside a call
// that kept the GIL it is held time already, and nothing is adjusted.
class PythonScope {
 public:
  PythonScope() : inside_release_(PyGILState_Check() == 0) {
    if (inside_release_) {
      // A call that did not read the CPU clock counts its wall time as CPU time: so then
      // does its Python part.
      by_wall_ = !thread_gil_meter().call_reads_cpu;
      start_ns_ = now_ns();
      start_cpu_ns_ = by_wall_ ? 0 : thread_cpu_ns();
    }
    gil_.emplace();
    if (inside_release_) acquired_ns_ = now_ns();
  }
  ~PythonScope() {
    gil_.reset();  // lets go of the GIL before the clocks are read
    if (!inside_release_) return;
    GilMeter& meter = thread_gil_meter();
    const int64_t wall = now_ns() - start_ns_;
    meter.released_ns -= wall;
    meter.released_cpu_ns -= by_wall_ ? wall : thread_cpu_ns() - start_cpu_ns_;
    meter.wait_ns += acquired_ns_ - start_ns_;
  }
  PythonScope(const PythonScope&) = delete;
  PythonScope& operator=(const PythonScope&) = delete;

 private:
  bool inside_release_;
  bool by_wall_ = false;
  int64_t start_ns_ = 0, start_cpu_ns_ = 0, acquired_ns_ = 0;
  std::optional<py::gil_scoped_acquire> gil_;
};

inline void stop_releasing_gil(double timeout_s) {
  g_closing.store(true);
  py::gil_scoped_release release;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (g_released_calls.load() > 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

// numpy dtype check by type number: dtype objects are not unique (one that went through pickle
// is equal to, but not the same object as, np.dtype("float32")), so identity is wrong, and
// building dtype objects per call is slow.
template <typename T>
bool same_dtype(const py::array& a) {
  // By kind and size: type numbers are ambiguous too (int64 is NPY_LONG or NPY_LONGLONG).
  constexpr char kind = std::is_same_v<T, bool>          ? 'b'
                        : std::is_floating_point_v<T>    ? 'f'
                        : std::is_signed_v<T>            ? 'i'
                                                         : 'u';
  const auto* d = py::detail::array_descriptor_proxy(py::detail::array_proxy(a.ptr())->descr);
  return d->kind == kind && a.itemsize() == static_cast<py::ssize_t>(sizeof(T)) &&
         d->byteorder != '>';
}

}  // namespace rlpar_py
