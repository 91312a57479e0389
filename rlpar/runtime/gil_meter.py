"""The GIL meter: how much of a thread's time it held the GIL, and what that predicts.

Python threads run their bytecode one at a time, so a thread's *GIL-held* time is serial: N
threads that each hold the GIL a share h of their time cannot together run more than 1 / h
threads' worth of work, however many cores there are (Amdahl's law over the held share). rlpar
measures, per thread:

- ``native``: time inside rlpar's native calls that released the GIL (the bindings' release
  guard counts it, per thread: `rlpar._native.gil_meter`);
- ``wait``: time those calls then waited to take the GIL back while another thread held it
  (the convoy effect: a short release can cost a switch interval, 5 ms by default);
- ``held``: the thread's CPU time outside those calls (`time.thread_time` less the CPU time
  the release guard counted inside them): Python bytecode, and native work done without
  releasing the GIL. A thread waiting on a queue, a pipe or the GIL itself takes no CPU time,
  so waits do not count as held; nor does a released call's time off the CPU (waiting for its
  thread pool's workers, or preempted), which is native wall time but not CPU time.

Shares are of the thread's wall time over the same interval; the rest (``1 - held - native -
wait``) is time the thread waited on something else (a queue, a worker process, the OS).
`ThreadMeter` must be made and read on the thread it measures.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from rlpar import _native

__all__ = ["GilTimes", "ThreadMeter", "actor_ceiling"]


@dataclass(frozen=True)
class GilTimes:
    """Seconds of one thread over an interval (see the module docstring)."""

    wall_s: float = 0.0
    cpu_s: float = 0.0
    native_s: float = 0.0
    wait_s: float = 0.0
    native_cpu_s: float = 0.0
    """The thread's CPU time inside the released calls (at most ``native_s``)."""

    @property
    def held_s(self) -> float:
        return max(0.0, self.cpu_s - self.native_cpu_s)

    def shares(self) -> dict[str, float]:
        """{"held", "wait", "native"}: shares of the wall time (0 for an empty interval)."""
        if self.wall_s <= 0:
            return {"held": 0.0, "wait": 0.0, "native": 0.0}
        return {
            "held": min(1.0, self.held_s / self.wall_s),
            "wait": min(1.0, self.wait_s / self.wall_s),
            "native": min(1.0, self.native_s / self.wall_s),
        }

    def __add__(self, other: GilTimes) -> GilTimes:
        return GilTimes(
            self.wall_s + other.wall_s,
            self.cpu_s + other.cpu_s,
            self.native_s + other.native_s,
            self.wait_s + other.wait_s,
            self.native_cpu_s + other.native_cpu_s,
        )

    def __sub__(self, other: GilTimes) -> GilTimes:
        return GilTimes(
            self.wall_s - other.wall_s,
            self.cpu_s - other.cpu_s,
            self.native_s - other.native_s,
            self.wait_s - other.wait_s,
            self.native_cpu_s - other.native_cpu_s,
        )


def _now() -> GilTimes:
    native_s, wait_s, _, native_cpu_s = _native.gil_meter()
    return GilTimes(time.perf_counter(), time.thread_time(), native_s, wait_s, native_cpu_s)


class ThreadMeter:
    """The calling thread's `GilTimes` since this meter was made (make and read it on the
    thread it measures: the native counters and `time.thread_time` are per thread).

    A `read` costs a few µs (a native call and a CPU-clock read), a share of a short fused
    unroll: loops call `poll`, which reads at most every ``interval_s``."""

    def __init__(self, interval_s: float = 0.05) -> None:
        self._start = _now()
        self._interval_s = interval_s
        self._next = 0.0  # the first poll reads

    def read(self) -> GilTimes:
        return _now() - self._start

    def poll(self) -> GilTimes | None:
        """`read` when ``interval_s`` has passed since the last poll that read, else None."""
        now = time.perf_counter()
        if now < self._next:
            return None
        self._next = now + self._interval_s
        return self.read()


def actor_ceiling(actor_held: float, learner_held: float = 0.0) -> float:
    """How many actor threads the GIL can serve before it is busy all the time: N actors that
    each hold it ``actor_held`` of their time, beside a learner that holds it ``learner_held``,
    fit while N * actor_held + learner_held <= 1 (inf when actors never hold it)."""
    if actor_held <= 0:
        return math.inf
    return max(0.0, 1.0 - learner_held) / actor_held
