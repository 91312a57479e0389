// rlpar/side_worker.h: one task at a time on a thread of its own.
#include "rlpar/side_worker.h"

#include <chrono>
#include <stdexcept>
#include <utility>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#endif

namespace rlpar {

namespace {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(_M_X64)
  _mm_pause();
#else
  std::this_thread::yield();
#endif
}

}  // namespace

SideWorker::SideWorker(double spin_s)
    : spin_ns_(spin_s > 0 ? static_cast<int64_t>(spin_s * 1e9) : 0) {
  thread_ = std::thread([this] { run(); });
}

SideWorker::~SideWorker() {
  try {
    wait();
  } catch (...) {
    // a task's exception nobody waited for: dropped with the worker
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_.store(true, std::memory_order_seq_cst);
  }
  task_cv_.notify_one();
  thread_.join();
}

bool SideWorker::spin_until(const std::function<bool()>& ready) const {
  if (ready()) return true;
  if (spin_ns_ == 0) return false;
  const auto until = std::chrono::steady_clock::now() + std::chrono::nanoseconds(spin_ns_);
  for (int i = 1;; ++i) {
    cpu_relax();
    if (ready()) return true;
    if (i % 64 == 0 && std::chrono::steady_clock::now() >= until) return false;
  }
}

void SideWorker::submit(std::function<void()> task) {
  if (pending()) {
    throw std::logic_error("SideWorker::submit: a task is still pending (wait() first)");
  }
  task_ = std::move(task);
  error_ = nullptr;
  // seq_cst with the worker's store of worker_sleeping_ and its reload of submitted_: either
  // it sees this task before it sleeps, or this thread sees it asleep and wakes it.
  submitted_.fetch_add(1, std::memory_order_seq_cst);
  if (worker_sleeping_.load(std::memory_order_seq_cst)) {
    { std::lock_guard<std::mutex> lock(mu_); }  // it checks its predicate under the mutex
    task_cv_.notify_one();
  }
}

bool SideWorker::pending() const {
  return finished_.load(std::memory_order_acquire) != submitted_.load(std::memory_order_relaxed);
}

void SideWorker::run_task(uint64_t n) {
  try {
    task_();
  } catch (...) {
    error_ = std::current_exception();
  }
  task_ = nullptr;
  finished_.store(n, std::memory_order_seq_cst);
}

void SideWorker::wait() {
  const uint64_t target = submitted_.load(std::memory_order_relaxed);
  // seq_cst loads here and in run(): the other half of each sleeping handshake (see submit)
  auto done = [&] { return finished_.load(std::memory_order_seq_cst) == target; };
  uint64_t unclaimed = target - 1;
  if (!done() && claimed_.compare_exchange_strong(unclaimed, target, std::memory_order_acq_rel)) {
    // The worker has not started it (asleep, or off its CPU): run it here.
    stolen_.fetch_add(1, std::memory_order_relaxed);
    run_task(target);
  } else if (!spin_until(done)) {
    caller_sleeping_.store(true, std::memory_order_seq_cst);
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, done);
    caller_sleeping_.store(false, std::memory_order_relaxed);
  }
  if (error_) {
    std::exception_ptr e = std::exchange(error_, nullptr);
    std::rethrow_exception(e);
  }
}

void SideWorker::run() {
  uint64_t done = 0;
  for (;;) {
    auto ready = [&] {
      return submitted_.load(std::memory_order_seq_cst) != done ||
             stop_.load(std::memory_order_seq_cst);
    };
    if (!spin_until(ready)) {
      worker_sleeping_.store(true, std::memory_order_seq_cst);
      std::unique_lock<std::mutex> lock(mu_);
      task_cv_.wait(lock, ready);
      worker_sleeping_.store(false, std::memory_order_relaxed);
    }
    if (submitted_.load(std::memory_order_acquire) == done) return;  // stopped, nothing pending
    uint64_t unclaimed = done;
    done += 1;
    if (!claimed_.compare_exchange_strong(unclaimed, done, std::memory_order_acq_rel)) {
      continue;  // the caller took it in wait() and marks it finished itself
    }
    run_task(done);
    if (caller_sleeping_.load(std::memory_order_seq_cst)) {
      { std::lock_guard<std::mutex> lock(mu_); }
      done_cv_.notify_one();
    }
  }
}

}  // namespace rlpar
