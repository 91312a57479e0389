"""Options of the built-in agents: reward clipping (`reward_clip`, Atari's convention: the loss
sees clipped rewards, exactly as if the env had returned them clipped), IMPALA's `passes`
(several optimizer steps on one batch) and the linear learning-rate schedule
(`optim.lr_decay_env_steps`), and the torso an image observation gets (`net.torso`)."""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

import rlpar

ROOT = Path(__file__).resolve().parent.parent

OBS, ACTIONS = gym.spaces.Box(-1, 1, (3,), np.float32), gym.spaces.Discrete(2)


def agent_and_batch(
    name: str, rewards: np.ndarray, **config: object
) -> tuple[rlpar.Agent, rlpar.Net, rlpar.LearnerState, rlpar.Batch]:
    """An agent (lr 0.01 unless ``config`` says otherwise), its net and learner state, and a
    batch of rewards [T, N] on random observations, acted by the initial parameters."""
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
    return agent, net, state, batch


def params_after_a_step(
    name: str, rewards: np.ndarray, learn_calls: int = 1, **config: object
) -> np.ndarray:
    agent, net, state, batch = agent_and_batch(name, rewards, **config)
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


@pytest.mark.parametrize(("name", "passes"), [("impala", 1), ("impala", 3), ("a3c", 1)])
def test_the_learning_rate_anneals_linearly_by_env_steps_learned(name, passes) -> None:
    """lr * (1 - learned / lr_decay_env_steps), each batch's T x N steps counted once whatever
    the passes, down to 0 (where the parameters stop moving) and no further."""
    extra = {"passes": passes} if name == "impala" else {}
    agent, net, state, batch = agent_and_batch(
        name, np.ones((5, 4)), optim={"lr": 0.01, "lr_decay_env_steps": 60}, **extra
    )
    seen = []
    for _ in range(4):
        metrics = agent.learn(net, state, batch)
        seen.append(metrics["learning_rate"])
    np.testing.assert_allclose(seen, [0.01, 0.01 * 40 / 60, 0.01 * 20 / 60, 0.0])
    before = state.params.copy()
    assert agent.learn(net, state, batch)["learning_rate"] == 0.0
    np.testing.assert_array_equal(state.params, before)
    # the position is learner state, kept by checkpoints: a copy of it continues the schedule
    assert state.extra["lr_schedule_env_steps"] == 5 * 20


def test_a_constant_learning_rate_is_the_default() -> None:
    agent, net, state, batch = agent_and_batch("impala", np.ones((5, 4)))
    assert [agent.learn(net, state, batch)["learning_rate"] for _ in range(3)] == [0.01] * 3
    assert "lr_schedule_env_steps" not in state.extra


@pytest.mark.parametrize("bad", [0, -5])
def test_lr_decay_env_steps_must_be_positive(bad) -> None:
    with pytest.raises(rlpar.ConfigError, match="lr_decay_env_steps: expected an integer >= 1"):
        rlpar.make_agent("a3c", {"optim": {"lr_decay_env_steps": bad}})


def test_a_resumed_run_continues_the_schedule(tmp_path) -> None:
    from rlpar.checkpoint import latest_checkpoint
    from rlpar.config import EnvConfig, RuntimeConfig
    from rlpar.runtime import Runner

    def agent() -> rlpar.Agent:
        return rlpar.make_agent("impala", {"optim": {"lr_decay_env_steps": 4000}})

    def runtime(steps: int) -> RuntimeConfig:
        return RuntimeConfig(
            num_actors=1, envs_per_actor=4, unroll_length=5, total_env_steps=steps,
            checkpoint_interval_s=None, deterministic=True,
        )  # fmt: skip

    env = EnvConfig("CartPole-v1")
    first = Runner(agent(), env, runtime(1000), checkpoint_dir=tmp_path)
    first.run()
    learned = first.state.extra["lr_schedule_env_steps"]
    assert learned >= 1000
    second = Runner(agent(), env, runtime(2000), resume=latest_checkpoint(tmp_path))
    assert second.state.extra["lr_schedule_env_steps"] == learned
    second.run()
    assert second.state.extra["lr_schedule_env_steps"] >= 2000
    assert second.state.optimizer.lr < first.state.optimizer.lr < 1e-3


# ----------------------------------------------------------------------------- from a config


def test_impala_cnn_torso_trains_from_the_shipped_config() -> None:
    """experiments/minatar_breakout_impala_cnn.toml picks the torso; a few learner steps run
    (on rlpar's native Catch, so MinAtar need not be installed), split over 2 learner threads."""
    from rlpar.app.experiment import load_experiment

    path = (
        Path(__file__).resolve().parent.parent / "experiments" / "minatar_breakout_impala_cnn.toml"
    )
    exp = load_experiment(
        path,
        [
            "env.id=rlpar/Catch-v0",
            "env.setup=none",
            "env.kwargs={}",
            "agent.net.impala_channels=[4, 8]",
            "agent.net.conv_hidden=32",
            "runtime.num_actors=1",
            "runtime.envs_per_actor=4",
            "runtime.unroll_length=5",
            "runtime.total_env_steps=400",
            "runtime.learner_threads=2",
        ],
    )
    agent = exp.make_agent()
    frames = gym.spaces.Box(0, 255, (10, 10, 1), np.uint8)
    spec = agent.net_spec(frames, gym.spaces.Discrete(3))
    assert any(isinstance(layer, rlpar.Residual) for layer in spec.layers)
    assert spec.layers[:2] == (rlpar.Conv2d(4, 3, 1, 1), rlpar.MaxPool2d(3, 2, 1))
    result = rlpar.Runner(agent, exp.env, exp.runtime).run()
    assert result.learner_steps > 0
