// Binding of rlpar/ticket_queue.h: the GIL is kept for a push or pop that finds room or a
// ticket and wakes no one (a mutex taken and given back), and released (CallScope's blocking
// form, gil.h) to block on the queue or to wake a thread blocked on it. The wake-up is one
// futex call, but waking a thread whose vCPU went idle takes the hypervisor tens of us: on a
// 2-vCPU Intel Xeon the learner (which wakes actors waiting for free buffers) held the GIL 16.5 %
// of its time waking without it against 22 % with it (fused CartPole, 1 actor x 64 envs, 3 runs
// each). The price of letting go: in a loop of GIL-bound threads the waker may then wait for the
// GIL (two actors on gymnasium's CartPole beside an idle learner, `rlpar bench runtime`: 40 % of
// their time, at an unchanged env-step rate).
#include <pybind11/pybind11.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>

#include "bindings.h"
#include "gil.h"
#include "rlpar/ticket_queue.h"

namespace py = pybind11;

namespace rlpar_py {
namespace {

using rlpar::TicketQueue;

// None: no limit; else a number >= 0 (0: do not block).
double timeout_arg(py::handle timeout) {
  if (timeout.is_none()) return -1.0;
  const double t = timeout.cast<double>();
  if (!(t >= 0) || std::isinf(t)) {
    throw py::value_error("timeout: expected None or a finite number of seconds >= 0, got " +
                          py::repr(timeout).cast<std::string>());
  }
  return t;
}

bool put(TicketQueue& q, int64_t ticket, py::handle timeout) {
  const double t = timeout_arg(timeout);
  bool wake = false;
  if (q.try_push(ticket, wake)) {
    if (wake) {  // without the GIL: see the top of the file
      CallScope scope(true, false, true);
      q.wake_popper();
    }
    return true;
  }
  if (t == 0) return false;
  CallScope scope(true, false, true);
  // Once the interpreter is exiting the GIL is no longer released (gil.h): a wait would keep
  // it from the very thread that could make room, so it gives up at once.
  if (!scope.released()) return false;
  return q.push(ticket, t);
}

py::object get(TicketQueue& q, py::handle timeout) {
  const double t = timeout_arg(timeout);
  int64_t ticket = 0;
  bool wake = false;
  if (q.try_pop(ticket, wake)) {
    if (wake) {
      CallScope scope(true, false, true);
      q.wake_pusher();
    }
    return py::int_(ticket);
  }
  if (t == 0) return py::none();
  bool got;
  {
    CallScope scope(true, false, true);
    got = scope.released() && q.pop(ticket, t);  // as in put
  }
  return got ? py::object(py::int_(ticket)) : py::object(py::none());
}

}  // namespace

void bind_ticket_queue(py::module_& m) {
  py::class_<TicketQueue, std::shared_ptr<TicketQueue>>(
      m, "TicketQueue",
      "A FIFO of int tickets between threads (rlpar/ticket_queue.h) whose blocking waits and "
      "wake-ups run without the GIL; rlpar.runtime.handoff.HandOff carries Python objects "
      "through it. Once the interpreter exits, a wait gives up at once (as a timeout).")
      .def(py::init<int64_t>(), py::arg("maxsize") = 0,
           "At most maxsize tickets queued (0: no bound).")
      .def("put", &put, py::arg("ticket"), py::arg("timeout") = py::none(),
           "Append ticket, waiting at most timeout seconds for room (None: no limit, 0: do not "
           "wait). True if appended.")
      .def("get", &get, py::arg("timeout") = py::none(),
           "The oldest ticket, waiting at most timeout seconds for one (None: no limit, 0: do "
           "not wait); None on timeout.")
      .def("qsize", &TicketQueue::size, "Tickets queued now.")
      .def_property_readonly("maxsize", &TicketQueue::maxsize);
}

}  // namespace rlpar_py
