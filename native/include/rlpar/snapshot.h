// rlpar/snapshot.h — lock-free parameter snapshots: one writer (learner), many readers (actors).
//
// The learner keeps improving one flat float32 parameter vector of `n` floats. Every actor wants a
// recent, *consistent* copy of it: all `n` floats from the same learner step, never half of one
// step and half of the next. A SnapshotStore hands out such copies without ever blocking an actor:
//
//     rlpar::SnapshotStore store(num_params);            // slot 0 holds zeros at version 0
//
//     // learner thread (the single writer)
//     store.publish(params, num_params);                  // copy in, becomes the latest snapshot
//
//     // any actor thread, any number of them
//     {
//       rlpar::Pin pin = store.pin();                     // wait-free: one atomic add
//       forward(pin.data(), obs, ...);                    // pin.data() cannot change while pinned
//       rollout.policy_version = pin.version();
//     }                                                   // unpinned here: one atomic add
//
// How it works, in four lines (the proof is at the top of src/snapshot.cc):
//   - The store owns a fixed pool of `num_slots` buffers. One of them is *current*.
//   - A reader pins the current slot; a pinned slot is never written to until it is unpinned.
//   - The writer fills a slot that is neither current nor pinned, then makes it current.
//   - If every other slot is pinned, the publish is *skipped* (counted in skipped()), never waited
//     for. With num_slots >= (most pins held at once) + 2 that cannot happen.
//
// Costs: pin and unpin are one atomic read-modify-write each (no lock, no system call, no loop),
// and a publish is one memcpy of the parameters plus two atomic operations. A pinned buffer is
// immutable, so a binding can hand it to numpy zero-copy as a read-only array whose owner keeps the
// Pin alive (a Pin is movable: `new rlpar::Pin(store.pin())` inside a capsule, deleted by its
// destructor; the capsule must also keep the store's owner alive). Such arrays count as pins for
// the sizing rule.
//
// Threads: pin(), the Pin methods and every const accessor may be called from any thread at any
// time. begin_write(), commit(), abandon_write() and publish() belong to ONE writer at a time; if
// the writer role moves to another thread, hand it over with a happens-before edge (a mutex, a
// join). The store must outlive every Pin taken from it.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

namespace rlpar {

class SnapshotStore;

// A read-only view of one snapshot, held pinned until release() or destruction. Move-only.
// A default-constructed or moved-from Pin is invalid: data() is nullptr, size() and version()
// are 0.
class Pin {
 public:
  Pin() noexcept = default;
  Pin(Pin&& other) noexcept;
  Pin& operator=(Pin&& other) noexcept;
  Pin(const Pin&) = delete;
  Pin& operator=(const Pin&) = delete;
  ~Pin() { release(); }

  const float* data() const noexcept { return data_; }  // 64-byte aligned, size() floats
  std::size_t size() const noexcept { return size_; }
  std::uint64_t version() const noexcept { return version_; }
  bool valid() const noexcept { return store_ != nullptr; }

  // Unpins now (idempotent); afterwards the Pin is invalid and data() must not be read.
  void release() noexcept;

 private:
  friend class SnapshotStore;
  Pin(const SnapshotStore* store, int slot, const float* data, std::size_t size,
      std::uint64_t version) noexcept
      : store_(store), data_(data), size_(size), version_(version), slot_(slot) {}

  const SnapshotStore* store_ = nullptr;
  const float* data_ = nullptr;
  std::size_t size_ = 0;
  std::uint64_t version_ = 0;
  int slot_ = -1;
};

class SnapshotStore {
 public:
  static constexpr int kDefaultSlots = 8;
  static constexpr int kMinSlots = 3;    // the current slot, one being written, one pinned
  static constexpr int kMaxSlots = 255;  // the slot index lives in 8 bits of one atomic word

  // n: floats per snapshot (> 0). num_slots: pool size in [kMinSlots, kMaxSlots]; choose at least
  // (most pins held at once across all readers) + 2 so that no publish is ever skipped.
  // Throws std::invalid_argument otherwise. Before the first publish, pin() sees zeros at
  // version 0.
  explicit SnapshotStore(std::size_t n, int num_slots = kDefaultSlots);
  ~SnapshotStore();
  SnapshotStore(const SnapshotStore&) = delete;
  SnapshotStore& operator=(const SnapshotStore&) = delete;

  std::size_t size() const noexcept { return n_; }
  int num_slots() const noexcept { return num_slots_; }

  // ---- readers (any thread; wait-free) ----
  // Pins the latest snapshot. Never fails, never blocks.
  Pin pin() const noexcept;

  // ---- the writer (one thread at a time) ----
  // Reserves a free slot and returns its buffer (size() floats, 64-byte aligned, old contents), or
  // nullptr when every non-current slot is pinned; that counts one skip. Calling it again before
  // commit() returns the same reservation. Readers cannot see the buffer until commit().
  float* begin_write();
  // Makes the reserved slot the latest snapshot with version latest_version() + 1 and returns it.
  // Throws std::logic_error without a reservation.
  std::uint64_t commit();
  // Same, with an explicit version (e.g. the learner's step, so that policy lag stays exact even
  // when publishes are skipped). Throws std::invalid_argument unless version > latest_version();
  // the reservation is kept in that case.
  std::uint64_t commit(std::uint64_t version);
  // Drops the reservation. Nothing was visible to readers, so nothing needs undoing; the slot stays
  // free and may be handed out again by the next begin_write(). A no-op without a reservation.
  void abandon_write() noexcept;

  // begin_write() + memcpy + commit(). Returns false (and counts a skip) when no slot is free.
  // Throws std::invalid_argument if n != size() or src is null.
  bool publish(const float* src, std::size_t n);
  bool publish(const float* src, std::size_t n, std::uint64_t version);

  // ---- monitoring (any thread) ----
  // Version of the latest commit; a pin() that starts after this returned v has version() >= v.
  std::uint64_t latest_version() const noexcept;
  std::uint64_t publishes() const noexcept;  // successful commits
  std::uint64_t skipped() const noexcept;    // begin_write() calls that found no free slot
  // Slots with at least one outstanding pin, read without synchronisation: exact only when no
  // thread is pinning or publishing, otherwise an estimate for logs and tests.
  int pinned_slots_hint() const noexcept;

 private:
  friend class Pin;
  struct Slot;  // defined in snapshot.cc
  struct AlignedFree {
    void operator()(float* p) const noexcept;
  };

  void unpin(int slot) const noexcept;
  float* slot_data(int slot) const noexcept { return buffers_.get() + stride_ * slot; }
  void check_publish_args(const float* src, std::size_t n) const;

  // Readers' hot word, alone on its cache line: [pin count : 56 | current slot index : 8].
  alignas(64) mutable std::atomic<std::uint64_t> cur_{0};

  alignas(64) const std::size_t n_;
  const int num_slots_;
  const std::size_t stride_;  // floats between slot buffers: n_ rounded up to 64 bytes
  std::unique_ptr<Slot[]> slots_;
  std::unique_ptr<float, AlignedFree> buffers_;

  // Writer-only state, plus atomics the writer stores and monitors load.
  int current_ = 0;     // slot index in cur_, known to the writer because only it changes it
  int reserved_ = -1;   // slot handed out by begin_write(), or -1
  std::uint64_t version_ = 0;
  std::atomic<std::uint64_t> latest_version_{0};
  std::atomic<std::uint64_t> publishes_{0};
  std::atomic<std::uint64_t> skipped_{0};
};

}  // namespace rlpar
