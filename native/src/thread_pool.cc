#include "rlpar/thread_pool.h"

#include <stdexcept>
#include <string>

namespace rlpar {

namespace {
// The pool whose task this thread is running, if any (nested runs go inline).
thread_local const ThreadPool* tl_running = nullptr;

struct RunningScope {
  const ThreadPool* saved;
  explicit RunningScope(const ThreadPool* p) : saved(tl_running) { tl_running = p; }
  ~RunningScope() { tl_running = saved; }
};
}  // namespace

ThreadPool::ThreadPool(int64_t threads) {
  if (threads < 1 || threads > kMaxThreads) {
    throw std::invalid_argument("threads: expected an integer from 1 to " +
                                std::to_string(kMaxThreads) + ", got " + std::to_string(threads));
  }
  workers_.reserve(static_cast<size_t>(threads - 1));
  for (int64_t i = 1; i < threads; ++i) workers_.emplace_back([this] { work(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void ThreadPool::drain(const std::function<void(int64_t)>& fn, int64_t tasks) {
  RunningScope scope(this);
  for (int64_t i; (i = next_.fetch_add(1, std::memory_order_relaxed)) < tasks;) {
    try {
      fn(i);
    } catch (...) {
      errors_[static_cast<size_t>(i)] = std::current_exception();  // each task its own slot
    }
  }
}

void ThreadPool::work() {
  uint64_t seen = 0;
  for (;;) {
    const std::function<void(int64_t)>* fn;
    int64_t tasks;
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, [&] { return stop_ || (fn_ != nullptr && generation_ != seen); });
      if (stop_) return;
      seen = generation_;
      fn = fn_;
      tasks = tasks_;
      ++active_;
    }
    drain(*fn, tasks);
    {
      std::lock_guard<std::mutex> lock(mu_);
      --active_;
    }
    idle_.notify_one();
  }
}

void ThreadPool::run(int64_t tasks, const std::function<void(int64_t)>& fn) {
  if (tasks <= 0) return;
  if (tl_running == this || workers_.empty() || tasks == 1) {
    for (int64_t i = 0; i < tasks; ++i) fn(i);  // exceptions propagate directly
    return;
  }
  std::lock_guard<std::mutex> turn(run_mu_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    errors_.assign(static_cast<size_t>(tasks), nullptr);
    next_.store(0, std::memory_order_relaxed);
    fn_ = &fn;
    tasks_ = tasks;
    ++generation_;
  }
  wake_.notify_all();
  drain(fn, tasks);
  std::exception_ptr first;
  {
    // Every task is claimed once the caller's drain returns; those still running belong to
    // active workers. A worker that wakes after fn_ is cleared waits for the next run.
    std::unique_lock<std::mutex> lock(mu_);
    idle_.wait(lock, [&] { return active_ == 0; });
    fn_ = nullptr;
    for (const std::exception_ptr& e : errors_) {
      if (e) {
        first = e;
        break;
      }
    }
  }
  if (first) std::rethrow_exception(first);
}

}  // namespace rlpar
