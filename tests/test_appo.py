"""The APPO agent and the framework facility under it (`rlpar.minibatches`, the learner's
seeded `LearnerState.rng`): epochs x minibatches of whole unrolls, PPO's metrics, bad config,
determinism, resume with value statistics, LSTM minibatches, Gaussian policies, the learner's
threads, and short runs on the env modes."""

from __future__ import annotations

import dataclasses

import gymnasium as gym
import numpy as np
import pytest

import rlpar
from rlpar.checkpoint import latest_checkpoint, load_checkpoint
from rlpar.config import EnvConfig, RuntimeConfig
from rlpar.runtime import Runner

OBS, ACTIONS = gym.spaces.Box(-1, 1, (3,), np.float32), gym.spaces.Discrete(2)


def column_batch(t: int, n: int, state_size: int = 0) -> rlpar.Batch:
    """A batch [T, N] whose every array says which column it came from (value n + 1)."""
    col = np.arange(1, n + 1, dtype=np.float32)
    ones = np.ones((t, n), np.float32)
    return rlpar.Batch(
        obs=np.broadcast_to(col[None, :, None], (t + 1, n, 3)).copy(),
        actions=(ones * col).astype(np.int64),
        rewards=ones * col,
        terminated=np.zeros((t, n), bool),
        truncated=np.zeros((t, n), bool),
        mask=np.ones((t, n), bool),
        behaviour=np.broadcast_to(col[None, :, None], (t, n, 4)).copy(),
        versions=np.ones(2, np.int64),
        policy_lag=np.array([0, 3]),
        learner_version=4,
        core_state=np.broadcast_to(col[:, None], (n, state_size)).copy() if state_size else None,
    )


def columns_of(mb: rlpar.Batch) -> list[int]:
    cols = [int(c) - 1 for c in mb.rewards[0]]
    for name in ("obs", "actions", "behaviour"):  # every array agrees
        assert [
            int(c) - 1 for c in getattr(mb, name)[0, :, ...].reshape(mb.num_columns, -1)[:, 0]
        ] == cols
    if mb.core_state is not None:
        assert [int(c) - 1 for c in mb.core_state[:, 0]] == cols
    return cols


@pytest.mark.parametrize("state_size", [0, 5])
def test_minibatches_partition_the_columns_and_reshuffle_each_epoch(state_size) -> None:
    batch = column_batch(3, 12, state_size)
    rng = np.random.default_rng(7)
    epochs = [[columns_of(mb) for mb in rlpar.minibatches(batch, 4, rng)] for _ in range(3)]
    for epoch in epochs:
        assert all(len(cols) == 3 and cols == sorted(cols) for cols in epoch)
        assert sorted(c for cols in epoch for c in cols) == list(range(12))
    assert epochs[0] != epochs[1] != epochs[2]  # a fresh order each epoch
    again = np.random.default_rng(7)  # the same generator state: the same minibatches
    assert [
        [columns_of(mb) for mb in rlpar.minibatches(batch, 4, again)] for _ in range(3)
    ] == epochs
    in_order = [columns_of(mb) for mb in rlpar.minibatches(batch, 3)]
    assert in_order == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    mb = rlpar.minibatches(batch, 2, rng)[0]
    assert mb.learner_version == 4 and list(mb.policy_lag) == [0, 3]


@pytest.mark.parametrize("count", [5, 0, 13, 2.0, True])
def test_minibatches_refuse_a_count_that_does_not_divide_the_columns(count) -> None:
    with pytest.raises(
        rlpar.ConfigError, match=r"minibatches: expected a divisor of the batch's 12"
    ):
        rlpar.minibatches(column_batch(2, 12), count)  # type: ignore[arg-type]


def agent_and_batch(seed: int = 0, t: int = 6, n: int = 8, **config: object):
    """An APPO agent, its net and learner state, and a random batch [T, N] acted by the initial
    parameters (slightly perturbed, so the ratios are not all 1)."""
    agent = rlpar.make_agent("appo", {"optim": {"lr": 0.01}, **config})
    net = rlpar.Net(agent.net_spec(OBS, ACTIONS))
    state = agent.init_state(net, net.init_params(seed=0))
    state.rng = np.random.default_rng(seed)
    rng = np.random.default_rng(1)
    obs = rng.uniform(-1, 1, (t + 1, n, 3)).astype(np.float32)
    out = net.forward(state.params, obs.reshape(-1, 3)).reshape(t + 1, n, -1)
    done = rng.random((t, n)) < 0.1
    mask = np.ones((t, n), bool)
    mask[1:] = ~done[:-1]
    done &= mask
    batch = rlpar.Batch(
        obs=obs, actions=rng.integers(0, 2, (t, n)),
        rewards=rng.normal(0, 1, (t, n)).astype(np.float32), terminated=done,
        truncated=np.zeros((t, n), bool), mask=mask,
        behaviour=out[:t] + rng.normal(0, 0.1, out[:t].shape).astype(np.float32),
        versions=np.array([3, 4]), policy_lag=np.array([2, 1]), learner_version=5,
    )  # fmt: skip
    return agent, net, state, batch


def test_learn_is_epochs_times_minibatches_optimizer_steps_from_the_learner_rng() -> None:
    """`learn` is, step for step, the loop the agent guide shows: per epoch a fresh shuffle of
    the columns from ``state.rng``, one clipped optimizer step per minibatch."""
    agent, net, state, batch = agent_and_batch(epochs=3, minibatches=2)
    metrics = agent.learn(net, state, batch)

    twin, _, by_hand, _ = agent_and_batch(epochs=3, minibatches=2)
    for _ in range(3):
        for mb in rlpar.minibatches(batch, 2, by_hand.rng):
            grad, _ = rlpar.loss_gradient(net, by_hand.params, mb, twin.loss)
            rlpar.clip_grad_norm(grad, 0.5)
            by_hand.optimizer.step(by_hand.params, grad)
    np.testing.assert_array_equal(state.params, by_hand.params)
    assert state.rng.bit_generator.state == by_hand.rng.bit_generator.state

    one_epoch = agent_and_batch(epochs=1, minibatches=2)
    one_epoch[0].learn(one_epoch[1], one_epoch[2], one_epoch[3])
    assert not np.array_equal(state.params, one_epoch[2].params)
    for key in ("approx_kl", "clip_fraction", "explained_variance", "value_loss", "policy_loss",
                "entropy", "ratio_mean", "grad_norm", "learning_rate"):  # fmt: skip
        assert isinstance(metrics[key], float) and np.isfinite(metrics[key]), key
    assert metrics["ratio_min"] <= metrics["ratio_mean"] <= metrics["ratio_max"]
    assert metrics["approx_kl"] >= 0 and 0 <= metrics["clip_fraction"] <= 1
    assert metrics["policy_lag_mean"] == 1.5 and metrics["policy_lag_max"] == 2
    assert metrics["valid_steps"] == batch.mask.sum()


def test_later_epochs_move_the_policy_and_the_clip_holds_it() -> None:
    """The ratios move away from 1 over the epochs (KL grows), and with a tiny clip they stop
    being followed: more steps clipped than with a wide one."""
    kls, clipped = [], []
    for eps in (0.01, 10.0):
        agent, net, state, batch = agent_and_batch(epochs=8, minibatches=1, clip_eps=eps)
        agent.learn(net, state, batch)
        agent2, net2, state2, _ = agent_and_batch(epochs=1, minibatches=1, clip_eps=eps)
        state2.params[...] = state.params
        m = agent2.learn(net2, state2, batch)  # the moved policy on the same batch
        kls.append(m["approx_kl"])
        clipped.append(m["clip_fraction"])
    assert kls[1] > kls[0] > 0
    assert clipped[0] > clipped[1]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"epochs": 0}, "epochs: expected an integer >= 1, got 0"),
        ({"minibatches": 0}, "minibatches: expected an integer >= 1, got 0"),
        ({"clip_eps": 0.0}, "clip_eps: expected a number > 0, got 0.0"),
        ({"clip_eps": -0.2}, "clip_eps: expected a number > 0"),
        ({"gae_lambda": 1.2}, r"gae_lambda: expected a number in \[0, 1\], got 1.2"),
        ({"gae_lambda": -0.1}, r"gae_lambda: expected a number in \[0, 1\]"),
        ({"value_clip": -1.0}, "value_clip: expected a number >= 0"),
        ({"ratio_clip": "wide"}, "ratio_clip: expected 'symmetric' or 'reciprocal', got 'wide'"),
        ({"advantage": "td"}, "advantage: expected 'vtrace' or 'gae', got 'td'"),
        ({"epochs": "4"}, "epochs"),
        ({"nonsense": 1}, "unknown key 'agent.nonsense'"),
    ],
)
def test_bad_config_names_the_key(change, message) -> None:
    with pytest.raises(rlpar.ConfigError, match=message):
        rlpar.make_agent("appo", change)


def runtime(**kw) -> RuntimeConfig:
    base = dict(
        num_actors=1, envs_per_actor=4, unroll_length=8, batch_rollouts=1,
        total_env_steps=1500, checkpoint_interval_s=None, deterministic=True, seed=3,
    )  # fmt: skip
    return RuntimeConfig(**{**base, **kw})


def appo(**config: object) -> rlpar.Agent:
    return rlpar.make_agent("appo", {"epochs": 2, "minibatches": 2, **config})


def test_minibatches_that_do_not_divide_the_runtimes_batch_are_refused_up_front() -> None:
    with pytest.raises(rlpar.ConfigError, match=(
        r"agent.minibatches: expected a divisor of the batch's 6 columns \(runtime.batch_rollouts "
        r"2 x runtime.envs_per_actor 3\).*got 4"
    )):  # fmt: skip
        Runner(
            appo(minibatches=4),
            EnvConfig("CartPole-v1"),
            runtime(envs_per_actor=3, batch_rollouts=2),
        )


def test_deterministic_runs_are_reproducible() -> None:
    runs = []
    for _ in range(2):
        runner = Runner(appo(), EnvConfig("CartPole-v1"), runtime())
        runner.run()
        runs.append(runner.params.copy())
    np.testing.assert_array_equal(runs[0], runs[1])


def test_resume_restores_the_value_statistics_and_the_learner_rng(tmp_path) -> None:
    env = EnvConfig("CartPole-v1")
    first = Runner(appo(normalize_values=True), env, runtime(), checkpoint_dir=tmp_path / "a")
    first.run()
    stats = first.state.extra["value_norm"]
    assert stats["count"] > 1000 and stats["mean"] > 1.0  # CartPole's returns, seen by the stats
    ckpt = load_checkpoint(latest_checkpoint(tmp_path / "a"))
    assert ckpt.extra["agent"]["value_norm"] == stats
    second = Runner(appo(normalize_values=True), env, runtime(total_env_steps=2500),
                    resume=latest_checkpoint(tmp_path / "a"))  # fmt: skip
    assert second.state.extra["value_norm"] == stats
    assert second.state.rng.bit_generator.state == first.state.rng.bit_generator.state
    second.run()
    assert second.state.extra["value_norm"]["count"] > stats["count"]


def test_value_normalisation_refuses_a_checkpoint_without_its_statistics(tmp_path) -> None:
    env = EnvConfig("CartPole-v1")
    Runner(appo(), env, runtime(), checkpoint_dir=tmp_path).run()
    resumed = Runner(appo(normalize_values=True), env, runtime(total_env_steps=2500),
                     resume=latest_checkpoint(tmp_path))  # fmt: skip
    with pytest.raises(rlpar.ConfigError, match=(
        r"agent.normalize_values: expected the learner state to hold the running value "
        r"statistics .* got none"
    )):  # fmt: skip
        resumed.run()


def test_lstm_minibatches_rerun_each_unroll_from_its_stored_state() -> None:
    """An LSTM core: each minibatch's columns carry their own stored state, so a minibatch's
    gradient is the gradient of those columns in the whole batch's forward."""
    agent = rlpar.make_agent("appo", {"net": {"lstm": 8}, "normalize_advantages": False})
    net = rlpar.Net(agent.net_spec(OBS, ACTIONS))
    state = agent.init_state(net, net.init_params(seed=0))
    rng = np.random.default_rng(0)
    t, n = 5, 4
    obs = rng.uniform(-1, 1, (t + 1, n, 3)).astype(np.float32)
    core = rng.normal(0, 0.5, (n, net.state_size)).astype(np.float32)
    out, _ = net.forward_train(state.params, obs.reshape(-1, 3), state=core,
                               resets=np.zeros((t + 1, n), bool))  # fmt: skip
    batch = rlpar.Batch(
        obs=obs, actions=rng.integers(0, 2, (t, n)),
        rewards=rng.normal(0, 1, (t, n)).astype(np.float32), terminated=np.zeros((t, n), bool),
        truncated=np.zeros((t, n), bool), mask=np.ones((t, n), bool),
        behaviour=out.reshape(t + 1, n, -1)[:t].copy(), versions=np.ones(1, np.int64),
        policy_lag=np.zeros(1, np.int64), learner_version=1, core_state=core,
    )  # fmt: skip
    halves = rlpar.minibatches(batch, 2, np.random.default_rng(1))
    assert all(
        mb.core_state is not None and mb.core_state.shape == (2, net.state_size) for mb in halves
    )
    # On-policy and unnormalised, the loss of a column depends on that column alone: the halves'
    # gradients (each a mean over its own steps) average to the whole batch's.
    whole, _ = rlpar.loss_gradient(net, state.params, batch, agent.loss)
    parts = [rlpar.loss_gradient(net, state.params, mb, agent.loss)[0].copy() for mb in halves]
    np.testing.assert_allclose((parts[0] + parts[1]) / 2, whole, rtol=1e-4, atol=1e-6)


def test_a_gaussian_policy_learns_in_a_run_with_the_learners_threads() -> None:
    runner = Runner(
        appo(), EnvConfig("Pendulum-v1"), runtime(learner_threads=2, total_env_steps=2000)
    )
    result = runner.run()
    assert result.learner_steps > 0 and np.isfinite(runner.params).all()


@pytest.mark.parametrize(
    ("env", "vectorization"),
    [("CartPole-v1", "async"), ("rlpar/CartPole-v1", "sync"), ("CartPole-v1", "sync")],
)
def test_short_runs_on_the_env_modes(env, vectorization) -> None:
    env_cfg = dataclasses.replace(EnvConfig(env), vectorization=vectorization)
    result = Runner(appo(net={"lstm": 4}), env_cfg, runtime(deterministic=False)).run()
    assert result.learner_steps > 0 and result.episodes > 0
