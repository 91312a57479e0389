"""`rlpar bench ray`: the Ray backend against the threads backend on this one machine.

The `cartpole_impala` experiment's settings (IMPALA, gymnasium's CartPole-v1, 2 actors of 16
envs, unrolls of 8, one rollout per learner step: real learner steps), run for a fixed time by
each backend: the threads repeats first, then the Ray ones on one local Ray instance (127.0.0.1
only), whose start is not timed, nor is the start of the Ray actor processes.
``env_steps_per_s`` is measured after a warm-up (the first third of each run);
``policy_lag_mean`` is the mean, over the same span, of the learner's mean policy lag (in
versions: one per learner step). Each value is the median of the repeats.
"""

from __future__ import annotations

import statistics
from typing import Any

from rlpar.bench.timing import medians
from rlpar.config import EnvConfig, RuntimeConfig
from rlpar.registry import make_agent
from rlpar.runtime import Progress, Runner

__all__ = ["bench_ray"]

SETTINGS: dict[str, Any] = {
    "num_actors": 2,
    "envs_per_actor": 16,
    "unroll_length": 8,
    "batch_rollouts": 1,
}


def _measure(backend: str, seconds: float) -> dict[str, float]:
    agent = make_agent("impala", {"entropy_cost": 0.01, "optim": {"name": "adam", "lr": 0.003}})
    runtime = RuntimeConfig(
        **SETTINGS, total_env_steps=10**12, max_wall_s=seconds, checkpoint_interval_s=None,
        backend=backend,
    )  # fmt: skip
    samples: list[Progress] = []
    Runner(agent, EnvConfig("CartPole-v1"), runtime).run(
        on_progress=samples.append, progress_interval_s=0.1
    )
    warm = [p for p in samples if p.wall_s >= seconds / 3]
    first, last = warm[0], warm[-1]
    rate = (last.env_steps - first.env_steps) / (last.wall_s - first.wall_s)
    return {
        "env_steps_per_s": rate,
        "policy_lag_mean": statistics.fmean(p.policy_lag_mean for p in warm),
    }


def bench_ray(quick: bool = False) -> dict[str, Any]:
    """``{"env_steps_per_s": {"threads": .., "ray": ..}, "policy_lag_mean": {...}, ...}``."""
    from rlpar.runtime.ray import init_local_ray  # Ray is an optional dependency

    seconds, repeats = (2.0, 1) if quick else (5.0, 3)
    # Threads first, before Ray starts: an idle Ray instance takes a few % of this machine.
    results = medians({"threads": lambda: _measure("threads", seconds)}, repeats)
    ray = init_local_ray(num_cpus=SETTINGS["num_actors"])
    try:
        results |= medians({"ray": lambda: _measure("ray", seconds)}, repeats)
    finally:
        ray.shutdown()
    rate = {b: v["env_steps_per_s"] for b, v in results.items()}
    lag = {b: v["policy_lag_mean"] for b, v in results.items()}
    return {
        "env_steps_per_s": {b: round(v) for b, v in rate.items()},
        "policy_lag_mean": {b: round(v, 2) for b, v in lag.items()},
        "ray_vs_threads": round(rate["ray"] / rate["threads"], 3),
        "setup": {
            "env": "CartPole-v1 (gymnasium vector env)",
            "agent": "impala (cartpole_impala.toml)",
            **SETTINGS,
            "seconds_per_measure": seconds,
            "repeats": repeats,
        },
    }
