"""The learner step's own cost, part of ``rlpar bench runtime``: per built-in agent, at the
sizes of the project's CartPole configs, how long `Agent.learn` takes on one batch and how
much of it holds the GIL (what actors that need the GIL lose to it), with `rlpar.train_step`
fused into one native call per optimizer step (`rlpar.train_steps`: one per batch) and as the
separate calls (``native=False``).

Measured on one thread with nothing else running, by the thread's GIL meter: held = wall
time minus the time rlpar's calls ran with the GIL released. The two forms alternate, and
each figure is the median of the repeats.
"""

from __future__ import annotations

import functools
import time
from typing import Any

import gymnasium as gym
import numpy as np

import rlpar
from rlpar import _native
from rlpar.bench.timing import medians
from rlpar.data import Rollout

__all__ = ["bench_learner_step"]

# (agent, config, T, K, B): cartpole_impala's and cartpole_appo's learner steps.
CASES = {
    "impala": ("impala", {}, 8, 16, 1),
    "appo": ("appo", {"epochs": 6, "minibatches": 4, "optim": {"lr": 2e-3}}, 32, 16, 1),
}


def _setup(name: str, config: dict, t: int, k: int, b: int):
    obs_space, action_space = gym.spaces.Box(-1, 1, (4,), np.float32), gym.spaces.Discrete(2)
    agent = rlpar.make_agent(name, config)
    net = rlpar.Net(agent.net_spec(obs_space, action_space))
    state = agent.init_state(net, net.init_params(seed=0))
    rng = np.random.default_rng(1)
    rollouts = []
    for i in range(b):
        r = Rollout.allocate(
            t, k, (4,), np.dtype(np.float32), (), np.dtype(np.int64), net.output_size, actor=i
        )
        r.obs[:] = rng.uniform(-1, 1, r.obs.shape)
        r.behaviour[:] = net.forward(state.params, r.obs[:-1].reshape(-1, 4)).reshape(t, k, -1)
        r.actions[:] = rng.integers(0, 2, (t, k))
        r.rewards[:] = 1.0
        r.mask[:] = True
        r.terminated[:] = rng.random((t, k)) < 0.02
        rollouts.append(r)
    return agent, net, state, rlpar.Batch.stack(rollouts, 1)


def _measure(case: tuple, native: bool, seconds: float) -> dict[str, float]:
    agent, net, state, batch = _setup(*case)
    original = rlpar.train_step, rlpar.train_steps
    # the agents call rlpar.train_step or rlpar.train_steps
    rlpar.train_step = functools.partial(rlpar.train_step, native=native)
    rlpar.train_steps = functools.partial(rlpar.train_steps, native=native)
    try:
        for _ in range(5):
            agent.learn(net, state, batch)
        released0, _, calls0, _ = _native.gil_meter()
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            agent.learn(net, state, batch)
            n += 1
        wall = (time.perf_counter() - t0) / n
        released1, _, calls1, _ = _native.gil_meter()
    finally:
        rlpar.train_step, rlpar.train_steps = original
    released = (released1 - released0) / n
    return {
        "learn_us": wall * 1e6,
        "gil_held_us": (wall - released) * 1e6,
        "gil_held_share": (wall - released) / wall,
        "released_calls": (calls1 - calls0) / n,
    }


def bench_learner_step(quick: bool = False) -> dict[str, Any]:
    """``{agent: {"fused": {...}, "separate": {...}, "held_ratio": fused / separate}}``, each
    form's ``learn_us``, ``gil_held_us``, ``gil_held_share`` and ``released_calls`` per
    `Agent.learn`."""
    seconds, repeats = (0.2, 1) if quick else (1.0, 3)
    configs = {
        (name, native): (lambda c=case, nat=native: _measure(c, nat, seconds))
        for name, case in CASES.items()
        for native in (True, False)
    }
    med = medians(configs, repeats)
    out: dict[str, Any] = {}
    for name, (agent, config, t, k, b) in CASES.items():
        fused, separate = med[(name, True)], med[(name, False)]
        out[name] = {
            "fused": {key: round(v, 3) for key, v in fused.items()},
            "separate": {key: round(v, 3) for key, v in separate.items()},
            "held_ratio": round(fused["gil_held_us"] / separate["gil_held_us"], 3),
            "setup": f"{agent} {config} T={t} K={k} B={b}",
        }
    return out
