// rlpar/side_worker.h — one task at a time on a thread of its own, handed over without a
// system call while the two threads keep each other busy.
//
// An actor that steps a Python env in its own thread (holding the GIL) hands the inference of
// one half of its envs to a `SideWorker` and steps the other half meanwhile (double buffering
// for "sync" envs, rlpar/runtime/actor.py). The tasks come every few tens of µs, and a wake-up
// through the kernel costs about as much on a VM (a futex wake and an IPI to an idle vCPU), so
// both sides spin for a while before they sleep:
//
//   caller:  submit(task)  ...its own work...  wait()     (rethrows the task's exception)
//   worker:  spin up to spin_s for a task, then sleep until one comes; run it; mark it done
//
// A task the worker has not started by the time the caller waits for it (the worker asleep, or
// off its CPU because every core is busy) is run by the caller itself, in `wait`: each task is
// claimed once, by one side (a compare-and-swap), so waiting never costs more than doing.
//
// The sleeping side is woken through a mutex and a condition variable; a side that is spinning
// is not, and a hand-off then costs two atomic operations. One caller thread at a time; a task
// submitted while another is pending is refused (std::logic_error). Everything the caller wrote
// before `submit` is visible to the task, and everything the task wrote is visible to the
// caller after `wait` (release / acquire on the task counters).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

namespace rlpar {

class SideWorker {
 public:
  // spin_s: how long each side spins before it sleeps (the worker for the next task, the
  // caller in `wait` for the task to finish).
  explicit SideWorker(double spin_s = 100e-6);
  ~SideWorker();  // waits for a pending task, then ends the thread
  SideWorker(const SideWorker&) = delete;
  SideWorker& operator=(const SideWorker&) = delete;

  // Runs `task` on the worker thread. std::logic_error if a task is still pending (`wait`
  // first).
  void submit(std::function<void()> task);
  // Waits until the submitted task has finished (returns at once if none is pending), running
  // it here if the worker has not started it, and rethrows what it threw.
  void wait();
  // Whether a submitted task has not finished yet (it may be running).
  bool pending() const;
  // Tasks the caller ran itself in `wait` because the worker had not started them.
  uint64_t stolen() const { return stolen_.load(std::memory_order_relaxed); }
  uint64_t submitted() const { return submitted_.load(std::memory_order_relaxed); }

 private:
  void run();
  // Runs task n (claimed by this thread), keeps its error, marks it finished.
  void run_task(uint64_t n);
  bool spin_until(const std::function<bool()>& ready) const;

  const int64_t spin_ns_;
  std::function<void()> task_;        // written by the caller before submitted_ moves
  std::exception_ptr error_;          // written by the worker before finished_ moves
  std::atomic<uint64_t> submitted_{0};
  std::atomic<uint64_t> stolen_{0};
  std::atomic<uint64_t> claimed_{0};   // the last task the worker or the caller took to run
  std::atomic<uint64_t> finished_{0};
  std::atomic<bool> worker_sleeping_{false};
  std::atomic<bool> caller_sleeping_{false};
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::condition_variable task_cv_, done_cv_;
  std::thread thread_;
};

}  // namespace rlpar
