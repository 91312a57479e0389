// Micro-benchmarks of the snapshot store: see rlpar/internal/bench_snapshot.h.
#include "rlpar/internal/bench_snapshot.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "rlpar/snapshot.h"

namespace rlpar {

namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Keeps the compiler from dropping stores to memory nobody reads afterwards.
void clobber_memory() { asm volatile("" ::: "memory"); }

double time_pin_unpin_ns(SnapshotStore& store, int iters, int repeats) {
  std::vector<float> params(store.size(), 1.0f);
  std::atomic<bool> stop{false};
  std::thread writer([&] {
    while (!stop.load(std::memory_order_relaxed)) store.publish(params.data(), params.size());
  });
  std::vector<double> ns;
  std::uint64_t sink = 0;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = Clock::now();
    for (int i = 0; i < iters; ++i) {
      Pin pin = store.pin();
      sink += pin.version();
    }
    ns.push_back(seconds_since(t0) * 1e9 / iters);
  }
  stop.store(true, std::memory_order_relaxed);
  writer.join();
  asm volatile("" : : "r"(sink));
  return median(ns);
}

}  // namespace

SnapshotBench bench_snapshot(std::size_t n_floats, int iters, int repeats) {
  if (n_floats == 0 || iters <= 0 || repeats <= 0) {
    throw std::invalid_argument("bench_snapshot: expected n_floats, iters, repeats > 0, got " +
                                std::to_string(n_floats) + ", " + std::to_string(iters) + ", " +
                                std::to_string(repeats));
  }
  SnapshotStore store(n_floats);
  SnapshotBench result{};
  result.pin_unpin_ns = time_pin_unpin_ns(store, iters, repeats);

  // Publish cycles through all slots (none is pinned), so the memcpy baseline cycles through as
  // many destination buffers: both then touch the same amount of memory, and the ratio isolates the
  // cost of the protocol rather than a cache-size effect.
  const std::size_t bytes = n_floats * sizeof(float);
  std::vector<float> src(n_floats, 2.0f);
  std::vector<std::vector<float>> dst(static_cast<std::size_t>(store.num_slots()),
                                      std::vector<float>(n_floats));
  std::vector<double> publish_us, memcpy_us;
  for (int r = 0; r < repeats; ++r) {
    auto t0 = Clock::now();
    for (int i = 0; i < iters; ++i) store.publish(src.data(), n_floats);
    publish_us.push_back(seconds_since(t0) * 1e6 / iters);

    t0 = Clock::now();
    for (int i = 0; i < iters; ++i) {
      std::memcpy(dst[static_cast<std::size_t>(i) % dst.size()].data(), src.data(), bytes);
      clobber_memory();
    }
    memcpy_us.push_back(seconds_since(t0) * 1e6 / iters);
  }
  const double mb = static_cast<double>(bytes) / 1e6;
  result.publish_us_per_mb = median(publish_us) / mb;
  result.memcpy_us_per_mb = median(memcpy_us) / mb;
  return result;
}

SnapshotReadersBench bench_snapshot_readers(std::size_t n_floats, int readers, double seconds) {
  if (n_floats == 0 || readers <= 0 || readers > 1024 || !(seconds > 0.0 && seconds <= 600.0)) {
    throw std::invalid_argument(
        "bench_snapshot_readers: expected n_floats > 0, 1 <= readers <= 1024, "
        "0 < seconds <= 600, got " +
        std::to_string(n_floats) + ", " + std::to_string(readers) + ", " + std::to_string(seconds));
  }
  SnapshotStore store(n_floats);
  std::vector<float> params(n_floats, 1.0f);
  store.publish(params.data(), n_floats);
  std::atomic<bool> go{false}, stop{false};
  std::vector<std::uint64_t> pins(static_cast<std::size_t>(readers), 0);
  std::uint64_t publishes = 0;
  std::vector<std::thread> threads;
  // If a thread cannot be started, the started ones are released and joined before the error
  // leaves: destroying a joinable std::thread would terminate the process.
  auto stop_all = [&] {
    stop.store(true, std::memory_order_relaxed);
    go.store(true, std::memory_order_release);
    for (auto& t : threads) t.join();
  };
  try {
    for (int r = 0; r < readers; ++r) {
      threads.emplace_back([&, r] {
        while (!go.load(std::memory_order_acquire)) {
        }
        std::uint64_t n = 0;
        float sink = 0.0f;
        while (!stop.load(std::memory_order_relaxed)) {
          Pin pin = store.pin();
          sink += pin.data()[0];
          ++n;
        }
        asm volatile("" : : "r"(sink));
        pins[static_cast<std::size_t>(r)] = n;
      });
    }
    threads.emplace_back([&] {  // the writer, last
      while (!go.load(std::memory_order_acquire)) {
      }
      std::uint64_t n = 0;
      while (!stop.load(std::memory_order_relaxed)) {
        store.publish(params.data(), n_floats);
        ++n;
      }
      publishes = n;
    });
  } catch (...) {
    stop_all();
    throw;
  }
  const std::uint64_t skipped0 = store.skipped();
  const auto t0 = Clock::now();
  go.store(true, std::memory_order_release);
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  stop_all();
  const double elapsed = seconds_since(t0);
  std::uint64_t total = 0;
  for (auto n : pins) total += n;
  SnapshotReadersBench result{};
  result.pins_per_s = static_cast<double>(total) / elapsed;
  result.publishes_per_s = static_cast<double>(publishes) / elapsed;
  result.skipped_fraction =
      publishes ? static_cast<double>(store.skipped() - skipped0) / static_cast<double>(publishes)
                : 0.0;
  return result;
}

}  // namespace rlpar
