"""Does CPython's switch interval, or keeping the GIL in the actor's forward, change how two
actor threads share it? Side by side in one process, taking turns, medians of the rounds:

    python experiments/switch_interval.py [ROUNDS]

For each setting (switch interval 5, 1, 0.5, 0.2 ms; and 5 ms with no call releasing the GIL),
the actor loops of ``rlpar bench envs`` (64 CartPoles a thread: gymnasium's, and rlpar's native
ones stepped one call a step) at 1 and 2 threads: env steps/s and the GIL meter's shares.
"""

from __future__ import annotations

import statistics
import sys

import rlpar
from rlpar.bench.envs import actor_loop_workers
from rlpar.bench.timing import loop_rate_gil

KINDS = ("python_env", "native_env")
SETTINGS = [(0.005, None), (0.001, None), (0.0005, None), (0.0002, None), (0.005, "never")]


def main(rounds: int) -> None:
    workers = actor_loop_workers(KINDS, (1, 2))
    default_interval, default_threshold = sys.getswitchinterval(), rlpar.gil_release_threshold()
    runs: dict[tuple, list[dict[str, float]]] = {}
    try:
        for _ in range(rounds):
            for interval, release in SETTINGS:
                sys.setswitchinterval(interval)
                rlpar.set_gil_release_threshold(1e30 if release == "never" else default_threshold)
                for kind in KINDS:
                    for n in (1, 2):
                        m = loop_rate_gil(workers[kind, n], 0.15, 0.8)
                        runs.setdefault((interval, release, kind, n), []).append(m)
    finally:
        sys.setswitchinterval(default_interval)
        rlpar.set_gil_release_threshold(default_threshold)
        for ws in workers.values():
            for w in ws:
                w.envs.close()
    for (interval, release, kind, n), ms in runs.items():
        med = {k: statistics.median(m[k] for m in ms) for k in ms[0]}
        one = statistics.median(m["rate"] for m in runs[(interval, release, kind, 1)])
        print(
            f"switch {interval * 1e3:.1f} ms, release {release or 'by work'}, {kind}, {n} "
            f"thread(s): {med['rate']:,.0f} env steps/s (x{med['rate'] / one:.2f}), held "
            f"{med['held']:.2f}, wait {med['wait']:.2f}, native {med['native']:.2f}"
        )


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 3)
