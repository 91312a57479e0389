"""The actor loop over rlpar's native envs in native calls (`Actor._run_native`, many rollouts
and their hand-offs per call) against one fused unroll per Python iteration (`Actor._run`'s
loop, what the runtime ran before), in one process, the two taking turns:

    python experiments/native_actor_loop_ab.py ROUNDS [SECONDS]

Each measure is `rlpar.bench.runtime.runtime_measure` (the whole runtime on rlpar's CartPole,
T = 20, the IMPALA learner training) at 1 x 64, 2 x 64 and 1 x 256 actors x envs. Prints, per
case and mode, the medians over the rounds of the env steps/s, the GIL shares, the GIL-held time
per rollout and per learner step, and the actor ceiling, as JSON.
"""

from __future__ import annotations

import json
import statistics
import sys
from typing import Any

from rlpar.bench.runtime import runtime_measure
from rlpar.runtime.actor import Actor

CASES = ((1, 64), (2, 64), (1, 256))
NATIVE = Actor._native_loop


def measure(actors: int, envs: int, seconds: float) -> dict[str, float]:
    m = runtime_measure(actors, True, seconds, envs, "rlpar/CartPole-v1", unroll_length=20)
    thread_s = m["wall_s"] * actors  # the actors' shares are of their summed wall time
    m["actor_held_us_per_rollout"] = 1e6 * m["actor_held"] * thread_s / max(m["rollouts"], 1)
    m["learner_held_us_per_step"] = (
        1e6 * m["learner_held"] * m["wall_s"] / max(m["learner_steps"], 1)
    )
    return m


def run(rounds: int, seconds: float) -> dict[str, Any]:
    modes = {"per_rollout": lambda self, q: False, "native_loop": NATIVE}
    got: dict[str, dict[str, list[dict[str, float]]]] = {
        f"{a}x{k}": {mode: [] for mode in modes} for a, k in CASES
    }
    try:
        for _ in range(rounds):
            for a, k in CASES:
                for mode, choose in modes.items():
                    Actor._native_loop = choose  # type: ignore[method-assign]
                    got[f"{a}x{k}"][mode].append(measure(a, k, seconds))
    finally:
        Actor._native_loop = NATIVE  # type: ignore[method-assign]
    keys = ("rate", "actor_held", "actor_wait", "actor_native", "actor_held_us_per_rollout",
            "learner_held", "learner_held_us_per_step", "ceiling")  # fmt: skip
    out: dict[str, Any] = {}
    for case, by_mode in got.items():
        out[case] = {
            mode: {key: round(statistics.median(r[key] for r in rs), 4) for key in keys}
            for mode, rs in by_mode.items()
        }
        out[case]["rate_ratio"] = round(
            out[case]["native_loop"]["rate"] / out[case]["per_rollout"]["rate"], 3
        )
    return out


if __name__ == "__main__":
    seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 4.0
    print(json.dumps(run(int(sys.argv[1]), seconds), indent=1))
