// SideWorker (rlpar/side_worker.h), the thread an actor hands one half's inference to. Under
// ThreadSanitizer: tasks that write plain memory the caller then reads, interleaved with the
// caller's own writes to other memory, with the worker spinning, sleeping between tasks, and
// the caller sleeping in wait, and the caller running a task the worker has not started; each
// task runs once; a task's exception comes back from wait; a second submit while one is
// pending is refused; a worker destroyed with a task pending finishes it first.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "check.h"
#include "rlpar/side_worker.h"

using rlpar::SideWorker;

namespace {

// The caller writes even slots, the task odd ones, then the caller checks every slot: what the
// task wrote is visible after wait, what the caller wrote before submit is visible to the task.
void hand_offs(double spin_s, int rounds, bool pause_between) {
  SideWorker worker(spin_s);
  std::vector<int64_t> data(64, 0);
  int64_t seen_by_task = -1;
  int64_t runs = 0;  // each task runs once, whoever runs it (the worker, or the caller in wait)
  int bad = 0;
  for (int r = 1; r <= rounds; ++r) {
    for (size_t i = 0; i < data.size(); i += 2) data[i] = r;
    worker.submit([&data, &seen_by_task, &runs, r] {
      ++runs;
      seen_by_task = data[0];
      for (size_t i = 1; i < data.size(); i += 2) data[i] = -r;
    });
    if (pause_between && r % 7 == 0) std::this_thread::sleep_for(std::chrono::microseconds(300));
    worker.wait();
    if (worker.pending() || seen_by_task != r || runs != r) ++bad;
    for (size_t i = 0; i < data.size(); ++i) {
      if (data[i] != (i % 2 ? -r : r)) ++bad;
    }
  }
  CHECK(bad == 0);
  CHECK(worker.submitted() == static_cast<uint64_t>(rounds));
  CHECK(worker.stolen() <= worker.submitted());
}

// A caller that waits at once, with a worker that never spins: the worker is often still
// asleep, and the caller runs those tasks itself; every task still runs exactly once.
void the_caller_runs_tasks_the_worker_has_not_started() {
  SideWorker worker(0.0);
  std::vector<int> runs(2000, 0);
  for (size_t i = 0; i < runs.size(); ++i) {
    worker.submit([&runs, i] { ++runs[i]; });
    worker.wait();
  }
  int wrong = 0;
  for (int n : runs) wrong += n != 1;
  CHECK(wrong == 0);
  CHECK(worker.stolen() > 0);
}

// Tasks that take longer than the caller spins: the caller sleeps in wait and is woken.
void the_caller_sleeps_and_is_woken() {
  SideWorker worker(1e-6);
  std::atomic<int> ran{0};
  for (int r = 0; r < 20; ++r) {
    worker.submit([&ran] {
      std::this_thread::sleep_for(std::chrono::microseconds(500));
      ran.fetch_add(1);
    });
    worker.wait();
  }
  CHECK(ran.load() == 20);
}

void errors_and_misuse() {
  SideWorker worker;
  worker.wait();  // nothing pending: returns at once
  worker.submit([] { throw std::invalid_argument("task failed"); });
  bool threw = false;
  try {
    worker.wait();
  } catch (const std::invalid_argument& e) {
    threw = std::string(e.what()) == "task failed";
  }
  CHECK(threw);
  worker.wait();  // the error was handed over once
  std::atomic<bool> go{false};
  worker.submit([&go] {
    while (!go.load()) std::this_thread::yield();
  });
  bool refused = false;
  try {
    worker.submit([] {});
  } catch (const std::logic_error& e) {
    refused = std::string(e.what()).find("still pending") != std::string::npos;
  }
  CHECK(refused);
  CHECK(worker.pending());
  go.store(true);
  worker.wait();
  CHECK(!worker.pending());
  int after = 0;
  worker.submit([&after] { after = 1; });
  worker.wait();
  CHECK(after == 1);  // the worker goes on after an error and a refusal
}

void destroyed_with_a_task_pending() {
  int done = 0;
  {
    SideWorker worker(0.0);  // never spins: every hand-off goes through the condition variable
    worker.submit([&done] {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      done = 1;
    });
  }
  CHECK(done == 1);
  { SideWorker idle; }  // made and destroyed without a task
}

}  // namespace

int main() {
  hand_offs(100e-6, 20000, false);  // both spin: no system call
  hand_offs(0.0, 3000, false);      // neither spins: every hand-off sleeps and wakes
  hand_offs(20e-6, 3000, true);     // the worker falls asleep between some tasks
  the_caller_runs_tasks_the_worker_has_not_started();
  the_caller_sleeps_and_is_woken();
  errors_and_misuse();
  destroyed_with_a_task_pending();
  return rlpar_test::finish("test_side_worker");
}
