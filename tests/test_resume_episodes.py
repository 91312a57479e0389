"""Resuming the episodes in progress: native envs save and load their whole state, actors keep
it (with the observations, returns so far and the recurrent core's state) as of their last
finished unroll, checkpoints carry it as arrays, and a resumed run continues those episodes
instead of starting new ones. Envs that cannot save their state start new episodes, as before."""

from __future__ import annotations

import io
import logging

import actor_helpers
import numpy as np
import pytest
from rlpar.envs.native import AcrobotVectorEnv, CartPoleVectorEnv, CatchVectorEnv

import rlpar
from rlpar.checkpoint import Checkpoint, latest_checkpoint, load_checkpoint, save_checkpoint
from rlpar.config import EnvConfig, RuntimeConfig
from rlpar.runtime import Runner
from rlpar.runtime.actor import Actor
from rlpar.runtime.common import EpisodeLog

GAMES = [CartPoleVectorEnv, AcrobotVectorEnv, CatchVectorEnv]


def stepped(cls, steps: int, seed: int = 3, k: int = 6):
    envs = cls(num_envs=k)
    envs.reset(seed=seed)
    rng = np.random.default_rng(seed)
    n = envs.single_action_space.n
    for _ in range(steps):
        envs.step(rng.integers(0, n, k))
    return envs


def same_future(a, b, steps: int = 300, seed: int = 7) -> None:
    """``a`` and ``b`` return the same observations, rewards and flags for the same actions."""
    rng = np.random.default_rng(seed)
    n = a.single_action_space.n
    for _ in range(steps):
        actions = rng.integers(0, n, a.num_envs)
        for x, y in zip(a.step(actions)[:4], b.step(actions)[:4], strict=True):
            np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("cls", GAMES)
def test_native_envs_continue_bit_for_bit_from_a_loaded_state(cls) -> None:
    """Saved at a step where envs have just ended their episode (their next step is the
    reset step, drawn from their own generator), loaded into envs with other seeds: the same
    observation now and the same future, resets included."""
    a = stepped(cls, 0)
    rng = np.random.default_rng(0)
    for _ in range(2000):  # until an episode has just ended in some env but not in all
        a.step(rng.integers(0, a.single_action_space.n, a.num_envs))
        state = a.save_state()
        if state["needs_reset"].any():  # (Catch's episodes all end together)
            break
    else:
        pytest.fail("no episode ended")
    b = stepped(cls, 11, seed=99)
    obs = b.load_state(state)
    np.testing.assert_array_equal(obs, a.native.observe())
    for key, value in b.save_state().items():
        np.testing.assert_array_equal(value, state[key], err_msg=key)
    same_future(a, b)


def test_save_state_gives_arrays_of_fixed_dtypes() -> None:
    envs = stepped(CartPoleVectorEnv, 5, k=4)
    state = envs.save_state()
    assert {k: (v.dtype, v.shape) for k, v in state.items()} == {
        "game": (np.float64, (4, 4)),
        "rng": (np.uint64, (4, 4)),
        "elapsed": (np.int64, (4,)),
        "needs_reset": (np.bool_, (4,)),
    }
    assert (state["elapsed"] == 5).all()
    state["game"][:] = 0.0  # new arrays: the envs are untouched
    assert np.abs(envs.save_state()["game"]).sum() > 0


def _with(state: dict, **changes) -> dict:
    out = {k: v.copy() for k, v in state.items()}
    for key, value in changes.items():
        if value is None:
            del out[key]
        else:
            out[key] = value
    return out


def test_a_refused_state_names_the_problem_and_changes_nothing() -> None:
    source = stepped(CatchVectorEnv, 4, k=3)
    good = source.save_state()
    target = stepped(CatchVectorEnv, 2, seed=5, k=3)
    before = target.save_state()
    game = good["game"].copy()
    game[1, 0] = 9  # the ball in the bottom row: only a terminal state may hold it
    nan = good["game"].copy()
    nan[2, 1] = np.nan
    cases = [
        (_with(good, game=None), KeyError, "no 'game'"),
        (
            _with(good, elapsed=good["elapsed"].astype(np.int32)),
            TypeError,
            "'elapsed' must be int64",
        ),
        (_with(good, rng=good["rng"][:2]), ValueError, r"'rng' must have shape \(3, 4\)"),
        (_with(good, rng=np.zeros((3, 4), np.uint64)), ValueError, "env 0: an all-zero generator"),
        (_with(good, game=game), ValueError, "env 1: Catch state: ball_row"),
        (_with(good, game=nan), ValueError, "env 2: Catch state: ball_col"),
        (
            _with(good, elapsed=np.array([0, -1, 0])),
            ValueError,
            "env 1: elapsed steps must be >= 0",
        ),
    ]
    for state, error, match in cases:
        with pytest.raises(error, match=match):
            target.load_state(state)
        for key, value in target.save_state().items():
            np.testing.assert_array_equal(value, before[key], err_msg=f"{match}: {key}")
    with pytest.raises(TypeError, match="the dict save_state returned"):
        target.load_state([good["game"]])  # type: ignore[arg-type]


def test_a_state_at_the_time_limit_must_be_waiting_for_its_reset() -> None:
    envs = CartPoleVectorEnv(num_envs=2, max_episode_steps=10)
    envs.reset(seed=0)
    state = envs.save_state()
    state["elapsed"][:] = 10
    with pytest.raises(ValueError, match="env 0: elapsed steps 10 reach the time limit 10"):
        envs.load_state(state)
    state["needs_reset"][:] = True
    envs.load_state(state)
    _, rewards, terminated, truncated, _ = envs.step(np.zeros(2, np.int64))
    assert not (terminated | truncated).any() and (rewards == 0).all()  # the reset step


def test_checkpoint_arrays_round_trip_and_refuse_objects(tmp_path) -> None:
    net = rlpar.Net(
        rlpar.NetSpec(input_shape=(3,), layers=[rlpar.Linear(4)], heads=[rlpar.Categorical(2)])
    )
    arrays = {
        "actors/0/obs": np.arange(12, dtype=np.uint8).reshape(3, 4),
        "actors/0/prev_done": np.array([True, False, True]),
        "actors/0/env/rng": np.array([[2**64 - 1, 1, 2, 3]], np.uint64),
    }
    ckpt = Checkpoint(
        params=net.init_params(seed=0), optimizer={}, counters={}, rng_states={}, config={},
        net_signature=rlpar.checkpoint.net_signature(net), arrays=arrays,
    )  # fmt: skip
    loaded = load_checkpoint(save_checkpoint(tmp_path / "c.rlpar", ckpt))
    assert set(loaded.arrays) == set(arrays) and loaded.optimizer == {}
    for name, value in arrays.items():
        assert loaded.arrays[name].dtype == value.dtype
        np.testing.assert_array_equal(loaded.arrays[name], value)
    empty: dict = {
        k: {} for k in ("optimizer_scalars", "counters", "rng_states", "config", "extra")
    }
    meta = {"arrays": ["params", "other/x"], "net_signature": ckpt.net_signature, **empty}
    buf = io.BytesIO()
    for a in (ckpt.params, np.zeros(2)):
        np.lib.format.write_array(buf, a, allow_pickle=False)
    with pytest.raises(ValueError, match="unknown array 'other/x'"):
        rlpar.checkpoint._decode(meta, buf.getvalue())
    ckpt.arrays = {"bad": np.array([object()])}
    with pytest.raises(TypeError, match="checkpoint array 'bad' must be a numpy array of bool"):
        save_checkpoint(tmp_path / "d.rlpar", ckpt)
    assert not (tmp_path / "d.rlpar").exists()


def make_actor(lstm: int, generation: int, keep: bool = True, k: int = 4) -> Actor:
    return actor_helpers.make_actor(
        "rlpar/CartPole-v1", lstm, num_envs=k, generation=generation, keep_resume_state=keep
    )


def unrolls(actor: Actor, n: int) -> list[dict[str, np.ndarray]]:
    out, episodes = [], EpisodeLog()
    for _ in range(n):
        r = actor.free.get()
        actor.unroll(r, episodes)
        keys = ("obs", "actions", "rewards", "mask", "terminated", "behaviour", "core_state")
        out.append({k: getattr(r, k).copy() for k in keys})
        actor.free.put(r)
    return out


@pytest.mark.parametrize("lstm", [0, 8])
def test_an_actor_continues_its_episodes_from_its_saved_state(lstm) -> None:
    """An actor's state after 5 unrolls (envs, observations, episode returns, the LSTM core's
    state and the generators), loaded into a fresh actor whose envs were reset with other
    seeds: both make the same next unrolls bit for bit (the fused native path), and the first
    episode to end after the resume has the length and return it would have had."""
    a = make_actor(lstm, generation=0)
    assert a.sampler is not None, "expected the fused path"
    unrolls(a, 5)
    rng_state, arrays = a.checkpoint_state()
    assert arrays is not None
    expected_keys = {"obs", "prev_done", "ep_return", "ep_length"}
    expected_keys |= {f"env/{k}" for k in ("game", "rng", "elapsed", "needs_reset")}
    expected_keys |= {"core/state", "core/starts"} if lstm else set()
    assert set(arrays) == expected_keys
    assert (arrays["ep_length"] > 0).any()
    if lstm:
        assert np.abs(arrays["core/state"]).sum() > 0
    b = make_actor(lstm, generation=1)
    assert not np.array_equal(b.carry.obs, a.carry.obs)
    b.set_rng_state(rng_state["numpy"], rng_state["sampler"])
    b.load_resume_state(arrays)
    np.testing.assert_array_equal(b.carry.ep_length, arrays["ep_length"])
    after_a, after_b = unrolls(a, 4), unrolls(b, 4)
    for ra, rb in zip(after_a, after_b, strict=True):
        for key in ra:
            np.testing.assert_array_equal(ra[key], rb[key], err_msg=key)


def test_an_actor_refuses_a_state_that_does_not_fit() -> None:
    a = make_actor(8, generation=0)
    unrolls(a, 2)
    _, arrays = a.checkpoint_state()
    assert arrays is not None
    wider = make_actor(8, generation=0, k=5)
    with pytest.raises(ValueError, match=r"saved 'env/game' has shape \(4, 4\), this actor's is"):
        wider.load_resume_state(arrays)
    ff = make_actor(0, generation=0)
    with pytest.raises(ValueError, match="saved state holds"):
        ff.load_resume_state(arrays)
    bad = dict(arrays, obs=arrays["obs"].astype(np.float64))
    with pytest.raises(ValueError, match="saved 'obs' is float64, needs float32"):
        a.load_resume_state(bad)
    assert make_actor(8, generation=0, keep=False).checkpoint_state()[1] is None


def runtime(**kw) -> RuntimeConfig:
    base = dict(num_actors=2, envs_per_actor=3, unroll_length=6, batch_rollouts=2,
                total_env_steps=1200, checkpoint_interval_s=None, seed=4)  # fmt: skip
    base.update(kw)
    return RuntimeConfig(**base)


def lstm_impala() -> rlpar.Agent:
    return rlpar.make_agent("impala", {"net": {"hidden": [16], "lstm": 8}})


def test_a_resumed_run_continues_the_checkpointed_episodes(tmp_path) -> None:
    """Checkpoint -> resume through the Runner: every actor's envs, observations, episode
    lengths and returns so far and core state come back as the checkpoint holds them."""
    env = EnvConfig("rlpar/CartPole-v1")
    Runner(lstm_impala(), env, runtime(), checkpoint_dir=tmp_path).run()
    ckpt = load_checkpoint(latest_checkpoint(tmp_path))
    assert {k.split("/")[1] for k in ckpt.arrays} == {"0", "1"}
    resumed = Runner(
        lstm_impala(), env, runtime(total_env_steps=2400), resume=latest_checkpoint(tmp_path)
    )
    for i, actor in enumerate(resumed.actors):
        saved = {k.removeprefix(f"actors/{i}/"): v for k, v in ckpt.arrays.items()
                 if k.startswith(f"actors/{i}/")}  # fmt: skip
        assert isinstance(actor, Actor) and actor.carry.core is not None
        np.testing.assert_array_equal(actor.carry.core.state, saved["core/state"])
        np.testing.assert_array_equal(actor.carry.ep_length, saved["ep_length"])
        np.testing.assert_array_equal(actor.carry.ep_return, saved["ep_return"])
        np.testing.assert_array_equal(actor.carry.obs, saved["obs"])
        env_state = actor.envs.save_state()  # type: ignore[attr-defined]
        for key, value in env_state.items():
            np.testing.assert_array_equal(value, saved[f"env/{key}"])
    assert resumed.run().env_steps > 1200


def test_resume_with_other_envs_per_actor_starts_new_episodes(tmp_path, caplog) -> None:
    env = EnvConfig("rlpar/CartPole-v1")
    Runner(lstm_impala(), env, runtime(), checkpoint_dir=tmp_path).run()
    with caplog.at_level(logging.WARNING, logger="rlpar"):
        resumed = Runner(
            lstm_impala(), env, runtime(envs_per_actor=4), resume=latest_checkpoint(tmp_path)
        )
    assert "actor 0 starts new episodes" in caplog.text
    actor = resumed.actors[0]
    assert isinstance(actor, Actor) and actor.carry.core is not None
    assert (actor.carry.ep_length == 0).all() and not actor.carry.core.state.any()


def test_envs_that_cannot_save_their_state_checkpoint_none(tmp_path) -> None:
    """gymnasium's CartPole (no save_state): the checkpoint holds no actor arrays, and a
    resumed run starts new episodes from a zero core state, as before."""
    env = EnvConfig("CartPole-v1")
    Runner(lstm_impala(), env, runtime(), checkpoint_dir=tmp_path).run()
    path = latest_checkpoint(tmp_path)
    assert load_checkpoint(path).arrays == {}
    resumed = Runner(lstm_impala(), env, runtime(total_env_steps=2400), resume=path)
    actor = resumed.actors[0]
    assert isinstance(actor, Actor) and actor.carry.core is not None
    assert not actor.carry.core.state.any() and (actor.carry.ep_length == 0).all()
