// rlpar/ticket_queue.h: the queue behind the runtime's rollout hand-offs.
#include "rlpar/ticket_queue.h"

#include <chrono>
#include <stdexcept>
#include <string>

namespace rlpar {

TicketQueue::TicketQueue(int64_t maxsize) : maxsize_(maxsize) {
  if (maxsize < 0) {
    throw std::invalid_argument("TicketQueue: maxsize must be >= 0 (0: unbounded), got " +
                                std::to_string(maxsize));
  }
}

bool TicketQueue::try_push(int64_t ticket, bool& wake) {
  std::lock_guard<std::mutex> lock(mu_);
  if (full()) return false;
  items_.push_back(ticket);
  wake = poppers_waiting_ > 0;
  return true;
}

bool TicketQueue::try_pop(int64_t& ticket, bool& wake) {
  std::lock_guard<std::mutex> lock(mu_);
  if (items_.empty()) return false;
  ticket = items_.front();
  items_.pop_front();
  wake = pushers_waiting_ > 0;
  return true;
}

namespace {

// Waits on `cv` until `ready()` or the timeout (< 0: none); `waiting` counts this thread while
// it waits, so the other side's fast path knows to wake it.
template <typename Ready>
bool wait_until_ready(std::unique_lock<std::mutex>& lock, std::condition_variable& cv,
                      int64_t& waiting, double timeout_s, Ready ready) {
  if (ready()) return true;
  ++waiting;
  bool ok;
  if (timeout_s < 0) {
    cv.wait(lock, ready);
    ok = true;
  } else {
    ok = cv.wait_for(lock, std::chrono::duration<double>(timeout_s), ready);
  }
  --waiting;
  return ok;
}

}  // namespace

bool TicketQueue::push(int64_t ticket, double timeout_s) {
  bool wake;
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (!wait_until_ready(lock, not_full_, pushers_waiting_, timeout_s, [&] { return !full(); })) {
      return false;
    }
    items_.push_back(ticket);
    wake = poppers_waiting_ > 0;
  }
  if (wake) wake_popper();
  return true;
}

bool TicketQueue::pop(int64_t& ticket, double timeout_s) {
  bool wake;
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (!wait_until_ready(lock, not_empty_, poppers_waiting_, timeout_s,
                          [&] { return !items_.empty(); })) {
      return false;
    }
    ticket = items_.front();
    items_.pop_front();
    wake = pushers_waiting_ > 0;
  }
  if (wake) wake_pusher();
  return true;
}

void TicketQueue::wake_popper() { not_empty_.notify_one(); }
void TicketQueue::wake_pusher() { not_full_.notify_one(); }

int64_t TicketQueue::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(items_.size());
}

}  // namespace rlpar
