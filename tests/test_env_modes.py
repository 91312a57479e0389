"""`env.vectorization` and `env.double_buffer`: the same rollouts as "sync" (bit for bit in
deterministic mode), faults that stop the run, and no worker process left behind."""

from __future__ import annotations

import os
import sys
import threading

import gymnasium as gym
import numpy as np
import pytest
from tiny_agent import TinyAgent

import rlpar
from rlpar.config import ConfigError, EnvConfig, RuntimeConfig
from rlpar.runtime import Runner
from rlpar.runtime.env_modes import SplitEnvs, ale_game, per_env_seeds
from rlpar.runtime.envs import env_seeds, make_actor_envs


class WalkEnv(gym.Env):
    """A seeded random walk: obs = (position, step, noise); it terminates past |position| 4,
    and the TimeLimit truncates long episodes. ``explode_at``: raise on that step; ``die_at``:
    kill the worker process on that step (what an out-of-memory kill looks like)."""

    observation_space = gym.spaces.Box(-1e6, 1e6, (3,), np.float32)
    action_space = gym.spaces.Discrete(3)

    def __init__(self, explode_at: int | None = None, die_at: int | None = None):
        self.explode_at, self.die_at, self.calls = explode_at, die_at, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.pos, self.t = 0.0, 0
        return self._obs(), {}

    def _obs(self) -> np.ndarray:
        return np.array([self.pos, self.t, self.np_random.random()], np.float32)

    def step(self, action):
        self.calls += 1
        if self.calls == self.explode_at:
            raise KeyError("walk env exploded")
        if self.calls == self.die_at:
            os._exit(3)
        self.t += 1
        self.pos += float(action) - 1.0 + self.np_random.normal()
        return self._obs(), float(self.pos), abs(self.pos) > 4.0, False, {}


gym.register("rlpar-test/Walk-v0", WalkEnv, max_episode_steps=12)


def child_processes() -> list[int]:
    """Live child processes of this process (from /proc: no extra dependency), except
    multiprocessing's resource tracker (one per process, started with the first worker, it
    lives as long as this process does)."""
    me, kids = os.getpid(), []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:
            continue
        if int(fields[1]) == me and fields[0] != "Z" and b"resource_tracker" not in cmdline:
            kids.append(int(pid))
    return kids


def runtime(**kw) -> RuntimeConfig:
    base = dict(num_actors=2, envs_per_actor=4, unroll_length=5, batch_rollouts=2,
                deterministic=True, total_env_steps=1200, checkpoint_interval_s=None,
                join_timeout_s=5.0, seed=7)  # fmt: skip
    return RuntimeConfig(**{**base, **kw})


def deterministic_run(env: EnvConfig) -> tuple[np.ndarray, list]:
    runner = Runner(TinyAgent(), env, runtime())
    runner.run()
    return runner.state.params.copy(), runner.episodes.recent(10_000)


@pytest.mark.parametrize(
    "modes",
    [{"vectorization": "async", "workers_per_actor": 2},
     {"vectorization": "async", "workers_per_actor": 4},
     {"vectorization": "async", "workers_per_actor": 2, "double_buffer": True},
     {"double_buffer": True}],
)  # fmt: skip
def test_async_modes_train_exactly_like_sync(modes) -> None:
    before = child_processes()
    sync_params, sync_episodes = deterministic_run(EnvConfig("rlpar-test/Walk-v0"))
    params, episodes = deterministic_run(EnvConfig("rlpar-test/Walk-v0", **modes))
    np.testing.assert_array_equal(params, sync_params)
    assert [e[:2] for e in episodes] == [e[:2] for e in sync_episodes]
    assert len(sync_episodes) > 20  # terminations and truncations both happen in 1200 steps
    assert child_processes() == before


def test_double_buffering_carries_a_recurrent_state_like_sync() -> None:
    """Each half's LSTM state advances with its own columns: the same training as "sync"."""
    import rlpar

    def run(env: EnvConfig) -> np.ndarray:
        agent = rlpar.make_agent("impala", {"net": {"hidden": [16], "lstm": 8}})
        runner = Runner(agent, env, runtime(total_env_steps=600))
        runner.run()
        return runner.state.params.copy()

    sync = run(EnvConfig("rlpar-test/Walk-v0"))
    split = run(EnvConfig("rlpar-test/Walk-v0", vectorization="async", workers_per_actor=2,
                          double_buffer=True))  # fmt: skip
    np.testing.assert_array_equal(split, sync)


@pytest.mark.parametrize("lstm", [False, True], ids=["mlp", "lstm"])
def test_sync_double_buffering_acts_on_the_side_thread_like_in_turn(
    lstm: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ "sync" + double buffering with a native sampler: each half steps in the actor thread
    while the other half's act runs on the step loop's side thread; the run trains exactly
    as with the halves' acts made in turn (`InTurn`), and with an LSTM (whose
    forward gives each row what it gives the whole batch) exactly as "sync"."""
    from rlpar.runtime.unrollers import SideProbe

    config = {"net": {"hidden": [16], "lstm": 8}} if lstm else {}
    env = EnvConfig("rlpar-test/Walk-v0", double_buffer=True)

    def run(env: EnvConfig) -> tuple[np.ndarray, list, list[bool]]:
        runner = Runner(rlpar.make_agent("impala", config), env, runtime(total_env_steps=600))
        runner.run()
        sides = [a.path == "split_side" and a.stats.side_unrolls > 0 for a in runner.actors]
        return runner.state.params.copy(), runner.episodes.recent(10_000), sides

    side, side_episodes, sides = run(env)
    assert sides == [True, True]
    with monkeypatch.context() as m:
        m.setattr(SideProbe, "next", lambda self, now: False)  # every unroll in turn
        turns, turn_episodes, _ = run(env)
    np.testing.assert_array_equal(side, turns)
    assert [e[:2] for e in side_episodes] == [e[:2] for e in turn_episodes]
    if lstm:
        np.testing.assert_array_equal(side, run(EnvConfig("rlpar-test/Walk-v0"))[0])


def test_an_env_that_raises_under_sync_double_buffering_stops_the_run() -> None:
    """The env raises while the other half's act runs on the side thread: the run stops with
    the env's error, as "sync" does."""
    env = EnvConfig("rlpar-test/Walk-v0", kwargs={"explode_at": 40}, double_buffer=True)
    runner = Runner(rlpar.make_agent("impala"), env, runtime(deterministic=False,
                    total_env_steps=10**7, max_wall_s=60.0))  # fmt: skip
    with pytest.raises(KeyError, match="walk env exploded") as info:
        runner.run()
    assert "actor-" in str(info.value.__notes__)


def test_async_envs_step_like_sync_envs() -> None:
    sync = make_actor_envs(EnvConfig("rlpar-test/Walk-v0"), 6)
    grouped = make_actor_envs(
        EnvConfig("rlpar-test/Walk-v0", vectorization="async", workers_per_actor=3), 6
    )
    try:
        obs_s, _ = sync.reset(seed=env_seeds(sync, 1, 0))
        obs_g, _ = grouped.reset(seed=env_seeds(grouped, 1, 0))
        np.testing.assert_array_equal(obs_g, obs_s)
        rng = np.random.default_rng(0)
        ends = 0
        for _ in range(60):
            a = rng.integers(3, size=6)
            for got, want in zip(grouped.step(a)[:4], sync.step(a)[:4], strict=True):
                np.testing.assert_array_equal(got, want)
            ends += int(want.sum())
        assert ends > 0
        assert grouped.single_observation_space == sync.single_observation_space
    finally:
        sync.close()
        grouped.close()


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [({"explode_at": 40}, KeyError, "walk env exploded"),
     ({"die_at": 40}, RuntimeError, r"worker process of 'rlpar-test/Walk-v0' died.*exit codes")],
)  # fmt: skip
@pytest.mark.parametrize("double_buffer", [False, True])
def test_a_failing_or_dying_worker_stops_the_run_and_leaves_no_process(
    kwargs, error, match, double_buffer
) -> None:
    before = child_processes()
    env = EnvConfig("rlpar-test/Walk-v0", kwargs=kwargs, vectorization="async",
                    workers_per_actor=2, double_buffer=double_buffer)  # fmt: skip
    runner = Runner(TinyAgent(), env, runtime(deterministic=False, total_env_steps=10**7,
                                              max_wall_s=60.0))  # fmt: skip
    done = threading.Event()
    with pytest.raises(error, match=match) as info:
        try:
            runner.run()
        finally:
            done.set()
    assert "actor-" in str(info.value.__notes__)
    assert child_processes() == before


def test_an_env_that_cannot_be_pickled_names_the_key_and_the_fix() -> None:
    env = EnvConfig("rlpar-test/Walk-v0", kwargs={"explode_at": lambda: 1},
                    vectorization="async")  # fmt: skip
    with pytest.raises(ValueError, match=r"cannot be pickled.*env.setup.*\"sync\""):
        make_actor_envs(env, 2)


@pytest.mark.parametrize(
    ("kw", "match"),
    [({"vectorization": "threads"}, r'vectorization: expected "sync" \| "async" \| "ale"'),
     ({"workers_per_actor": 0}, "workers_per_actor: expected None or an integer >= 1")],
)  # fmt: skip
def test_bad_env_mode_keys_are_named(kw, match) -> None:
    with pytest.raises(ConfigError, match=match):
        EnvConfig("rlpar-test/Walk-v0", **kw)


def test_workers_must_divide_the_envs() -> None:
    with pytest.raises(ValueError, match=r"workers_per_actor: expected a divisor of .* \(6\)"):
        make_actor_envs(EnvConfig("rlpar-test/Walk-v0", vectorization="async",
                                  workers_per_actor=4), 6)  # fmt: skip
    with pytest.raises(ValueError, match="double_buffer: expected an even number"):
        make_actor_envs(EnvConfig("rlpar-test/Walk-v0", vectorization="async",
                                  workers_per_actor=2, double_buffer=True), 3)  # fmt: skip


@pytest.mark.parametrize(("mode", "extra"), [("ale", "atari"), ("envpool", "envpool")])
def test_a_missing_engine_names_the_extra(monkeypatch, mode, extra) -> None:
    import builtins

    real_import = builtins.__import__

    def no_engines(name, *args, **kwargs):
        if name.split(".")[0] in ("ale_py", "envpool"):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_engines)
    for name in ("ale_py", "ale_py.vector_env", "ale_py.roms", "envpool"):
        monkeypatch.setitem(sys.modules, name, None)  # imported earlier: a None entry refuses
    with pytest.raises(ValueError, match=rf'vectorization = "{mode}" needs .*rlpar\[{extra}\]'):
        make_actor_envs(EnvConfig("ALE/Pong-v5", vectorization=mode), 2)


def test_ale_game_names() -> None:
    assert ale_game("ALE/Pong-v5") == "pong"
    assert ale_game("ALE/MontezumaRevenge-v5") == "montezuma_revenge"
    assert ale_game("SpaceInvadersNoFrameskip-v4") == "space_invaders"


def test_ale_envs_are_channels_last_and_split_halves_step_the_same() -> None:
    pytest.importorskip("ale_py.vector_env")
    whole = make_actor_envs(EnvConfig("ALE/Pong-v5", vectorization="ale"), 4)
    split = make_actor_envs(EnvConfig("ALE/Pong-v5", vectorization="ale", double_buffer=True), 4)
    try:
        assert isinstance(split, SplitEnvs)
        assert whole.single_observation_space.shape == (84, 84, 4)
        assert whole.single_action_space == gym.spaces.Discrete(6)
        seeds = env_seeds(whole, 0, 0)
        np.testing.assert_array_equal(whole.reset(seed=seeds)[0], split.reset(seed=seeds)[0])
        rng = np.random.default_rng(0)
        for _ in range(30):
            a = rng.integers(6, size=4)
            for got, want in zip(split.step(a)[:4], whole.step(a)[:4], strict=True):
                np.testing.assert_array_equal(got, want)
    finally:
        whole.close()
        split.close()


def test_ale_reset_takes_an_int_seed_as_gymnasium_does() -> None:
    """An int seed s seeds env i with s + i (the final evaluation resets with one int)."""
    pytest.importorskip("ale_py.vector_env")
    a = make_actor_envs(EnvConfig("ALE/Pong-v5", vectorization="ale"), 2)
    b = make_actor_envs(EnvConfig("ALE/Pong-v5", vectorization="ale"), 2)
    try:
        np.testing.assert_array_equal(a.reset(seed=7)[0], b.reset(seed=[7, 8])[0])
        for _ in range(40):
            act = np.array([2, 3])
            np.testing.assert_array_equal(a.step(act)[0], b.step(act)[0])
    finally:
        a.close()
        b.close()


def test_ale_evaluation_plays_whole_episodes() -> None:
    pytest.importorskip("ale_py.vector_env")
    agent = rlpar.make_agent("impala", {"net": {"conv": [[8, 8, 4]], "conv_hidden": 16}})
    env = EnvConfig("ALE/Pong-v5", vectorization="ale", kwargs={"max_num_frames_per_episode": 400})
    probe = make_actor_envs(env, 1)
    spaces = (probe.single_observation_space, probe.single_action_space)
    probe.close()
    net = rlpar.Net(agent.net_spec(*spaces))
    agent.init_state(net, net.init_params(seed=0))
    result = rlpar.evaluate_policy(agent, net, net.init_params(seed=0), env, episodes=2, seed=3)
    assert result is not None and result.episodes == 2 and np.isfinite(result.mean_return)


def test_ale_results_are_put_back_in_env_order() -> None:
    """ale-py's results carry env ids; a step returned out of order is put back in order (each
    env's observation, reward and flags stay in its own column)."""
    from rlpar.runtime.env_modes import AleEnvs

    class Shuffled:
        def recv(self) -> tuple:
            ids = np.array([2, 0, 1])
            obs = np.stack([np.full((4, 2, 2), i, np.uint8) for i in ids])  # [K, C, H, W]
            return obs, ids * 1.0, ids == 0, ids == 1, {"env_id": ids}

    envs = AleEnvs.__new__(AleEnvs)
    envs.env, envs.num_envs = Shuffled(), 3
    obs, reward, terminated, truncated = envs.recv()
    assert obs.shape == (3, 2, 2, 4)
    np.testing.assert_array_equal(obs[:, 0, 0, 0], [0, 1, 2])
    np.testing.assert_array_equal(reward, [0.0, 1.0, 2.0])
    np.testing.assert_array_equal(terminated, [True, False, False])
    np.testing.assert_array_equal(truncated, [False, True, False])


def test_an_unknown_atari_id_names_the_key() -> None:
    pytest.importorskip("ale_py.vector_env")
    with pytest.raises(ValueError, match=r"env.id 'ALE/Pongg-v5'.*no game 'pongg'.*'pong'"):
        make_actor_envs(EnvConfig("ALE/Pongg-v5", vectorization="ale"), 2)


def test_envpool_pong_steps_channels_last() -> None:
    pytest.importorskip("envpool")
    envs = make_actor_envs(EnvConfig("ALE/Pong-v5", vectorization="envpool"), 4)
    try:
        obs, _ = envs.reset(seed=env_seeds(envs, 0, 0))
        assert obs.shape == (4, 84, 84, 4) and obs.dtype == np.uint8
        obs, reward, terminated, truncated, _ = envs.step(np.zeros(4, np.int64))
        assert obs.shape == (4, 84, 84, 4)
        assert reward.shape == terminated.shape == truncated.shape == (4,)
    finally:
        envs.close()
    with pytest.raises(ValueError, match=r"EnvPool has no task 'Pongg-v5'"):
        make_actor_envs(EnvConfig("ALE/Pongg-v5", vectorization="envpool"), 2)


def test_gil_bound_actor_threads_are_warned_about_once_measured() -> None:
    from rlpar.runtime.env_modes import GIL_CHECK_AFTER_S, gil_bound_warning

    sync, split = EnvConfig("rlpar-test/Walk-v0"), EnvConfig("x", vectorization="async")
    assert gil_bound_warning(sync, 2, 0.1, 0.1) is None  # not measured long enough
    assert gil_bound_warning(sync, 2, GIL_CHECK_AFTER_S, 0.5 * GIL_CHECK_AFTER_S) is not None
    assert gil_bound_warning(sync, 1, 10.0, 1.0) is None  # one actor thread: no one to wait on
    assert gil_bound_warning(sync, 4, 1.0, 10.0) is None  # inference-bound (GIL released)
    assert gil_bound_warning(split, 4, 10.0, 1.0) is None  # steps outside the GIL
    warning = gil_bound_warning(sync, 3, 8.0, 2.0)
    assert warning is not None
    assert "3 actor threads" in warning and "80%" in warning
    assert 'env.vectorization = "async"' in warning


def test_the_runner_checks_its_actor_threads_once(caplog) -> None:
    runner = Runner(TinyAgent(), EnvConfig("rlpar-test/Walk-v0"), runtime())
    try:
        for actor in runner.actors:  # what two GIL-bound actor threads measure
            actor.stats.env_s, actor.stats.inference_s = 0.5, 0.1
        with caplog.at_level("WARNING", logger="rlpar"):
            runner._gil_check()  # 1.2 s of actor time: too early to judge
            assert not runner._gil_check.done and not caplog.records
            for actor in runner.actors:
                actor.stats.env_s = 2.0
            runner._gil_check()
            runner._gil_check()
        assert runner._gil_check.done
        assert [r.getMessage()[:16] for r in caplog.records] == ["2 actor threads "]
    finally:
        runner.close()


@pytest.mark.parametrize(
    ("seed", "want"),
    [(None, None), (5, [5, 6, 7, 8]), (np.int64(5), [5, 6, 7, 8]), ([9, 1, 2, 3], [9, 1, 2, 3])],
)
def test_every_mode_reads_the_seeds_gymnasium_reset_accepts(seed, want) -> None:
    assert per_env_seeds(seed, 4) == want


@pytest.mark.parametrize("seed", [[1, 2], "7", 1.5, True, [1, 2, 3, None]])
def test_a_seed_no_reset_accepts_names_what_was_expected(seed) -> None:
    with pytest.raises(ValueError, match="expected None, an int or a list of 4 ints"):
        per_env_seeds(seed, 4)


@pytest.mark.parametrize("double_buffer", [False, True])
def test_async_envs_take_an_int_seed_as_env_i_seeded_seed_plus_i(double_buffer) -> None:
    cfg = EnvConfig("rlpar-test/Walk-v0", vectorization="async", workers_per_actor=2,
                    double_buffer=double_buffer)  # fmt: skip
    envs = make_actor_envs(cfg, 4)
    try:
        by_int, _ = envs.reset(seed=11)
        by_list, _ = envs.reset(seed=[11, 12, 13, 14])
    finally:
        envs.close()
    sync = make_actor_envs(EnvConfig("rlpar-test/Walk-v0"), 4)
    want, _ = sync.reset(seed=11)
    sync.close()
    np.testing.assert_array_equal(by_int, by_list)
    np.testing.assert_array_equal(by_int, want)


def test_the_side_choice_probes_both_ways_and_keeps_the_faster() -> None:
    """`SideProbe`: blocks of `SIDE_PROBE_UNROLLS` unrolls side, in turn, in turn, side, each
    timed from its first unroll's start to the next block's; then `SIDE_KEEP_UNROLLS` unrolls
    the way that took less time, then a new probe."""
    from rlpar.runtime.unrollers import SIDE_KEEP_UNROLLS, SIDE_PROBE_UNROLLS, SideProbe

    def probe(choice: SideProbe, now: float, side_s: float, turn_s: float) -> tuple[list, float]:
        ways = []
        for _ in range(4 * SIDE_PROBE_UNROLLS):
            way = choice.next(now)
            ways.append(way)
            now += side_s if way else turn_s
        return ways, now

    choice = SideProbe()
    p = SIDE_PROBE_UNROLLS
    ways, now = probe(choice, 0.0, side_s=1.0, turn_s=2.0)
    assert ways == [True] * p + [False] * 2 * p + [True] * p
    kept = [choice.next(now + i) for i in range(SIDE_KEEP_UNROLLS)]
    assert kept == [True] * SIDE_KEEP_UNROLLS  # the side thread was faster
    ways, now = probe(choice, 1e6, side_s=3.0, turn_s=2.0)  # the next probe
    assert ways == [True] * p + [False] * 2 * p + [True] * p
    assert [choice.next(now + i) for i in range(SIDE_KEEP_UNROLLS)] == [False] * SIDE_KEEP_UNROLLS
    assert choice.next(2e6) is True  # and probes again
