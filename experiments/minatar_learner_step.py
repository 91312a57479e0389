"""The learner step of `minatar_breakout_suite.toml` on its own: IMPALA's `learn` (three
optimizer steps) on one MinAtar-shaped batch [T=20, N=16] (uint8 frames 10x10x4, 6 actions),
with one learner thread and with a pool of two splitting the torso's rows, taking turns.
Prints one JSON object: ms per `learn` for each, medians of the rounds, and whether the two
gave the same parameters bit for bit.

    python experiments/minatar_learner_step.py [ROUNDS] [SECONDS_EACH]

The learning rate is tiny so that repeating one batch for seconds cannot diverge (the value
would otherwise chase its own bootstrap): the arithmetic per step is the config's."""

from __future__ import annotations

import json
import statistics
import sys
import time

import gymnasium as gym
import numpy as np

import rlpar
from rlpar import ShardPool
from rlpar.data import Rollout

T, N = 20, 16
CONFIG = {
    "entropy_cost": 0.01,
    "passes": 3,
    "net": {"conv": [[16, 3, 1]], "conv_hidden": 128},
    "optim": {"name": "adam", "lr": 1e-6},
}


def setup() -> tuple[rlpar.Agent, rlpar.Net, np.ndarray, rlpar.Batch]:
    """The agent, its net, initial parameters and one batch [T, N] of random frames."""
    agent = rlpar.make_agent("impala", CONFIG)
    obs_space = gym.spaces.Box(0, 1, (10, 10, 4), np.uint8)
    net = rlpar.Net(agent.net_spec(obs_space, gym.spaces.Discrete(6)))
    params = net.init_params(seed=0)
    rng = np.random.default_rng(1)
    r = Rollout.allocate(
        T, N, (10, 10, 4), np.dtype(np.uint8), (), np.dtype(np.int64), net.output_size, actor=0
    )
    r.obs[:] = rng.random(r.obs.shape) < 0.1
    r.behaviour[:] = net.forward(params, r.obs[:-1].reshape(-1, 10, 10, 4)).reshape(T, N, -1)
    r.actions[:] = rng.integers(0, 6, (T, N))
    r.rewards[:] = 0.1
    r.mask[:] = True
    r.terminated[:] = rng.random((T, N)) < 0.02
    return agent, net, params, rlpar.Batch.stack([r], 1)


def ms_per_learn(
    agent: rlpar.Agent,
    net: rlpar.Net,
    state: rlpar.LearnerState,
    batch: rlpar.Batch,
    seconds: float,
) -> float:
    """Milliseconds per `agent.learn` on ``batch`` over ``seconds`` (after 3 unmeasured calls)."""
    for _ in range(3):
        agent.learn(net, state, batch)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        agent.learn(net, state, batch)
        n += 1
    return (time.perf_counter() - t0) / n * 1e3


def main(rounds: int, seconds: float) -> dict:
    """``rounds`` rounds of one thread then two, ``seconds`` each; the JSON's fields."""
    agent, net, params, batch = setup()
    one = agent.init_state(net, params.copy())
    two = agent.init_state(net, params.copy())
    two.pool = ShardPool(2, split="rows")
    times: dict[str, list[float]] = {"1_thread": [], "2_threads_rows": []}
    try:
        for _ in range(rounds):
            times["1_thread"].append(ms_per_learn(agent, net, one, batch, seconds))
            times["2_threads_rows"].append(ms_per_learn(agent, net, two, batch, seconds))
        check_one = agent.init_state(net, params.copy())
        check_two = agent.init_state(net, params.copy())
        check_two.pool = two.pool
        for _ in range(3):
            agent.learn(net, check_one, batch)
            agent.learn(net, check_two, batch)
        same = bool(np.array_equal(check_one.params, check_two.params))
    finally:
        two.pool.close()
    med = {k: statistics.median(v) for k, v in times.items()}
    return {
        "ms_per_learn": med,
        "rounds": times,
        "rows_speedup": med["1_thread"] / med["2_threads_rows"],
        "rows_same_floats": same,
    }


if __name__ == "__main__":
    args = sys.argv[1:]
    print(json.dumps(main(int(args[0]) if args else 3, float(args[1]) if len(args) > 1 else 2.0)))
