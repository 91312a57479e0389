"""`HandOff`: the runtime's queue of Python objects between threads, with its blocking waits and
wake-ups outside the GIL.

A `queue.Queue` is Python code around locks: a put that wakes a blocked getter runs
`threading.Condition`'s bookkeeping with the GIL held (the learner's step hands every rollout
back to its actor's free queue that way), and a getter's blocking wait spends kernel time that
the GIL meter reads as held time. A `HandOff` keeps its items in a table of slots and passes
only the slot numbers through a native `rlpar._native.TicketQueue`: an uncontended ``put`` or
``get`` is a mutex taken and given back (0.37 µs a pair against `queue.Queue`'s 1.57 µs); a
blocking wait and the wake-up of a blocked thread (which on a VM can take tens of µs when the
thread's vCPU went idle) let go of the GIL.

An item can also be given a slot of its own for good (`reserve`): it is then queued under that
slot's number every time, and a native loop that knows the number can queue it without Python
(`rlpar._native.FusedActorLoop` hands an actor's rollout buffers to the learner that way, through
`tickets`).

It offers the part of `queue.Queue`'s interface the runtime uses (``put``, ``get``,
``put_nowait``, ``get_nowait``, ``qsize``, ``empty``, ``maxsize``), with the same exceptions
(`queue.Full`, `queue.Empty`), so `queue_get`/`queue_put` and the Ray backend take either.

`run_native_actor_loop` is an actor's side of these hand-offs when its whole loop is native
(the plan's ``native_loop``): the buffers go round between its free queue and the learner's
queue by their tickets, without Python per rollout.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import TYPE_CHECKING, Generic, TypeVar

import numpy as np

from rlpar import _native
from rlpar.runtime.common import EpisodeSink
from rlpar.runtime.envs import explain_env_error
from rlpar.runtime.gil_meter import ThreadMeter

if TYPE_CHECKING:
    from rlpar.data import Rollout
    from rlpar.runtime.actor import Actor

__all__ = ["NATIVE_LOOP_S", "HandOff", "run_native_actor_loop"]

#: How long one native call of an actor's native loop runs (`run_native_actor_loop`): between
#: two, the actor looks at the stop flag and logs the episodes that ended. The Python between
#: two calls (~60 us) is 0.6 % of it.
NATIVE_LOOP_S = 0.01

T = TypeVar("T")


class HandOff(Generic[T]):
    """A FIFO of objects between threads: at most ``maxsize`` queued (0: no bound), any number
    of putters and getters."""

    def __init__(self, maxsize: int = 0) -> None:
        if maxsize < 0:
            raise ValueError(f"maxsize: expected an int >= 0 (0: no bound), got {maxsize}")
        self.maxsize = maxsize
        self._tickets = _native.TicketQueue(maxsize)
        self._slots: list[T | None] = []
        self._vacant: list[int] = []  # slot numbers not in use
        self._reserved: dict[int, int] = {}  # id(item) -> its own slot (`reserve`)
        self._kept: list[bool] = []  # per slot: it belongs to a reserved item
        self._grow_lock = threading.Lock()

    # The slot table needs no lock: list.pop and list.append are atomic (under the GIL, and
    # per list in a free-threaded build), a slot belongs to one thread from the moment it is
    # taken from ``_vacant`` until it is given back, and the ticket queue's mutex orders the
    # putter's write of a slot before the getter's read of it.

    @property
    def tickets(self) -> _native.TicketQueue:
        """The native queue of slot numbers (for native code that queues reserved items)."""
        return self._tickets

    def reserve(self, item: T) -> int:
        """Give ``item`` a slot of its own for good and return its number: every `put` of
        ``item`` queues that number, `get` leaves the slot holding it, and queueing the number
        on `tickets` (from native code, without the GIL) is the same as ``put(item)``. The same
        number again for an item already reserved. An item must not be queued twice at once."""
        with self._grow_lock:
            slot = self._reserved.get(id(item))
            if slot is None:
                self._slots.append(item)
                self._kept.append(True)
                slot = self._reserved[id(item)] = len(self._slots) - 1
            return slot

    def put(self, item: T, block: bool = True, timeout: float | None = None) -> None:
        """Append ``item``, waiting at most ``timeout`` seconds for room (None: no limit);
        `queue.Full` if there was none."""
        slot = self._reserved.get(id(item)) if self._reserved else None
        if slot is not None:
            if not self._tickets.put(slot, timeout if block else 0.0):
                raise queue.Full
            return
        try:
            slot = self._vacant.pop()
        except IndexError:
            slot = self._grow()
        self._slots[slot] = item  # before its ticket is queued: a getter never finds it empty
        if not self._tickets.put(slot, timeout if block else 0.0):
            self._slots[slot] = None
            self._vacant.append(slot)
            raise queue.Full

    def get(self, block: bool = True, timeout: float | None = None) -> T:
        """The oldest item, waiting at most ``timeout`` seconds for one (None: no limit);
        `queue.Empty` if none came."""
        slot = self._tickets.get(timeout if block else 0.0)
        if slot is None:
            raise queue.Empty
        item = self._slots[slot]
        if not self._kept[slot]:
            self._slots[slot] = None
            self._vacant.append(slot)
        return item  # type: ignore[return-value]  # a queued slot holds its item

    def put_nowait(self, item: T) -> None:
        self.put(item, block=False)

    def get_nowait(self) -> T:
        return self.get(block=False)

    def qsize(self) -> int:
        return int(self._tickets.qsize())

    def empty(self) -> bool:
        return self.qsize() == 0

    def _grow(self) -> int:
        with self._grow_lock:  # two growers must not both read the same new length
            self._slots.append(None)
            self._kept.append(False)
            return len(self._slots) - 1


def run_native_actor_loop(
    actor: Actor,
    stop: threading.Event,
    out: HandOff[Rollout],
    episodes: EpisodeSink,
    meter: ThreadMeter,
) -> None:
    """``actor``'s loop in native calls (`rlpar._native.FusedActorLoop.run`, over envs that offer
    ``fused_loop``, `rlpar.runtime.common.NativeLoopEnvs`) of up to `NATIVE_LOOP_S` each,
    without the GIL: take a free buffer, pin the latest snapshot, fused unroll, stamp the
    rollout's version and seq (the learner reads them, `Rollout.read_stamp`), queue it on
    ``out``. Between two calls, with the GIL: the episodes that ended, the stats, the checkpoint
    copy, the stop flag. Not in deterministic mode (it waits for versions)."""
    c, envs = actor.carry, actor.envs
    c.obs = np.array(c.obs)  # written in place by the loop from now on
    c.prev_done = np.array(c.prev_done, bool)
    loop = envs.fused_loop(  # type: ignore[attr-defined]  # the plan checked NativeLoopEnvs
        actor.net,
        actor.store,
        actor.sampler,
        actor.free.tickets,
        out.tickets,
        actor.buffers,
        [out.reserve(r) for r in actor.buffers],
        c,
        seq=actor.seq,
    )
    steps = actor.buffers[0].env_steps
    stats, clock = actor.stats, time.perf_counter
    while not stop.is_set():
        t0 = clock()
        try:
            n, ends, wait_s = loop.run(NATIVE_LOOP_S)
        except ValueError as e:
            raise explain_env_error(envs, e) from e
        finally:
            actor.seq = loop.seq
        if n:
            episodes.add_many(ends)
            c.unroll_done(None)
            stats.rollouts += n
            stats.env_steps += n * steps
        stats.env_s += clock() - t0 - wait_s
        stats.queue_wait_s += wait_s
        if (gil := meter.poll()) is not None:
            stats.gil = gil
