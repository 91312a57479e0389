"""The actor's whole loop over native envs in native calls (`rlpar._native.FusedActorLoop`,
`Actor._run_native`): the same rollouts as one `fused_unroll` after another, handed over through
the runtime's `HandOff`s by ticket, and used by the runtime outside deterministic mode."""

from __future__ import annotations

import dataclasses
import threading

import gymnasium as gym
import numpy as np
import pytest

import rlpar
from rlpar import _native
from rlpar import envs as _registers_native_envs  # noqa: F401  (the rlpar/... ids)
from rlpar.config import EnvConfig, RuntimeConfig
from rlpar.data import Rollout
from rlpar.runtime.actor_carry import Carry
from rlpar.runtime.handoff import HandOff
from rlpar.runtime.recurrent import CoreState

ARRAYS = ("obs", "actions", "rewards", "terminated", "truncated", "mask", "behaviour")
K, T = 8, 6


def make_net(lstm: bool) -> rlpar.Net:
    spec = rlpar.mlp_spec(4, [rlpar.Categorical(2), rlpar.Value()], hidden=(16,))
    return rlpar.Net(dataclasses.replace(spec, core=rlpar.LSTM(8)) if lstm else spec)


def allocate(envs, net: rlpar.Net, t: int = T) -> Rollout:
    space = envs.single_observation_space
    r = Rollout.allocate(
        t, envs.num_envs, space.shape, space.dtype, (), np.int64, net.output_size,
        state_size=net.state_size,
    )  # fmt: skip
    r.stamp = np.zeros(2, np.int64)
    return r


def carry_for(envs, net: rlpar.Net, obs: np.ndarray) -> Carry:
    sampler = _native.CategoricalSampler(7)
    return Carry(0, envs, net, obs, np.random.default_rng(0), sampler, keep_resume_state=False)


class Setup:
    """A feed-forward net, a store holding ``params`` (seeded ones by default), K native
    CartPoles and an actor's carry; `loop` binds a FusedActorLoop over one buffer."""

    def __init__(self, params: np.ndarray | None = None) -> None:
        self.net = make_net(False)
        self.store = rlpar.SnapshotStore(self.net.num_params)
        self.store.publish(self.net.init_params(seed=1) if params is None else params)
        self.envs = gym.make_vec("rlpar/CartPole-v1", num_envs=K)
        obs, _ = self.envs.reset(seed=0)
        self.carry = carry_for(self.envs, self.net, obs)
        self.free, self.out = HandOff[Rollout](), HandOff[Rollout]()

    def loop(self) -> tuple[_native.FusedActorLoop, Rollout]:
        r = allocate(self.envs, self.net)
        self.free.reserve(r)
        tickets = [self.out.reserve(r)]
        loop = self.envs.fused_loop(
            self.net, self.store, self.carry.sampler, self.free.tickets, self.out.tickets, [r],
            tickets, self.carry,
        )  # fmt: skip
        return loop, r


def reference(net: rlpar.Net, store: rlpar.SnapshotStore, n: int) -> tuple[list, list]:
    """n rollouts made by one `fused_unroll` after another, and the episodes that ended."""
    envs = gym.make_vec("rlpar/CartPole-v1", num_envs=K)
    envs.reset(seed=3)
    sampler = _native.CategoricalSampler(7)
    ret, length = np.zeros(K), np.zeros(K, np.int64)
    core = CoreState(net, K) if net.recurrent else None
    rollouts, ends = [], []
    for _ in range(n):
        r = allocate(envs, net)
        with store.pin() as snap:
            version, ended = envs.fused_unroll(net, snap, sampler, r, ret, length, core)
        r.version = version
        rollouts.append(r)
        ends += ended
    return rollouts, ends


@pytest.mark.parametrize("lstm", [False, True])
def test_the_loop_makes_the_rollouts_of_successive_fused_unrolls(lstm: bool) -> None:
    """Two buffers go round between the loop (this thread) and a consumer thread that copies
    each rollout and gives the buffer back: the copies, in order, are the rollouts of n fused
    unrolls one after another, stamped with the snapshot's version and their seq."""
    n = 25
    net = make_net(lstm)
    store = rlpar.SnapshotStore(net.num_params)
    store.publish(net.init_params(seed=1))
    expected, expected_ends = reference(net, store, n)

    envs = gym.make_vec("rlpar/CartPole-v1", num_envs=K)
    obs, _ = envs.reset(seed=3)
    carry = carry_for(envs, net, obs)
    carry.prev_done = np.zeros(K, bool)
    buffers = [allocate(envs, net), allocate(envs, net)]
    free, out = HandOff[Rollout](), HandOff[Rollout](maxsize=2)
    out_tickets = []
    for r in buffers:
        free.reserve(r)
        free.put(r)
        out_tickets.append(out.reserve(r))
    assert out_tickets == [0, 1]
    loop = envs.fused_loop(net, store, carry.sampler, free.tickets, out.tickets, buffers,
                           out_tickets, carry, seq=0)  # fmt: skip
    got: list[Rollout] = []

    def consume() -> None:
        while len(got) < n:
            r = out.get(timeout=10)
            r.read_stamp()
            copy = allocate(envs, net)
            for name in (*ARRAYS, "core_state"):
                getattr(copy, name)[...] = getattr(r, name)
            copy.version, copy.seq = r.version, r.seq
            got.append(copy)
            if len(got) < n - 1:  # the loop stops once no buffer comes back
                free.put(r)

    consumer = threading.Thread(target=consume)
    consumer.start()
    ends: list = []
    made = 0
    while made < n:
        count, ended, wait_s = loop.run(0.2)
        assert count > 0 and wait_s >= 0
        made += count
        ends += ended
    consumer.join(timeout=10)
    assert made == n and len(got) == n and loop.seq == n
    for i, (a, b) in enumerate(zip(got, expected, strict=True)):
        for name in ARRAYS:
            np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
        if lstm:
            np.testing.assert_array_equal(a.core_state, b.core_state)
        assert (a.version, a.seq) == (1, i)
    assert ends == expected_ends and len(ends) > 0
    # the carry holds the last rollout's next observations and ends, for checkpoints
    np.testing.assert_array_equal(carry.obs, expected[-1].obs[-1])
    np.testing.assert_array_equal(
        carry.prev_done, expected[-1].terminated[-1] | expected[-1].truncated[-1]
    )


def test_the_loop_returns_when_no_buffer_comes_free() -> None:
    setup = Setup()
    loop, r = setup.loop()
    assert loop.run(0.05)[0] == 0  # nothing free: waits out the budget, makes nothing
    setup.free.put(r)
    count, _, _ = loop.run(0.05)
    assert count == 1 and setup.out.get(timeout=0) is r and r.stamp[0] == 1


def test_the_loop_refuses_bad_arguments() -> None:
    setup = Setup()
    net, store, envs, carry = setup.net, setup.store, setup.envs, setup.carry
    free, out = setup.free, setup.out
    good = allocate(envs, net)

    def loop(buffers: list, tickets: list | None = None, **kw):
        args = dict(net=net, store=store, sampler=carry.sampler, free=free.tickets,
                    out=out.tickets, buffers=buffers, carry=carry)  # fmt: skip
        args.update(kw)
        return envs.fused_loop(out_tickets=tickets or list(range(len(buffers))), **args)

    bad = allocate(envs, net)
    bad.rewards = np.zeros((T, K), np.float64)
    with pytest.raises(TypeError, match=r"buffers\[1\].rewards must be float32, got float64"):
        loop([good, bad])
    bad = allocate(envs, net)
    bad.mask = np.zeros((T, K - 1), bool)
    with pytest.raises(ValueError, match=r"buffers\[0\].mask must have shape \(6, 8\), got"):
        loop([bad])
    bad = allocate(envs, net)
    bad.obs = np.zeros((T, K, 4), np.float32)
    with pytest.raises(ValueError, match=r"buffers\[1\].obs must have shape \(7, 8, 4\), got \(6"):
        loop([good, bad])
    bad = allocate(envs, net)
    bad.stamp = None
    with pytest.raises(TypeError, match=r"buffers\[0\].stamp must be a numpy array, got NoneType"):
        loop([bad])
    with pytest.raises(ValueError, match=r"out_tickets\[0\]: expected a ticket >= 0, got -3"):
        loop([good], [-3])
    with pytest.raises(ValueError, match="two lists of the same length >= 1, got 1 and 2"):
        loop([good], [0, 1])
    with pytest.raises(ValueError, match="two lists of the same length >= 1, got 0 and 0"):
        envs.fused_loop(net, store, carry.sampler, free.tickets, out.tickets, [], [], carry)
    small = rlpar.SnapshotStore(net.num_params - 1)
    with pytest.raises(ValueError, match=f"store: holds {net.num_params - 1} values"):
        loop([good], store=small)
    wide = rlpar.Net(rlpar.mlp_spec(4, [rlpar.Categorical(3), rlpar.Value()]))
    with pytest.raises(ValueError, match="Categorical head has 3 logits, CartPole-v1 has 2"):
        loop([good], net=wide, store=rlpar.SnapshotStore(wide.num_params))
    with pytest.raises(ValueError, match="state and starts are for a recurrent net"):
        _native.FusedActorLoop(envs.native, net, store, carry.sampler, free.tickets, out.tickets,
                               [good], [0], carry.ep_return, carry.ep_length, carry.prev_done,
                               carry.obs, state=np.zeros((K, 8), np.float32))  # fmt: skip
    lstm = make_net(True)
    lstm_store = rlpar.SnapshotStore(lstm.num_params)
    with pytest.raises(ValueError, match="the net has an LSTM core: FusedActorLoop needs state"):
        _native.FusedActorLoop(envs.native, lstm, lstm_store, carry.sampler, free.tickets,
                               out.tickets, [allocate(envs, lstm)], [0], carry.ep_return,
                               carry.ep_length, carry.prev_done, carry.obs)  # fmt: skip

    ok = loop([good])
    with pytest.raises(ValueError, match="budget_s: expected a finite number of seconds >= 0"):
        ok.run(-1.0)
    free.tickets.put(5)  # names no buffer
    with pytest.raises(ValueError, match=r"ticket 5, expected a buffer index in \[0, 1\)"):
        ok.run(0.05)


def test_a_diverged_net_raises_from_the_loop() -> None:
    setup = Setup(np.full(make_net(False).num_params, np.nan, np.float32))
    loop, r = setup.loop()
    setup.free.put(r)
    with pytest.raises(ValueError, match="NaN"):
        loop.run(0.05)
    assert setup.out.qsize() == 0  # the buffer it was filling is not handed on


def test_the_runtime_runs_native_actor_loops_outside_deterministic_mode() -> None:
    """A run on native envs: its actors make their rollouts in native loop calls (each buffer
    stamped), the learner reads the versions from the stamps (a policy lag within the buffers
    in flight), and the counters and episodes add up."""
    runtime = RuntimeConfig(num_actors=2, envs_per_actor=8, unroll_length=8, batch_rollouts=2,
                            buffers_per_actor=1, total_env_steps=30_000,
                            checkpoint_interval_s=None)  # fmt: skip
    runner = rlpar.Runner(rlpar.make_agent("impala"), EnvConfig("rlpar/CartPole-v1"), runtime)
    result = runner.run()
    stats = [a.stats for a in runner.actors]
    assert all(a.fused and a.buffers[0].stamp is not None for a in runner.actors)
    assert all(a.seq == s.rollouts > 0 for a, s in zip(runner.actors, stats, strict=True))
    assert sum(s.env_steps for s in stats) == 64 * sum(s.rollouts for s in stats) >= 30_000
    assert result.env_steps >= 30_000 and runner.episodes.count > 0
    learner = runner.learner.stats
    assert learner.steps > 0 and 0 <= learner.lag_max <= 2
    assert learner.dropped_rollouts == 0


def test_reserved_items_keep_their_slot() -> None:
    q: HandOff[object] = HandOff(maxsize=3)
    a, b, c = object(), object(), object()
    sa = q.reserve(a)
    assert q.reserve(a) == sa  # the same slot again
    q.put(b)  # an unreserved item beside it
    q.put(a)
    q.tickets.put(sa)  # native code queueing the slot number: the same as put(a)
    assert [q.get(timeout=0), q.get(timeout=0), q.get(timeout=0)] == [b, a, a]
    q.put(c)
    sc_free = q.qsize()
    assert sc_free == 1 and q.get(timeout=0) is c
    q.put(a)
    assert q.get(timeout=0) is a  # still its own after every get
