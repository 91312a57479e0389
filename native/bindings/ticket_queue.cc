// Binding of rlpar/ticket_queue.h: the GIL is kept for a push or pop that finds room or a
// ticket and wakes no one (a mutex taken and given back), and released (CallScope's blocking
// form, gil.h) to block on the queue or to wake a thread blocked on it. The wake-up is one
// futex call, but waking a thread whose vCPU went idle takes the hypervisor tens of us: on a
// 2-vCPU Intel Xeon the learner (which wakes actors waiting for free buffers) held the GIL 16.5 %
// of its time waking without it against 22 % with it (fused CartPole, 1 actor x 64 envs, 3 runs
// each). The price of letting go: in a loop of GIL-bound threads the waker may then wait for the
// GIL (two actors on gymnasium's CartPole beside an idle learner, `rlpar bench runtime`: 40 % of
// their time, at an unchanged env-step rate).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "bindings.h"
#include "convert.h"
#include "gil.h"
#include "inbox_py.h"
#include "rlpar/inbox.h"
#include "rlpar/one_call.h"
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

// Marks an object in use by one thread for a scope; a second thread gets a RuntimeError.
class Busy : public rlpar::OneCall {
 public:
  Busy(std::atomic<bool>& flag, const char* what)
      : OneCall(flag, [what] {
          return std::logic_error(std::string("RolloutInbox.") + what +
                                  ": another thread is using this inbox (one thread at a time)");
        }) {}
};

// rlpar::RolloutInbox over a HandOff's queue: every registered buffer's arrays are checked
// against the first one's layout and kept alive here; take() waits for tickets without the GIL
// and copies each rollout with it released or kept (release_gil).
class PyInbox {
 public:
  PyInbox(std::shared_ptr<TicketQueue> inbox, const py::sequence& layout,
          const std::vector<int64_t>& env_axis)
      : inbox_(std::move(inbox)) {
    if (!inbox_) throw py::type_error("RolloutInbox: inbox must be a TicketQueue");
    if (layout.size() < 1 || layout.size() != env_axis.size()) {
      throw py::value_error("RolloutInbox: expected a buffer's arrays and one env axis each, got " +
                            std::to_string(layout.size()) + " and " +
                            std::to_string(env_axis.size()));
    }
    std::vector<int64_t> rows, row_bytes;
    for (size_t f = 0; f < layout.size(); ++f) {
      const std::string what = "layout[" + std::to_string(f) + "]";
      py::array a = as_array(layout[f], what.c_str());
      const int64_t axis = env_axis[f];
      if ((axis != 0 && axis != 1) || a.ndim() <= axis) {
        throw py::value_error(what + ": env axis must be 0 or 1 and within its " +
                              std::to_string(a.ndim()) + " dims, got " + std::to_string(axis));
      }
      dtypes_.push_back(a.dtype());
      shapes_.emplace_back(a.shape(), a.shape() + a.ndim());
      axes_.push_back(axis);
      rows.push_back(axis == 0 ? 1 : a.shape(0));
      row_bytes.push_back(axis == 0 ? a.nbytes() : a.nbytes() / std::max<py::ssize_t>(a.shape(0), 1));
    }
    core_ = std::make_unique<rlpar::RolloutInbox>(*inbox_, rows, row_bytes);
  }

  void add(int64_t ticket, const py::sequence& arrays, std::shared_ptr<TicketQueue> free,
           int64_t free_ticket, py::handle stamp) {
    if (!free) throw py::type_error("RolloutInbox.add: free must be a TicketQueue");
    if (ticket < 0 || free_ticket < 0) {
      throw py::value_error("RolloutInbox.add: ticket and free_ticket must be >= 0, got " +
                            std::to_string(ticket) + " and " + std::to_string(free_ticket));
    }
    const Busy busy(busy_, "add");
    if (arrays.size() != shapes_.size()) {
      throw py::value_error("RolloutInbox.add: expected " + std::to_string(shapes_.size()) +
                            " arrays, got " + std::to_string(arrays.size()));
    }
    rlpar::InboxEntry e;
    for (size_t f = 0; f < shapes_.size(); ++f) {
      e.fields.push_back(checked(arrays[f], f, "arrays", 1));
    }
    e.free = free.get();
    e.free_ticket = free_ticket;
    e.stamp = output_array<int64_t>(keep(stamp), "stamp", {2});
    core_->add(ticket, std::move(e));
    frees_.push_back(std::move(free));
  }

  py::tuple take(const py::sequence& dst, py::handle versions, int64_t start,
                 int64_t learner_version, py::object max_lag, py::handle timeout,
                 py::handle release_gil) {
    const int64_t count = versions_count(versions);
    int64_t* v = output_array<int64_t>(versions, "versions", {count});
    if (dst.size() != shapes_.size()) {
      throw py::value_error("take: expected " + std::to_string(shapes_.size()) +
                            " batch arrays, got " + std::to_string(dst.size()));
    }
    std::vector<void*> out;
    for (size_t f = 0; f < shapes_.size(); ++f) {
      out.push_back(const_cast<void*>(checked(dst[f], f, "dst", count, true)));
    }
    if (start < 0 || start > count) {
      throw py::value_error("take: start must be in [0, " + std::to_string(count) + "], got " +
                            std::to_string(start));
    }
    const int64_t lag = max_lag.is_none() ? -1 : max_lag.cast<int64_t>();
    if (lag < 0 && !max_lag.is_none()) {
      throw py::value_error("take: max_lag must be None or >= 0, got " + std::to_string(lag));
    }
    const Busy busy(busy_, "take");
    const double wait = timeout_arg(timeout);
    const bool release = !release_gil.is_none() && release_gil.cast<bool>();
    using Clock = std::chrono::steady_clock;
    const auto begin = Clock::now();
    int64_t filled = start, dropped = 0;
    while (filled < count) {
      int64_t ticket = 0;
      bool wake = false;
      bool got = inbox_->try_pop(ticket, wake);
      if (got && wake) {
        CallScope scope(true, false, true);
        inbox_->wake_pusher();
      }
      if (!got) {
        double left = -1;
        if (wait >= 0) {
          left = std::max(0.0, wait - std::chrono::duration<double>(Clock::now() - begin).count());
          if (left == 0) break;
        }
        CallScope scope(true, false, true);
        got = scope.released() && inbox_->pop(ticket, left);
      }
      if (!got) break;
      rlpar::RolloutInbox::Accepted a;
      {
        CallScope scope(release, false);
        a = core_->accept(ticket, out, v, filled, count, learner_version, lag);
        if (release && a.wake != nullptr) {
          a.wake->wake_popper();
          a.wake = nullptr;
        }
      }
      if (a.wake != nullptr) {  // without the GIL: see the top of the file
        CallScope scope(true, false, true);
        a.wake->wake_popper();
      }
      a.kept ? ++filled : ++dropped;
    }
    return py::make_tuple(filled, dropped);
  }

  // learn_loop's access (inbox_py.h): the batch arrays checked as take() checks them, and the
  // inbox held for this thread for as long as the access lives.
  InboxAccess access(const py::sequence& dst, py::handle versions) {
    InboxAccess a;
    a.count = versions_count(versions);
    a.versions = output_array<int64_t>(versions, "versions", {a.count});
    if (dst.size() != shapes_.size()) {
      throw py::value_error("dst: expected " + std::to_string(shapes_.size()) +
                            " batch arrays, got " + std::to_string(dst.size()));
    }
    for (size_t f = 0; f < shapes_.size(); ++f) {
      a.dst.push_back(const_cast<void*>(checked(dst[f], f, "dst", a.count, true)));
    }
    auto busy = std::make_shared<Busy>(busy_, "learn_loop");
    a.hold = busy;
    a.core = core_.get();
    return a;
  }

 private:
  static int64_t versions_count(py::handle versions) {
    if (!py::isinstance<py::array>(versions)) {
      throw py::type_error("versions must be a numpy array, got " + type_name(versions));
    }
    const auto a = py::reinterpret_borrow<py::array>(versions);
    if (a.ndim() != 1 || a.shape(0) < 1) {
      throw py::value_error("versions must have shape (B,) with B >= 1, got " + shape_str(a));
    }
    return a.shape(0);
  }

  py::handle keep(py::handle obj) {
    kept_.push_back(py::reinterpret_borrow<py::object>(obj));
    return obj;
  }

  // Field f of a buffer (times = 1) or of a batch of `times` buffers: the layout's dtype and
  // shape (the env axis `times` as long), C-contiguous (and writable for a batch).
  const void* checked(py::handle obj, size_t f, const char* what, int64_t times,
                      bool writable = false) {
    const std::string name = std::string(what) + "[" + std::to_string(f) + "]";
    if (!py::isinstance<py::array>(obj)) {
      throw py::type_error(name + " must be a numpy array, got " + type_name(obj));
    }
    const auto a = py::reinterpret_borrow<py::array>(obj);
    if (!a.dtype().is(dtypes_[f]) && !a.dtype().equal(dtypes_[f])) {
      throw py::type_error(name + " must be " + py::str(dtypes_[f]).cast<std::string>() +
                           ", got " + dtype_str(a));
    }
    std::vector<py::ssize_t> want = shapes_[f];
    want[static_cast<size_t>(axes_[f])] *= times;
    require_dims(a, name.c_str(), want);
    if (!(a.flags() & py::array::c_style) || (writable && !a.writeable())) {
      throw py::value_error(name + " must be a C-contiguous" + (writable ? ", writable" : "") +
                            " array");
    }
    if (!writable) keep(obj);
    return a.data();
  }

  std::shared_ptr<TicketQueue> inbox_;
  std::vector<py::dtype> dtypes_;
  std::vector<std::vector<py::ssize_t>> shapes_;
  std::vector<int64_t> axes_;
  std::unique_ptr<rlpar::RolloutInbox> core_;
  std::vector<std::shared_ptr<TicketQueue>> frees_;
  std::vector<py::object> kept_;
  std::atomic<bool> busy_{false};  // add and take: one thread at a time
};

}  // namespace

InboxAccess inbox_access(py::handle inbox, const py::sequence& dst, py::handle versions) {
  if (!py::isinstance<PyInbox>(inbox)) {
    throw py::type_error("inbox must be an rlpar._native.RolloutInbox, got " + type_name(inbox));
  }
  return inbox.cast<PyInbox&>().access(dst, versions);
}

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

  py::class_<PyInbox>(
      m, "RolloutInbox",
      "The learner's take of a batch from the rollout inbox (rlpar/inbox.h): tickets popped "
      "from `inbox` (waiting without the GIL), each named buffer copied side by side into the "
      "batch arrays and handed back to its actor's free queue, with no Python per rollout. "
      "Register every buffer (add) before the first take; one thread takes.")
      .def(py::init<std::shared_ptr<TicketQueue>, const py::sequence&, const std::vector<int64_t>&>(),
           py::arg("inbox"), py::arg("layout"), py::arg("env_axis"),
           "layout: one buffer's arrays (the rollout fields, in order); env_axis: the axis each "
           "is concatenated along in a batch (1 for [T, K, ...], 0 for a [K, S] core state).")
      .def("add", &PyInbox::add, py::arg("ticket"), py::arg("arrays"), py::arg("free"),
           py::arg("free_ticket"), py::arg("stamp"),
           "Register the buffer `ticket` names on the inbox: its arrays (the layout's dtypes and "
           "shapes), the actor's free TicketQueue and its ticket there, and its stamp int64 [2] "
           "(stamp[0]: the version it was acted with).")
      .def("take", &PyInbox::take, py::arg("dst"), py::arg("versions"), py::arg("start"),
           py::arg("learner_version"), py::arg("max_lag") = py::none(),
           py::arg("timeout") = py::none(), py::arg("release_gil") = py::none(),
           "Fill column blocks start .. B - 1 of the batch arrays `dst` (the layout's shapes "
           "with B times the env axis) and versions int64 [B] from the rollouts queued, waiting "
           "at most `timeout` seconds in all (None: no limit); a rollout more than max_lag "
           "versions behind learner_version is handed back unused. The copies run with the GIL "
           "released when release_gil is True (kept otherwise). Returns (columns filled, "
           "rollouts dropped).");
}

}  // namespace rlpar_py
