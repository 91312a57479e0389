// rlpar/ticket_queue.h — a blocking FIFO of integer tickets between threads, with no Python.
//
// The runtime hands rollouts from actor threads to the learner and back through two kinds of
// queue (the learner's inbox and each actor's free buffers). The items are tickets (slot numbers
// of a table the Python side keeps: rlpar/runtime/handoff.py), so a blocking wait and the
// wake-up of a blocked thread can run without the GIL; the binding keeps the GIL for the common
// uncontended push and pop.
//
//     rlpar::TicketQueue q(8);        // at most 8 tickets queued (0: no bound)
//     bool wake = false;
//     if (q.try_push(3, wake) && wake) q.wake_popper();    // producer, fast path
//     int64_t t;
//     if (!q.try_pop(t, wake)) q.pop(t, 0.05);              // consumer, blocking <= 50 ms
//
// Every member is safe to call from any thread at any time (one mutex; waits on two condition
// variables). The waiter counts make the fast paths tell whether a wake is needed at all, so an
// uncontended hand-off makes no system call.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>

namespace rlpar {

class TicketQueue {
 public:
  // maxsize >= 0 (0: unbounded; std::invalid_argument otherwise).
  explicit TicketQueue(int64_t maxsize);

  // Appends `ticket` unless the queue is full; `wake` is set when a popper is blocked, and the
  // caller must then call wake_popper() (after letting go of whatever it holds: the GIL).
  bool try_push(int64_t ticket, bool& wake);
  // Takes the oldest ticket unless the queue is empty; `wake` as for try_push, for a pusher
  // blocked on a full queue (wake_pusher()).
  bool try_pop(int64_t& ticket, bool& wake);

  // Blocking forms: wait at most `timeout_s` seconds (< 0: without limit) for room / a ticket.
  // False on timeout, with nothing changed. They wake the other side themselves.
  bool push(int64_t ticket, double timeout_s);
  bool pop(int64_t& ticket, double timeout_s);

  void wake_popper();
  void wake_pusher();

  int64_t size() const;
  int64_t maxsize() const { return maxsize_; }

 private:
  bool full() const { return maxsize_ > 0 && static_cast<int64_t>(items_.size()) >= maxsize_; }

  const int64_t maxsize_;
  mutable std::mutex mu_;
  std::condition_variable not_empty_, not_full_;
  std::deque<int64_t> items_;
  int64_t poppers_waiting_ = 0, pushers_waiting_ = 0;
};

}  // namespace rlpar
