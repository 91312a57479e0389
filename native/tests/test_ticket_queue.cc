// TicketQueue (rlpar/ticket_queue.h), the queue under the runtime's rollout hand-offs. Under
// ThreadSanitizer: producers and consumers hand tickets over through a bounded queue, with and
// without blocking, and every ticket arrives exactly once, in order per producer; a full queue
// makes a pusher wait and a pop wakes it; timeouts return with nothing changed. The learner's
// RolloutInbox (rlpar/inbox.h) over it: actor threads fill buffers and queue them while the
// learner takes batches; every batch holds whole rollouts, each buffer back with its actor.
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "check.h"
#include "rlpar/inbox.h"
#include "rlpar/ticket_queue.h"

using rlpar::TicketQueue;

namespace {

void fifo_bounds_and_timeouts() {
  TicketQueue q(2);
  bool wake = true;
  CHECK(q.try_push(7, wake) && !wake);
  CHECK(q.try_push(8, wake) && !wake);
  CHECK(!q.try_push(9, wake));  // full
  CHECK(q.size() == 2);
  const auto t0 = std::chrono::steady_clock::now();
  CHECK(!q.push(9, 0.02));  // times out, nothing added
  CHECK(std::chrono::steady_clock::now() - t0 >= std::chrono::milliseconds(15));
  CHECK(q.size() == 2);
  int64_t t = -1;
  CHECK(q.try_pop(t, wake) && t == 7 && !wake);
  CHECK(q.pop(t, 0.0) && t == 8);
  CHECK(!q.try_pop(t, wake) && t == 8);
  CHECK(!q.pop(t, 0.02) && t == 8);  // times out, t untouched
  TicketQueue unbounded(0);
  for (int64_t i = 0; i < 1000; ++i) CHECK(unbounded.try_push(i, wake));
  for (int64_t i = 0; i < 1000; ++i) CHECK(unbounded.try_pop(t, wake) && t == i);
  bool threw = false;
  try {
    TicketQueue bad(-1);
  } catch (const std::invalid_argument& e) {
    threw = std::string(e.what()).find("got -1") != std::string::npos;
  }
  CHECK(threw);
}

// A blocked popper is counted, so a push reports that it must be woken, and the wake lets it
// return with the ticket; the same for a pusher blocked on a full queue. (Should the other
// thread not be waiting yet, it takes or leaves the ticket on its own: both ends are checked.)
void fast_paths_report_waiters() {
  TicketQueue q(1);
  int64_t got = -1;
  bool popped = false;  // CHECK is for the main thread only (its tally is not atomic)
  std::thread popper([&] { popped = q.pop(got, 10.0); });
  for (;;) {
    bool wake = false, unused = false;
    CHECK(q.try_push(5, wake));
    if (wake) {
      q.wake_popper();
      break;
    }
    int64_t back = -1;
    if (!q.try_pop(back, unused)) break;  // the popper came first and took it without waiting
    CHECK(back == 5);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  popper.join();
  CHECK(popped && got == 5);
  CHECK(q.size() == 0);

  bool unused = false;
  CHECK(q.try_push(1, unused));
  bool pushed = false;
  std::thread pusher([&] { pushed = q.push(2, 10.0); });
  for (;;) {
    bool wake = false;
    int64_t t = -1;
    CHECK(q.try_pop(t, wake) && t == 1);
    if (wake) {
      q.wake_pusher();
      break;
    }
    if (!q.try_push(1, unused)) break;  // the pusher filled the room first
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  pusher.join();
  CHECK(pushed);
  int64_t last = -1;
  bool wake = false;
  CHECK(q.try_pop(last, wake) && last == 2);  // however the two met, the pusher's ticket is in
  CHECK(q.size() == 0);
}

// kProducers push kPerProducer tickets each (producer p: p * kPerProducer + i, in order), half
// by the fast path with explicit wakes and half blocking; kConsumers pop until all arrived.
// Every ticket arrives once, and each producer's in the order it pushed them.
void many_threads_hand_over_everything() {
  constexpr int kProducers = 3, kConsumers = 3;
  constexpr int64_t kPerProducer = 20000;
  for (int64_t maxsize : {int64_t{1}, int64_t{4}, int64_t{0}}) {
    TicketQueue q(maxsize);
    std::vector<std::atomic<int>> seen(kProducers * kPerProducer);
    std::atomic<int64_t> received{0};
    std::atomic<int> out_of_order{0};
    std::vector<std::thread> threads;
    for (int p = 0; p < kProducers; ++p) {
      threads.emplace_back([&, p] {
        for (int64_t i = 0; i < kPerProducer; ++i) {
          const int64_t ticket = p * kPerProducer + i;
          bool wake = false;
          if (i % 2 == 0 && q.try_push(ticket, wake)) {
            if (wake) q.wake_popper();
          } else {
            while (!q.push(ticket, 0.01)) {
            }
          }
        }
      });
    }
    for (int c = 0; c < kConsumers; ++c) {
      threads.emplace_back([&] {
        std::vector<int64_t> last(kProducers, -1);
        while (received.load() < kProducers * kPerProducer) {
          int64_t t;
          bool wake = false;
          bool got = q.try_pop(t, wake);
          if (got && wake) q.wake_pusher();
          if (!got) got = q.pop(t, 0.01);
          if (!got) continue;
          received.fetch_add(1);
          seen[static_cast<size_t>(t)].fetch_add(1);
          const int64_t p = t / kPerProducer;
          if (t <= last[static_cast<size_t>(p)]) out_of_order.fetch_add(1);
          last[static_cast<size_t>(p)] = t;
        }
      });
    }
    for (auto& th : threads) th.join();
    bool once = true;
    for (auto& s : seen) once &= s.load() == 1;
    CHECK(once);
    CHECK(out_of_order.load() == 0);
    CHECK(q.size() == 0);
  }
}

// Two actors, two buffers each ([3 rows of 4 floats] and [1 row of 2 int64]), filled with the
// rollout's code (actor * 1000000 + seq) and stamped with it; the learner takes 600 batches of 3.
void inbox_takes_whole_rollouts_under_threads() {
  constexpr int kActors = 2, kBuffers = 2, kBatches = 600, kB = 3;
  TicketQueue inbox(kActors * kBuffers);
  rlpar::RolloutInbox take_from(inbox, {3, 1}, {4 * 4, 2 * 8});
  struct Buffer {
    std::array<float, 12> a{};
    std::array<int64_t, 2> b{};
    std::array<int64_t, 2> stamp{};
  };
  std::vector<Buffer> buffers(kActors * kBuffers);
  std::vector<std::unique_ptr<TicketQueue>> frees;
  for (int a = 0; a < kActors; ++a) {
    frees.push_back(std::make_unique<TicketQueue>(0));
    for (int i = 0; i < kBuffers; ++i) {
      Buffer& buf = buffers[a * kBuffers + i];
      take_from.add(a * kBuffers + i,
                    {{buf.a.data(), buf.b.data()}, frees[a].get(), i, buf.stamp.data()});
      bool wake = false;
      CHECK(frees[a]->try_push(i, wake));
    }
  }
  std::atomic<bool> stop{false};
  std::atomic<int> push_failures{0};  // CHECK is for the main thread only
  std::vector<std::thread> actors;
  for (int a = 0; a < kActors; ++a) {
    actors.emplace_back([&, a] {
      for (int64_t seq = 0; !stop.load();) {
        int64_t i = 0;
        if (!frees[a]->pop(i, 0.01)) continue;
        Buffer& buf = buffers[a * kBuffers + i];
        const int64_t code = a * 1000000 + seq++;
        buf.a.fill(static_cast<float>(code % 1000));
        buf.b.fill(code);
        buf.stamp[0] = code;
        if (!inbox.push(a * kBuffers + i, 1.0)) ++push_failures;
      }
    });
  }
  std::vector<float> a(3 * kB * 4);
  std::vector<int64_t> b(kB * 2), versions(kB);
  std::array<int64_t, kActors> last{-1, -1};
  int whole_batches = 0;
  for (int n = 0; n < kBatches; ++n) {
    const auto t = take_from.take({a.data(), b.data()}, versions.data(), 0, kB, 0, -1, 5.0);
    if (t.filled != kB) break;
    bool whole = t.dropped == 0;
    for (int p = 0; p < kB; ++p) {
      const int64_t code = versions[p];
      for (int r = 0; r < 3; ++r) {
        for (int j = 0; j < 4; ++j) {
          whole = whole && a[(r * kB + p) * 4 + j] == static_cast<float>(code % 1000);
        }
      }
      whole = whole && b[p * 2] == code && b[p * 2 + 1] == code;
      const auto actor = static_cast<size_t>(code / 1000000);
      whole = whole && actor < last.size() && code > last[actor];  // each actor's in its order
      if (actor < last.size()) last[actor] = code;
    }
    whole_batches += whole ? 1 : 0;
  }
  stop.store(true);
  for (auto& th : actors) th.join();
  CHECK(whole_batches == kBatches);
  CHECK(push_failures.load() == 0);
  // a ticket that names no buffer is refused
  bool refused = false;
  try {
    (void)take_from.accept(99, {a.data(), b.data()}, versions.data(), 0, kB, 0, -1);
  } catch (const std::invalid_argument&) {
    refused = true;
  }
  CHECK(refused);
}

}  // namespace

int main() {
  fifo_bounds_and_timeouts();
  fast_paths_report_waiters();
  many_threads_hand_over_everything();
  inbox_takes_whole_rollouts_under_threads();
  return rlpar_test::finish("test_ticket_queue");
}
