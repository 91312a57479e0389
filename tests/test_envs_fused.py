"""The fused actor loop (one native call per unroll) against rlpar's Python actor loop: same
rollout format and invariants, and the very same rollouts from the same seeds."""

from __future__ import annotations

import threading

import gymnasium as gym
import numpy as np
import pytest
from tiny_agent import TinyAgent

import rlpar
from rlpar import _native
from rlpar import envs as rlpar_envs
from rlpar.data import Rollout
from rlpar.runtime.actor import Actor
from rlpar.runtime.common import EpisodeLog
from rlpar.runtime.envs import env_seeds

CategoricalSampler = _native.CategoricalSampler


class SamplerAgent(TinyAgent):
    """TinyAgent acting with the native sampler, so the Python loop draws what the fused one
    draws from the same seed."""

    def __init__(self, seed: int, net_spec: rlpar.NetSpec | None = None) -> None:
        super().__init__()
        self.sampler = CategoricalSampler(seed)
        self.spec = net_spec

    def net_spec(self, obs_space: gym.Space, action_space: gym.Space) -> rlpar.NetSpec:
        return self.spec or super().net_spec(obs_space, action_space)

    def act(self, net: rlpar.Net, out: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        (name, _, begin, size) = net.outputs[0]
        assert name == "logits"
        return self.sampler.sample(np.ascontiguousarray(out[:, begin : begin + size]))


def catch_spec() -> rlpar.NetSpec:
    return rlpar.NetSpec(
        input_shape=(10, 10, 1),
        input_dtype="uint8",
        layers=[rlpar.Flatten(), rlpar.Linear(32), rlpar.ReLU()],
        heads=[rlpar.Categorical(3), rlpar.Value()],
    )


def allocate(envs: rlpar_envs.NativeVectorEnv, net: rlpar.Net, t: int) -> Rollout:
    space = envs.single_observation_space
    return Rollout.allocate(
        t, envs.num_envs, space.shape, space.dtype, (), np.int64, net.output_size
    )


ARRAYS = ("obs", "actions", "rewards", "terminated", "truncated", "mask", "behaviour")


@pytest.mark.parametrize(
    ("env_id", "spec"), [("rlpar/CartPole-v1", None), ("rlpar/Catch-v0", catch_spec())]
)
def test_fused_unroll_equals_python_actor_loop(env_id, spec):
    k, t_len, seed, unrolls = 8, 16, 3, 40
    agent = SamplerAgent(seed=11, net_spec=spec)
    py_envs = gym.make_vec(env_id, num_envs=k)
    net = rlpar.Net(agent.net_spec(py_envs.single_observation_space, py_envs.single_action_space))
    params = net.init_params(seed=0)
    store = rlpar.SnapshotStore(net.num_params)
    store.publish(params, version=5)
    actor = Actor(
        0, envs=py_envs, agent=agent, net=net, store=store, unroll_length=t_len,
        num_buffers=1, seed=seed,
    )  # fmt: skip
    log = EpisodeLog()

    fused_envs = gym.make_vec(env_id, num_envs=k)
    fused_envs.reset(seed=env_seeds(fused_envs, seed, 0))
    sampler = CategoricalSampler(11)
    ep_return, ep_length = np.zeros(k), np.zeros(k, np.int64)
    episodes = []
    for _ in range(unrolls):
        r_py = actor.free.get()
        actor.unroll(r_py, log)
        actor.free.put(r_py)
        r_fused = allocate(fused_envs, net, t_len)
        with store.pin() as snap:
            version, ends = fused_envs.fused_unroll(
                net, snap, sampler, r_fused, ep_return, ep_length
            )
        assert version == r_py.version == 5
        for name in ARRAYS:
            np.testing.assert_array_equal(getattr(r_fused, name), getattr(r_py, name), name)
        episodes.extend(ends)
    assert len(episodes) > 20
    assert episodes == [(ret, length) for ret, length, _ in log.episodes]
    np.testing.assert_array_equal(ep_return, actor.carry.ep_return)
    np.testing.assert_array_equal(ep_length, actor.carry.ep_length)
    assert sampler.state == agent.sampler.state


def test_fused_rollout_invariants():
    k, t_len = 16, 32
    envs = gym.make_vec("rlpar/CartPole-v1", num_envs=k, max_episode_steps=20)
    envs.reset(seed=0)
    net = rlpar.Net(rlpar.mlp_spec(4, [rlpar.Categorical(2), rlpar.Value()], hidden=(16,)))
    params = net.init_params(seed=1)
    sampler = CategoricalSampler(0)
    ep_return, ep_length = np.zeros(k), np.zeros(k, np.int64)
    prev_done = np.zeros(k, bool)
    for _ in range(4):
        r = allocate(envs, net, t_len)
        version, ends = envs.fused_unroll(net, params, sampler, r, ep_return, ep_length)
        assert version == 0
        assert r.obs.shape == (t_len + 1, k, 4) and r.obs.dtype == np.float32
        assert r.actions.dtype == np.int64 and set(np.unique(r.actions)) <= {0, 1}
        done = r.terminated | r.truncated
        np.testing.assert_array_equal(r.mask[0], ~prev_done)
        np.testing.assert_array_equal(r.mask[1:], ~done[:-1])
        assert not r.rewards[~r.mask].any() and (r.rewards[r.mask] == 1).all()
        assert not done[~r.mask].any()
        for t in range(t_len):
            np.testing.assert_array_equal(r.behaviour[t], net.forward(params, r.obs[t]))
        np.testing.assert_array_equal(r.obs[-1], envs.native.observe())
        assert len(ends) == int(done.sum())
        assert all(1 <= length <= 20 and ret == length for ret, length in ends)
        prev_done = done[-1]


def test_fused_unroll_threads_give_the_sequential_result():
    """Two threads unrolling their own envs at once (GIL released) get exactly what each gets
    alone: nothing is shared but the net and the snapshot."""
    k, t_len = 32, 20
    net = rlpar.Net(rlpar.mlp_spec(4, [rlpar.Categorical(2), rlpar.Value()]))
    store = rlpar.SnapshotStore(net.num_params)
    store.publish(net.init_params(seed=0))

    def run(seed: int, out: list) -> None:
        envs = gym.make_vec("rlpar/CartPole-v1", num_envs=k)
        envs.reset(seed=seed)
        sampler = CategoricalSampler(seed)
        ret, length = np.zeros(k), np.zeros(k, np.int64)
        for _ in range(30):
            r = allocate(envs, net, t_len)
            with store.pin() as snap:
                envs.fused_unroll(net, snap, sampler, r, ret, length, release_gil=True)
            out.append(r.actions.copy())

    alone = {s: [] for s in (1, 2)}
    for s in alone:
        run(s, alone[s])
    together = {s: [] for s in (1, 2)}
    threads = [threading.Thread(target=run, args=(s, together[s])) for s in together]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    for s in alone:
        np.testing.assert_array_equal(np.stack(alone[s]), np.stack(together[s]))


def test_fused_unroll_errors():
    envs = gym.make_vec("rlpar/CartPole-v1", num_envs=4)
    envs.reset(seed=0)
    net = rlpar.Net(rlpar.mlp_spec(4, [rlpar.Categorical(2), rlpar.Value()]))
    params = net.init_params(seed=0)
    sampler = CategoricalSampler(0)
    ret, length = np.zeros(4), np.zeros(4, np.int64)
    r = allocate(envs, net, 5)

    envs.check_fused(net)
    wrong_heads = rlpar.Net(rlpar.mlp_spec(4, [rlpar.Categorical(3), rlpar.Value()]))
    with pytest.raises(ValueError, match="Categorical head has 3 logits, CartPole-v1 has 2"):
        envs.check_fused(wrong_heads)
    with pytest.raises(ValueError, match="Categorical head has 3 logits, CartPole-v1 has 2"):
        envs.fused_unroll(wrong_heads, wrong_heads.init_params(0), sampler, r, ret, length)
    no_logits = rlpar.Net(rlpar.mlp_spec(4, [rlpar.Value()]))
    with pytest.raises(ValueError, match="exactly one Categorical head, this one has 0"):
        envs.fused_unroll(no_logits, no_logits.init_params(0), sampler, r, ret, length)
    wide = rlpar.Net(rlpar.mlp_spec(6, [rlpar.Categorical(2), rlpar.Value()]))
    with pytest.raises(
        ValueError, match=r"float32 inputs \(6,\), CartPole-v1 gives float32 observations \(4,\)"
    ):
        envs.fused_unroll(wide, wide.init_params(0), sampler, r, ret, length)
    with pytest.raises(ValueError, match="params must be a flat float32 vector of"):
        envs.fused_unroll(net, params[:-1], sampler, r, ret, length)
    with pytest.raises(TypeError, match="params must be a Snapshot or a float32 array"):
        envs.fused_unroll(net, params.tolist(), sampler, r, ret, length)

    before = [envs.native.get_state(i) for i in range(4)]
    bad = allocate(envs, net, 5)
    bad.rewards = bad.rewards.astype(np.float64)
    with pytest.raises(TypeError, match="rewards must be float32, got float64"):
        envs.fused_unroll(net, params, sampler, bad, ret, length)
    bad = allocate(envs, net, 5)
    bad.mask = np.zeros((5, 3), bool)
    with pytest.raises(ValueError, match=r"mask must have shape \(5, 4\), got \(5, 3\)"):
        envs.fused_unroll(net, params, sampler, bad, ret, length)
    bad = allocate(envs, net, 5)
    bad.obs = bad.obs[:, :, ::-1]
    with pytest.raises(ValueError, match="obs must be a C-contiguous, writable array"):
        envs.fused_unroll(net, params, sampler, bad, ret, length)
    bad = allocate(envs, net, 5)
    bad.terminated = bad.terminated.tolist()
    with pytest.raises(TypeError, match="terminated must be a numpy array, got list"):
        envs.fused_unroll(net, params, sampler, bad, ret, length)
    with pytest.raises(TypeError, match="ep_length must be int64"):
        envs.fused_unroll(net, params, sampler, r, ret, length.astype(np.int32))
    store = rlpar.SnapshotStore(net.num_params)
    snap = store.pin()
    snap.release()
    with pytest.raises(ValueError, match="snapshot was released"):
        envs.fused_unroll(net, snap, sampler, r, ret, length)
    after = [envs.native.get_state(i) for i in range(4)]
    for (s0, e0), (s1, e1) in zip(before, after, strict=True):
        np.testing.assert_array_equal(s0, s1)
        assert e0 == e1


def test_sampler_draws_from_the_softmax():
    logits = np.array([[0.0, 1.0, 2.0, -np.inf]], np.float32)
    sampler = CategoricalSampler(123)
    draws = np.concatenate([sampler.sample(np.repeat(logits, 1000, axis=0)) for _ in range(40)])
    freq = np.bincount(draws, minlength=4) / draws.size
    p = np.exp(logits[0, :3] - 2.0)
    p /= p.sum()
    np.testing.assert_allclose(freq[:3], p, atol=0.01)
    assert freq[3] == 0


def test_sampler_state_round_trip_and_errors():
    a = CategoricalSampler(5)
    logits = np.zeros((64, 6), np.float32)
    a.sample(logits)
    saved = a.state
    first = a.sample(logits)
    b = CategoricalSampler(0)
    b.state = saved
    np.testing.assert_array_equal(b.sample(logits), first)
    with pytest.raises(ValueError, match="all-zero"):
        b.state = (0, 0, 0, 0)
    with pytest.raises(ValueError, match="NaN or \\+inf"):
        a.sample(np.array([[0.0, np.nan]], np.float32))
    with pytest.raises(ValueError, match="all -inf"):
        a.sample(np.full((1, 2), -np.inf, np.float32))
    with pytest.raises(TypeError, match="logits must be float32, got float64"):
        a.sample(np.zeros((2, 2)))
