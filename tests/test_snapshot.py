"""SnapshotStore from Python: zero-copy pinned views, skips, and readers racing a publisher."""

from __future__ import annotations

import collections
import threading

import numpy as np
import pytest

import rlpar
from rlpar import _native

N = 1000


def pattern(version: int) -> np.ndarray:
    """Exactly representable in float32, different for every version and element."""
    return ((version % 4096) * 1024 + np.arange(N)).astype(np.float32)


def test_pin_before_first_publish_is_zeros_at_version_zero() -> None:
    store = rlpar.SnapshotStore(N)
    snap = store.pin()
    assert snap.version == 0
    assert not snap.params.any()


def test_publish_then_pin_reads_a_read_only_zero_copy_view() -> None:
    store = rlpar.SnapshotStore(N, num_slots=4)
    assert store.publish(pattern(1))
    snap = store.pin()
    view = snap.params
    assert snap.version == 1 == store.latest_version
    np.testing.assert_array_equal(view, pattern(1))
    assert not view.flags.writeable
    with pytest.raises(ValueError):
        view[0] = 1.0
    assert np.shares_memory(view, snap.params)


def test_view_outlives_the_snapshot_object_and_keeps_its_pin() -> None:
    store = rlpar.SnapshotStore(N, num_slots=3)
    store.publish(pattern(1))
    snap = store.pin()
    view = snap.params
    snap.release()
    del snap
    for v in range(2, 40):  # 3 slots: the pinned one must never be reused while the view lives
        store.publish(pattern(v))
    np.testing.assert_array_equal(view, pattern(1))


def test_publish_skips_instead_of_waiting_when_every_spare_slot_is_pinned() -> None:
    store = rlpar.SnapshotStore(N, num_slots=3)
    held = []
    version = 0
    while store.skipped == 0 and version < 10:
        version += 1
        store.publish(pattern(version))
        held.append(store.pin())
    assert store.skipped == 1
    assert not store.publish(pattern(100))
    assert store.skipped == 2
    held.clear()
    assert store.publish(pattern(101), version=101)
    assert store.pin().version == 101


def test_versions_must_grow() -> None:
    store = rlpar.SnapshotStore(N)
    store.publish(pattern(5), version=5)
    with pytest.raises(ValueError, match="version must be > latest_version"):
        store.publish(pattern(5), version=5)


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "match"),
    [
        ((0,), {}, ValueError, "size must be >= 1"),
        ((N,), {"num_slots": 2}, ValueError, "num_slots"),
        ((N,), {"num_slots": 256}, ValueError, "num_slots"),
    ],
)
def test_bad_store_arguments(args, kwargs, error, match) -> None:
    with pytest.raises(error, match=match):
        rlpar.SnapshotStore(*args, **kwargs)


def test_bad_publish_arguments() -> None:
    store = rlpar.SnapshotStore(N)
    with pytest.raises(TypeError, match="float32"):
        store.publish(np.zeros(N))
    with pytest.raises(ValueError, match=f"{N} values"):
        store.publish(np.zeros(N + 1, np.float32))
    with pytest.raises(ValueError, match="contiguous"):
        store.publish(np.zeros(2 * N, np.float32)[::2])


def test_net_forward_reads_a_snapshot_in_place() -> None:
    net = rlpar.Net(rlpar.mlp_spec(4, [rlpar.Categorical(2), rlpar.Value()]))
    params = net.init_params(seed=0)
    store = rlpar.SnapshotStore(net.num_params)
    store.publish(params)
    obs = np.random.default_rng(0).standard_normal((8, 4)).astype(np.float32)
    with store.pin() as snap:
        np.testing.assert_array_equal(net.forward(snap, obs), net.forward(params, obs))
        out, tape = net.forward_train(snap, obs)
    grad = net.backward(tape, np.ones_like(out))  # the tape keeps the snapshot alive
    _, tape2 = net.forward_train(params, obs)
    np.testing.assert_array_equal(grad, net.backward(tape2, np.ones_like(out)))
    small = rlpar.SnapshotStore(3)
    with pytest.raises(ValueError, match="snapshot holds 3 values"):
        net.forward(small.pin(), obs)
    released = store.pin()
    released.release()
    with pytest.raises(ValueError, match="released"):
        net.forward(released, obs)


def test_eight_readers_hold_views_while_the_learner_publishes() -> None:
    """Each reader keeps its last 3 views and re-checks them later: pinned data never changes."""
    readers, held_per_reader = 8, 3
    store = rlpar.SnapshotStore(N, num_slots=readers * held_per_reader + 2)
    store.publish(pattern(1))
    stop = threading.Event()
    errors: list[str] = []
    reads = [0] * readers

    def reader(r: int) -> None:
        held: collections.deque = collections.deque(maxlen=held_per_reader)
        last = 0
        while not stop.is_set():
            snap = store.pin()
            version, view = snap.version, snap.params
            snap.release()
            if version < last:
                errors.append(f"reader {r}: version went back from {last} to {version}")
            last = version
            held.append((version, view))
            for v, old in held:
                if not np.array_equal(old, pattern(v)):
                    errors.append(f"reader {r}: snapshot {v} changed while pinned")
            reads[r] += 1

    threads = [threading.Thread(target=reader, args=(r,)) for r in range(readers)]
    for t in threads:
        t.start()
    try:
        buf = np.empty(N, np.float32)
        for version in range(2, 3000):
            buf[:] = pattern(version)
            assert store.publish(buf), "no publish may be skipped with enough slots"
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=30)
    assert not any(t.is_alive() for t in threads)
    assert not errors, errors[:5]
    assert store.skipped == 0
    assert sum(reads) > readers


def test_views_and_tapes_keep_the_store_alive() -> None:
    net = rlpar.Net(rlpar.mlp_spec(4, [rlpar.Value()]))
    store = rlpar.SnapshotStore(net.num_params)
    store.publish(net.init_params(seed=0))
    snap = store.pin()
    view = snap.params
    out, tape = net.forward_train(snap, np.ones((2, 4), np.float32))
    expected = view.copy()
    del store, snap
    np.testing.assert_array_equal(view, expected)
    assert net.backward(tape, np.ones_like(out)).shape == (net.num_params,)


def test_arrays_that_went_through_pickle_are_accepted() -> None:
    """A pickled float32 array has an equal but distinct dtype object (Ray sends arrays so)."""
    import pickle

    net = rlpar.Net(rlpar.mlp_spec(4, [rlpar.Categorical(2), rlpar.Value()]))
    params = pickle.loads(pickle.dumps(net.init_params(seed=0)))
    store = rlpar.SnapshotStore(net.num_params)
    assert store.publish(params)
    obs = pickle.loads(pickle.dumps(np.ones((3, 4), np.float32)))
    np.testing.assert_array_equal(net.forward(params, obs), net.forward(store.pin(), obs))


def test_reader_scaling_bench_reports_rates_and_rejects_bad_arguments() -> None:
    r = _native.bench_snapshot_readers(1024, 3, 0.02)
    assert r["pins_per_s"] > 0 and r["publishes_per_s"] > 0
    assert 0.0 <= r["skipped_fraction"] <= 1.0
    with pytest.raises(ValueError, match=r"1 <= readers <= 1024.*got 1024, 0, "):
        _native.bench_snapshot_readers(1024, 0, 0.01)
    with pytest.raises(ValueError, match=r"expected n_floats > 0, got -1"):
        _native.bench_snapshot_readers(-1, 1, 0.01)
    with pytest.raises(ValueError, match=r"0 < seconds <= 600"):
        _native.bench_snapshot_readers(8, 1, float("nan"))
