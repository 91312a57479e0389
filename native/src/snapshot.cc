// Lock-free snapshot store: see rlpar/snapshot.h for the interface.
//
// Why it is correct
// -----------------
// State: N slots, each a buffer + `version` + `released` (atomic, incremented by readers on unpin)
// + `credited` (written only by the writer). One atomic word `cur` = [pin count : 56 | index : 8].
//
// 1. A pin cannot be lost or miscounted. pin() is a single fetch_add on `cur`: the same atomic
//    operation that reads the current index also counts the pin against it. There is no window
//    between "read which slot is current" and "announce that I use it" for the writer to slip a
//    publish into — the race that breaks every "load index, then increment the slot's counter"
//    design. The writer's exchange() swaps the index and takes the count of pins taken on the old
//    slot while it was current, atomically; pins after the exchange in `cur`'s modification order
//    see the new index.
//
// 2. credited vs released. Every pin of slot S is counted in exactly one exchange() that retired S
//    (the count resets to 0 with each new index), and the writer adds that count to S.credited.
//    So once S is not current, credited(S) = all pins ever taken on S, and released(S) <=
//    credited(S) with equality iff every one of them has been unpinned. Pins are only ever taken on
//    the current slot and the writer alone changes which slot is current, so a non-current slot
//    with released == credited has no reader and cannot gain one: the writer may overwrite it.
//    (released can run ahead of credited while S is current — a reader may pin and unpin before the
//    exchange — but the writer never considers the current slot.)
//
// 3. Memory ordering (both edges are needed; TSan flags either one weakened):
//    - writer fills S, stores S.version, then exchange(release); a reader's fetch_add(acquire)
//      reads that exchange or a later pin's fetch_add (read-modify-writes extend the release
//      sequence), so the filled buffer and version happen-before the reader's reads.
//    - a reader's reads of S happen-before its released.fetch_add(release); the writer's
//      released.load(acquire) that sees the final count makes them happen-before its next writes
//      to S. The exchange needs no acquire: the writer reads nothing the readers wrote through
//      `cur` except the count, which is a value, not a publication.
//
// 4. N >= P + 2 never skips, where P is the most pins outstanding at once (every reader's Pins,
//    including those kept alive by numpy arrays). begin_write() looks at the N - 1 non-current
//    slots; a slot is busy only while it has an outstanding pin, and each pin keeps at most one
//    slot busy, so at least N - 1 - P >= 1 slot is free.
//
// 5. Overflow: the pin count restarts at 0 with every publish; 2^56 pins between two publishes
//    would take centuries. released/credited are 64-bit and only grow.
#include "rlpar/snapshot.h"

#include <cstring>
#include <new>
#include <stdexcept>
#include <string>

namespace rlpar {
namespace {

constexpr int kIndexBits = 8;
constexpr std::uint64_t kIndexMask = (std::uint64_t{1} << kIndexBits) - 1;
constexpr std::uint64_t kPinUnit = std::uint64_t{1} << kIndexBits;
constexpr std::size_t kAlignBytes = 64;
constexpr std::size_t kAlignFloats = kAlignBytes / sizeof(float);

}  // namespace

struct SnapshotStore::Slot {
  // The two counters begin_write() compares, on their own cache line so that unpins do not evict
  // `version` from the caches of readers that are pinning.
  // released: incremented by readers on unpin.
  alignas(64) std::atomic<std::uint64_t> released{0};
  // credited: pins counted against this slot when it stopped being current. Only the writer
  // stores it (plain load + store, no read-modify-write); atomic only so that pinned_slots_hint()
  // may peek.
  std::atomic<std::uint64_t> credited{0};
  // Written by the writer while no reader can pin this slot; read by readers after pinning it.
  alignas(64) std::uint64_t version = 0;
};

void SnapshotStore::AlignedFree::operator()(float* p) const noexcept {
  ::operator delete(p, std::align_val_t(kAlignBytes));
}

SnapshotStore::SnapshotStore(std::size_t n, int num_slots)
    : n_(n),
      num_slots_(num_slots),
      stride_((n + kAlignFloats - 1) / kAlignFloats * kAlignFloats) {
  if (n == 0) {
    throw std::invalid_argument("SnapshotStore: expected n > 0 floats, got 0");
  }
  if (num_slots < kMinSlots || num_slots > kMaxSlots) {
    throw std::invalid_argument("SnapshotStore: expected num_slots in [" +
                                std::to_string(kMinSlots) + ", " + std::to_string(kMaxSlots) +
                                "], got " + std::to_string(num_slots));
  }
  slots_ = std::make_unique<Slot[]>(static_cast<std::size_t>(num_slots));
  const std::size_t total = stride_ * static_cast<std::size_t>(num_slots);
  buffers_.reset(static_cast<float*>(
      ::operator new(total * sizeof(float), std::align_val_t(kAlignBytes))));
  // Slot 0 is current before the first publish: zeros at version 0. The other slots are zeroed too
  // so that begin_write() never hands out uninitialised memory.
  std::memset(buffers_.get(), 0, total * sizeof(float));
}

SnapshotStore::~SnapshotStore() = default;

// ---- readers ----

Pin SnapshotStore::pin() const noexcept {
  const std::uint64_t word = cur_.fetch_add(kPinUnit, std::memory_order_acquire);
  const int slot = static_cast<int>(word & kIndexMask);
  return Pin(this, slot, slot_data(slot), n_, slots_[slot].version);
}

void SnapshotStore::unpin(int slot) const noexcept {
  slots_[slot].released.fetch_add(1, std::memory_order_release);
}

Pin::Pin(Pin&& other) noexcept
    : store_(other.store_),
      data_(other.data_),
      size_(other.size_),
      version_(other.version_),
      slot_(other.slot_) {
  other.store_ = nullptr;
  other.release();
}

Pin& Pin::operator=(Pin&& other) noexcept {
  if (this != &other) {
    release();
    store_ = other.store_;
    data_ = other.data_;
    size_ = other.size_;
    version_ = other.version_;
    slot_ = other.slot_;
    other.store_ = nullptr;
    other.release();
  }
  return *this;
}

void Pin::release() noexcept {
  if (store_ != nullptr) store_->unpin(slot_);
  store_ = nullptr;
  data_ = nullptr;
  size_ = 0;
  version_ = 0;
  slot_ = -1;
}

// ---- the writer ----

float* SnapshotStore::begin_write() {
  if (reserved_ >= 0) return slot_data(reserved_);
  // Scan the non-current slots starting after the current one: in steady state that is the slot
  // retired longest ago, whose readers have had the most time to unpin.
  for (int k = 1; k < num_slots_; ++k) {
    const int s = (current_ + k) % num_slots_;
    const Slot& slot = slots_[s];
    if (slot.released.load(std::memory_order_acquire) ==
        slot.credited.load(std::memory_order_relaxed)) {
      reserved_ = s;
      return slot_data(s);
    }
  }
  skipped_.store(skipped_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  return nullptr;
}

std::uint64_t SnapshotStore::commit() { return commit(version_ + 1); }

std::uint64_t SnapshotStore::commit(std::uint64_t version) {
  if (reserved_ < 0) {
    throw std::logic_error("SnapshotStore::commit: no slot reserved by begin_write()");
  }
  if (version <= version_) {
    throw std::invalid_argument("SnapshotStore::commit: expected a version > " +
                                std::to_string(version_) + ", got " + std::to_string(version));
  }
  slots_[reserved_].version = version;
  const std::uint64_t old = cur_.exchange(static_cast<std::uint64_t>(reserved_),
                                          std::memory_order_release);
  Slot& retired = slots_[old & kIndexMask];
  retired.credited.store(retired.credited.load(std::memory_order_relaxed) + (old >> kIndexBits),
                         std::memory_order_relaxed);
  current_ = reserved_;
  reserved_ = -1;
  version_ = version;
  publishes_.store(publishes_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  latest_version_.store(version, std::memory_order_release);
  return version;
}

void SnapshotStore::abandon_write() noexcept { reserved_ = -1; }

void SnapshotStore::check_publish_args(const float* src, std::size_t n) const {
  if (n != n_) {
    throw std::invalid_argument("SnapshotStore::publish: expected " + std::to_string(n_) +
                                " floats, got " + std::to_string(n));
  }
  if (src == nullptr) throw std::invalid_argument("SnapshotStore::publish: src is null");
}

bool SnapshotStore::publish(const float* src, std::size_t n) {
  return publish(src, n, version_ + 1);
}

bool SnapshotStore::publish(const float* src, std::size_t n, std::uint64_t version) {
  check_publish_args(src, n);
  if (version <= version_) {
    throw std::invalid_argument("SnapshotStore::publish: expected a version > " +
                                std::to_string(version_) + ", got " + std::to_string(version));
  }
  float* dst = begin_write();
  if (dst == nullptr) return false;
  std::memcpy(dst, src, n * sizeof(float));
  commit(version);
  return true;
}

// ---- monitoring ----

std::uint64_t SnapshotStore::latest_version() const noexcept {
  return latest_version_.load(std::memory_order_acquire);
}

std::uint64_t SnapshotStore::publishes() const noexcept {
  return publishes_.load(std::memory_order_relaxed);
}

std::uint64_t SnapshotStore::skipped() const noexcept {
  return skipped_.load(std::memory_order_relaxed);
}

int SnapshotStore::pinned_slots_hint() const noexcept {
  const std::uint64_t word = cur_.load(std::memory_order_relaxed);
  const int current = static_cast<int>(word & kIndexMask);
  int pinned = 0;
  for (int s = 0; s < num_slots_; ++s) {
    const Slot& slot = slots_[s];
    std::uint64_t taken = slot.credited.load(std::memory_order_relaxed);
    if (s == current) taken += word >> kIndexBits;
    if (slot.released.load(std::memory_order_relaxed) < taken) ++pinned;
  }
  return pinned;
}

}  // namespace rlpar
