"""The learner's native take of a batch (`NativeInbox`, `rlpar._native.RolloutInbox`): the batch
`Batch.stack` makes of the same rollouts, their buffers back in their actors' free queues, the
policy-lag drop, partial takes, bad input, and the runtime using it where it can."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import rlpar
from rlpar import _native
from rlpar.config import EnvConfig, RuntimeConfig
from rlpar.data import ARRAY_FIELDS, ENV_AXIS, Batch, Rollout
from rlpar.runtime.handoff import HandOff
from rlpar.runtime.learner import LearnerStats, NativeInbox

T, K, S = 5, 3, 2


class FakeActor:
    """What the inbox needs of an actor: its buffers and their free queue."""

    def __init__(self, seed: int, n: int = 2, state_size: int = S) -> None:
        rng = np.random.default_rng(seed)
        self.free: HandOff[Rollout] = HandOff()
        self.buffers = []
        for i in range(n):
            r = Rollout.allocate(T, K, (4,), np.float32, (), np.int64, 3, state_size=state_size)
            for name in ARRAY_FIELDS:
                a = getattr(r, name)
                bits = a.dtype == bool
                a[...] = rng.integers(0, 2, a.shape) if bits else rng.normal(size=a.shape)
            r.stamp = np.array([10 + i, i], np.int64)
            r.version, r.seq = 10 + i, i
            self.buffers.append(r)
            self.free.reserve(r)


def make(n_actors: int = 2, state_size: int = S) -> tuple[HandOff[Rollout], list, NativeInbox]:
    q: HandOff[Rollout] = HandOff(maxsize=8)
    actors = [FakeActor(seed, state_size=state_size) for seed in range(n_actors)]
    return q, actors, NativeInbox(q, actors, release_gil=False)


@pytest.mark.parametrize("release_gil", [False, True])
@pytest.mark.parametrize("state_size", [0, S])
def test_the_batch_is_batch_stack_of_the_same_rollouts(release_gil: bool, state_size: int) -> None:
    q, actors, inbox = make(state_size=state_size)
    inbox.release_gil = release_gil
    order = [actors[1].buffers[0], actors[0].buffers[1], actors[0].buffers[0]]
    for r in order:
        q.put(r)
    batch = inbox.take(threading.Event(), 3, 12, None, LearnerStats())
    assert batch is not None
    expected = Batch.stack(order, 12)
    for name in ARRAY_FIELDS:
        got, want = getattr(batch, name), getattr(expected, name)
        assert got.dtype == want.dtype and got.flags.c_contiguous, name
        np.testing.assert_array_equal(got, want, err_msg=name)
    np.testing.assert_array_equal(batch.versions, [10, 11, 10])
    np.testing.assert_array_equal(batch.policy_lag, [2, 1, 2])
    assert batch.learner_version == 12
    # every buffer went back to its own actor's free queue, in the order taken
    assert [actors[1].free.get(timeout=0)] == [actors[1].buffers[0]]
    assert [actors[0].free.get(timeout=0), actors[0].free.get(timeout=0)] == [
        actors[0].buffers[1],
        actors[0].buffers[0],
    ]
    assert q.qsize() == 0


def test_old_rollouts_are_handed_back_and_counted() -> None:
    q, actors, inbox = make()
    stats = LearnerStats()
    for r in (actors[0].buffers[0], actors[0].buffers[1], actors[1].buffers[1]):
        q.put(r)  # versions 10, 11, 11
    batch = inbox.take(threading.Event(), 2, 13, 2, stats)  # lag 3 is too old
    assert batch is not None and stats.dropped_rollouts == 1
    np.testing.assert_array_equal(batch.versions, [11, 11])
    assert actors[0].free.qsize() == 2 and actors[1].free.qsize() == 1


def test_a_take_waits_for_the_rest_and_stops_with_the_run() -> None:
    q, actors, inbox = make()
    stats, stop = LearnerStats(), threading.Event()
    q.put(actors[0].buffers[0])
    threading.Timer(0.1, q.put, args=(actors[1].buffers[0],)).start()
    batch = inbox.take(stop, 2, 10, None, stats)  # the second comes after a few polls
    assert batch is not None
    np.testing.assert_array_equal(batch.obs[:, K:], actors[1].buffers[0].obs)
    q.put(actors[0].buffers[1])
    threading.Timer(0.1, stop.set).start()
    assert inbox.take(stop, 2, 10, None, stats) is None  # stopped with one of two taken
    assert actors[0].free.qsize() == 2  # the one taken went back


def test_bad_input_is_refused() -> None:
    q, actors, inbox = make()
    native = inbox._inbox
    layout = [getattr(actors[0].buffers[0], n) for n in ARRAY_FIELDS]
    axes = [ENV_AXIS[n] for n in ARRAY_FIELDS]
    with pytest.raises(ValueError, match="one env axis each, got 8 and 7"):
        _native.RolloutInbox(q.tickets, layout, axes[:-1])
    with pytest.raises(ValueError, match=r"layout\[7\]: env axis must be 0 or 1"):
        _native.RolloutInbox(q.tickets, layout, [*axes[:-1], 2])
    bad = [a.copy() for a in layout]
    bad[2] = bad[2].astype(np.float64)
    with pytest.raises(TypeError, match=r"arrays\[2\] must be float32, got float64"):
        native.add(7, bad, actors[0].free.tickets, 0, np.zeros(2, np.int64))
    bad = [a.copy() for a in layout]
    bad[0] = bad[0][:-1]
    with pytest.raises(ValueError, match=r"arrays\[0\] must have shape \(6, 3, 4\)"):
        native.add(7, bad, actors[0].free.tickets, 0, np.zeros(2, np.int64))
    with pytest.raises(TypeError, match="stamp must be int64"):
        native.add(7, layout, actors[0].free.tickets, 0, np.zeros(2, np.int32))

    dst = [np.empty_like(a) for a in layout]
    versions = np.empty(1, np.int64)
    with pytest.raises(ValueError, match="expected 8 batch arrays, got 7"):
        native.take(dst[:-1], versions, 0, 1)
    wrong = list(dst)
    wrong[6] = np.empty((T, K, 4), np.float32)
    with pytest.raises(ValueError, match=r"dst\[6\] must have shape \(5, 3, 3\)"):
        native.take(wrong, versions, 0, 1)
    with pytest.raises(ValueError, match=r"start must be in \[0, 1\], got 2"):
        native.take(dst, versions, 2, 1)
    with pytest.raises(ValueError, match="versions must have shape"):
        native.take(dst, np.empty(0, np.int64), 0, 1)
    with pytest.raises(ValueError, match="ticket and free_ticket must be >= 0, got -1 and 0"):
        native.add(-1, layout, actors[0].free.tickets, 0, np.zeros(2, np.int64))
    with pytest.raises(ValueError, match="ticket and free_ticket must be >= 0, got 7 and -2"):
        native.add(7, layout, actors[0].free.tickets, -2, np.zeros(2, np.int64))
    with pytest.raises(ValueError, match="max_lag must be None or >= 0, got -1"):
        native.take(dst, versions, 0, 1, max_lag=-1)
    q.tickets.put(50)  # names no buffer
    with pytest.raises(ValueError, match="ticket 50, which names no registered buffer"):
        native.take(dst, versions, 0, 1, timeout=0)
    assert native.take(dst, versions, 0, 1, timeout=0) == (0, 0)  # nothing queued: no wait


def test_the_runtime_takes_batches_natively_where_it_can() -> None:
    """Native envs: taken natively, the copies without the GIL; gymnasium envs: natively for
    the learner's native loop only (an agent whose step it runs), else in Python; deterministic
    mode (batches ordered by actor): in Python."""
    runtime = RuntimeConfig(num_actors=2, envs_per_actor=4, unroll_length=5, batch_rollouts=2,
                            total_env_steps=4_000, checkpoint_interval_s=None)  # fmt: skip
    agent = rlpar.make_agent("impala")
    native = rlpar.Runner(agent, EnvConfig("rlpar/CartPole-v1"), runtime)
    assert native.learner.inbox is not None and native.learner.inbox.release_gil
    result = native.run()
    assert result.learner_steps > 0 and native.learner.stats.lag_max <= 4
    looped = rlpar.Runner(rlpar.make_agent("impala"), EnvConfig("CartPole-v1"), runtime)
    assert looped.learner.inbox is not None and looped.plan.learner.loop == "native_learn"
    looped.close()
    python = rlpar.Runner(rlpar.make_agent("appo", {"minibatches": 2}), EnvConfig("CartPole-v1"),
                          runtime)  # fmt: skip
    assert python.learner.inbox is None and python.plan.learner.loop == "python"
    python.close()
    ordered = RuntimeConfig(**{**runtime.__dict__, "deterministic": True})
    deterministic = rlpar.Runner(
        rlpar.make_agent("impala"), EnvConfig("rlpar/CartPole-v1"), ordered
    )
    assert deterministic.learner.inbox is None
    deterministic.close()


class Recording:
    """IMPALA that keeps each batch's versions and lags, and raises at ``fail_at`` steps."""

    def __new__(cls, fail_at: int | None = None):
        base = type(rlpar.make_agent("impala"))

        class Agent(base):
            lags: list[np.ndarray] = []  # noqa: RUF012  (one list per made class)

            def learn(self, net, state, batch):
                if fail_at is not None and state.steps == fail_at:
                    raise KeyError("learner exploded")
                self.lags.append(batch.policy_lag.copy())
                return super().learn(net, state, batch)

        return Agent(base.Config())


def test_stale_rollouts_are_dropped_on_the_native_path() -> None:
    runtime = RuntimeConfig(num_actors=2, envs_per_actor=4, unroll_length=5, batch_rollouts=1,
                            buffers_per_actor=3, max_policy_lag=0, total_env_steps=6_000,
                            checkpoint_interval_s=None)  # fmt: skip
    agent = Recording()
    runner = rlpar.Runner(agent, EnvConfig("rlpar/CartPole-v1"), runtime)
    assert runner.learner.inbox is not None
    runner.run()
    assert runner.learner.stats.dropped_rollouts > 0  # 6 buffers in flight, lag 0 allowed
    assert agent.lags and all(int(lag.max()) == 0 for lag in agent.lags)


def test_a_learner_error_stops_native_actors_and_is_reraised() -> None:
    runtime = RuntimeConfig(num_actors=2, envs_per_actor=4, unroll_length=5, batch_rollouts=1,
                            total_env_steps=10**9, checkpoint_interval_s=None)  # fmt: skip
    runner = rlpar.Runner(Recording(fail_at=3), EnvConfig("rlpar/CartPole-v1"), runtime)
    with pytest.raises(KeyError, match="learner exploded") as info:
        runner.run()
    assert any("learner" in note for note in getattr(info.value, "__notes__", []))
    assert not [t for t in threading.enumerate() if t.name.startswith("rlpar-")]


def test_one_thread_at_a_time_takes() -> None:
    """A second thread gets a RuntimeError while one waits inside take (not a data race)."""
    q, actors, inbox = make()
    native = inbox._inbox
    layout = [getattr(actors[0].buffers[0], n) for n in ARRAY_FIELDS]
    dst = [np.empty_like(a) for a in layout]
    got: list = []

    def wait() -> None:
        while True:
            try:  # refused only if the main thread's probe is inside take at that moment
                got.append(native.take(dst, np.empty(1, np.int64), 0, 1, timeout=30))
                return
            except RuntimeError:
                continue

    waiter = threading.Thread(target=wait)
    waiter.start()
    refused = None
    for _ in range(10_000):  # until the waiter is inside its take
        try:
            native.take([np.empty_like(a) for a in layout], np.empty(1, np.int64), 0, 1, timeout=0)
        except RuntimeError as e:
            refused = e
            break
        threading.Event().wait(0.001)
    q.put(actors[0].buffers[0])  # lets the waiter finish
    waiter.join(timeout=30)
    assert refused is not None and "another thread is using this inbox" in str(refused)
    assert got == [(1, 0)]
