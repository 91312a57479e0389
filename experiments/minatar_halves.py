"""What "sync" double buffering costs and hides on MinAtar Breakout, with no runtime around it:
one vector env of 16 against two of 8 stepped in turn (env steps/s, random actions drawn
beforehand), and the suite's conv forward at batch 16 against two forwards of 8 (µs per 16
rows). Rounds take turns; medians. Prints one JSON object:

    python experiments/minatar_halves.py [ROUNDS]

Needs MinAtar (``pip install minatar --no-deps``).
"""

from __future__ import annotations

import json
import statistics
import sys
import time
import timeit
from collections.abc import Callable

import numpy as np

import rlpar
from rlpar.bench.runtime import MINATAR, MINATAR_NET
from rlpar.runtime.envs import make_actor_envs

K = 16


def env_rate(
    step: Callable[[np.ndarray], object], actions: list[np.ndarray], seconds: float
) -> float:
    """Env steps/s of ``step`` over ``actions`` ([K] each, in a cycle) for ``seconds``."""
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for a in actions:
            step(a)
        n += len(actions) * K
    return n / (time.perf_counter() - t0)


def main(rounds: int) -> dict[str, float]:
    """Medians of ``rounds``: "env_16" and "env_2x8" (env steps/s), "forward_16_us" and
    "forward_2x8_us" (µs per 16 rows)."""
    whole = make_actor_envs(MINATAR, K)
    halves = [make_actor_envs(MINATAR, K // 2) for _ in range(2)]
    try:
        whole.reset(seed=0)
        for i, h in enumerate(halves):
            h.reset(seed=i * K // 2)
        whole.action_space.seed(0)
        actions = [whole.action_space.sample() for _ in range(64)]

        def split(a: np.ndarray) -> None:
            halves[0].step(a[: K // 2])
            halves[1].step(a[K // 2 :])

        spaces = whole.single_observation_space, whole.single_action_space
        net = rlpar.Net(rlpar.make_agent("impala", {"net": MINATAR_NET}).net_spec(*spaces))
        params = net.init_params(seed=0)
        obs = np.random.default_rng(0).integers(0, 2, (K, *net.input_shape)).astype(np.uint8)
        keys = ("env_16", "env_2x8", "forward_16_us", "forward_2x8_us")
        out: dict[str, list[float]] = {k: [] for k in keys}
        first, second = obs[: K // 2], obs[K // 2 :]

        def forward_16() -> None:
            net.forward(params, obs)

        def forward_2x8() -> None:
            net.forward(params, first)
            net.forward(params, second)

        n = 2000
        for _ in range(rounds):
            out["env_16"].append(env_rate(whole.step, actions, 1.5))
            out["env_2x8"].append(env_rate(split, actions, 1.5))
            out["forward_16_us"].append(timeit.timeit(forward_16, number=n) / n * 1e6)
            out["forward_2x8_us"].append(timeit.timeit(forward_2x8, number=n) / n * 1e6)
        return {k: round(statistics.median(v), 1) for k, v in out.items()}
    finally:
        whole.close()
        for h in halves:
            h.close()


if __name__ == "__main__":
    print(json.dumps(main(int(sys.argv[1]) if len(sys.argv) > 1 else 3)))
