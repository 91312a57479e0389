// Concurrent stress test of SnapshotStore: one writer publishing as fast as it can, several readers
// verifying every element of every snapshot they pin. Built with -fsanitize=thread it also proves
// the memory ordering: TSan reports any read of a slot not ordered after the write that filled it.
//
// Usage: test_snapshot_stress [reads_in_main_scenario=10000000] [floats_per_snapshot=64]
//
// Scenarios:
//   honest        num_slots = readers + 4: no torn read, versions never go back, and no skip at all
//                 (N >= pins + 2, see snapshot.h).
//   honest-tight  num_slots = 3 < readers + 2: publishes get skipped and slots are reused as soon
//                 as they are free, the hardest case for the credited/released accounting.
//   broken        a writer that bypasses the protocol and overwrites the slot readers hold. The
//                 checker MUST report torn reads, otherwise it could not have caught a real bug.
//
// How the broken writer coexists with TSan: it writes with relaxed atomic stores, and the checker
// always reads with relaxed atomic loads. Atomic-vs-atomic accesses are not a data race, so TSan
// stays quiet about the deliberate bug and the program has no undefined behaviour; yet the honest
// writer fills slots with plain stores (memcpy and a loop), and TSan reports a plain write racing
// with an atomic read, so the honest scenarios keep their full TSan coverage. (Checked by weakening
// the store's orderings to relaxed: TSan then fails the honest scenarios.)
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "check.h"
#include "rlpar/snapshot.h"

using rlpar::Pin;
using rlpar::SnapshotStore;

namespace {

// Element i of the snapshot with this version. Integers below 2^24 are exact in float; the odd
// multiplier makes two versions less than 2^24 apart differ in every element, so a single element
// from another version is caught. Version 0 is the store's initial all-zeros snapshot.
float pattern(std::uint64_t version, std::size_t i) {
  if (version == 0) return 0.0f;
  return static_cast<float>((version * 2654435761ull + i * 40503ull) & 0xFFFFFFull);
}

float load_relaxed(const float* p) {
  float v;
  __atomic_load(p, &v, __ATOMIC_RELAXED);
  return v;
}

void store_relaxed(float* p, float v) { __atomic_store(p, &v, __ATOMIC_RELAXED); }

// True iff every element matches the pinned version's pattern (reads all of them regardless).
bool matches(const float* data, std::size_t n, std::uint64_t version) {
  bool ok = true;
  for (std::size_t i = 0; i < n; ++i) ok &= load_relaxed(data + i) == pattern(version, i);
  return ok;
}

enum class Writer { kHonest, kBroken };

struct Scenario {
  const char* name;
  Writer writer;
  int num_slots;
  int readers;
  std::uint64_t reads;  // in total, split evenly across readers
  std::size_t n;
};

struct ReaderStats {
  std::uint64_t reads = 0;
  std::uint64_t torn = 0;
  std::uint64_t backwards = 0;
  std::uint64_t version_changes = 0;
  std::uint64_t wrong_size = 0;
};

void run_reader(const SnapshotStore& store, std::uint64_t reads, ReaderStats& out) {
  ReaderStats s;
  std::uint64_t last = 0;
  for (; s.reads < reads; ++s.reads) {
    Pin pin = store.pin();
    const std::uint64_t v = pin.version();
    s.backwards += v < last;
    s.version_changes += v != last;
    last = v;
    s.wrong_size += pin.size() != store.size();
    s.torn += !matches(pin.data(), pin.size(), v);
  }
  out = s;
}

// Both writers set `started` once their first write is complete, and run() starts the readers only
// then: the honest readers are sure to see publishes, the broken ones are sure to pin overwritten
// data, whatever the scheduler does.

// Alternates the two ways of publishing, with explicit versions so that a skipped publish simply
// leaves a gap and the pattern always matches the committed version.
void run_honest_writer(SnapshotStore& store, std::atomic<bool>& started,
                       const std::atomic<bool>& stop) {
  const std::size_t n = store.size();
  std::vector<float> scratch(n);
  for (std::uint64_t v = 1; !stop.load(std::memory_order_relaxed); ++v) {
    if (v % 2) {
      for (std::size_t i = 0; i < n; ++i) scratch[i] = pattern(v, i);
      store.publish(scratch.data(), n, v);
    } else if (float* buf = store.begin_write()) {
      for (std::size_t i = 0; i < n; ++i) buf[i] = pattern(v, i);
      store.commit(v);
    }
    started.store(true, std::memory_order_relaxed);
  }
}

// The bug a careless single-buffer store would have: new parameters written over the snapshot that
// readers are using. It pins the current slot only to get its address.
void run_broken_writer(const SnapshotStore& store, std::atomic<bool>& started,
                       const std::atomic<bool>& stop) {
  Pin pin = store.pin();
  float* data = const_cast<float*>(pin.data());
  for (std::uint64_t v = pin.version() + 1; !stop.load(std::memory_order_relaxed); ++v) {
    for (std::size_t i = 0; i < pin.size(); ++i) store_relaxed(data + i, pattern(v, i));
    started.store(true, std::memory_order_relaxed);
  }
}

struct Result {
  ReaderStats total;
  std::uint64_t publishes = 0;
  std::uint64_t skips = 0;
  double seconds = 0;
};

Result run(const Scenario& sc) {
  SnapshotStore store(sc.n, sc.num_slots);
  std::atomic<bool> started{false}, stop{false};
  std::vector<ReaderStats> stats(static_cast<std::size_t>(sc.readers));
  const auto t0 = std::chrono::steady_clock::now();

  std::thread writer([&] {
    if (sc.writer == Writer::kHonest) {
      run_honest_writer(store, started, stop);
    } else {
      run_broken_writer(store, started, stop);
    }
  });
  while (!started.load(std::memory_order_relaxed)) std::this_thread::yield();
  std::vector<std::thread> readers;
  for (int r = 0; r < sc.readers; ++r) {
    const std::uint64_t share =
        sc.reads / sc.readers + (static_cast<std::uint64_t>(r) < sc.reads % sc.readers);
    readers.emplace_back(run_reader, std::cref(store), share, std::ref(stats[r]));
  }
  for (std::thread& t : readers) t.join();
  stop.store(true, std::memory_order_relaxed);
  writer.join();

  Result res;
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (const ReaderStats& s : stats) {
    res.total.reads += s.reads;
    res.total.torn += s.torn;
    res.total.backwards += s.backwards;
    res.total.version_changes += s.version_changes;
    res.total.wrong_size += s.wrong_size;
  }
  res.publishes = store.publishes();
  res.skips = store.skipped();
  std::printf(
      "  %-12s n=%zu slots=%d readers=%d: reads=%llu publishes=%llu skips=%llu torn=%llu "
      "backwards=%llu version_changes_seen=%llu in %.2f s\n",
      sc.name, sc.n, sc.num_slots, sc.readers, static_cast<unsigned long long>(res.total.reads),
      static_cast<unsigned long long>(res.publishes), static_cast<unsigned long long>(res.skips),
      static_cast<unsigned long long>(res.total.torn),
      static_cast<unsigned long long>(res.total.backwards),
      static_cast<unsigned long long>(res.total.version_changes), res.seconds);
  return res;
}

std::uint64_t parse_arg(int argc, char** argv, int i, std::uint64_t fallback) {
  return argc > i ? std::strtoull(argv[i], nullptr, 10) : fallback;
}

}  // namespace

int main(int argc, char** argv) {
  const std::uint64_t reads = parse_arg(argc, argv, 1, 10'000'000);
  const std::size_t n = parse_arg(argc, argv, 2, 64);
  const int readers = 4;
  const auto t0 = std::chrono::steady_clock::now();

  const Result honest = run({"honest", Writer::kHonest, readers + 4, readers, reads, n});
  CHECK(honest.total.reads == reads);
  CHECK(honest.total.torn == 0);
  CHECK(honest.total.backwards == 0);
  CHECK(honest.total.wrong_size == 0);
  CHECK(honest.publishes > 0);
  CHECK(honest.total.version_changes > 0);  // readers really saw publishes happen under them
  CHECK(honest.skips == 0);                 // num_slots >= readers + 2

  const Result tight = run({"honest-tight", Writer::kHonest, 3, readers, reads / 5, n});
  CHECK(tight.total.torn == 0);
  CHECK(tight.total.backwards == 0);
  CHECK(tight.publishes > 0);

  const Result broken = run({"broken", Writer::kBroken, readers + 4, readers, reads / 50, n});
  CHECK(broken.total.torn > 0);  // the checker catches a writer that bypasses the protocol

  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("  total %llu reads in %.2f s\n",
              static_cast<unsigned long long>(honest.total.reads + tight.total.reads +
                                              broken.total.reads),
              seconds);
  return rlpar_test::finish("test_snapshot_stress");
}
