"""Options of the built-in agents: reward clipping (`reward_clip`, Atari's convention: the loss
sees clipped rewards, exactly as if the env had returned them clipped) and IMPALA's `passes`
(several optimizer steps on one batch)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

import rlpar

OBS, ACTIONS = gym.spaces.Box(-1, 1, (3,), np.float32), gym.spaces.Discrete(2)


def params_after_a_step(
    name: str, rewards: np.ndarray, learn_calls: int = 1, **config: object
) -> np.ndarray:
    agent = rlpar.make_agent(name, {"optim": {"lr": 0.01}, **config})
    net = rlpar.Net(agent.net_spec(OBS, ACTIONS))
    state = agent.init_state(net, net.init_params(seed=0))
    t, n = rewards.shape
    rng = np.random.default_rng(1)
    obs = rng.uniform(-1, 1, (t + 1, n, 3)).astype(np.float32)
    out = net.forward(state.params, obs.reshape(-1, 3)).reshape(t + 1, n, -1)
    batch = rlpar.Batch(
        obs=obs,
        actions=rng.integers(0, 2, (t, n)),
        rewards=rewards.astype(np.float32),
        terminated=np.zeros((t, n), bool),
        truncated=np.zeros((t, n), bool),
        mask=np.ones((t, n), bool),
        behaviour=out[:t].copy(),
        versions=np.ones(1, np.int64),
        policy_lag=np.zeros(1, np.int64),
        learner_version=1,
    )
    for _ in range(learn_calls):
        agent.learn(net, state, batch)
    return state.params.copy()


@pytest.mark.parametrize("name", ["impala", "a3c"])
def test_rewards_are_clipped_before_the_loss_and_scaled_after(name) -> None:
    rewards = np.random.default_rng(0).normal(0, 4, (6, 4))
    assert (np.abs(rewards) > 1).any() and (np.abs(rewards) < 1).any()
    clipped = params_after_a_step(name, rewards, reward_clip=1.0, reward_scale=0.5)
    by_hand = params_after_a_step(name, 0.5 * np.clip(rewards, -1, 1))
    np.testing.assert_array_equal(clipped, by_hand)
    unclipped = params_after_a_step(name, rewards, reward_scale=0.5)
    assert not np.array_equal(clipped, unclipped)


@pytest.mark.parametrize("bad", [0.0, -1.0])
def test_a_reward_clip_must_be_positive(bad) -> None:
    with pytest.raises(rlpar.ConfigError, match="reward_clip: expected a number > 0 or none"):
        rlpar.make_agent("impala", {"reward_clip": bad})


def test_impala_passes_are_optimizer_steps_on_the_same_batch() -> None:
    rewards = np.random.default_rng(0).normal(0, 1, (6, 4))
    three_passes = params_after_a_step("impala", rewards, passes=3)
    np.testing.assert_array_equal(three_passes, params_after_a_step("impala", rewards, 3))
    assert not np.array_equal(three_passes, params_after_a_step("impala", rewards))
    with pytest.raises(rlpar.ConfigError, match="passes: expected an integer >= 1, got 0"):
        rlpar.make_agent("impala", {"passes": 0})
