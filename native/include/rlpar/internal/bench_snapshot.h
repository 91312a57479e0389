// rlpar/internal/bench_snapshot.h — micro-benchmarks of the snapshot store (rlpar/snapshot.h),
// for tuning and for `rlpar bench`: not part of the store's interface.
#pragma once

#include <cstddef>

namespace rlpar {

// Micro-benchmark for tuning and for the Python bench: all times are medians over `repeats`.
struct SnapshotBench {
  double pin_unpin_ns;       // one pin() + release() on this thread while another thread publishes
  double publish_us_per_mb;  // publish() of n_floats, per 10^6 bytes, no pins held
  double memcpy_us_per_mb;   // plain memcpy into as many buffers as the store has slots, per 10^6 B
};

// Times `iters` operations per repeat. Throws std::invalid_argument unless all arguments are > 0.
SnapshotBench bench_snapshot(std::size_t n_floats, int iters, int repeats);

// `readers` threads pin + read one float + unpin in a loop for `seconds` while one writer thread
// publishes continuously. Totals over the run, to see how pins scale with readers.
struct SnapshotReadersBench {
  double pins_per_s;        // all readers together
  double publishes_per_s;   // the writer, while they read
  double skipped_fraction;  // publishes skipped because every spare slot was pinned
};

// Throws std::invalid_argument unless n_floats > 0, 1 <= readers <= 1024, 0 < seconds <= 600.
SnapshotReadersBench bench_snapshot_readers(std::size_t n_floats, int readers, double seconds);

}  // namespace rlpar
