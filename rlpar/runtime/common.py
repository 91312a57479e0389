"""What the actor, the learner, the runner and the Ray backend share: the stop-aware queue
calls, the stats each thread writes, the episode log, and the typed contracts (Protocols) for
an actor's stand-in and for what envs can do (run a whole unroll or an actor's whole loop
natively, step in two halves), which the run's plan asks (`rlpar.runtime.plan`)."""

from __future__ import annotations

import queue
import threading
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar, runtime_checkable

import numpy as np

from rlpar.runtime.gil_meter import GilTimes

if TYPE_CHECKING:
    from rlpar.data import Rollout
    from rlpar.nn import Net
    from rlpar.runtime.recurrent import CoreState
    from rlpar.snapshot import Snapshot

__all__ = [
    "POLL_S",
    "ActorHandle",
    "ActorState",
    "ActorStats",
    "EpisodeLog",
    "EpisodeSink",
    "FusedEnvs",
    "HalvedEnvs",
    "ItemQueue",
    "NativeLoopEnvs",
    "RecentLog",
    "ResumableEnvs",
    "queue_get",
    "queue_put",
]

POLL_S = 0.05  # how often a blocked thread looks at the stop flag

T = TypeVar("T")

#: What a checkpoint keeps of one actor (`ActorHandle.checkpoint_state`): its generators'
#: states, and the arrays that continue its episodes (None where its envs cannot save theirs).
ActorState = tuple[dict[str, Any], dict[str, np.ndarray] | None]


class ItemQueue(Protocol[T]):
    """What the runtime's threads hand items through: a `queue.Queue` or a
    `rlpar.runtime.handoff.HandOff` (its waits outside the GIL)."""

    def get(self, block: bool = True, timeout: float | None = None) -> T: ...

    def put(self, item: T, block: bool = True, timeout: float | None = None) -> None: ...

    def qsize(self) -> int: ...


def queue_get(q: ItemQueue[T], stop: threading.Event) -> T | None:
    """The next item of ``q``, or None once ``stop`` is set (never blocks past `POLL_S`)."""
    while not stop.is_set():
        try:
            return q.get(timeout=POLL_S)
        except queue.Empty:
            continue
    return None


def queue_put(q: ItemQueue[T], item: T, stop: threading.Event) -> bool:
    """Put ``item`` into ``q``; False (not put) once ``stop`` is set."""
    while not stop.is_set():
        try:
            q.put(item, timeout=POLL_S)
            return True
        except queue.Full:
            continue
    return False


@dataclass
class ActorStats:
    """Written by the actor thread only; read by the main thread for monitoring."""

    env_steps: int = 0
    rollouts: int = 0
    env_s: float = 0.0
    inference_s: float = 0.0
    queue_wait_s: float = 0.0
    side_unrolls: int = 0
    """"sync" double buffering: unrolls whose acts of one half ran on the step loop's side
    thread while the other half stepped (the others took turns: `SIDE_STEAL_LIMIT`)."""
    gil: GilTimes = field(default_factory=GilTimes)
    """The actor thread's GIL meter since it started, as of its last finished unroll."""


_Item = TypeVar("_Item")


class RecentLog(Generic[_Item]):
    """An append-only log that keeps its newest ``keep`` items, so a run of any length holds a
    bounded number (the evaluator's points, the target checks). `count` numbers every item
    ever appended; readers that consume items as they come use `since`. Any thread may append
    or read."""

    def __init__(self, keep: int = 1000) -> None:
        self._items: deque[_Item] = deque(maxlen=keep)
        self._lock = threading.Lock()
        self.count = 0

    def append(self, item: _Item) -> None:
        with self._lock:
            self._items.append(item)
            self.count += 1

    def since(self, n: int) -> tuple[list[_Item], int]:
        """(the kept items numbered ``n`` and later, the count after them): pass the count back
        next time to get only what came since."""
        with self._lock:
            new = min(self.count - n, len(self._items))
            return (list(self._items)[len(self._items) - new :] if new > 0 else []), self.count

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[_Item]:
        with self._lock:
            return iter(list(self._items))

    def __getitem__(self, i: int) -> _Item:
        with self._lock:
            return self._items[i]


class EpisodeSink(Protocol):
    """Where an actor reports the episodes that ended: (return, length) pairs."""

    def add_many(self, ended: list[tuple[float, int]]) -> None: ...


@dataclass
class EpisodeLog:
    """Finished episodes from every actor: (return, length, run env steps at the end)."""

    env_steps: Callable[[], int] = lambda: 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    episodes: list[tuple[float, int, int]] = field(default_factory=list)
    count: int = 0

    def add_many(self, ended: list[tuple[float, int]]) -> None:
        """Log (return, length) pairs: one lock and one env-step count for all of them (an
        unroll over many short episodes ends dozens, all while holding the GIL)."""
        if not ended:
            return
        steps = self.env_steps()
        with self.lock:
            self.episodes.extend([(ret, length, steps) for ret, length in ended])
            self.count += len(ended)
            if len(self.episodes) > 10_000:
                del self.episodes[: len(self.episodes) - 5_000]

    def recent(self, n: int) -> list[tuple[float, int, int]]:
        with self.lock:
            return self.episodes[-n:]


class ActorHandle(Protocol):
    """What the runner and the learner need of an actor: a local `rlpar.runtime.actor.Actor`,
    or its stand-in on the driver for an actor thread in a Ray process (`RemoteActor`)."""

    index: int

    @property
    def free(self) -> ItemQueue:
        """Rollout buffers (or slots) the learner hands back after using them."""

    stats: ActorStats

    def run(
        self,
        stop: threading.Event,
        out_queue: ItemQueue[Rollout],
        episodes: EpisodeLog,
        wait_for_version: Callable[[int], bool] | None = None,
        rollouts_per_version: int = 1,
    ) -> None:
        """Produce rollouts into ``out_queue`` until ``stop`` is set."""

    def rng_state(self) -> dict[str, Any]:
        """The sampling generators' states as of the last finished unroll (for checkpoints)."""

    def set_rng_state(self, numpy_state: dict | None, sampler_state: list | None) -> None:
        """Restore what `rng_state` returned (None leaves that generator as it is)."""

    def checkpoint_state(self) -> ActorState:
        """(`rng_state`, the arrays that let a resumed run continue this actor's episodes),
        both as of the same finished unroll. The arrays are None where the envs cannot save
        their state (see `ResumableEnvs`): a resumed run then starts new episodes."""

    def load_resume_state(self, arrays: dict[str, np.ndarray]) -> None:
        """Continue the episodes that `checkpoint_state`'s arrays describe (ValueError, with
        nothing changed, if they do not fit this actor's envs)."""


class ResumableEnvs(Protocol):
    """Vector envs whose whole state can be saved as arrays and put back (rlpar's native envs;
    any vector env can offer it). An actor over such envs checkpoints its episodes in progress
    (env states, observations, returns so far, a recurrent core's state), and a resumed run
    continues them instead of starting new ones."""

    def save_state(self) -> dict[str, np.ndarray]:
        """Every env's state as named numeric or bool arrays (new arrays)."""

    def load_state(self, state: dict[str, np.ndarray]) -> np.ndarray:
        """Put every env back in ``state``; return the observations [K, ...] they returned
        last. Raise (changing nothing) if ``state`` does not fit."""


@runtime_checkable
class FusedEnvs(Protocol):
    """Vector envs that can run a whole unroll in one GIL-free native call (forward with the
    pinned snapshot, categorical sampling, env steps): rlpar's native envs (``rlpar/...``)."""

    def check_fused(self, net: Net) -> None:
        """Raise ValueError (saying why) unless `fused_unroll` can run ``net`` on these envs."""

    def fused_unroll(
        self,
        net: Net,
        snapshot: Snapshot,
        sampler: Any,
        rollout: Rollout,
        ep_return: np.ndarray,
        ep_length: np.ndarray,
        core: CoreState | None = None,
    ) -> tuple[int, list[tuple[float, int]]]:
        """Fill ``rollout``; returns (the snapshot's version, the episodes that ended).
        ``core``: a recurrent net's `rlpar.runtime.recurrent.CoreState` (carried, updated)."""


@runtime_checkable
class NativeLoopEnvs(FusedEnvs, Protocol):
    """`FusedEnvs` that also run an actor's whole loop natively (`fused_loop`, see
    `rlpar.runtime.handoff.run_native_actor_loop`): rlpar's native envs."""

    def fused_loop(
        self,
        net: Net,
        store: Any,
        sampler: Any,
        free: Any,
        out: Any,
        buffers: Any,
        out_tickets: Any,
        carry: Any,
        seq: int = 0,
    ) -> Any:
        """The native actor loop (`rlpar._native.FusedActorLoop`) over these envs: it takes
        free buffers' tickets from ``free``, fills them and puts ``out_tickets`` on ``out``."""


@runtime_checkable
class HalvedEnvs(Protocol):
    """An actor's envs in two halves that step apart, for double buffering
    (`rlpar.runtime.env_modes.SplitEnvs`): ``halves[h]`` steps the columns ``cols[h]`` with
    ``send(actions)`` and ``recv() -> (obs, reward, terminated, truncated)``."""

    halves: list[Any]
    cols: list[slice]

    def sync_halves(self) -> list[Any] | None:
        """Each half's vector envs where every half steps in the caller's thread (a "sync"
        half: `recv` steps them there), else None."""
