"""The one timing toolkit of every ``rlpar bench`` command.

The machine may be small and noisy, so configurations that are compared are measured side by
side in one process, taking turns, and every figure is the median over repeats:

- `medians`: each configuration once per round, ``repeats`` rounds, the median of each;
- `time_interleaved`: seconds per call of several functions, chunk by chunk in turn;
- `loop_rate`: steps/s of threads that each run a `Loop` (e.g. an actor's unrolls);
- `sig`: round to the digits the noise allows; `BackgroundLoad`: how much *other* work ran;
- `import_optional` and `single_threaded`: the optional peers (torch, EnvPool) on one thread.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import statistics
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Protocol

from rlpar.runtime.gil_meter import GilTimes, ThreadMeter, actor_ceiling

__all__ = [
    "BackgroundLoad",
    "Loop",
    "cpus",
    "import_optional",
    "loop_rate",
    "loop_rate_gil",
    "medians",
    "sig",
    "single_threaded",
    "time_interleaved",
]


def sig(x: float, digits: int = 4) -> float:
    """``x`` rounded to ``digits`` significant digits (the noise is larger than that)."""
    return float(f"{x:.{digits}g}")


def cpus() -> int:
    """Cores this process may run on (its affinity mask where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def medians(configs: Mapping[Any, Callable[..., Any]], repeats: int) -> dict[Any, Any]:
    """Run each configuration once per round for ``repeats`` rounds; the median of each (per
    key when a measurement returns a dict of figures)."""
    runs: dict[Any, list] = {key: [] for key in configs}
    for _ in range(repeats):
        for key, measure in configs.items():
            runs[key].append(measure())

    def median(values: list) -> Any:
        if isinstance(values[0], dict):
            return {k: statistics.median(v[k] for v in values) for k in values[0]}
        return statistics.median(values)

    return {key: median(v) for key, v in runs.items()}


def _calls_per_chunk(fn: Callable[[], object], chunk_s: float) -> int:
    fn()  # warm-up: workspaces, caches, lazy initialisation
    n = 1
    while True:
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        dt = time.perf_counter() - t0
        if dt >= chunk_s / 4:
            return max(1, round(n * chunk_s / dt))
        n *= 2


def time_interleaved(
    fns: dict[str, Callable[[], object]], chunk_s: float, repeats: int
) -> dict[str, float]:
    """Median seconds per call of each function; the functions take turns, a chunk of about
    ``chunk_s`` seconds each, ``repeats`` times."""
    numbers = {name: _calls_per_chunk(fn, chunk_s) for name, fn in fns.items()}

    def chunk(name: str) -> float:
        fn, n = fns[name], numbers[name]
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        return (time.perf_counter() - t0) / n

    return medians({name: (lambda name=name: chunk(name)) for name in fns}, repeats)


class Loop(Protocol):
    """What `loop_rate` runs: ``loop`` until stopped, counting what it did in ``steps``."""

    steps: int

    def loop(self, stop: threading.Event) -> None: ...


def loop_rate(workers: Sequence[Loop], warmup_s: float, seconds: float) -> float:
    """Steps/s of all ``workers`` together, each looping on its own thread: counted over
    ``seconds`` after ``warmup_s`` of running; the threads are stopped and joined after."""
    return loop_rate_gil(workers, warmup_s, seconds)["rate"]


def loop_rate_gil(workers: Sequence[Loop], warmup_s: float, seconds: float) -> dict[str, float]:
    """`loop_rate` as {"rate"}, with the workers' GIL shares over their whole loop
    (`rlpar.runtime.gil_meter`, the mean over threads): {"held", "wait", "native"}, and
    "ceiling": the threads of this loop the GIL could serve (1 / held; 0 when unbounded)."""
    stop = threading.Event()
    meters: list[GilTimes] = [GilTimes()] * len(workers)

    def metered(i: int) -> None:
        meter = ThreadMeter()
        try:
            workers[i].loop(stop)
        finally:
            meters[i] = meter.read()

    threads = [threading.Thread(target=metered, args=(i,)) for i in range(len(workers))]
    for t in threads:
        t.start()
    try:
        time.sleep(warmup_s)
        n0, t0 = sum(w.steps for w in workers), time.perf_counter()
        time.sleep(seconds)
        n1, t1 = sum(w.steps for w in workers), time.perf_counter()
    finally:
        stop.set()
        for t in threads:
            t.join()
    shares = sum(meters, GilTimes()).shares()
    ceiling = actor_ceiling(shares["held"])
    return {"rate": (n1 - n0) / (t1 - t0), **shares, "ceiling": ceiling if ceiling < 1e9 else 0.0}


def import_optional(name: str) -> Any:
    """The module, or None when it is not installed (peers are optional baselines)."""
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


@contextlib.contextmanager
def single_threaded(torch: Any) -> Iterator[dict[str, int]]:
    """Run torch and numpy's BLAS on one thread, like a native call, for a fair comparison.

    Yields what was limited (``torch_threads``, ``numpy_blas_threads``). numpy's BLAS can only be
    limited when threadpoolctl is importable; otherwise OpenBLAS keeps one thread per core, whose
    wake-ups made numpy's batch-256 forward 3x slower and erratic here.
    """
    limited: dict[str, int] = {}
    with contextlib.ExitStack() as stack:
        if torch:
            before = torch.get_num_threads()
            torch.set_num_threads(1)
            stack.callback(torch.set_num_threads, before)
            limited["torch_threads"] = 1
        threadpoolctl = import_optional("threadpoolctl")
        if threadpoolctl is not None:
            stack.enter_context(threadpoolctl.threadpool_limits(limits=1, user_api="blas"))
            limited["numpy_blas_threads"] = 1
        yield limited


class BackgroundLoad:
    """CPU cores that *other* processes kept busy while a benchmark ran (Linux; else None).

    On a small shared machine a burst of someone else's work takes a core from 2-thread runs and
    spoils their ratios; this says whether a result can be trusted (~0 is a clean run).
    """

    def __enter__(self) -> BackgroundLoad:
        self.cores: float | None = None
        self._start = self._sample()
        return self

    def __exit__(self, *exc: object) -> None:
        end = self._sample()
        if self._start and end:
            (busy0, own0, t0), (busy1, own1, t1) = self._start, end
            self.cores = sig(max(0.0, (busy1 - busy0) - (own1 - own0)) / (t1 - t0), 2)

    @staticmethod
    def _sample() -> tuple[float, float, float] | None:
        try:
            with open("/proc/stat") as f:
                ticks = [int(v) for v in f.readline().split()[1:9]]
            hz = os.sysconf("SC_CLK_TCK")
        except (OSError, ValueError, AttributeError):
            return None
        busy = sum(ticks) - ticks[3] - ticks[4]  # all but idle and iowait
        return busy / hz, time.process_time(), time.perf_counter()
