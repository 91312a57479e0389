// rlpar/thread_pool.h — an explicit pool of worker threads for intra-op parallelism.
//
// A learner that owns one passes it to Net::forward_train_seq / Net::backward, which then split
// the torso over the pool's threads (see rlpar/net.h). The pool is never implicit:
// calls without one run on the calling thread alone, so actor threads are never oversubscribed
// by a hidden pool. Workers are plain std::threads that never touch Python.
//
//     rlpar::ThreadPool pool(4);                      // the caller + 3 workers
//     pool.run(8, [&](int64_t i) { work(i); });       // returns once all 8 tasks have run
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace rlpar {

class ThreadPool {
 public:
  static constexpr int64_t kMaxThreads = 1024;

  // 1 <= threads <= kMaxThreads (std::invalid_argument otherwise): the calling thread plus
  // threads - 1 workers.
  explicit ThreadPool(int64_t threads);
  ~ThreadPool();  // stops and joins the workers
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int64_t threads() const { return static_cast<int64_t>(workers_.size()) + 1; }

  // Runs fn(0) .. fn(tasks - 1), spread over the calling thread and the workers; returns once
  // every task has finished. Which thread runs which task is not fixed, so a task must write
  // only its own outputs. If tasks throw, the exception of the lowest-numbered failing task is
  // rethrown (after all tasks have ended). Callers on several threads take turns; a call made
  // from inside a task of this pool, a pool of one thread or a run of one task runs its tasks
  // inline, in order, on the calling thread (there the first exception ends the run).
  void run(int64_t tasks, const std::function<void(int64_t)>& fn);

 private:
  void work();
  void drain(const std::function<void(int64_t)>& fn, int64_t tasks);

  std::mutex run_mu_;  // one run at a time
  std::mutex mu_;      // guards everything below but next_
  std::condition_variable wake_, idle_;
  const std::function<void(int64_t)>* fn_ = nullptr;  // null between runs
  int64_t tasks_ = 0;
  uint64_t generation_ = 0;
  int64_t active_ = 0;  // workers inside the current run
  bool stop_ = false;
  std::atomic<int64_t> next_{0};  // next task to claim
  std::vector<std::exception_ptr> errors_;
  std::vector<std::thread> workers_;
};

}  // namespace rlpar
