"""The learner thread: a thin shell around ``agent.learn`` (batching, policy lag, publishing),
and between two steps, the run's hooks (stop rules, target checks, checkpoints)."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from rlpar.agent import Agent, LearnerState
from rlpar.data import Batch, Rollout
from rlpar.nn import Net
from rlpar.runtime.common import POLL_S, ActorHandle, EpisodeLog, ItemQueue
from rlpar.runtime.gil_meter import GilTimes, ThreadMeter
from rlpar.snapshot import SnapshotStore

__all__ = ["Learner", "LearnerHook", "LearnerStats", "VersionClock"]

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


class Learner:
    """Consumes B rollouts per step, calls ``agent.learn``, publishes version ``steps + 1``."""

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
    ) -> None:
        self.agent, self.net, self.state, self.store = agent, net, state, store
        self.actors = actors
        self.batch_rollouts = batch_rollouts
        self.max_policy_lag = max_policy_lag
        self.deterministic = deterministic
        self.clock = clock
        self.episodes = episodes
        self.stats = stats if stats is not None else LearnerStats()

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
            while not stop.is_set():
                rollouts = self._gather(stop, in_queue)
                if rollouts is None:
                    return
                self.step(rollouts)
                for hook in hooks:
                    if stop.is_set():
                        break
                    hook()
                if (gil := meter.poll()) is not None:
                    self.stats.gil = gil
        finally:
            self.stats.gil = meter.read()  # the whole loop, however it ended

    def step(self, rollouts: list[Rollout]) -> dict[str, float]:
        """One learner step on exactly these rollouts; hands their buffers back to the actors."""
        s = self.stats
        if self.deterministic:
            rollouts.sort(key=lambda r: (r.actor, r.seq))
        batch = Batch.stack(rollouts, self.version)
        ended = [e for r in rollouts for e in r.ended]  # read before the actors reuse them
        for r in rollouts:
            self.actors[r.actor].free.put(r)
        if self.episodes is not None:
            self.episodes.add_many(ended)  # deterministic mode: logged in batch order
        t0 = time.perf_counter()
        metrics = self.agent.learn(self.net, self.state, batch)
        self.state.steps += 1
        t1 = time.perf_counter()
        if not self.store.publish(self.state.params, version=self.version):
            s.skipped_publishes += 1
        if self.deterministic:  # only deterministic actors wait for versions
            self.clock.advance(self.version)
        s.publish_s += time.perf_counter() - t1
        s.learn_s += t1 - t0
        s.steps += 1
        s.samples += batch.rewards.size
        lags = [batch.learner_version - r.version for r in rollouts]  # np.mean/max: ~10 us
        s.lag_mean = sum(lags) / len(lags)
        s.lag_max = max(lags)
        s.metrics = metrics
        s.last_batch = (batch.actions, batch.mask)  # the batch is the learner's own copy
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
