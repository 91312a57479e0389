"""What several benchmarks run: inputs, a net configuration, an acting-only policy.

- `random_obs`: a batch of observations for a net (uint8 frames or float32 normals);
- `synthetic_batch`: a learner `Batch` on given observations, as if an actor had sent it;
- `NATURE_NET`: the IMPALA ``[agent.net]`` table of the Nature-DQN torso;
- `PolicyAgent`: an mlp categorical policy that acts and never learns (actor-loop benches).
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

import rlpar
from rlpar.agent import Agent, LearnerState
from rlpar.data import Batch
from rlpar.nn import Head

__all__ = ["NATURE_NET", "PolicyAgent", "random_obs", "synthetic_batch"]

NATURE_NET = {"conv": [[32, 8, 4], [64, 4, 2], [64, 3, 1]], "conv_hidden": 512}


def random_obs(net: rlpar.Net, batch: int, rng: np.random.Generator) -> np.ndarray:
    """``[batch, *net.input_shape]``: uint8 in [0, 255] for a uint8 net, else float32 normals."""
    shape = (batch, *net.input_shape)
    if net.input_uint8:
        return rng.integers(0, 256, shape, dtype=np.uint8)
    return rng.standard_normal(shape).astype(np.float32)


def synthetic_batch(
    rng: np.random.Generator, net: rlpar.Net, params: np.ndarray, obs: np.ndarray, actions: int
) -> Batch:
    """A batch on observations ``obs`` [T+1, N, ...]: behaviour is the net's own output plus
    noise, random actions, rewards and episode ends (mask[t+1] = not done[t])."""
    t1, n = obs.shape[:2]
    out = net.forward(params, obs.reshape(t1 * n, *obs.shape[2:])).reshape(t1, n, -1)
    done = rng.random((t1 - 1, n)) < 0.05
    mask = np.ones_like(done)
    mask[1:] = ~done[:-1]
    return Batch(
        obs=obs, actions=rng.integers(0, actions, (t1 - 1, n)).astype(np.int64),
        rewards=rng.standard_normal((t1 - 1, n)).astype(np.float32),
        terminated=done & mask, truncated=np.zeros_like(done), mask=mask,
        behaviour=out[:-1] + 0.1 * rng.standard_normal(out[:-1].shape).astype(np.float32),
        versions=np.zeros(1, np.int64), policy_lag=np.zeros(1, np.int64), learner_version=1,
    )  # fmt: skip


class PolicyAgent(Agent):
    """An mlp categorical policy that only acts. It samples the softmax of its logits (here
    by Gumbel-max), so it promises `native_sampling` as the built-in agents do: the actors
    draw with the native sampler, and `act` runs only where they cannot."""

    native_sampling = True

    def net_spec(self, obs_space: gym.Space, action_space: gym.Space) -> rlpar.NetSpec:
        assert isinstance(action_space, gym.spaces.Discrete) and obs_space.shape is not None
        heads: list[Head] = [rlpar.Categorical(int(action_space.n)), rlpar.Value()]
        return rlpar.mlp_spec(int(np.prod(obs_space.shape)), heads, hidden=(64, 64))

    def init_state(self, net: rlpar.Net, params: np.ndarray) -> LearnerState:
        return LearnerState(params=params, optimizer=rlpar.SGD(net.num_params, lr=0.0))

    def act(self, net: rlpar.Net, out: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        logits = out[:, :-1]
        return np.argmax(logits - np.log(-np.log(rng.random(logits.shape))), axis=1)

    def learn(self, net: rlpar.Net, state: LearnerState, batch: Batch) -> dict[str, float]:
        return {}
