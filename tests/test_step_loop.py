"""The step loop (`_native.StepLoop`): an actor's Python-env unroll with one native call between
two env steps, against a slow reference written like the numpy loop it replaced (obs stored,
forward, act, env step, the step's results written, the episodes carried, one array at a time),
and the runtime's stepped and double-buffered paths bit for bit like it."""

from __future__ import annotations

import threading

import gymnasium as gym
import numpy as np
import pytest

import rlpar
from rlpar import _native
from rlpar.data import Rollout
from rlpar.nn import LSTM, Categorical, Flatten, Linear, NetSpec, PyLayer, Tanh, Value
from rlpar.runtime.recurrent import CoreState

K, T = 6, 25


def cartpoles(seed: int, reward_scale: float = 0.1, limit: int = 14) -> gym.vector.VectorEnv:
    """K CartPoles whose episodes end by termination and by a short time limit, with rewards
    that float32 cannot hold exactly (0.1 per step)."""

    def make() -> gym.Env:
        env = gym.make("CartPole-v1", max_episode_steps=limit)
        return gym.wrappers.TransformReward(env, lambda r: reward_scale * r)

    envs = gym.vector.SyncVectorEnv([make] * K)
    envs.reset(seed=seed)
    return envs


def make_net(recurrent: bool = False) -> rlpar.Net:
    core = LSTM(8) if recurrent else None
    return rlpar.Net(NetSpec((4,), [Linear(16), Tanh()], [Categorical(2), Value()], core=core))


class Carry:
    """What an actor carries between unrolls: obs, episodes, the core state."""

    def __init__(self, envs: gym.vector.VectorEnv, net: rlpar.Net, seed: int) -> None:
        self.obs, _ = envs.reset(seed=seed)
        self.prev_done = np.zeros(K, bool)
        self.ep_return = np.zeros(K, np.float64)
        self.ep_length = np.zeros(K, np.int64)
        self.core = CoreState(net, K) if net.recurrent else None


def new_rollout(net: rlpar.Net, k: int = K) -> Rollout:
    return Rollout.allocate(T, k, (4,), np.dtype(np.float32), (), np.dtype(np.int64),
                            net.output_size, state_size=net.state_size)  # fmt: skip


def reference_unroll(net, params, envs, c: Carry, r: Rollout, act) -> list[tuple[float, int]]:
    ends = []
    if c.core is not None:
        c.core.begin_unroll(r)
    for t in range(T):
        r.obs[t] = c.obs
        if c.core is None:
            net.forward(params, r.obs[t], r.behaviour[t])
        else:
            c.core.forward(params, r.obs[t], r.behaviour[t])
        r.actions[t] = act(r.behaviour[t])
        c.obs, reward, terminated, truncated, _ = envs.step(r.actions[t])
        r.rewards[t], r.terminated[t], r.truncated[t] = reward, terminated, truncated
        valid = ~c.prev_done
        r.mask[t] = valid
        if c.core is not None:
            c.core.after_step(valid)
        c.ep_return += np.where(valid, reward, 0.0)
        c.ep_length += valid
        c.prev_done[:] = terminated | truncated
        for k in np.flatnonzero(c.prev_done):
            ends.append((float(c.ep_return[k]), int(c.ep_length[k])))
            c.ep_return[k], c.ep_length[k] = 0.0, 0
    r.obs[-1] = c.obs
    return ends


def stepped_unroll(loop, params, envs, c: Carry, r: Rollout, act) -> list[tuple[float, int]]:
    core = () if c.core is None else (c.core.state, c.core.starts)
    loop.begin(params, r, c.prev_done, c.ep_return, c.ep_length, *core)
    loop.act(0, c.obs)
    if act is not None:
        r.actions[0] = act(r.behaviour[0])
    for t in range(1, T):
        obs, reward, terminated, truncated, _ = envs.step(r.actions[t - 1])
        loop.step(t, obs, reward, terminated, truncated)
        if act is not None:
            r.actions[t] = act(r.behaviour[t])
    c.obs, reward, terminated, truncated, _ = envs.step(r.actions[-1])
    loop.record(T - 1, c.obs, reward, terminated, truncated)
    ends, seconds = loop.end()
    assert seconds > 0
    return ends


def assert_same_rollout(a: Rollout, b: Rollout) -> None:
    for name in ("obs", "actions", "rewards", "terminated", "truncated", "mask", "behaviour",
                 "core_state"):  # fmt: skip
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)


def numpy_act(seed: int):
    rng = np.random.default_rng(seed)

    def act(out: np.ndarray) -> np.ndarray:
        logits = out[:, :2].astype(np.float64)
        p = np.exp(logits - logits.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        return (rng.random((len(out), 1)) > np.cumsum(p, 1)).sum(1)

    return act


def sampler_act(seed: int):
    sampler = _native.CategoricalSampler(seed)
    return lambda out: sampler.sample(np.ascontiguousarray(out[:, :2]))


@pytest.mark.parametrize("recurrent", [False, True], ids=["mlp", "lstm"])
@pytest.mark.parametrize("native", [False, True], ids=["python_act", "native_sampler"])
def test_the_step_loop_writes_what_the_numpy_loop_wrote(recurrent: bool, native: bool) -> None:
    net = make_net(recurrent)
    params = net.init_params(5)
    ref_envs, envs = cartpoles(1), cartpoles(1)
    ref, mine = Carry(ref_envs, net, 1), Carry(envs, net, 1)
    ref_act = sampler_act(9) if native else numpy_act(9)
    loop = _native.StepLoop(net, K, _native.CategoricalSampler(9) if native else None)
    my_act = None if native else numpy_act(9)
    all_ends = []
    for _ in range(4):  # carried across unrolls: obs, episodes in progress, core state
        r_ref, r_mine = new_rollout(net), new_rollout(net)
        ends_ref = reference_unroll(net, params, ref_envs, ref, r_ref, ref_act)
        ends_mine = stepped_unroll(loop, params, envs, mine, r_mine, my_act)
        assert_same_rollout(r_ref, r_mine)
        assert ends_mine == ends_ref  # float64 returns: the env's 0.1s, not float32's
        all_ends += ends_ref
        for name in ("prev_done", "ep_return", "ep_length"):
            np.testing.assert_array_equal(getattr(mine, name), getattr(ref, name))
        if recurrent:
            np.testing.assert_array_equal(mine.core.state, ref.core.state)
            np.testing.assert_array_equal(mine.core.starts, ref.core.starts)
    assert len(all_ends) > 5 and any(length == 14 for _, length in all_ends)


def test_halves_acted_one_after_the_other_write_what_two_loops_write() -> None:
    """Double buffering's calls (each half's record and act on its own column range of one
    rollout) write exactly what two loops of K / 2 envs write into two rollouts."""
    net = make_net()
    params = net.init_params(2)
    h = K // 2
    split = _native.StepLoop(net, K)
    halves = [_native.StepLoop(net, h), _native.StepLoop(net, h)]
    r_split = new_rollout(net)
    r_halves = [new_rollout(net, h), new_rollout(net, h)]
    carry_split = np.zeros(K, bool), np.zeros(K, np.float64), np.zeros(K, np.int64)
    carries = [(np.zeros(h, bool), np.zeros(h, np.float64), np.zeros(h, np.int64))
               for _ in range(2)]  # fmt: skip
    rng = np.random.default_rng(0)
    obs = rng.standard_normal((K, 4)).astype(np.float32)
    split.begin(params, r_split, *carry_split)
    for loop, r, c in zip(halves, r_halves, carries, strict=True):
        loop.begin(params, r, *c)
    cols = ((0, h), (h, K))
    for (b, e), loop in zip(cols, halves, strict=True):
        split.act(0, obs[b:e], b, e)
        loop.act(0, obs[b:e])
    for t in range(1, T + 1):
        obs = rng.standard_normal((K, 4)).astype(np.float32)
        reward = rng.random(K)
        terminated, truncated = rng.random(K) < 0.1, rng.random(K) < 0.05
        for (b, e), loop in zip(cols, halves, strict=True):
            args = obs[b:e], reward[b:e], terminated[b:e], truncated[b:e]
            if t < T:
                split.step(t, *args, b, e)
                loop.step(t, *args)
            else:
                split.record(t - 1, *args, b, e)
                loop.record(t - 1, *args)
    ends_split, _ = split.end()
    ends_halves = [x for loop in halves for x in loop.end()[0]]
    for name in ("obs", "actions", "rewards", "terminated", "truncated", "mask", "behaviour"):
        whole = np.concatenate([getattr(r, name) for r in r_halves], axis=1)
        np.testing.assert_array_equal(getattr(r_split, name), whole, err_msg=name)
    assert sorted(ends_split) == sorted(ends_halves) and len(ends_split) > 3
    np.testing.assert_array_equal(carry_split[1], np.concatenate([c[1] for c in carries]))


def test_the_runtime_python_path_learns_what_the_numpy_loop_learns() -> None:
    """A whole deterministic run on gymnasium CartPole: the stepped path with the agent's own
    `act` and with the native sampler run the same code paths, bit for bit reproducible."""
    runtime = rlpar.RuntimeConfig(num_actors=1, envs_per_actor=8, unroll_length=8,
                                  batch_rollouts=1, seed=4, deterministic=True,
                                  total_env_steps=6_000, checkpoint_interval_s=None)  # fmt: skip

    def run() -> rlpar.Runner:
        runner = rlpar.Runner(rlpar.make_agent("impala"), rlpar.EnvConfig("CartPole-v1"), runtime)
        runner.run()
        return runner

    first, second = run(), run()
    assert first.actors[0].loop is not None and not first.actors[0].fused
    np.testing.assert_array_equal(first.state.params, second.state.params)
    assert first.episodes.count == second.episodes.count > 0


def test_bad_calls_raise_and_name_what_was_expected() -> None:
    net = make_net()
    params = net.init_params(0)
    c = Carry(cartpoles(0), net, 0)
    r = new_rollout(net)
    loop = _native.StepLoop(net, K, _native.CategoricalSampler(1))
    with pytest.raises(ValueError, match="no unroll is bound: call begin"):
        loop.act(0, c.obs)
    with pytest.raises(ValueError, match=r"ep_return must have shape \(6,\), got \(5,\)"):
        loop.begin(params, r, c.prev_done, c.ep_return[:5].copy(), c.ep_length)
    with pytest.raises(ValueError, match="state and starts are for a recurrent net"):
        loop.begin(params, r, c.prev_done, c.ep_return, c.ep_length, np.zeros((K, 4), np.float32))
    assert loop.begin(params, r, c.prev_done, c.ep_return, c.ep_length) == 0
    with pytest.raises(ValueError, match="previous unroll was not ended"):
        loop.begin(params, r, c.prev_done, c.ep_return, c.ep_length)
    with pytest.raises(ValueError, match=r"obs must have shape \(6, 4\), got \(6, 5\)"):
        loop.act(0, np.zeros((K, 5), np.float32))
    with pytest.raises(TypeError, match="obs must be numbers"):
        loop.act(0, np.full((K, 4), "x"))
    with pytest.raises(ValueError, match=r"act: t must be in \[0, 24\], got 25"):
        loop.act(T, c.obs)
    with pytest.raises(ValueError, match=r"envs \[4, 2\) are not a non-empty range of the 6"):
        loop.act(0, c.obs[:2], 4, 2)
    loop.act(0, c.obs)
    with pytest.raises(ValueError, match=r"reward must have shape \(6,\), got \(3,\)"):
        loop.step(1, c.obs, np.zeros(3), np.zeros(K, bool), np.zeros(K, bool))
    with pytest.raises(ValueError, match=r"step: t must be in \[1, 24\], got 0"):
        loop.step(0, c.obs, np.zeros(K), np.zeros(K, bool), np.zeros(K, bool))
    episodes, _ = loop.end()
    assert episodes == []
    with pytest.raises(ValueError, match="params must be a flat float32 vector of"):
        loop.begin(params[:-1], r, c.prev_done, c.ep_return, c.ep_length)
    no_logits = rlpar.Net(NetSpec((4,), [Linear(8)], [Value()]))
    with pytest.raises(ValueError, match="exactly one Categorical head, this one has 0"):
        _native.StepLoop(no_logits, K, _native.CategoricalSampler(1))
    with pytest.raises(TypeError, match="sampler must be a CategoricalSampler or None, got int"):
        _native.StepLoop(net, K, 3)
    lstm = make_net(recurrent=True)
    with pytest.raises(ValueError, match="the net has an LSTM core: begin needs state"):
        _native.StepLoop(lstm, K).begin(lstm.init_params(0), new_rollout(lstm), c.prev_done,
                                        c.ep_return, c.ep_length)  # fmt: skip


def diverged_loop() -> tuple[_native.StepLoop, Carry]:
    """A loop with a sampler, bound to parameters that are all NaN."""
    net = make_net()
    params = net.init_params(0)
    params[:] = np.nan
    c = Carry(cartpoles(0), net, 0)
    loop = _native.StepLoop(net, K, _native.CategoricalSampler(1))
    loop.begin(params, new_rollout(net), c.prev_done, c.ep_return, c.ep_length)
    return loop, c


def test_a_diverged_net_raises_instead_of_sampling() -> None:
    loop, c = diverged_loop()
    with pytest.raises(ValueError, match="hold NaN or \\+inf: cannot sample an action"):
        loop.act(0, c.obs)
    loop.end()


class Reenter(PyLayer):
    """A Python layer that calls its loop again from inside the loop's own forward."""

    loop: _native.StepLoop | None = None

    def forward(self, x: np.ndarray) -> np.ndarray:
        assert self.loop is not None
        self.loop.act(0)
        return x

    def backward(self, x: np.ndarray, y: np.ndarray, dy: np.ndarray) -> np.ndarray:
        return dy


def test_a_loop_refuses_a_second_call_while_one_is_running() -> None:
    layer = Reenter()
    net = rlpar.Net(NetSpec((4,), [layer, Linear(4)], [Categorical(2)]))
    c = Carry(cartpoles(0), net, 0)
    loop = _native.StepLoop(net, K)
    layer.loop = loop
    loop.begin(net.init_params(0), new_rollout(net), c.prev_done, c.ep_return, c.ep_length)
    with pytest.raises(ValueError, match="a call is already in progress"):
        loop.act(0, c.obs)
    loop.end()


def test_loops_of_many_threads_share_one_net() -> None:
    """Eight threads, each with its own loop and rollout, act on one net at once: each gets
    exactly what it gets alone."""
    net = make_net()
    params = net.init_params(7)
    obs = np.random.default_rng(0).standard_normal((T + 1, K, 4)).astype(np.float32)

    def unroll(seed: int) -> Rollout:
        loop = _native.StepLoop(net, K, _native.CategoricalSampler(seed))
        r = new_rollout(net)
        zeros = np.zeros(K), np.zeros(K, bool)
        carry = np.zeros(K, bool), np.zeros(K, np.float64), np.zeros(K, np.int64)
        for _ in range(20):
            loop.begin(params, r, *carry)
            loop.act(0, obs[0])
            for t in range(1, T):
                loop.step(t, obs[t], zeros[0], zeros[1], zeros[1])
            loop.record(T - 1, obs[T], *zeros, zeros[1])
            loop.end()
        return r

    alone = [unroll(s) for s in range(8)]
    got: list[Rollout | None] = [None] * 8

    def work(i: int) -> None:
        got[i] = unroll(i)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    for a, b in zip(alone, got, strict=True):
        assert b is not None
        assert_same_rollout(a, b)


def side_unroll(loop, params, envs, c: Carry, r: Rollout, side: bool) -> list[tuple[float, int]]:
    """Double buffering over two halves of ``envs`` (each a vector env of K / 2) as the
    runtime's `SideActs` unroller runs it: each half steps while the other half's act runs on
    the loop's side thread (``side``), or with every act synchronous."""
    h = K // 2
    halves = [((0, h), envs[0]), ((h, K), envs[1])]
    loop.begin(params, r, c.prev_done, c.ep_return, c.ep_length)
    loop.act(0, c.obs[:h], 0, h)
    (loop.act_async if side else loop.act)(0, c.obs[h:], h, K)
    obs = []
    for t in range(T):
        obs.clear()
        for (b, e), half in halves:
            o, reward, terminated, truncated, _ = half.step(r.actions[t, b:e])
            obs.append(o)
            if t + 1 < T:
                (loop.step_async if side else loop.step)(t + 1, o, reward, terminated,
                                                          truncated, b, e)  # fmt: skip
            else:
                loop.record(t, o, reward, terminated, truncated, b, e)
    c.obs = np.concatenate(obs)
    ends, seconds = loop.end()
    assert seconds > 0
    return ends


def half_cartpoles(seed: int) -> list[gym.vector.VectorEnv]:
    """Two vector envs of K / 2 CartPoles, seeded as one vector env of K would be."""
    halves = []
    for i in range(2):
        envs = gym.vector.SyncVectorEnv(
            [lambda: gym.make("CartPole-v1", max_episode_steps=14)] * (K // 2)
        )
        envs.reset(seed=[seed + i * K // 2 + j for j in range(K // 2)])
        halves.append(envs)
    return halves


def test_acts_on_the_side_thread_write_what_acts_in_turn_write() -> None:
    """`act_async` / `step_async` (the forward and the draw of one half on the loop's side
    thread while the other half steps) write the same rollouts and episodes as the same calls
    made synchronously, unroll after unroll."""
    net = make_net()
    params = net.init_params(3)
    got = {}
    for side in (False, True):
        loop = _native.StepLoop(net, K, _native.CategoricalSampler(5))
        assert loop.can_act_async
        envs = half_cartpoles(0)
        c = Carry(gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * K), net, 0)
        c.obs = np.concatenate([e.reset(seed=[i * K // 2 + j for j in range(K // 2)])[0]
                                for i, e in enumerate(envs)])  # fmt: skip
        rollouts, ends = [], []
        for _ in range(4):
            r = new_rollout(net)
            ends += side_unroll(loop, params, envs, c, r, side)
            rollouts.append(r)
        got[side] = rollouts, ends
        submitted, stolen = loop.side_counts
        # an unroll hands the side thread act_async(0) and step_async(t) of both halves
        assert submitted == (4 * (1 + 2 * (T - 1)) if side else 0)
        assert 0 <= stolen <= submitted
    for a, b in zip(got[False][0], got[True][0], strict=True):
        assert_same_rollout(a, b)
    assert got[False][1] == got[True][1] and len(got[True][1]) > 3


def test_side_acts_need_a_sampler_and_a_native_net_and_wait_before_every_call() -> None:
    net = make_net()
    params = net.init_params(0)
    c = Carry(cartpoles(0), net, 0)
    no_sampler = _native.StepLoop(net, K)
    assert not no_sampler.can_act_async
    no_sampler.begin(params, new_rollout(net), c.prev_done, c.ep_return, c.ep_length)
    with pytest.raises(ValueError, match="only with a native sampler and a net without Python"):
        no_sampler.act_async(0, c.obs)
    no_sampler.end()
    python_layer = rlpar.Net(NetSpec((4,), [Reenter(), Linear(4)], [Categorical(2)]))
    assert not _native.StepLoop(python_layer, K, _native.CategoricalSampler(1)).can_act_async
    loop = _native.StepLoop(net, K, _native.CategoricalSampler(1))
    with pytest.raises(ValueError, match="no unroll is bound: call begin"):
        loop.act_async(0, c.obs)
    r = new_rollout(net)
    loop.begin(params, r, c.prev_done, c.ep_return, c.ep_length)
    with pytest.raises(ValueError, match=r"act_async: t must be in \[0, 24\], got 25"):
        loop.act_async(T, c.obs)
    loop.act_async(0, c.obs)
    loop.wait()  # the act is done: its actions are there
    first = r.actions[0].copy()
    assert np.all((first == 0) | (first == 1))
    with pytest.raises(ValueError, match=r"step_async: t must be in \[1, 24\], got 0"):
        loop.step_async(0, c.obs, np.zeros(K), np.zeros(K, bool), np.zeros(K, bool))
    loop.step_async(1, c.obs, np.zeros(K), np.zeros(K, bool), np.zeros(K, bool))
    loop.end()  # waits for the act in flight before it lets go of the arrays
    assert r.behaviour[1].any()


def test_a_diverged_net_raises_from_the_side_thread_at_the_next_call() -> None:
    loop, c = diverged_loop()
    loop.act_async(0, c.obs)
    with pytest.raises(ValueError, match="hold NaN or \\+inf: cannot sample an action"):
        loop.wait()
    loop.wait()  # raised once
    loop.act_async(0, c.obs)
    with pytest.raises(ValueError, match="hold NaN or \\+inf"):
        loop.end()  # end raises it too, and unbinds
    assert not loop.bound


def test_the_casts_envs_give_store_what_numpy_casts_give() -> None:
    """bool frames into a uint8 input, float64 and int64 observations into float32, float64
    and int64 rewards, non-contiguous arrays: what ``astype`` gives, bit for bit."""
    rng = np.random.default_rng(3)
    frames = rlpar.Net(
        NetSpec((3, 3, 2), [Flatten(), Linear(4)], [Categorical(2)], input_dtype="uint8")
    )
    vec = rlpar.Net(NetSpec((4,), [Linear(4)], [Categorical(2)]))
    cases = [
        (frames, rng.random((K, 3, 3, 2)) < 0.5, rng.normal(size=K)),
        (vec, rng.normal(size=(K, 4)) * 1e3, rng.integers(-9, 9, K)),
        (vec, rng.integers(-(2**40), 2**40, (K, 4)), rng.normal(size=K).astype(np.float32)),
        (vec, rng.normal(size=(K, 8))[:, ::2], rng.normal(size=2 * K)[::2]),
    ]
    for net, obs, reward in cases:
        r = Rollout.allocate(T, K, net.input_shape, np.dtype(np.uint8 if net is frames else
                             np.float32), (), np.dtype(np.int64), net.output_size)  # fmt: skip
        carry = np.zeros(K, bool), np.zeros(K, np.float64), np.zeros(K, np.int64)
        loop = _native.StepLoop(net, K)
        loop.begin(net.init_params(0), r, *carry)
        loop.act(0, obs)
        loop.record(0, obs, reward, np.zeros(K, bool), np.zeros(K, bool))
        loop.end()
        for t in (0, 1):
            np.testing.assert_array_equal(r.obs[t], obs.astype(r.obs.dtype))
        np.testing.assert_array_equal(r.rewards[0], reward.astype(np.float32))
        raw = reward.dtype == np.float64 and reward.flags.c_contiguous  # returns from doubles
        want = reward if raw else reward.astype(np.float32).astype(np.float64)
        np.testing.assert_array_equal(carry[1], want)
