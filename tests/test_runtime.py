"""The actor/learner runtime: rollout integrity, one version per unroll, policy lag, back-pressure,
supervision, signals, checkpoints and resume, deterministic mode."""

from __future__ import annotations

import os
import signal
import threading
import time

import gymnasium as gym
import numpy as np
import pytest
from tiny_agent import TinyAgent

import rlpar
from rlpar.checkpoint import latest_checkpoint, load_checkpoint
from rlpar.config import EnvConfig, RuntimeConfig
from rlpar.runtime import Runner

MAX_STEPS = 6


class CounterEnv(gym.Env):
    """obs = (episode id, step in episode); reward = 1 + action; an episode of id e terminates
    after 3 + e % 5 steps, so some episodes are truncated at MAX_STEPS by the TimeLimit."""

    observation_space = gym.spaces.Box(0, 1e9, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, fail_after: int | None = None, hang: threading.Event | None = None):
        self.fail_after, self.hang, self.calls = fail_after, hang, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if seed is not None:
            self.episode = int(self.np_random.integers(1000)) * 1000
        self.episode += 1
        self.t = 0
        return np.array([self.episode, 0], np.float32), {}

    def step(self, action):
        self.calls += 1
        if self.fail_after is not None and self.calls > self.fail_after:
            raise KeyError("counter env exploded")
        if self.hang is not None and self.calls > 50:
            self.hang.wait()
        self.t += 1
        terminated = self.t == 3 + self.episode % 5
        obs = np.array([self.episode, self.t], np.float32)
        return obs, 1.0 + float(action), terminated, False, {}


gym.register("rlpar-test/Counter-v0", CounterEnv, max_episode_steps=MAX_STEPS)


def small_runtime(**kw) -> RuntimeConfig:
    base = dict(
        num_actors=2,
        envs_per_actor=3,
        unroll_length=5,
        batch_rollouts=2,
        total_env_steps=3000,
        checkpoint_interval_s=None,
    )
    base.update(kw)
    return RuntimeConfig(**base)


def rlpar_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("rlpar-")]


def check_columns(batch) -> int:
    """Every transition in a batch is a real one from the counter env; returns valid steps."""
    obs, mask = batch.obs, batch.mask
    t_len, n = batch.rewards.shape
    checked = 0
    for c in range(n):
        for t in range(t_len):
            ep, step = obs[t, c]
            nxt_ep, nxt_step = obs[t + 1, c]
            if mask[t, c]:
                assert (nxt_ep, nxt_step) == (ep, step + 1), "a valid step crossed an episode"
                assert batch.rewards[t, c] == 1 + batch.actions[t, c]
                ends = 3 + int(ep) % 5
                assert batch.terminated[t, c] == (nxt_step == ends)
                assert batch.truncated[t, c] == (nxt_step == MAX_STEPS)  # may coincide with term
                checked += 1
            else:
                assert nxt_step == 0 and nxt_ep != ep, "the autoreset step must be masked"
                assert batch.rewards[t, c] == 0
                assert not batch.terminated[t, c] and not batch.truncated[t, c]
            if t > 0:
                done = batch.terminated[t - 1, c] or batch.truncated[t - 1, c]
                assert mask[t, c] == (not done)
    return checked


def test_rollouts_hold_real_transitions_one_version_each_and_no_thread_survives() -> None:
    before = len(rlpar_threads())
    agent = TinyAgent(record=True)
    runner = Runner(agent, EnvConfig("rlpar-test/Counter-v0"), small_runtime())
    result = runner.run()
    assert result.env_steps >= 3000
    assert result.learner_steps == len(agent.batches) > 10
    assert len(rlpar_threads()) == before
    valid = 0
    k = 3
    for batch in agent.batches:
        valid += check_columns(batch)
        for b, version in enumerate(batch.versions):
            cols = slice(b * k, (b + 1) * k)
            for t in range(batch.unroll_length):
                got = batch.behaviour[t, cols]
                obs = batch.obs[t, cols]
                # Same version: equal up to the GEMM's alignment-dependent rounding; any other
                # version differs by far more (every learner step moves every parameter).
                want = runner.net.forward(agent.params_by_version[int(version)], obs)
                np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
                other = agent.params_by_version.get(int(version) + 1)
                if other is not None:
                    assert not np.allclose(
                        got, runner.net.forward(other, obs), rtol=1e-5, atol=1e-7
                    )
    assert valid > 1000
    assert result.episodes > 100


def test_truncation_and_termination_both_happen() -> None:
    agent = TinyAgent(record=True)
    Runner(agent, EnvConfig("rlpar-test/Counter-v0"), small_runtime(total_env_steps=600)).run()
    terminated = sum(int(b.terminated.sum()) for b in agent.batches)
    truncated = sum(int(b.truncated.sum()) for b in agent.batches)
    assert terminated > 0 and truncated > 0


class SlowAgent(TinyAgent):
    def learn(self, net, state, batch):
        time.sleep(0.02)
        return super().learn(net, state, batch)


def test_back_pressure_bounds_what_actors_run_ahead() -> None:
    cfg = small_runtime(total_env_steps=10**9, max_wall_s=1.0, buffers_per_actor=2)
    runner = Runner(SlowAgent(), EnvConfig("rlpar-test/Counter-v0"), cfg)
    result = runner.run()
    per_rollout = cfg.unroll_length * cfg.envs_per_actor
    consumed = result.learner_steps * cfg.batch_rollouts * per_rollout
    in_flight = cfg.num_actors * (cfg.buffers_per_actor + 1) * per_rollout
    assert result.stopped_by == "max_wall_s"
    assert result.env_steps <= consumed + in_flight


def test_max_policy_lag_drops_stale_rollouts_and_counts_them() -> None:
    cfg = small_runtime(
        num_actors=4, batch_rollouts=1, buffers_per_actor=3, max_policy_lag=0, total_env_steps=4000
    )
    agent = SlowAgent(record=True)
    runner = Runner(agent, EnvConfig("rlpar-test/Counter-v0"), cfg)
    runner.run()
    assert runner.learner.stats.dropped_rollouts > 0
    assert all(int(b.policy_lag.max()) == 0 for b in agent.batches)


def test_policy_lag_is_measured() -> None:
    agent = SlowAgent(record=True)
    cfg = small_runtime(num_actors=2, buffers_per_actor=3, total_env_steps=2000)
    Runner(agent, EnvConfig("rlpar-test/Counter-v0"), cfg).run()
    lags = np.concatenate([b.policy_lag for b in agent.batches])
    assert lags.min() >= 0 and lags.max() >= 1
    for b in agent.batches:
        np.testing.assert_array_equal(b.policy_lag, b.learner_version - b.versions)


@pytest.mark.parametrize(
    ("where", "kwargs"),
    [("env", {"fail_after": 40}), ("learner", {}), ("act", {})],
)
def test_an_exception_anywhere_stops_the_run_and_is_reraised(where, kwargs) -> None:
    class Failing(TinyAgent):
        def learn(self, net, state, batch):
            if where == "learner" and state.steps == 3:
                raise KeyError("learner exploded")
            return super().learn(net, state, batch)

        def act(self, net, out, rng):
            if where == "act" and rng.random() < 0.05:
                raise KeyError("act exploded")
            return super().act(net, out, rng)

    before = len(rlpar_threads())
    env = EnvConfig("rlpar-test/Counter-v0", kwargs=kwargs)
    runner = Runner(Failing(), env, small_runtime(total_env_steps=10**9))
    t0 = time.perf_counter()
    with pytest.raises(KeyError, match="exploded") as info:
        runner.run()
    assert time.perf_counter() - t0 < 10
    thread = "learner" if where == "learner" else "actor-"
    assert any(thread in note for note in getattr(info.value, "__notes__", []))
    assert len(rlpar_threads()) == before


def test_a_hung_env_does_not_hang_shutdown() -> None:
    release = threading.Event()
    env = EnvConfig("rlpar-test/Counter-v0", kwargs={"hang": release})
    cfg = small_runtime(
        num_actors=1, batch_rollouts=1, total_env_steps=10**9, max_wall_s=0.5, join_timeout_s=0.5
    )
    try:
        t0 = time.perf_counter()
        result = Runner(TinyAgent(), env, cfg).run()
        assert time.perf_counter() - t0 < 5
        assert result.stuck_threads == ["rlpar-actor-0"]
    finally:
        release.set()
    for t in rlpar_threads():
        t.join(5)
    assert not rlpar_threads()


def test_sigint_stops_cleanly_with_a_final_checkpoint(tmp_path) -> None:
    cfg = small_runtime(total_env_steps=10**9)
    runner = Runner(TinyAgent(), EnvConfig("rlpar-test/Counter-v0"), cfg, checkpoint_dir=tmp_path)
    timer = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    result = runner.run()
    timer.join()
    assert result.stopped_by == "SIGINT"
    assert result.checkpoint is not None
    ckpt = load_checkpoint(result.checkpoint)
    assert ckpt.counters["learner_steps"] == result.learner_steps
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_resume_continues_every_counter(tmp_path) -> None:
    env = EnvConfig("rlpar-test/Counter-v0")
    first = Runner(TinyAgent(), env, small_runtime(total_env_steps=1500), checkpoint_dir=tmp_path)
    r1 = first.run()
    ckpt_path = latest_checkpoint(tmp_path)
    ckpt = load_checkpoint(ckpt_path)
    assert ckpt.counters["env_steps"] == r1.env_steps
    assert ckpt.counters["learner_steps"] == r1.learner_steps
    np.testing.assert_array_equal(ckpt.params, first.state.params)
    second = Runner(
        TinyAgent(),
        env,
        small_runtime(total_env_steps=3000),
        checkpoint_dir=tmp_path,
        resume=ckpt_path,
    )
    assert second.state.steps == r1.learner_steps
    np.testing.assert_array_equal(second.state.params, first.state.params)
    assert second.store.pin().version == r1.learner_steps + 1
    r2 = second.run()
    assert r2.env_steps >= 3000
    assert r2.learner_steps > r1.learner_steps
    assert r2.episodes > r1.episodes


def test_a_resumed_run_learns_at_its_own_configs_learning_rate(tmp_path) -> None:
    # The checkpoint holds the optimizer's moments and step count; the learning rate is the
    # config's (`--set agent.optim.lr=...` on resume, a PBT sweep's new value), not the old one.
    env = EnvConfig("rlpar-test/Counter-v0")
    first = Runner(
        TinyAgent(lr=1e-3), env, small_runtime(total_env_steps=1500), checkpoint_dir=tmp_path
    )
    first.run()
    ckpt_path = latest_checkpoint(tmp_path)
    assert load_checkpoint(ckpt_path).optimizer["lr"] == pytest.approx(1e-3)
    second = Runner(TinyAgent(lr=4e-3), env, small_runtime(total_env_steps=3000), resume=ckpt_path)
    assert second.state.optimizer.lr == pytest.approx(4e-3)
    assert second.state.optimizer.steps == first.state.optimizer.steps  # the rest is restored
    second.run()
    assert second.state.optimizer.lr == pytest.approx(4e-3)


def test_resume_from_another_architecture_fails_clearly(tmp_path) -> None:
    env = EnvConfig("rlpar-test/Counter-v0")
    Runner(
        TinyAgent(hidden=32), env, small_runtime(total_env_steps=300), checkpoint_dir=tmp_path
    ).run()
    with pytest.raises(ValueError, match="architecture"):
        Runner(TinyAgent(hidden=16), env, small_runtime(), resume=latest_checkpoint(tmp_path))


def test_deterministic_mode_gives_bit_identical_parameters() -> None:
    def final_params(seed: int) -> np.ndarray:
        cfg = small_runtime(
            deterministic=True,
            seed=seed,
            total_env_steps=2000,
            buffers_per_actor=2,
            batch_rollouts=4,
        )
        runner = Runner(TinyAgent(), EnvConfig("CartPole-v1"), cfg)
        runner.run()
        return runner.state.params.copy(), runner.state.steps

    (a, steps_a), (b, steps_b), (c, _) = final_params(1), final_params(1), final_params(2)
    assert steps_a == steps_b
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


def test_deterministic_mode_stops_at_the_target_at_the_same_step_every_time() -> None:
    """The target check runs on the learner thread, over episodes the learner logged in batch
    order: the stop point and the reported return do not depend on thread timing."""

    def run() -> tuple:
        cfg = small_runtime(
            deterministic=True,
            seed=3,
            total_env_steps=20_000,
            buffers_per_actor=2,
            batch_rollouts=4,
            target_return=25.0,
        )
        runner = Runner(TinyAgent(), EnvConfig("CartPole-v1"), cfg)
        res = runner.run()
        assert res.stopped_by == "target_return"
        assert res.mean_return is not None and res.mean_return >= 25.0
        assert res.env_steps == res.learner_steps * 4 * 5 * 3
        return res.mean_return, res.env_steps, res.learner_steps, res.episodes, runner.state.params

    first, second = run(), run()
    assert first[:4] == second[:4]
    np.testing.assert_array_equal(first[4], second[4])


def test_bad_env_and_spaces_fail_at_start_up() -> None:
    with pytest.raises(ValueError, match=r"unknown environment id 'CartPole-v9'.*CartPole-v1"):
        Runner(TinyAgent(), EnvConfig("CartPole-v9"), small_runtime())
    with pytest.raises(ValueError, match="Discrete action space"):
        Runner(TinyAgent(), EnvConfig("Pendulum-v1"), small_runtime())
    assert not rlpar_threads()


class _ShortParams(TinyAgent):
    def init_state(self, net: rlpar.Net, params: np.ndarray) -> rlpar.LearnerState:
        return super().init_state(net, params[:-1].copy())


def test_an_agent_whose_state_holds_parameters_of_another_size_fails_at_start_up() -> None:
    with pytest.raises(ValueError, match="params must be a contiguous flat float32 vector of"):
        Runner(_ShortParams(), EnvConfig("rlpar-test/Counter-v0"), small_runtime())
    assert not rlpar_threads()


def test_one_shared_net_serves_every_actor() -> None:
    runner = Runner(TinyAgent(), EnvConfig("CartPole-v1"), small_runtime(num_actors=3))
    assert all(a.net is runner.net for a in runner.actors)
    runner.run()
    assert isinstance(runner.net, rlpar.Net)


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (("impala", EnvConfig(), RuntimeConfig()), r"agent must be an rlpar.Agent, got str"),
        ((TinyAgent(), "CartPole-v1", RuntimeConfig()), r"env must be an rlpar.EnvConfig, got str"),
        (
            (TinyAgent(), EnvConfig(), {"num_actors": 1}),
            r"runtime must be .*RuntimeConfig, got dict",
        ),
    ],
)
def test_runner_arguments_of_the_wrong_type_are_named(args, match) -> None:
    with pytest.raises(TypeError, match=match):
        Runner(*args)


@pytest.mark.parametrize("count", [1, 3])
def test_batch_stack_copies_the_rollouts_side_by_side(count) -> None:
    from rlpar.data import ARRAY_FIELDS, Batch, Rollout

    rng = np.random.default_rng(0)
    rollouts = []
    for i in range(count):
        r = Rollout.allocate(4, 3, (2,), np.dtype(np.float32), (), np.dtype(np.int64), 5,
                             actor=i, state_size=2)  # fmt: skip
        for name in ARRAY_FIELDS:
            a = getattr(r, name)
            a[...] = rng.integers(0, 2, a.shape) if a.dtype == bool else rng.integers(0, 9, a.shape)
        r.version = 7 - i
        rollouts.append(r)
    batch = Batch.stack(rollouts, learner_version=8)
    for name in ARRAY_FIELDS:
        got, parts = getattr(batch, name), [getattr(r, name) for r in rollouts]
        axis = 0 if name == "core_state" else 1
        np.testing.assert_array_equal(got, np.concatenate(parts, axis=axis), err_msg=name)
        assert got.dtype == parts[0].dtype and got.flags.c_contiguous, name
        assert not any(np.shares_memory(got, p) for p in parts), name  # the buffers go back
    assert batch.num_columns == 3 * count
    np.testing.assert_array_equal(batch.versions, [7 - i for i in range(count)])
    np.testing.assert_array_equal(batch.policy_lag, [1 + i for i in range(count)])
