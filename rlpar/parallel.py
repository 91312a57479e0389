"""`ShardPool`: the threads of one learner step.

The runtime makes one per run when ``runtime.learner_threads`` > 1 and hands it to the agent as
``LearnerState.pool``. It offers two ways to use them:

- intra-op: ``pool.native`` (an `rlpar.ThreadPool` of the same size) passed to
  `rlpar.Net.forward_train` / `rlpar.Net.backward` splits the torso's batch rows over the threads
  inside each call, natively; the Python around the calls runs once, on the learner thread.
- shards: the agent splits its batch (`rlpar.Batch.split`) and calls `ShardPool.map`; each
  shard's work is native (forward, loss, backward with the GIL released), so the shards run in
  parallel, and the Python between the native calls is what the threads take turns on.

`rlpar.loss_gradient` (``rlpar/learner_step.py``) does either for any agent's loss.
"""

from __future__ import annotations

import functools
import itertools
import queue
import threading
from collections.abc import Callable, Iterable
from typing import TypeVar

import numpy as np

from rlpar import _native
from rlpar._checks import check_int
from rlpar.config import LEARNER_SPLITS

__all__ = ["ShardPool", "ThreadPool", "even_slices"]

#: Native worker threads for intra-op parallelism: ``ThreadPool(threads)`` is the calling thread
#: plus ``threads`` - 1 workers that never touch Python. Pass one as ``pool=`` to
#: `rlpar.Net.forward` / ``forward_train`` / ``backward`` to split the torso's batch rows over
#: them; calls without one run on the calling thread alone (no hidden pool).
ThreadPool = _native.ThreadPool

T = TypeVar("T")
R = TypeVar("R")

_MAX_THREADS = 256


def even_slices(n: int, parts: int) -> list[slice]:
    """``range(n)`` in ``parts`` contiguous slices whose sizes differ by at most one (callers
    keep ``1 <= parts <= n`` when no slice may be empty)."""
    bounds = [round(i * n / parts) for i in range(parts + 1)]
    return [slice(lo, hi) for lo, hi in itertools.pairwise(bounds)]


class ShardPool:
    """``threads`` - 1 daemon helper threads plus the calling thread, which runs one share of
    every `map` itself, and ``native``: an `rlpar.ThreadPool` of ``threads`` threads (the caller
    and ``threads`` - 1 native workers) for the net's intra-op parallelism, or None when
    ``split`` is "shards" (or the pool is closed). Not for use by two callers at once (one
    learner owns it). ``split`` ("auto", "rows" or "shards") tells an agent which of the two
    ways to use (``runtime.learner_split``)."""

    def __init__(
        self, threads: int, name: str = "rlpar-learner-shard", split: str = "auto"
    ) -> None:
        check_int("threads", threads, minimum=1, maximum=_MAX_THREADS)
        if not isinstance(split, str):
            raise TypeError(f"split: expected a string, got {type(split).__name__} {split!r}")
        if split not in LEARNER_SPLITS:
            raise ValueError(f'split: expected "auto", "rows" or "shards", got {split!r}')
        self.threads = threads
        self.split = split
        self._tasks: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._workers = [
            threading.Thread(target=self._work, name=f"{name}-{i + 1}", daemon=True)
            for i in range(threads - 1)
        ]
        self._closed = False
        self._buffers: dict[int, list[np.ndarray]] = {}
        self.native: _native.ThreadPool | None = (
            None if split == "shards" else _native.ThreadPool(threads)
        )
        for w in self._workers:
            w.start()

    def _work(self) -> None:
        while (task := self._tasks.get()) is not None:
            task()

    def map(self, fn: Callable[[T], R], items: Iterable[T]) -> list[R]:
        """``[fn(x) for x in items]``, spread over the pool's threads; returns once every call
        has finished. If calls raise, the first failing item's exception is raised (after all
        calls have ended, so none is still using the caller's data). ``fn`` must not call
        `map` on the same pool: its helpers would wait on each other."""
        if self._closed:
            raise RuntimeError("ShardPool.map after close()")
        items = list(items)
        n = len(items)
        results: list = [None] * n
        errors: list[BaseException | None] = [None] * n
        remaining = [n]
        done = threading.Condition()

        def run(i: int) -> None:
            try:
                results[i] = fn(items[i])
            except BaseException as exc:  # re-raised in the caller
                errors[i] = exc
            with done:
                remaining[0] -= 1
                if remaining[0] == 0:
                    done.notify()

        for i in range(1, n):
            self._tasks.put(functools.partial(run, i))
        if n:
            run(0)  # the caller's share; helpers take the rest (or the caller waits for them)
            with done:
                done.wait_for(lambda: remaining[0] == 0)
        for exc in errors:
            if exc is not None:
                raise exc
        return results

    def slices(self, n: int, min_size: int = 1 << 16) -> list[slice]:
        """``range(n)`` in at most ``threads`` contiguous slices of at least ``min_size`` items
        (one slice when ``n`` is small: splitting a short vector costs more than it saves)."""
        check_int("n", n, minimum=0, error=ValueError)
        check_int("min_size", min_size, minimum=1, error=ValueError)
        return even_slices(n, max(1, min(self.threads, n // min_size)))

    def buffers(self, size: int) -> list[np.ndarray]:
        """``threads`` + 1 float32 vectors of ``size`` values, made by the first call for a size
        and the same ones on every call after (contents undefined): a sharded step's gradient
        per shard, and their sum, without allocating them again on every step. What one step
        wrote there, the next overwrites."""
        check_int("size", size, minimum=0, error=ValueError)
        bufs = self._buffers.get(size)
        if bufs is None:
            bufs = self._buffers[size] = [
                np.empty(size, np.float32) for _ in range(self.threads + 1)
            ]
        return bufs

    def close(self, timeout_s: float = 2.0) -> list[str]:
        """Stop the helpers (idempotent); returns the names of any still running after
        ``timeout_s`` each (they are daemons: left behind, never waited for forever)."""
        if not self._closed:
            self._closed = True
            self.native = None  # its workers are joined when the last reference goes
            for _ in self._workers:
                self._tasks.put(None)
        for w in self._workers:
            w.join(timeout_s)
        return [w.name for w in self._workers if w.is_alive()]

    def __enter__(self) -> ShardPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
