"""The cost of a learner step by the way its loss is written, on one net and one batch: the
REINFORCE agent of examples/custom_agent.py (its gradient derived by hand in numpy), the same
agent with its loss in PyTorch (examples/custom_agent_torch.py, `rlpar.TorchLoss`), and the
built-in IMPALA agent (V-trace, its loss native: one `rlpar.train_step` call). Each step is
the agent's whole ``learn`` (forward, loss, backward, clip, optimizer) on the CartPole net of
the examples (4 -> 32 -> 2 logits + value), batch [T, N]; the three take turns, chunks of about
0.2 s, medians of the repeats; torch and numpy's BLAS on one thread::

    python experiments/loss_cost.py [T N [REPEATS]]      # default 32 16 15

Prints JSON: microseconds per learner step of each, and each against the native step.
"""

from __future__ import annotations

import importlib.util
import json
import platform
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np

import rlpar
from rlpar.bench.timing import single_threaded, time_interleaved

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _example(name: str):
    sys.path.insert(0, str(EXAMPLES))
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def batch(t: int, n: int, seed: int = 0) -> rlpar.Batch:
    rng = np.random.default_rng(seed)
    terminated = rng.random((t, n)) < 0.05
    mask = np.ones((t, n), bool)
    mask[1:] = ~terminated[:-1]
    return rlpar.Batch(
        obs=rng.normal(size=(t + 1, n, 4)).astype(np.float32),
        actions=rng.integers(0, 2, (t, n)),
        rewards=np.ones((t, n), np.float32),
        terminated=terminated,
        truncated=np.zeros((t, n), bool),
        mask=mask,
        behaviour=rng.normal(size=(t, n, 3)).astype(np.float32),
        versions=np.ones(1, np.int64),
        policy_lag=np.zeros(1, np.int64),
        learner_version=1,
    )


def main(t: int = 32, n: int = 16, repeats: int = 15) -> dict:
    numpy_module = _example("custom_agent")
    torch_module = _example("custom_agent_torch")
    obs, act = gym.spaces.Box(-1, 1, (4,), np.float32), gym.spaces.Discrete(2)
    config = numpy_module.ReinforceConfig()
    agents = {
        "numpy_loss": numpy_module.Reinforce(config),
        "torch_loss": torch_module.TorchReinforce(config),
        "native_impala": rlpar.make_agent("impala"),
    }
    # One net for all: the examples' torso (IMPALA's own default is wider).
    spec = agents["numpy_loss"].net_spec(obs, act)
    net = rlpar.Net(spec)
    b = batch(t, n)
    steps = {}
    for name, agent in agents.items():
        state = agent.init_state(net, net.init_params(seed=0))
        steps[name] = lambda agent=agent, state=state: agent.learn(net, state, b)
    import torch

    with single_threaded(torch) as limited:
        seconds = time_interleaved(steps, chunk_s=0.2, repeats=repeats)
    us = {k: round(v * 1e6, 1) for k, v in seconds.items()}
    return {
        "batch": [t, n],
        "net": "4 -> 32 -> 2 logits + value",
        "us_per_learner_step": us,
        "against_native": {k: round(v / us["native_impala"], 2) for k, v in us.items()},
        "threads": limited,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "repeats": repeats,
    }


if __name__ == "__main__":
    print(json.dumps(main(*map(int, sys.argv[1:])), indent=1))
