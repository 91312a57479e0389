"""The learner thread: a thin shell around ``agent.learn`` (batching, policy lag, publishing),
and between two steps, the run's hooks (stop rules, target checks, checkpoints).

The run's plan (`rlpar.runtime.plan`) gives the learner its loop: ``python`` takes each batch
in Python (`Learner._gather`, `Batch.stack`) and calls ``agent.learn``; ``native_inbox`` takes
it natively (`NativeInbox`: the rollouts popped from the inbox, copied side by side and handed
back in native code, no Python per rollout) and calls ``agent.learn``; ``native_learn`` runs
the take, the optimizer steps and the publish in native calls (`NativeLoop`)."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rlpar import _native
from rlpar.agent import Agent, LearnerState
from rlpar.data import ARRAY_FIELDS, ENV_AXIS, Batch, Rollout
from rlpar.learner_step import NativeLearn, learner_split
from rlpar.nn import Net
from rlpar.runtime.common import POLL_S, ActorHandle, ActorState, EpisodeLog, ItemQueue
from rlpar.runtime.gil_meter import GilTimes, ThreadMeter
from rlpar.runtime.handoff import HandOff
from rlpar.runtime.plan import LEARNER_LOOPS
from rlpar.snapshot import SnapshotStore

__all__ = [
    "LEARN_LOOP_S",
    "Learner",
    "LearnerHook",
    "LearnerStats",
    "NativeInbox",
    "NativeLoop",
    "VersionClock",
]

#: Called on the learner thread after each step, with nothing: a hook is built with what it
#: reads (the learner's state, quiet until the next step) and what it may do (decide the run's
#: stop verdict, write a checkpoint). See `Learner.run` for the order.
LearnerHook = Callable[[], None]


@dataclass
class LearnerStats:
    """Written by the learner thread only; read by the main thread for monitoring."""

    steps: int = 0
    samples: int = 0
    dropped_rollouts: int = 0
    skipped_publishes: int = 0
    lag_mean: float = 0.0
    lag_max: int = 0
    queue_wait_s: float = 0.0
    learn_s: float = 0.0
    publish_s: float = 0.0
    metrics: dict[str, float] = field(default_factory=dict)
    gil: GilTimes = field(default_factory=GilTimes)
    """The learner thread's GIL meter since it started, as of its last step."""
    last_batch: tuple[np.ndarray, np.ndarray] | None = None
    """The last batch's actions and mask, [T, N] or [T, N, A] and [T, N] (`last_actions`)."""

    @property
    def last_actions(self) -> np.ndarray | None:
        """The valid actions of the last batch, [M] or [M, A] (for the monitor's histogram;
        selected when read, not on every learner step)."""
        if self.last_batch is None:
            return None
        actions, mask = self.last_batch
        return actions[mask]

    def add_steps(
        self,
        steps: int,
        samples: int,
        *,
        learn_s: float,
        publish_s: float,
        skipped_publishes: int,
        lag: tuple[float, int],
        metrics: dict[str, float],
    ) -> None:
        """``steps`` learner steps on ``samples`` env steps in all, as every loop counts them:
        their time learning and publishing, their publishes skipped (`SnapshotStore.publish`),
        the last batch's policy lag (mean, max) and the last step's ``metrics``."""
        self.steps += steps
        self.samples += samples
        self.learn_s += learn_s
        self.publish_s += publish_s
        self.skipped_publishes += skipped_publishes
        self.lag_mean, self.lag_max = lag
        self.metrics = metrics


class VersionClock:
    """The latest published version, for actors that wait for one (deterministic mode)."""

    def __init__(self, version: int) -> None:
        self._cv = threading.Condition()
        self._version = version

    def advance(self, version: int) -> None:
        with self._cv:
            self._version = version
            self._cv.notify_all()

    def wait_for(self, version: int, stop: threading.Event) -> bool:
        with self._cv:
            while self._version < version:
                if stop.is_set():
                    return False
                self._cv.wait(POLL_S)
        return not stop.is_set()

    def waiter(self, first: int, stop: threading.Event) -> Callable[[int], bool]:
        """An actor's ``wait_for_version`` in deterministic mode: its v-th version (from 1) is
        ``first + v - 1``."""
        return lambda v: self.wait_for(first + v - 1, stop)


class NativeInbox:
    """The learner's side of the hand-off in native calls (`rlpar._native.RolloutInbox`): a
    batch's rollouts popped from ``queue`` (waiting without the GIL), copied side by side into
    new batch arrays and their buffers handed back to the actors' free queues, with no Python
    per rollout. Every buffer of ``actors`` gets a slot of its own in ``queue`` and in its
    actor's free queue (`HandOff.reserve`) and is registered here before any thread starts;
    each rollout's version comes from its ``stamp``.

    ``release_gil``: the copies run without the GIL (for actors that never want it, those
    whose whole loop is native: `rlpar.runtime.handoff.run_native_actor_loop`); else they keep it,
    since handing it to an actor that steps a Python env costs the learner more than the copy."""

    def __init__(self, queue: HandOff[Rollout], actors: Sequence[Any], release_gil: bool) -> None:
        first = actors[0].buffers[0]
        self.queue = queue
        self.release_gil = release_gil
        self._inbox = _native.RolloutInbox(
            queue.tickets,
            [getattr(first, n) for n in ARRAY_FIELDS],
            [ENV_AXIS[n] for n in ARRAY_FIELDS],
        )
        for actor in actors:
            for r in actor.buffers:
                arrays = [getattr(r, n) for n in ARRAY_FIELDS]
                free_ticket = actor.free.reserve(r)
                self._inbox.add(queue.reserve(r), arrays, actor.free.tickets, free_ticket, r.stamp)
        self._fields = [
            (n, getattr(first, n).dtype, getattr(first, n).shape, ENV_AXIS[n]) for n in ARRAY_FIELDS
        ]

    def batch_arrays(self, count: int) -> dict[str, np.ndarray]:
        """Empty arrays for a batch of ``count`` rollouts, by field (`rlpar.data.ARRAY_FIELDS`)."""
        arrays: dict[str, np.ndarray] = {}
        for name, dtype, shape, axis in self._fields:
            batch_shape = list(shape)
            batch_shape[axis] *= count
            arrays[name] = np.empty(batch_shape, dtype)
        return arrays

    def take(
        self,
        stop: threading.Event,
        count: int,
        version: int,
        max_lag: int | None,
        stats: LearnerStats,
    ) -> Batch | None:
        """The next ``count`` rollouts as a batch for learner ``version`` (None once ``stop``
        is set); rollouts more than ``max_lag`` versions old are handed back and counted."""
        arrays = self.batch_arrays(count)
        dst = list(arrays.values())
        versions = np.empty(count, np.int64)
        filled = 0
        t0 = time.perf_counter()
        while filled < count:
            if stop.is_set():
                return None
            filled, dropped = self._inbox.take(
                dst, versions, filled, version, max_lag, POLL_S, self.release_gil
            )
            stats.dropped_rollouts += dropped
        stats.queue_wait_s += time.perf_counter() - t0
        return Batch(
            **arrays, versions=versions, policy_lag=version - versions, learner_version=version
        )


#: Seconds a call of the learner's native loop runs before its thread returns to Python for its
#: stats, hooks and the stop flag (`NativeLoop`): the stop rules and checkpoints are looked at
#: every 10 ms instead of after every step, and a stopping run waits at most this long.
LEARN_LOOP_S = 0.01


class NativeLoop:
    """The learner's whole loop in native calls (`rlpar._native.learn_loop`), for an agent whose
    `rlpar.Agent.native_learn` says what its `learn` does, beside actor threads whose rollouts
    it takes natively (`NativeInbox`; their loops native, or stepping Python envs): each call
    takes batches, runs the agent's optimizer steps on them and publishes each as the next
    version without the GIL, for up to `LEARN_LOOP_S`; the learner thread takes the GIL back
    only to count the steps, update its stats and run its hooks. The batch arrays are this
    loop's own and reused; a batch that a call leaves part-taken stays in them for the next."""

    def __init__(self, inbox: NativeInbox, plan: NativeLearn, learner: Learner) -> None:
        self.inbox, self.plan, self.learner = inbox, plan, learner
        count = learner.batch_rollouts
        self.arrays = inbox.batch_arrays(count)
        #: the batch's fields in the inbox's layout order: the arrays the native take fills
        self.names = list(self.arrays)
        self.versions = np.zeros(count, np.int64)
        self.filled = 0
        self.done = np.zeros(2, np.int64)
        self.samples = int(self.arrays["rewards"].size)
        #: the take's arrays and the step's batch at once (the native loop's batch view)
        self.batch = Batch(**self.arrays, versions=self.versions, policy_lag=self.versions,
                           learner_version=1)  # fmt: skip
        pool = learner.state.pool
        #: how the step uses the learner's threads (`rlpar.learner_split`); "shards" has no
        #: loop (the plan chose another, `rlpar.learner_step.splits_into_shards`)
        self.split = learner_split(learner.net, pool, self.batch)
        if self.split == "shards":
            raise RuntimeError("the plan's native learn loop: the step is split into shards")
        self.pool = pool.native if pool is not None and self.split == "rows" else None
        state, net = learner.state, learner.net
        if state.grad is None or state.grad.shape != (net.num_params,):
            state.grad = np.empty(net.num_params, np.float32)
        self.grad = state.grad

    @staticmethod
    def plan_for(learner: Learner, inbox: NativeInbox | None) -> NativeLearn | None:
        """The agent's `rlpar.Agent.native_learn` where the loop can run it: batches taken
        natively and one of rlpar's optimizers."""
        if inbox is None:
            return None
        plan = learner.agent.native_learn(learner.net, learner.state)
        if plan is None or learner.state.optimizer.native_step() is None:
            return None
        return plan

    def run(self) -> int:
        """One call: the learner steps it took (0 when no whole batch came within the budget)."""
        ln, plan = self.learner, self.plan
        state, s = ln.state, ln.stats
        optim = state.optimizer.native_step()  # this step's count and learning rate
        if optim is None:
            raise RuntimeError("the learner's optimizer no longer has a native step")
        try:
            r = _native.learn_loop(
                self.inbox._inbox, self.batch, self.names, self.versions, self.filled, ln.version,
                ln.max_policy_lag, ln.net, state.params, self.grad,
                plan.loss.native, passes=plan.passes, max_grad_norm=float(plan.max_grad_norm),
                optimizer=optim, store=ln.store, pool=self.pool,
                budget_s=LEARN_LOOP_S, done=self.done,
            )  # fmt: skip
        except BaseException:
            # A step raised (a Python layer's error): what finished before it is applied and
            # published; count it, so that the state and the optimizer agree with the store.
            state.count_steps(applied=int(self.done[1]), learner_steps=int(self.done[0]))
            raise
        self.filled = r.filled
        s.dropped_rollouts += r.dropped
        s.queue_wait_s += r.take_s
        n = r.batches
        if n == 0:
            return 0
        # Only the last batch can hold a step that was not finite (the call ends after it).
        passes = r.passes
        state.count_steps(applied=r.applied, norms=[norm for norm, _ in passes], learner_steps=n)
        metrics: dict[str, float] = {}
        if passes:  # else a learner without steps (`NativeLearn.passes` = 0)
            metrics = r.metrics
            metrics["grad_norm"] = passes[-1][0]
            metrics["nonfinite_grad_steps"] = state.extra.get("nonfinite_grad_steps", 0)
        metrics["learning_rate"] = state.optimizer.lr
        s.add_steps(
            n, n * self.samples, learn_s=r.learn_s, publish_s=r.publish_s,
            skipped_publishes=r.skipped_publishes, lag=(r.lag_mean, r.lag_max), metrics=metrics,
        )  # fmt: skip
        if self.filled == 0:  # the arrays hold the last batch whole
            s.last_batch = (self.arrays["actions"].copy(), self.arrays["mask"].copy())
        return n


class Learner:
    """Consumes B rollouts per step, calls ``agent.learn``, publishes version ``steps + 1``.

    Deterministic mode: the actors make the rollouts of version v + 1 only once step v has
    published it (`VersionClock`), so right after a step every rollout made so far has been
    consumed. There the learner reads each actor's `checkpoint_state` (`actor_states`): the
    actors as the rollouts of steps <= ``steps`` left them, whatever they have done since."""

    def __init__(
        self,
        *,
        agent: Agent,
        net: Net,
        state: LearnerState,
        store: SnapshotStore,
        actors: Sequence[ActorHandle],
        batch_rollouts: int,
        max_policy_lag: int | None,
        deterministic: bool,
        clock: VersionClock,
        episodes: EpisodeLog | None = None,  # log the episodes that ride with rollouts
        stats: LearnerStats | None = None,
        loop: str = "python",
        inbox: NativeInbox | None = None,
    ) -> None:
        """``loop``: the run's plan for the learner (`rlpar.runtime.plan.LEARNER_LOOPS`);
        ``inbox``: the native take over the run's queue, for "native_inbox" and
        "native_learn" (built before any actor thread starts)."""
        if (loop != "python") != (inbox is not None) or loop not in LEARNER_LOOPS:
            raise ValueError(f"learner loop {loop!r} with inbox {inbox!r}")
        self.agent, self.net, self.state, self.store = agent, net, state, store
        self.actors = actors
        self.batch_rollouts = batch_rollouts
        self.max_policy_lag = max_policy_lag
        self.deterministic = deterministic
        self.clock = clock
        self.episodes = episodes
        self.stats = stats if stats is not None else LearnerStats()
        self.loop = loop
        #: takes the batches natively from its queue when set (the plan's native loops)
        self.inbox = inbox
        #: deterministic mode: each actor's `checkpoint_state` as of the learner's last step
        #: (before it, as restored); what the run's checkpoints keep of the actors. Else None.
        self.actor_states: list[ActorState] | None = (
            [a.checkpoint_state() for a in actors] if deterministic else None
        )

    @property
    def version(self) -> int:
        """Version of the parameters the learner holds (= learner steps + 1)."""
        return self.state.steps + 1

    def run(
        self,
        stop: threading.Event,
        in_queue: ItemQueue[Rollout],
        hooks: Sequence[LearnerHook] = (),
    ) -> None:
        """Step until ``stop`` is set, running ``hooks`` in order after every step: between two
        steps is the only time the learner's state is quiet. Once a hook (or anyone) sets
        ``stop``, the later hooks of that round are skipped: the run is ending, and whoever
        runs it writes the final checkpoint after this thread returns."""
        meter = ThreadMeter()
        try:
            step = self._loop(in_queue)
            while not stop.is_set():
                taken = step(stop)
                if taken is None:
                    return
                if taken == 0:
                    continue  # no step: nothing for the hooks
                for hook in hooks:
                    if stop.is_set():
                        break
                    hook()
                if (gil := meter.poll()) is not None:
                    self.stats.gil = gil
        finally:
            self.stats.gil = meter.read()  # the whole loop, however it ended

    def _loop(self, in_queue: ItemQueue[Rollout]) -> Callable[[threading.Event], int | None]:
        """The plan's loop as one round per call: the learner steps it took (0: none yet), None
        once ``stop`` is set. A batch source (Python gather, native inbox) under the agent's
        ``learn``, or the native learn loop, which takes and steps in the same native call."""
        inbox = self.inbox
        if inbox is not None and inbox.queue is not in_queue:
            raise ValueError("the learner's native inbox takes from another queue")
        if self.loop == "native_learn":
            plan = NativeLoop.plan_for(self, inbox)
            if inbox is None or plan is None:
                raise RuntimeError("the run's plan chose the native learn loop; it cannot run")
            loop = NativeLoop(inbox, plan, self)
            return lambda stop: loop.run()
        if inbox is not None:
            return lambda stop: self._take_and_learn(stop, inbox)
        return lambda stop: self._gather_and_step(stop, in_queue)

    def _take_and_learn(self, stop: threading.Event, inbox: NativeInbox) -> int | None:
        batch = inbox.take(stop, self.batch_rollouts, self.version, self.max_policy_lag, self.stats)
        if batch is None:
            return None
        self._learn(batch, inbox.release_gil)
        return 1

    def _gather_and_step(self, stop: threading.Event, in_queue: ItemQueue[Rollout]) -> int | None:
        rollouts = self._gather(stop, in_queue)
        if rollouts is None:
            return None
        self.step(rollouts)
        return 1

    def step(self, rollouts: list[Rollout]) -> dict[str, float]:
        """One learner step on exactly these rollouts; hands their buffers back to the actors.
        Deterministic mode: then `actor_states`, then the next version for the actors."""
        if self.deterministic:
            rollouts.sort(key=lambda r: (r.actor, r.seq))
        batch = Batch.stack(rollouts, self.version)
        ended = [e for r in rollouts for e in r.ended]  # read before the actors reuse them
        for r in rollouts:
            self.actors[r.actor].free.put(r)
        if self.episodes is not None:
            self.episodes.add_many(ended)  # deterministic mode: logged in batch order
        metrics = self._learn(batch)
        if self.deterministic:
            # Each actor has made its rollouts of this version (the learner took them after
            # the actor's copy) and waits for the next: read them before releasing it.
            self.actor_states = [a.checkpoint_state() for a in self.actors]
            self.clock.advance(self.version)
        return metrics

    def _learn(self, batch: Batch, release_gil: bool = False) -> dict[str, float]:
        """``agent.learn`` on ``batch`` (the learner's own copy), the publish, the stats."""
        t0 = time.perf_counter()
        metrics = self.agent.learn(self.net, self.state, batch)
        self.state.count_steps(learner_steps=1)
        t1 = time.perf_counter()
        release = True if release_gil else None
        published = self.store.publish(self.state.params, version=self.version, release_gil=release)
        lags = batch.policy_lag.tolist()  # np.mean/max: ~10 us
        self.stats.add_steps(
            1, batch.rewards.size, learn_s=t1 - t0, publish_s=time.perf_counter() - t1,
            skipped_publishes=0 if published else 1, lag=(sum(lags) / len(lags), max(lags)),
            metrics=metrics,
        )  # fmt: skip
        self.stats.last_batch = (batch.actions, batch.mask)  # the batch is the learner's own copy
        return metrics

    def _gather(self, stop: threading.Event, in_queue: ItemQueue[Rollout]) -> list | None:
        rollouts: list[Rollout] = []
        t0 = time.perf_counter()
        while len(rollouts) < self.batch_rollouts:
            if stop.is_set():
                return None
            try:
                r = in_queue.get(timeout=POLL_S)
            except queue.Empty:
                continue
            r.read_stamp()  # a native actor loop's rollout: its version and seq
            lag = self.version - r.version
            if self.max_policy_lag is not None and lag > self.max_policy_lag:
                self.stats.dropped_rollouts += 1
                self.actors[r.actor].free.put(r)
                continue
            rollouts.append(r)
        self.stats.queue_wait_s += time.perf_counter() - t0
        return rollouts
