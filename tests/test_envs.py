"""Native envs (rlpar.envs): equivalence with gymnasium, autoreset, seeding, errors, Catch's
rules, gymnasium registration and check_env, and a runtime smoke test."""

from __future__ import annotations

import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from gymnasium.vector import AutoresetMode
from tiny_agent import TinyAgent

import rlpar
from rlpar import _native
from rlpar import envs as rlpar_envs
from rlpar.config import EnvConfig, RuntimeConfig
from rlpar.runtime import Runner

OBS_ATOL = 1e-6  # float32 observations; on the project machine they agree bit for bit


# ---------------------------------------------------------------------------------------------
# Policies that reach both kinds of episode end (termination and the 500-step truncation)


def cartpole_policy(k: int):
    """A PD controller that balances for 500 steps, with a per-env share of random actions, so
    some envs truncate and the others terminate early."""
    eps = np.linspace(0.0, 1.0, k)

    def act(obs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        a = (3.0 * obs[:, 2] + obs[:, 3] > 0).astype(np.int64)
        explore = rng.random(k) < eps
        a[explore] = rng.integers(2, size=int(explore.sum()))
        return a

    return act


def acrobot_policy(k: int):
    """Energy pumping (torque +1 while the first link swings back) that reaches the goal in
    ~100 steps; the last two envs act at random and mostly hit the time limit."""

    def act(obs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        a = np.where(obs[:, 4] < 0, 2, 0).astype(np.int64)
        explore = rng.random(k) < 0.2
        explore[-2:] = True
        a[explore] = rng.integers(3, size=int(explore.sum()))
        return a

    return act


def gym_obs(game: str, state: np.ndarray) -> np.ndarray:
    """gymnasium's observation of a state (what its step returns for it)."""
    if game == "CartPole-v1":
        return np.array(state, np.float32)
    s = state
    return np.array(
        [np.cos(s[0]), np.sin(s[0]), np.cos(s[1]), np.sin(s[1]), s[2], s[3]], np.float32
    )


# ---------------------------------------------------------------------------------------------
# Equivalence with gymnasium's own envs


@pytest.mark.parametrize(
    ("game", "policy", "steps"),
    [("CartPole-v1", cartpole_policy, 3000), ("Acrobot-v1", acrobot_policy, 2500)],
)
def test_trajectories_match_gymnasium(game, policy, steps):
    """K native envs and K gymnasium envs (with gymnasium's TimeLimit) start from the same
    states and take the same actions; after every episode end the gymnasium env is reset and
    put in the native env's new initial state. Free-running between resets: no resync."""
    k = 8
    native = _native.VecEnv(game, k)
    obs = native.reset(np.arange(k, dtype=np.uint64) + 100)
    gyms = [gym.make(game) for _ in range(k)]
    for i, g in enumerate(gyms):
        g.reset(seed=i)
        g.unwrapped.state = native.get_state(i)[0]
    act = policy(k)
    rng = np.random.default_rng(0)
    prev_done = np.zeros(k, bool)
    terminations = truncations = 0
    for _ in range(steps):
        actions = act(obs, rng)
        obs, rewards, terminated, truncated = native.step(actions)
        for i, g in enumerate(gyms):
            state, elapsed = native.get_state(i)
            if prev_done[i]:  # the native env's autoreset step
                assert rewards[i] == 0 and not terminated[i] and not truncated[i]
                assert elapsed == 0
                g.reset()
                g.unwrapped.state = state
                np.testing.assert_allclose(obs[i], gym_obs(game, state), rtol=0, atol=OBS_ATOL)
                continue
            g_obs, g_reward, g_term, g_trunc, _ = g.step(int(actions[i]))
            np.testing.assert_allclose(obs[i], g_obs, rtol=0, atol=OBS_ATOL)
            np.testing.assert_allclose(state, g.unwrapped.state, rtol=1e-9, atol=1e-12)
            assert rewards[i] == g_reward
            assert (bool(terminated[i]), bool(truncated[i])) == (g_term, g_trunc)
        terminations += int(terminated.sum())
        truncations += int((truncated & ~terminated).sum())
        prev_done = terminated | truncated
    assert terminations >= 50 and truncations >= 3, (terminations, truncations)


def test_acrobot_from_gymnasium_reset_state():
    """gymnasium stores Acrobot's reset state as float32; the native env accepts it as is."""
    g = gym.make("Acrobot-v1").unwrapped
    native = _native.VecEnv("Acrobot-v1", 1)
    rng = np.random.default_rng(1)
    for seed in range(5):
        g.reset(seed=seed)
        native.set_state(0, g.state)
        for _ in range(200):
            a = int(rng.integers(3))
            g_obs, g_reward, g_term, _, _ = g.step(a)
            obs, rewards, terminated, _ = native.step(np.array([a]))
            np.testing.assert_allclose(obs[0], g_obs, rtol=0, atol=OBS_ATOL)
            assert (rewards[0], terminated[0]) == (g_reward, g_term)


def step_alongside(nv, other, actions, prev_done, sync):
    """Step the native vector env ``nv`` and gymnasium's vector env ``other`` with the same
    actions: same rewards and flags, same observations except on an autoreset step (there
    ``sync(i, state)`` puts ``other``'s env ``i`` in the native env's new state). Returns the
    native (obs, terminated, truncated)."""
    obs, rewards, terminated, truncated, _ = nv.step(actions)
    g_obs, g_rewards, g_term, g_trunc, _ = other.step(actions)
    np.testing.assert_array_equal(rewards, g_rewards)
    np.testing.assert_array_equal(terminated, g_term)
    np.testing.assert_array_equal(truncated, g_trunc)
    live = ~prev_done
    np.testing.assert_allclose(obs[live], g_obs[live], rtol=0, atol=OBS_ATOL)
    for i in np.flatnonzero(prev_done):
        sync(i, nv.native.get_state(i)[0])
    return obs, terminated, truncated


def test_vector_autoreset_matches_gymnasium_cartpole_vector_env():
    """Against gymnasium's own CartPole vector env (NEXT_STEP), with a short time limit so that
    truncations happen: same rewards, flags and observations on every step, reset steps
    included (after a reset step, gymnasium's new state is overwritten with the native one)."""
    k, limit = 6, 40
    gv = gym.make_vec(
        "CartPole-v1", num_envs=k, vectorization_mode="vector_entry_point", max_episode_steps=limit
    )
    assert gv.metadata["autoreset_mode"] == AutoresetMode.NEXT_STEP
    nv = gym.make_vec("rlpar/CartPole-v1", num_envs=k, max_episode_steps=limit)
    assert isinstance(nv, rlpar_envs.NativeVectorEnv)
    obs, _ = nv.reset(seed=5)
    gv.reset(seed=0)
    gv.unwrapped.state = np.stack([nv.native.get_state(i)[0] for i in range(k)], axis=1)
    act = cartpole_policy(k)
    rng = np.random.default_rng(2)
    prev_done = np.zeros(k, bool)
    ends = 0

    def sync(i, state):
        gv.unwrapped.state[:, i] = state

    for _ in range(800):
        obs, terminated, truncated = step_alongside(nv, gv, act(obs, rng), prev_done, sync)
        prev_done = terminated | truncated
        ends += int(prev_done.sum())
    assert ends > 50


def test_vector_autoreset_matches_gymnasium_sync_vector_env_acrobot():
    """Against gymnasium's SyncVectorEnv of Acrobot-v1 (TimeLimit 500, NEXT_STEP)."""
    k = 4
    sv = gym.make_vec("Acrobot-v1", num_envs=k, vectorization_mode="sync")
    nv = gym.make_vec("rlpar/Acrobot-v1", num_envs=k)
    obs, _ = nv.reset(seed=[11, 12, 13, 14])
    sv.reset(seed=0)
    for i, e in enumerate(sv.envs):
        e.unwrapped.state = nv.native.get_state(i)[0]
    act = acrobot_policy(k)
    rng = np.random.default_rng(3)
    prev_done = np.zeros(k, bool)
    truncations = terminations = 0

    def sync(i, state):
        sv.envs[i].unwrapped.state = state

    for _ in range(1100):
        obs, terminated, truncated = step_alongside(nv, sv, act(obs, rng), prev_done, sync)
        truncations += int((truncated & ~terminated).sum())
        terminations += int(terminated.sum())
        prev_done = terminated | truncated
    assert truncations >= 2 and terminations >= 5


# ---------------------------------------------------------------------------------------------
# Autoreset and time limit, on the native API itself


@pytest.mark.parametrize("game", ["CartPole-v1", "Acrobot-v1", "Catch-v0"])
def test_next_step_autoreset(game):
    k = 16
    envs = _native.VecEnv(game, k, max_episode_steps=25)
    obs = envs.reset(np.arange(k, dtype=np.uint64))
    rng = np.random.default_rng(0)
    prev_done = np.zeros(k, bool)
    elapsed = np.zeros(k, int)
    ends = 0
    for _ in range(400):
        actions = rng.integers(envs.num_actions, size=k)
        obs, rewards, terminated, truncated = envs.step(actions)
        assert obs.dtype == envs.obs_dtype and rewards.dtype == np.float32
        assert terminated.dtype == truncated.dtype == bool
        # reset step: reward 0, no flags, a fresh episode (0 steps so far)
        assert not rewards[prev_done].any()
        assert not terminated[prev_done].any() and not truncated[prev_done].any()
        elapsed = np.where(prev_done, 0, elapsed + 1)
        np.testing.assert_array_equal(truncated, elapsed >= 25)
        for i in range(k):
            assert envs.get_state(i)[1] == elapsed[i]
            assert envs.needs_reset(i) == bool(terminated[i] or truncated[i])
        np.testing.assert_array_equal(envs.observe(), obs)
        prev_done = terminated | truncated
        ends += int(prev_done.sum())
    assert ends > 100


def test_reset_step_ignores_its_action_and_time_limit_zero_disables():
    a = _native.VecEnv("CartPole-v1", 1, max_episode_steps=0)
    b = _native.VecEnv("CartPole-v1", 1, max_episode_steps=0)
    a.reset(np.array([7], np.uint64))
    b.reset(np.array([7], np.uint64))
    for env in (a, b):
        env.set_state(0, [2.39, 1.0, 0.0, 0.0])
        assert env.step(np.array([1]))[2][0]  # terminated
    obs_a = a.step(np.array([0]))[0]
    obs_b = b.step(np.array([1]))[0]
    np.testing.assert_array_equal(obs_a, obs_b)
    a.set_state(0, [0.0, 0.0, 0.0, 0.0], elapsed=10**6)
    assert not a.step(np.array([0]))[3][0]  # no time limit


# ---------------------------------------------------------------------------------------------
# Seeding


def trajectory(env: rlpar_envs.NativeVectorEnv, seed, steps: int = 60) -> np.ndarray:
    obs, _ = env.reset(seed=seed)
    rng = np.random.default_rng(0)
    out = [obs]
    for _ in range(steps):
        out.append(env.step(rng.integers(env.single_action_space.n, size=env.num_envs))[0])
    return np.stack(out)


@pytest.mark.parametrize("env_id", rlpar_envs.ENV_IDS)
def test_seeding_is_reproducible(env_id):
    env = gym.make_vec(env_id, num_envs=4)
    t1, t2 = trajectory(env, 42), trajectory(env, 42)
    np.testing.assert_array_equal(t1, t2)
    assert not np.array_equal(t1, trajectory(env, 43))
    # an int seed s means s + i for env i; the envs of one batch differ from each other
    np.testing.assert_array_equal(t1, trajectory(env, [42, 43, 44, 45]))
    assert not np.array_equal(t1[:, 0], t1[:, 1])
    # an env's stream depends only on its own seed, not on K or its neighbours
    one = gym.make_vec(env_id, num_envs=1)
    np.testing.assert_array_equal(trajectory(one, [44])[0, 0], t1[0, 2])
    # reset() after a seeded reset continues deterministically
    env.reset(seed=7)
    first = env.reset()[0]
    env.reset(seed=7)
    np.testing.assert_array_equal(env.reset()[0], first)


def test_single_env_matches_vector_env_zero():
    single = gym.make("rlpar/CartPole-v1").unwrapped
    vec = gym.make_vec("rlpar/CartPole-v1", num_envs=3)
    o1, _ = single.reset(seed=9)
    o2, _ = vec.reset(seed=9)
    np.testing.assert_array_equal(o1, o2[0])
    for _ in range(5):
        np.testing.assert_array_equal(single.step(1)[0], vec.step(np.ones(3, np.int64))[0][0])


def test_unseeded_resets_differ_between_envs_objects():
    a = gym.make_vec("rlpar/CartPole-v1", num_envs=2)
    b = gym.make_vec("rlpar/CartPole-v1", num_envs=2)
    assert not np.array_equal(a.reset()[0], b.reset()[0])


def test_bad_seeds():
    env = gym.make_vec("rlpar/Catch-v0", num_envs=2)
    with pytest.raises(ValueError, match="one int per env"):
        env.reset(seed=[1, 2, 3])
    with pytest.raises(ValueError, match=r"\[0, 2\*\*64\)"):
        env.reset(seed=-1)
    with pytest.raises(TypeError, match="int"):
        env.reset(seed=[1, 2.5])
    with pytest.raises(ValueError, match="no reset options"):
        env.reset(options={"low": -0.1})


# ---------------------------------------------------------------------------------------------
# Bad actions: clear errors, and no env changes


def snapshot_of(envs) -> list:
    return [
        (envs.get_state(i)[0].tolist(), envs.get_state(i)[1], envs.needs_reset(i))
        for i in range(envs.num_envs)
    ]


@pytest.mark.parametrize(
    ("actions", "error", "message"),
    [
        (
            np.array([0, 1, 2, 0]),
            ValueError,
            r"action 2 for env 2 is out of range: CartPole-v1 "
            r"takes actions 0\.\.1",
        ),
        (np.array([0, -1, 0, 0]), ValueError, "action -1 for env 1 is out of range"),
        (np.array([0, 1, 0]), ValueError, r"shape \(4,\), one per env, got \(3,\)"),
        (np.zeros((4, 1), np.int64), ValueError, r"got \(4, 1\)"),
        (np.zeros(4, np.float32), TypeError, "integers.*got dtype float32"),
        (np.zeros(4, bool), TypeError, "got dtype bool"),
        ("left", TypeError, "got dtype <U4"),
        (object(), TypeError, "actions must be a numpy array, got object"),
    ],
)
def test_bad_actions_raise_and_change_nothing(actions, error, message):
    envs = _native.VecEnv("CartPole-v1", 4)
    twin = _native.VecEnv("CartPole-v1", 4)
    for e in (envs, twin):
        e.reset(np.arange(4, dtype=np.uint64))
        for _ in range(30):  # some envs mid-episode, some about to reset
            e.step(np.ones(4, np.int64))
    before = snapshot_of(envs)
    with pytest.raises(error, match=message):
        envs.step(actions)
    assert snapshot_of(envs) == before
    # the generators did not move either: both go on identically, resets included
    for _ in range(50):
        a = np.zeros(4, np.int64)
        for x, y in zip(envs.step(a), twin.step(a), strict=True):
            np.testing.assert_array_equal(x, y)


def test_bad_actions_through_gymnasium_apis():
    vec = gym.make_vec("rlpar/Acrobot-v1", num_envs=3)
    vec.reset(seed=0)
    with pytest.raises(ValueError, match="action 3 for env 0 is out of range"):
        vec.step(np.array([3, 0, 0]))
    single = gym.make("rlpar/Catch-v0").unwrapped
    single.reset(seed=0)
    with pytest.raises(ValueError, match=r"out of range: Catch-v0 takes actions 0\.\.2"):
        single.step(5)
    with pytest.raises(TypeError, match="integers"):
        single.step(1.0)
    with pytest.raises(ValueError, match="single integer"):
        single.step([1, 2])


def test_bad_constructor_and_state_arguments():
    with pytest.raises(ValueError, match=r"unknown native env 'Pong'.*CartPole-v1, Acrobot-v1"):
        _native.VecEnv("Pong", 2)
    with pytest.raises(ValueError, match="num_envs must be >= 1, got 0"):
        _native.VecEnv("CartPole-v1", 0)
    with pytest.raises(ValueError, match="max_episode_steps must be >= 0"):
        _native.VecEnv("CartPole-v1", 1, max_episode_steps=-3)
    envs = _native.VecEnv("Catch-v0", 2)
    with pytest.raises(ValueError, match=r"env index must be in \[0, 1\], got 2"):
        envs.get_state(2)
    with pytest.raises(ValueError, match=r"state must have shape \(3,\), got \(4,\)"):
        envs.set_state(0, [1, 2, 3, 4])
    with pytest.raises(ValueError, match=r"ball_row must be an integer in \[0, 8\], got 9"):
        envs.set_state(0, [9, 0, 0])
    with pytest.raises(ValueError, match="paddle_col must be an integer in"):
        envs.set_state(0, [1, 0, 2.5])
    with pytest.raises(ValueError, match="elapsed steps must be >= 0"):
        envs.set_state(0, [1, 0, 2], elapsed=-1)
    with pytest.raises(ValueError, match="must be finite"):
        _native.VecEnv("CartPole-v1", 1).set_state(0, [np.nan, 0, 0, 0])
    with pytest.raises(TypeError, match="seeds must be a uint64 array"):
        envs.reset(np.array([1, 2]))


# ---------------------------------------------------------------------------------------------
# Catch


def find_on(frame: np.ndarray) -> set[tuple[int, int]]:
    return {(int(r), int(c)) for r, c in zip(*np.nonzero(frame[:, :, 0]), strict=True)}


def test_catch_frames_and_rules():
    k = 32
    env = gym.make_vec("rlpar/Catch-v0", num_envs=k)
    assert env.single_observation_space == gym.spaces.Box(0, 255, (10, 10, 1), np.uint8)
    assert env.single_action_space == gym.spaces.Discrete(3)
    obs, _ = env.reset(seed=0)
    rng = np.random.default_rng(0)
    columns = set()
    rewards_seen = []
    for _ in range(6):
        assert obs.shape == (k, 10, 10, 1) and obs.dtype == np.uint8
        assert set(np.unique(obs)) <= {0, 255}
        state = [env.native.get_state(i)[0].astype(int) for i in range(k)]
        for i, (row, col, paddle) in enumerate(state):
            assert (row, paddle) == (0, 5)
            assert find_on(obs[i]) == {(0, col), (9, 5)}
            columns.add(int(col))
        for t in range(9):
            actions = rng.integers(3, size=k)
            obs, rewards, terminated, truncated, _ = env.step(actions)
            assert not truncated.any()
            for i in range(k):
                row, col, paddle = state[i]
                paddle = min(9, max(0, paddle + int(actions[i]) - 1))
                state[i] = (row + 1, col, paddle)
                assert find_on(obs[i]) == {(row + 1, col), (9, paddle)}
                if t < 8:
                    assert rewards[i] == 0 and not terminated[i]
                else:
                    assert terminated[i]
                    assert rewards[i] == (1.0 if paddle == col else -1.0)
            rewards_seen.extend(rewards[terminated].tolist())
        obs, rewards, terminated, _, _ = env.step(np.zeros(k, np.int64))  # reset step
        assert not rewards.any() and not terminated.any()
    assert columns == set(range(10))
    assert {-1.0, 1.0} <= set(rewards_seen)


def test_catch_is_solved_by_following_the_ball():
    env = gym.make_vec("rlpar/Catch-v0", num_envs=64)
    obs, _ = env.reset(seed=3)
    total = np.zeros(64)
    for _ in range(3 * 10):
        ball = np.argmax(obs[:, :9, :, 0].max(axis=1), axis=1)
        paddle = np.argmax(obs[:, 9, :, 0], axis=1)
        actions = np.sign(ball - paddle) + 1
        obs, rewards, _, _, _ = env.step(actions)
        total += rewards
    np.testing.assert_array_equal(total, 3.0)


# ---------------------------------------------------------------------------------------------
# gymnasium registration and API checks


def test_registration_is_idempotent_and_complete():
    rlpar_envs.register_envs()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rlpar_envs.register_envs()
    for env_id in ("rlpar/CartPole-v1", "rlpar/Acrobot-v1", "rlpar/Catch-v0"):
        assert env_id in gym.registry
    assert gym.spec("rlpar/CartPole-v1").max_episode_steps == 500
    assert gym.spec("rlpar/Catch-v0").max_episode_steps is None


# gymnasium warns about CartPole's infinite velocity bounds, its own CartPole's as well
@pytest.mark.filterwarnings("ignore:.*A Box observation space m")
@pytest.mark.parametrize("env_id", rlpar_envs.ENV_IDS)
def test_check_env_passes(env_id):
    if "Catch" not in env_id:
        pytest.importorskip("pygame")
    env = gym.make(env_id, render_mode="rgb_array")
    check_env(env.unwrapped)


@pytest.mark.parametrize("env_id", rlpar_envs.ENV_IDS)
def test_make_vec_spaces_match_single_env(env_id):
    single = gym.make(env_id)
    vec = gym.make_vec(env_id, num_envs=5)
    assert vec.metadata["autoreset_mode"] == AutoresetMode.NEXT_STEP
    assert vec.single_observation_space == single.observation_space
    assert vec.single_action_space == single.action_space
    obs, _ = vec.reset(seed=0)
    assert obs in vec.observation_space
    obs, rewards, terminated, truncated, info = vec.step(vec.action_space.sample())
    assert obs in vec.observation_space and info == {}
    assert rewards.shape == terminated.shape == truncated.shape == (5,)


def test_spaces_equal_gymnasium_classic_control():
    for game in ("CartPole-v1", "Acrobot-v1"):
        ours, theirs = gym.make(f"rlpar/{game}"), gym.make(game)
        assert ours.observation_space == theirs.observation_space
        assert ours.action_space == theirs.action_space
        assert ours.spec.max_episode_steps == theirs.spec.max_episode_steps


def test_time_limit_of_single_env_comes_from_gymnasium():
    env = gym.make("rlpar/CartPole-v1", max_episode_steps=7)
    env.reset(seed=0)
    env.unwrapped.native.set_state(0, [0.0, 0.0, 0.0, 0.0])
    flags = [env.step(i % 2)[3] for i in range(7)]
    assert flags == [False] * 6 + [True]


# ---------------------------------------------------------------------------------------------
# The runtime on a native env


def test_runtime_runs_on_native_cartpole():
    runtime = RuntimeConfig(
        num_actors=2,
        envs_per_actor=8,
        unroll_length=10,
        batch_rollouts=2,
        total_env_steps=4000,
        checkpoint_interval_s=None,
    )
    result = Runner(TinyAgent(), EnvConfig(id="rlpar/CartPole-v1"), runtime).run()
    assert result.env_steps >= 4000
    assert result.learner_steps > 0 and result.episodes > 0
    assert isinstance(rlpar.Net, type)


# --- rgb_array render -------------------------------------------------------------------------


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Acrobot-v1"])
def test_classic_control_frames_are_gymnasiums_own_in_the_same_state(env_id):
    """The native env's frames, step after step, are what gymnasium's env of the same game
    draws from the same state (its dynamics are the native ones bit for bit)."""
    pytest.importorskip("pygame")
    native = gym.make(f"rlpar/{env_id}", render_mode="rgb_array")
    reference = gym.make(env_id, render_mode="rgb_array")
    native.reset(seed=3)
    reference.reset(seed=0)
    reference.unwrapped.state = native.unwrapped.native.save_state()["game"][0].copy()
    rng = np.random.default_rng(0)
    for step in range(30):
        np.testing.assert_array_equal(native.render(), reference.render(), err_msg=f"step {step}")
        action = int(rng.integers(native.action_space.n))
        _, _, term, trunc, _ = native.step(action)
        _, _, ref_term, _, _ = reference.step(action)
        assert term == ref_term
        if term or trunc:
            break
    native.close()
    reference.close()


def test_a_catch_frame_shows_the_ball_and_the_paddle_where_the_observation_has_them():
    env = gym.make("rlpar/Catch-v0", render_mode="rgb_array")
    obs, _ = env.reset(seed=5)
    rng = np.random.default_rng(0)
    cell = rlpar_envs.native._Renderer.CATCH_CELL
    colors = rlpar_envs.native._Renderer.CATCH_COLORS
    for _ in range(9):
        frame = env.render()
        assert frame.shape == (10 * cell, 10 * cell, 3) and frame.dtype == np.uint8
        board = frame[::cell, ::cell]  # one pixel per cell
        # every cell is one flat colour
        np.testing.assert_array_equal(np.repeat(np.repeat(board, cell, 0), cell, 1), frame)
        lit = obs[..., 0] > 0
        drawn = (board != colors["board"]).any(axis=-1)
        np.testing.assert_array_equal(drawn, lit)
        row, col = np.argwhere(lit[:-1])[0] if lit[:-1].any() else (9, None)
        if col is not None:
            assert tuple(board[row, col]) == colors["ball"]
        obs, _, terminated, _, _ = env.step(int(rng.integers(3)))
        if terminated:
            break
    env.close()


@pytest.mark.parametrize("env_id", rlpar_envs.ENV_IDS)
def test_a_vector_env_renders_each_env_as_the_single_env_does(env_id):
    if "Catch" not in env_id:
        pytest.importorskip("pygame")
    vec = gym.make_vec(env_id, num_envs=3, render_mode="rgb_array")
    vec.reset(seed=[4, 9, 2])
    frames = vec.render()
    assert len(frames) == 3
    for seed, frame in zip([4, 9, 2], frames, strict=True):
        single = gym.make(env_id, render_mode="rgb_array")
        single.reset(seed=seed)
        np.testing.assert_array_equal(frame, single.render())
        single.close()
    vec.close()


def test_render_modes_other_than_rgb_array_are_refused_and_none_renders_nothing():
    with pytest.raises(ValueError, match=r'render only render_mode="rgb_array", got .*human'):
        rlpar_envs.CartPoleEnv(render_mode="human")
    with pytest.raises(ValueError, match="human"):
        rlpar_envs.CatchVectorEnv(2, render_mode="human")
    env = rlpar_envs.CatchEnv()
    env.reset(seed=0)
    assert env.render() is None
    assert gym.spec("rlpar/CartPole-v1").make(render_mode="rgb_array").metadata["render_fps"] == 50


def test_acrobot_reset_states_are_float32_in_this_build():
    """gymnasium stores Acrobot's reset state as float32; so must every build of the core (a
    plain cast was dropped by GCC 12's vectorizer at -O3), on a reset and on an autoreset."""
    vec = gym.make_vec("rlpar/Acrobot-v1", num_envs=8, max_episode_steps=3)
    for seed in range(4):
        vec.reset(seed=seed * 8)
        game = vec.unwrapped.save_state()["game"]
        np.testing.assert_array_equal(game, game.astype(np.float32).astype(np.float64))
    for _ in range(4):  # the 4th step is every env's reset step (time limit 3)
        vec.step(np.zeros(8, np.int64))
    game = vec.unwrapped.save_state()["game"]
    np.testing.assert_array_equal(game, game.astype(np.float32).astype(np.float64))


@pytest.mark.parametrize("env_id", rlpar_envs.ENV_IDS)
def test_single_env_plays_the_episodes_of_vector_env_zero(env_id):
    """``NativeEnv.reset(seed=s)`` then ``reset()`` after each episode gives the episodes env 0
    of a vector env reset with ``seed=s`` plays through its autoresets (several episodes)."""
    single = gym.make(env_id, max_episode_steps=60).unwrapped
    vec = gym.make_vec(env_id, num_envs=3, max_episode_steps=60)
    n = vec.single_action_space.n
    rng = np.random.default_rng(0)
    o1, _ = single.reset(seed=5)
    o2, _ = vec.reset(seed=5)
    episodes, t = 0, 0
    while episodes < 6:
        np.testing.assert_array_equal(o1, o2[0], err_msg=f"episode {episodes}, step {t}")
        actions = rng.integers(n, size=3)
        o1, r1, term, trunc, _ = single.step(int(actions[0]))
        t += 1
        trunc = trunc or t == 60  # the single env's time limit is gymnasium's TimeLimit's
        o2, r2, term2, trunc2, _ = vec.step(actions)
        assert (r1, term, trunc) == (r2[0], term2[0], trunc2[0]), (episodes, t)
        np.testing.assert_array_equal(o1, o2[0], err_msg=f"episode {episodes}, step {t}")
        if term or trunc:
            episodes, t = episodes + 1, 0
            o1, _ = single.reset()
            o2 = vec.step(actions)[0]  # the reset step (NEXT_STEP autoreset)
