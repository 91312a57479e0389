// Single-threaded behaviour of SnapshotStore: construction, versions, the skip path, abandoned
// writes, Pin ownership. The concurrent protocol is exercised by test_snapshot_stress.cc.
#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <utility>
#include <vector>

#include "check.h"
#include "rlpar/internal/bench_snapshot.h"
#include "rlpar/snapshot.h"

using rlpar::Pin;
using rlpar::SnapshotStore;

namespace {

bool all_equal(const float* data, std::size_t n, float value) {
  for (std::size_t i = 0; i < n; ++i) {
    if (data[i] != value) return false;
  }
  return true;
}

void test_constructor_validates() {
  CHECK_THROWS(std::invalid_argument, SnapshotStore(0));
  CHECK_THROWS(std::invalid_argument, SnapshotStore(4, 2));
  CHECK_THROWS(std::invalid_argument, SnapshotStore(4, 256));
  CHECK_THROWS(std::invalid_argument, SnapshotStore(4, -1));
  try {
    SnapshotStore bad(4, 2);
  } catch (const std::invalid_argument& e) {
    CHECK(std::string(e.what()).find("[3, 255], got 2") != std::string::npos);
  }
  SnapshotStore lo(1, 3), hi(1, 255);
  CHECK(lo.num_slots() == 3 && hi.num_slots() == 255 && lo.size() == 1);
}

void test_initial_snapshot_is_zeros_at_version_0() {
  SnapshotStore store(37);
  Pin pin = store.pin();
  CHECK(pin.valid());
  CHECK(pin.version() == 0 && store.latest_version() == 0 && store.publishes() == 0);
  CHECK(pin.size() == 37 && all_equal(pin.data(), 37, 0.0f));
}

void test_publish_versions_and_alignment() {
  const std::size_t n = 37;  // not a multiple of 16: the slot stride must still keep alignment
  SnapshotStore store(n, 5);
  std::vector<float> params(n);
  for (std::uint64_t v = 1; v <= 20; ++v) {
    params.assign(n, static_cast<float>(v));
    CHECK(store.publish(params.data(), n));
    Pin pin = store.pin();
    CHECK(pin.version() == v && store.latest_version() == v);
    CHECK(all_equal(pin.data(), n, static_cast<float>(v)));
    CHECK(reinterpret_cast<std::uintptr_t>(pin.data()) % 64 == 0);
  }
  CHECK(store.publishes() == 20 && store.skipped() == 0);

  CHECK(store.publish(params.data(), n, 100));  // explicit versions, e.g. the learner's step
  CHECK(store.pin().version() == 100);
  CHECK_THROWS(std::invalid_argument, store.publish(params.data(), n, 100));
  CHECK_THROWS(std::invalid_argument, store.publish(params.data(), n - 1));
  CHECK_THROWS(std::invalid_argument, store.publish(nullptr, n));
  CHECK(store.publish(params.data(), n));
  CHECK(store.latest_version() == 101);
}

// Fills the store with pins until no slot is free: pin the current slot, publish, repeat. The last
// publish lands in the only unpinned slot, which is then current and so not writable either.
std::vector<Pin> pin_every_other_slot(SnapshotStore& store, std::vector<float>& params) {
  std::vector<Pin> pins;
  for (int k = 0; k < store.num_slots() - 1; ++k) {
    pins.push_back(store.pin());
    CHECK(store.publish(params.data(), params.size()));
  }
  CHECK(store.pinned_slots_hint() == store.num_slots() - 1);
  return pins;
}

void test_skip_when_every_slot_is_pinned_then_recover() {
  const std::size_t n = 16;
  SnapshotStore store(n, 4);
  std::vector<float> params(n, 1.0f);
  std::vector<Pin> pins = pin_every_other_slot(store, params);
  const std::uint64_t version = store.latest_version();

  // Must return at once, not wait for a reader: ctest's timeout catches a hang, this a slow path.
  const auto t0 = std::chrono::steady_clock::now();
  CHECK(!store.publish(params.data(), n));
  CHECK(store.begin_write() == nullptr);
  const auto elapsed = std::chrono::steady_clock::now() - t0;
  CHECK(elapsed < std::chrono::milliseconds(100));
  CHECK(store.skipped() == 2 && store.latest_version() == version);
  CHECK(store.pin().version() == version);  // readers are unaffected by a skipped publish

  // The pinned snapshots stayed intact while the writer kept trying.
  CHECK(pins[0].version() == 0 && all_equal(pins[0].data(), n, 0.0f));

  pins[1].release();  // one slot comes free: now num_slots - 2 pins, so publishing always works
  CHECK(store.pinned_slots_hint() == store.num_slots() - 2);
  params.assign(n, 7.0f);
  for (int k = 0; k < 2 * store.num_slots(); ++k) CHECK(store.publish(params.data(), n));
  CHECK(store.skipped() == 2);
  Pin latest = store.pin();
  CHECK(latest.version() == store.latest_version() && all_equal(latest.data(), n, 7.0f));
  CHECK(pins[2].version() == 2 && all_equal(pins[2].data(), n, 1.0f));

  pins.clear();
  latest.release();
  CHECK(store.pinned_slots_hint() == 0);
}

// The guarantee behind the default pool size: with at most num_slots - 2 pins outstanding, no
// publish is skipped, whichever versions those pins hold.
void test_n_minus_2_pins_never_skip() {
  const std::size_t n = 8;
  SnapshotStore store(n, 6);
  std::vector<float> params(n, 3.0f);
  std::vector<Pin> pins(static_cast<std::size_t>(store.num_slots() - 2));
  for (int step = 0; step < 1000; ++step) {
    // Replace one pin per step, chosen so that pins of many different ages coexist.
    pins[static_cast<std::size_t>(step * 7 % 11) % pins.size()] = store.pin();
    CHECK(store.publish(params.data(), n));
  }
  CHECK(store.skipped() == 0 && store.publishes() == 1000);
}

void test_abandoned_write_is_invisible() {
  const std::size_t n = 16;
  SnapshotStore store(n, 3);
  std::vector<float> params(n, 1.0f);
  CHECK(store.publish(params.data(), n));

  float* buf = store.begin_write();
  CHECK(buf != nullptr);
  CHECK(store.begin_write() == buf);  // the reservation is kept until commit or abandon
  for (std::size_t i = 0; i < n; ++i) buf[i] = -1.0f;
  store.abandon_write();
  store.abandon_write();  // harmless without a reservation
  CHECK_THROWS(std::logic_error, store.commit());

  Pin pin = store.pin();
  CHECK(pin.version() == 1 && all_equal(pin.data(), n, 1.0f));
  CHECK(store.publishes() == 1 && store.latest_version() == 1);

  buf = store.begin_write();
  CHECK(buf != nullptr);
  for (std::size_t i = 0; i < n; ++i) buf[i] = 2.0f;
  CHECK_THROWS(std::invalid_argument, store.commit(1));  // not newer: reservation survives
  CHECK(store.commit() == 2);
  CHECK(all_equal(store.pin().data(), n, 2.0f));
  CHECK(pin.version() == 1 && all_equal(pin.data(), n, 1.0f));
}

void test_pin_is_move_only_owner() {
  SnapshotStore store(4, 3);
  Pin a = store.pin();
  CHECK(store.pinned_slots_hint() == 1);
  Pin b = std::move(a);
  CHECK(!a.valid() && a.data() == nullptr && a.size() == 0);  // NOLINT(bugprone-use-after-move)
  CHECK(b.valid() && store.pinned_slots_hint() == 1);
  a.release();  // releasing an invalid pin is a no-op
  b.release();
  b.release();
  CHECK(!b.valid() && store.pinned_slots_hint() == 0);

  Pin c = store.pin();
  Pin d = store.pin();
  c = std::move(d);  // c's own pin is released first, exactly once
  CHECK(store.pinned_slots_hint() == 1);
  c = Pin();
  CHECK(store.pinned_slots_hint() == 0);
}

// Only that it runs cleanly (under the sanitizers) and reports sane numbers; timing targets are
// checked on optimised builds, not here.
void test_bench_runs() {
  const rlpar::SnapshotBench b = rlpar::bench_snapshot(256, 2000, 3);
  CHECK(b.pin_unpin_ns > 0 && b.publish_us_per_mb > 0 && b.memcpy_us_per_mb > 0);
  CHECK_THROWS(std::invalid_argument, rlpar::bench_snapshot(0, 1, 1));
  CHECK_THROWS(std::invalid_argument, rlpar::bench_snapshot(1, 0, 1));
  CHECK_THROWS(std::invalid_argument, rlpar::bench_snapshot(1, 1, 0));

  // Four readers and the writer race on the store (TSan sees it).
  const rlpar::SnapshotReadersBench r = rlpar::bench_snapshot_readers(256, 4, 0.05);
  CHECK(r.pins_per_s > 0 && r.publishes_per_s > 0);
  CHECK(r.skipped_fraction >= 0 && r.skipped_fraction <= 1);
  CHECK_THROWS(std::invalid_argument, rlpar::bench_snapshot_readers(0, 1, 0.01));
  CHECK_THROWS(std::invalid_argument, rlpar::bench_snapshot_readers(1, 0, 0.01));
  CHECK_THROWS(std::invalid_argument, rlpar::bench_snapshot_readers(1, 1025, 0.01));
  CHECK_THROWS(std::invalid_argument, rlpar::bench_snapshot_readers(1, 1, 0.0));
}

}  // namespace

int main() {
  test_constructor_validates();
  test_initial_snapshot_is_zeros_at_version_0();
  test_publish_versions_and_alignment();
  test_skip_when_every_slot_is_pinned_then_recover();
  test_n_minus_2_pins_never_skip();
  test_abandoned_write_is_invisible();
  test_pin_is_move_only_owner();
  test_bench_runs();
  return rlpar_test::finish("test_snapshot");
}
