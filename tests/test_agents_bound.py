"""The built-in agents' action-bound penalty for Gaussian policies: its value and gradient
against float64 finite differences, and that it pulls a mean far outside the bounds back."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

import rlpar
from rlpar import bound_penalty


def test_bound_penalty_gradient_matches_finite_differences() -> None:
    rng = np.random.default_rng(0)
    mean = rng.normal(0, 3, (5, 4, 2))  # [T, N, A]: many inside [-1, 2] x [-2, 2], many out
    mask = rng.random((5, 4)) < 0.8
    low, high = np.array([-1.0, -2.0]), np.array([2.0, 2.0])
    loss, grad = bound_penalty(mean, mask, low, high, cost=0.7)
    centre, half = (high + low) / 2, (high - low) / 2
    excess = np.maximum(np.abs(mean - centre) - half, 0) * mask[..., None]
    assert loss == pytest.approx(0.7 * (excess**2).sum() / mask.sum())
    eps = 1e-6
    for idx in np.ndindex(mean.shape):
        up, down = mean.copy(), mean.copy()
        up[idx] += eps
        down[idx] -= eps
        numeric = (
            bound_penalty(up, mask, low, high, 0.7)[0]
            - bound_penalty(down, mask, low, high, 0.7)[0]
        ) / (2 * eps)
        assert grad[idx] == pytest.approx(numeric, abs=1e-4)
    inside = (np.abs(mean - centre) <= half) | ~mask[..., None]
    assert (grad[inside] == 0).all()


def test_the_learner_pulls_an_out_of_bounds_mean_back() -> None:
    """A Pendulum policy whose mean starts far above the bound (clipped actions: no reward
    signal there) is pulled back toward it by the penalty alone (no reward to learn from)."""
    obs_space = gym.spaces.Box(-1, 1, (3,), np.float32)
    act_space = gym.spaces.Box(-2, 2, (1,), np.float32)

    def mean_after(cost: float) -> float:
        agent = rlpar.make_agent(
            "impala",
            {"action_bound_cost": cost, "entropy_cost": 0.0, "baseline_cost": 0.0,
             "optim": {"lr": 0.05}},
        )  # fmt: skip
        net = rlpar.Net(agent.net_spec(obs_space, act_space))
        params = net.init_params(seed=0)
        mean_col = net.output_slices["mean"].start
        offsets = {
            name: (start, int(np.prod(shape))) for name, _, start, shape, *_ in net.param_info
        }
        for name, value in (("heads.0.weight", 0.0), ("heads.0.bias", 8.0)):
            start, size = offsets[name]
            params[start : start + size] = value  # the mean: 8, far above the bound 2
        state = agent.init_state(net, params)
        t, n = 4, 8
        obs = np.zeros((t + 1, n, 3), np.float32)
        out = net.forward(params, obs.reshape(-1, 3)).reshape(t + 1, n, -1)
        batch = rlpar.Batch(
            obs=obs,
            actions=np.full((t, n, 1), 2.0, np.float32),
            rewards=np.zeros((t, n), np.float32),
            terminated=np.zeros((t, n), bool),
            truncated=np.zeros((t, n), bool),
            mask=np.ones((t, n), bool),
            behaviour=out[:t].copy(),
            versions=np.ones(1, np.int64),
            policy_lag=np.zeros(1, np.int64),
            learner_version=1,
        )
        for _ in range(50):
            metrics = agent.learn(net, state, batch)
        assert ("bound_loss" in metrics) == (cost > 0)
        return float(net.forward(state.params, obs[0])[0, mean_col])

    pulled, left = mean_after(1.0), mean_after(0.0)
    assert pulled < 6.0 and pulled < left - 1.0, (pulled, left)
