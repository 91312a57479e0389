"""`rlpar bench runtime`: env steps/s of the whole actor/learner runtime.

gymnasium's CartPole-v1 (its vectorized version) with the IMPALA agent's mlp policy, 1 and 2
actor threads, with the learner idle (it takes rollouts and hands them back without training)
and busy (real IMPALA learner steps). Rates are measured after a warm-up, the configurations
alternate, and each value is the median of the repeats.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from rlpar.agent import Agent, LearnerState
from rlpar.bench.timing import medians
from rlpar.config import EnvConfig, RuntimeConfig
from rlpar.data import Batch
from rlpar.nn import Net, NetSpec
from rlpar.registry import make_agent
from rlpar.runtime import Runner

__all__ = ["bench_runtime"]


class _IdleLearner(Agent):
    """The IMPALA agent with a learner step that does nothing (actors alone are measured)."""

    def __init__(self, inner: Agent) -> None:
        self.inner = inner

    @property
    def native_sampling(self) -> bool:  # type: ignore[override]
        """As the wrapped agent's (set by its net_spec): native envs then take the fused path."""
        return self.inner.native_sampling

    def net_spec(self, obs_space: gym.Space, action_space: gym.Space) -> NetSpec:
        return self.inner.net_spec(obs_space, action_space)

    def init_state(self, net: Net, params: np.ndarray) -> LearnerState:
        return self.inner.init_state(net, params)

    def act(self, net: Net, out: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return self.inner.act(net, out, rng)

    def learn(self, net: Net, state: LearnerState, batch: Batch) -> dict[str, float]:
        return {}


def runtime_rate(
    num_actors: int,
    busy: bool,
    seconds: float,
    envs_per_actor: int,
    env_id: str = "CartPole-v1",
    unroll_length: int = 16,
    learner_threads: int = 1,
    batch_rollouts: int = 1,
) -> float:
    """Env steps/s of one run, read from its progress reports after the first third."""
    agent = make_agent("impala", {"optim": {"lr": 0.003}})
    if not busy:
        agent = _IdleLearner(agent)
    runtime = RuntimeConfig(
        num_actors=num_actors, envs_per_actor=envs_per_actor, unroll_length=unroll_length,
        batch_rollouts=batch_rollouts, total_env_steps=10**12, max_wall_s=seconds,
        checkpoint_interval_s=None, learner_threads=learner_threads,
    )  # fmt: skip
    samples: list[tuple[float, int]] = []
    Runner(agent, EnvConfig(env_id), runtime).run(
        on_progress=lambda p: samples.append((p.wall_s, p.env_steps)), progress_interval_s=0.1
    )
    warm = [s for s in samples if s[0] >= seconds / 3]
    (t0, n0), (t1, n1) = warm[0], warm[-1]
    return (n1 - n0) / (t1 - t0)


def bench_runtime(quick: bool = False) -> dict[str, Any]:
    """``{"env_steps_per_s": {"1": .., "2": ..}, "with_learner": {"1": .., "2": ..}}``."""
    seconds, repeats = (0.6, 1) if quick else (3.0, 3)
    envs_per_actor = 16
    configs = {
        (actors, busy): (lambda a=actors, b=busy: runtime_rate(a, b, seconds, envs_per_actor))
        for actors in (1, 2)
        for busy in (False, True)
    }
    med = medians(configs, repeats)
    out = {
        "env_steps_per_s": {str(a): round(med[(a, False)]) for a in (1, 2)},
        "with_learner": {str(a): round(med[(a, True)]) for a in (1, 2)},
    }
    out["ratios"] = {
        "two_actors_vs_one": round(med[(2, False)] / med[(1, False)], 3),
        "learner_cost": {str(a): round(1 - med[(a, True)] / med[(a, False)], 3) for a in (1, 2)},
    }
    out["setup"] = {
        "env": "CartPole-v1 (gymnasium vector env)",
        "envs_per_actor": envs_per_actor,
        "unroll_length": 16,
        "policy": "mlp 4-64-64 tanh, categorical + value",
        "seconds_per_measure": seconds,
        "repeats": repeats,
    }
    return out
