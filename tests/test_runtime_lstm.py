"""Recurrent policies through the runtime: actors carry the core state, rollouts store it at the
unroll start, the learner re-runs each unroll from it with the episode-start resets; agents,
deterministic mode, checkpoints, evaluation and the fused native unroll."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import numpy as np
import pytest
from actor_helpers import make_actor
from test_runtime import small_runtime as runtime_base

import rlpar
from rlpar.checkpoint import latest_checkpoint
from rlpar.config import EnvConfig, RuntimeConfig
from rlpar.data import Batch, episode_starts
from rlpar.runtime import Runner
from rlpar.runtime.actor import Actor
from rlpar.runtime.common import EpisodeLog
from rlpar.runtime.recurrent import CoreState


def impala(lstm: int = 8, **kw) -> rlpar.Agent:
    return rlpar.make_agent("impala", {"net": {"hidden": [16], "lstm": lstm}, **kw})


MATMULS = [
    "float32",
    pytest.param(
        "bf16x3",
        marks=pytest.mark.skipif(not rlpar.amx_available(), reason="no AMX-BF16 tiles"),
    ),
]


def small_runtime(**kw) -> RuntimeConfig:
    """test_runtime's small run, with 6-step unrolls and 1500 env steps unless ``kw`` says."""
    return runtime_base(**{"unroll_length": 6, "total_env_steps": 1500, **kw})


def check_learner_rerun(net: rlpar.Net, params: np.ndarray, r: rlpar.Rollout) -> int:
    """The learner's re-run of ``r`` from its stored start state, with the episode-start
    resets, reproduces the actor's outputs; returns the episodes that started inside it."""
    batch = Batch.stack([r], learner_version=1)
    t_len, k = r.rewards.shape
    obs = batch.obs.reshape((t_len + 1) * k, *batch.obs.shape[2:])
    out, tape = net.forward_train(params, obs, **batch.core_args())
    tape.release()
    np.testing.assert_allclose(
        out.reshape(t_len + 1, k, -1)[:t_len], r.behaviour, rtol=1e-5, atol=1e-5
    )
    return int(episode_starts(r.mask)[1:].sum())


@pytest.mark.parametrize("matmul", MATMULS)
def test_learner_rerun_of_each_unroll_gives_the_actors_outputs(matmul: str) -> None:
    """Three consecutive unrolls with episodes ending inside them: recomputing each from its
    stored start state with `episode_starts` reproduces the behaviour outputs; and the state
    carried across unrolls is the one the previous unroll ended with. With bf16x3 the actor's
    steps read the core's weights packed once for the snapshot, the learner packs its own."""
    actor = make_actor(lstm_matmul=matmul)
    net, params = actor.net, actor.params
    episodes = EpisodeLog()
    seen_resets = 0
    for _ in range(6):
        r = actor.free.get()
        actor.unroll(r, episodes)
        seen_resets += check_learner_rerun(net, params, r)
        actor.free.put(r)
    assert seen_resets > 0, "no episode started inside an unroll: the resets went untested"
    assert episodes.count > 0


def test_stored_state_is_the_previous_unrolls_end_state() -> None:
    actor = make_actor()
    net, params = actor.net, actor.params
    episodes = EpisodeLog()
    first, second = actor.free.get(), actor.free.get()
    actor.unroll(first, episodes)
    actor.unroll(second, episodes)
    t_len = first.rewards.shape[0]
    state = first.core_state.copy()
    starts = episode_starts(first.mask)
    for t in range(t_len):
        net.forward(params, first.obs[t], state=state, resets=starts[t])
    state[starts[t_len]] = 0.0  # the start pending for the next unroll's step 0
    np.testing.assert_allclose(second.core_state, state, rtol=1e-6, atol=1e-6)
    assert np.abs(second.core_state).sum() > 0


def test_feed_forward_rollouts_carry_an_empty_state() -> None:
    actor = make_actor(lstm=0)
    r = actor.free.get()
    actor.unroll(r, EpisodeLog())
    assert r.core_state.shape == (3, 0)
    assert Batch.stack([r, r], learner_version=1).core_args() == {}


def test_batch_stacks_and_splits_the_state_by_env() -> None:
    actor = make_actor()
    rollouts = [actor.free.get() for _ in range(2)]
    for r in rollouts:
        actor.unroll(r, EpisodeLog())
    batch = Batch.stack(rollouts, learner_version=2)
    assert batch.core_state.shape == (6, 16)
    np.testing.assert_array_equal(batch.core_state[3:], rollouts[1].core_state)
    shards = batch.split(2)
    np.testing.assert_array_equal(shards[1].core_state, batch.core_state[3:])
    assert shards[1].core_args()["resets"].shape == (8, 3)
    np.testing.assert_array_equal(
        shards[1].core_args(bootstrap=False)["resets"], shards[1].core_args()["resets"][:-1]
    )


@pytest.mark.parametrize("name", ["impala", "a3c"])
def test_agents_train_with_an_lstm_core(name) -> None:
    agent = rlpar.make_agent(name, {"net": {"hidden": [16], "lstm": 8}})
    runner = Runner(agent, EnvConfig("CartPole-v1"), small_runtime(learner_threads=2))
    before = runner.state.params.copy()
    result = runner.run()
    assert result.learner_steps > 0
    assert runner.net.recurrent
    assert not np.array_equal(before, runner.state.params)
    assert np.isfinite(runner.state.params).all()


def test_lstm_config_is_checked() -> None:
    with pytest.raises(ValueError, match="lstm: expected an integer >= 0, got -1"):
        rlpar.make_agent("impala", {"net": {"lstm": -1}})


def test_deterministic_mode_is_bit_identical_with_an_lstm() -> None:
    def final_params(seed: int) -> np.ndarray:
        cfg = small_runtime(deterministic=True, seed=seed, buffers_per_actor=2, batch_rollouts=4)
        runner = Runner(impala(), EnvConfig("CartPole-v1"), cfg)
        runner.run()
        return runner.state.params.copy()

    a, b, c = final_params(1), final_params(1), final_params(2)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


def test_checkpoint_resume_keeps_the_core_and_refuses_another_width(tmp_path) -> None:
    env = EnvConfig("CartPole-v1")
    first = Runner(impala(), env, small_runtime(total_env_steps=600), checkpoint_dir=tmp_path)
    first.run()
    path = latest_checkpoint(tmp_path)
    second = Runner(impala(), env, small_runtime(total_env_steps=1200), resume=path)
    np.testing.assert_array_equal(second.state.params, first.state.params)
    assert second.run().learner_steps > first.state.steps
    with pytest.raises(ValueError, match="architecture"):
        Runner(impala(lstm=4), env, small_runtime(), resume=path)


@pytest.mark.parametrize("matmul", MATMULS)
@pytest.mark.parametrize("env_id", ["rlpar/CartPole-v1", "rlpar/Catch-v0"])
def test_fused_unroll_carries_the_state_like_the_python_path(env_id, matmul: str) -> None:
    """The fused native unroll runs a recurrent net: over consecutive unrolls, with episodes
    ending inside them, its outputs equal a step-by-step replay of the recorded observations
    and masks through the Python path's `CoreState` (bit for bit: the same native call; with
    bf16x3, weights packed once for the snapshot against packed from the array in each call),
    each rollout stores the state its step 0 was fed, and the learner's re-run reproduces them."""
    actor = make_actor(env_id, lstm_matmul=matmul)
    assert actor.sampler is not None, "the fused unroll refused the recurrent net"
    net, params = actor.net, actor.params
    replay = CoreState(net, actor.num_envs)
    episodes = EpisodeLog()
    seen_resets = 0
    for _ in range(8):
        r = actor.free.get()
        actor.unroll(r, episodes)
        start = SimpleNamespace(core_state=np.empty_like(r.core_state))
        replay.begin_unroll(start)  # only its core_state is written
        np.testing.assert_array_equal(r.core_state, start.core_state)
        for t in range(r.rewards.shape[0]):
            out = np.empty_like(r.behaviour[t])
            replay.forward(params, r.obs[t], out)
            np.testing.assert_array_equal(out, r.behaviour[t])
            replay.after_step(r.mask[t])
        seen_resets += check_learner_rerun(net, params, r)
        actor.free.put(r)
    assert seen_resets > 0, "no episode started inside an unroll: the resets went untested"
    assert np.abs(replay.state).sum() > 0


def test_fused_unroll_checks_the_state_arrays() -> None:
    actor = make_actor("rlpar/CartPole-v1")
    r = actor.free.get()
    arrays = (r.obs, r.actions, r.rewards, r.terminated, r.truncated, r.mask, r.behaviour)
    args = (actor.envs.native, actor.net, actor.params, actor.sampler, *arrays,
            actor.carry.ep_return, actor.carry.ep_length)  # fmt: skip
    with pytest.raises(ValueError, match=r"LSTM core: fused_unroll needs state float32 \[K, 16\]"):
        rlpar._native.fused_unroll(*args)
    state, starts = actor.carry.core.state, actor.carry.core.starts
    env_before = actor.envs.native.get_state(0)[0].copy()
    state_before = state.copy()
    with pytest.raises(ValueError, match=r"state must have shape \(3, 16\)"):
        rlpar._native.fused_unroll(
            *args, state=state[:, :8].copy(), starts=starts, core_state=r.core_state
        )
    with pytest.raises(TypeError, match="starts"):
        rlpar._native.fused_unroll(
            *args, state=state, starts=starts.astype(np.uint8), core_state=r.core_state
        )
    with pytest.raises(ValueError, match="must not share memory"):
        rlpar._native.fused_unroll(*args, state=state, starts=starts, core_state=state)
    both = np.zeros(state.size + 16, np.float32)  # overlapping, not identical, views
    with pytest.raises(ValueError, match="must not share memory"):
        rlpar._native.fused_unroll(
            *args,
            state=both[: state.size].reshape(state.shape),
            starts=starts,
            core_state=both[16:].reshape(state.shape),
        )
    # a refused call moves no env and leaves the carried state alone
    np.testing.assert_array_equal(actor.envs.native.get_state(0)[0], env_before)
    np.testing.assert_array_equal(state, state_before)
    ff = make_actor("rlpar/CartPole-v1", lstm=0)
    ff_args = (ff.envs.native, ff.net, ff.params, ff.sampler, *arrays, ff.carry.ep_return,
               ff.carry.ep_length)  # fmt: skip
    with pytest.raises(ValueError, match="this net is feed-forward"):
        rlpar._native.fused_unroll(*ff_args, state=state, starts=starts)
    with pytest.raises(ValueError, match="this net is feed-forward"):
        rlpar._native.fused_unroll(*ff_args, core_state=r.core_state)


def test_fused_native_training_with_an_lstm_is_deterministic() -> None:
    """IMPALA + LSTM on a native env runs the fused unroll, learns something and is
    bit-reproducible in deterministic mode."""

    def final(seed: int) -> tuple[np.ndarray, Runner]:
        cfg = small_runtime(deterministic=True, seed=seed, total_env_steps=3000)
        runner = Runner(impala(), EnvConfig("rlpar/CartPole-v1"), cfg)
        assert all(a.sampler is not None for a in runner.actors), "not on the fused path"
        runner.run()
        return runner.state.params.copy(), runner

    a, runner = final(1)
    b, _ = final(1)
    np.testing.assert_array_equal(a, b)
    assert runner.state.steps > 0 and np.isfinite(a).all()


def test_actor_threads_keep_their_own_states() -> None:
    """Two actors sharing one net, each on its own thread: every rollout still re-runs to its
    own behaviour outputs (no state crosses actors)."""
    actors = [make_actor() for _ in range(2)]
    errors: list[BaseException] = []
    done: list[tuple[Actor, object]] = []

    def work(actor: Actor) -> None:
        try:
            for _ in range(3):
                r = actor.free.get()
                actor.unroll(r, EpisodeLog())
                done.append((actor, r))
        except BaseException as e:  # re-raised below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(a,)) for a in actors]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    for actor, r in done:
        batch = Batch.stack([r], learner_version=1)
        obs = batch.obs.reshape(-1, batch.obs.shape[-1])
        out, tape = actor.net.forward_train(actor.params, obs, **batch.core_args())
        tape.release()
        t_len, k = r.rewards.shape
        np.testing.assert_allclose(
            out.reshape(t_len + 1, k, -1)[:t_len], r.behaviour, rtol=1e-5, atol=1e-5
        )


def test_evaluation_carries_the_state() -> None:
    """The evaluation's episode loop (`rlpar eval`, a run's evaluations) runs a recurrent net
    (it must pass the state)."""
    from rlpar.runtime.evaluation import _play

    actor = make_actor()
    played = _play(actor.envs, actor.net, actor.params, actor.agent, 4, True, 0, None)
    assert played is not None
    returns, _, policy, cut = played
    assert len(returns) == 4 and policy == "greedy" and cut == 0
    # Cut at 2 steps: every episode is cut, and the envs reset with the state restarted.
    played = _play(actor.envs, actor.net, actor.params, actor.agent, 4, True, 0, None, None, 2)
    assert played is not None
    returns, lengths, _, cut = played
    assert len(returns) == 4 and lengths == [2] * 4 and cut == 4
