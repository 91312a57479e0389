"""The learner step over threads: `rlpar.ShardPool`, `Batch.split`, `rlpar.loss_gradient`'s
sharded and row-split steps (the built-in agents', a custom agent's) against the one-thread
step, and ``runtime.learner_threads`` in whole runs."""

from __future__ import annotations

import itertools
import threading
import time

import gymnasium as gym
import numpy as np
import pytest

import rlpar
from rlpar import (
    Batch,
    EnvConfig,
    LearnerState,
    Runner,
    RuntimeConfig,
    ShardPool,
    _native,
    learner_split,
)


def rlpar_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("rlpar-")]


# ------------------------------------------------------------------------------ ShardPool


def test_pool_maps_in_order_on_several_threads() -> None:
    seen: set[str] = set()
    gate = threading.Barrier(3, timeout=5)

    def work(x: int) -> int:
        seen.add(threading.current_thread().name)
        gate.wait()  # all three calls must be running at once
        return x * x

    with ShardPool(3) as pool:
        assert pool.map(work, [1, 2, 3]) == [1, 4, 9]
        assert pool.map(lambda x: x + 1, list(range(10))) == list(range(1, 11))  # > threads
        assert pool.map(work, []) == []
    assert len(seen) == 3 and threading.current_thread().name in seen
    assert not rlpar_threads()


def test_pool_raises_the_first_failure_after_every_call_ended() -> None:
    finished = []

    def work(x: int) -> int:
        if x == 1:
            raise KeyError("shard 1")
        if x == 2:
            raise ValueError("shard 2")
        time.sleep(0.05)
        finished.append(x)
        return x

    pool = ShardPool(4)
    with pytest.raises(KeyError, match="shard 1"):
        pool.map(work, [0, 1, 2, 3])
    assert sorted(finished) == [0, 3]
    assert pool.map(abs, [-1, -2]) == [1, 2]  # still usable
    assert pool.close() == [] and pool.close() == []
    with pytest.raises(RuntimeError, match="after close"):
        pool.map(abs, [1])
    assert not rlpar_threads()


@pytest.mark.parametrize(
    ("threads", "exc", "match"),
    [(0, ValueError, "expected an integer from 1 to 256, got 0"),
     (2.0, TypeError, "expected an integer, got float"),
     (True, TypeError, "expected an integer, got bool"), (257, ValueError, "got 257")],
)  # fmt: skip
def test_pool_rejects_bad_thread_counts(threads, exc, match) -> None:
    with pytest.raises(exc, match=match):
        ShardPool(threads)


# ---------------------------------------------------------------------------- Batch.split


def random_batch(rng: np.random.Generator, net: rlpar.Net, params: np.ndarray, T: int, N: int):
    """A CartPole-shaped batch [T, N] respecting mask[t+1] = not done[t]; behaviour is the net's
    own output plus noise, so V-trace weights are not all 1."""
    obs = rng.standard_normal((T + 1, N, 4)).astype(np.float32)
    out = net.forward(params, obs.reshape(-1, 4)).reshape(T + 1, N, -1)
    behaviour = out[:T] + 0.3 * rng.standard_normal(out[:T].shape).astype(np.float32)
    actions = rng.integers(0, 2, (T, N)).astype(np.int64)
    done = rng.random((T, N)) < 0.1
    terminated = done & (rng.random((T, N)) < 0.7)
    truncated = done & ~terminated
    mask = np.ones((T, N), bool)
    mask[1:] = ~done[:-1]
    terminated &= mask
    truncated &= mask
    mask[:, 0] = False  # a column with no valid step
    return Batch(
        obs=obs, actions=actions, rewards=rng.standard_normal((T, N)).astype(np.float32),
        terminated=terminated, truncated=truncated, mask=mask, behaviour=behaviour,
        versions=np.array([3, 4]), policy_lag=np.array([1, 0]), learner_version=5,
    )  # fmt: skip


def impala_net() -> tuple[rlpar.Agent, rlpar.Net]:
    agent = rlpar.make_agent("impala", {"optim": {"lr": 0.01}})
    env = gym.make("CartPole-v1")
    net = rlpar.Net(agent.net_spec(env.observation_space, env.action_space))
    return agent, net


def test_split_covers_the_columns_in_contiguous_shards() -> None:
    _, net = impala_net()
    batch = random_batch(np.random.default_rng(0), net, net.init_params(seed=0), 6, 11)
    shards = batch.split(4)
    sizes = [s.num_columns for s in shards]
    assert len(sizes) == 4 and sum(sizes) == 11 and max(sizes) - min(sizes) <= 1
    for name in ("obs", "actions", "rewards", "terminated", "truncated", "mask", "behaviour"):
        parts = [getattr(s, name) for s in shards]
        assert all(p.flags.c_contiguous for p in parts)
        np.testing.assert_array_equal(np.concatenate(parts, axis=1), getattr(batch, name))
    assert all(s.learner_version == 5 and list(s.versions) == [3, 4] for s in shards)
    assert len(batch.split(50)) == 11  # never an empty shard
    for bad in (0, -1):
        with pytest.raises(ValueError, match="parts: expected an integer >= 1"):
            batch.split(bad)
    for bad in (1.5, True):
        with pytest.raises(TypeError, match="parts: expected an integer, got"):
            batch.split(bad)


# ------------------------------------------------------------------- the sharded agent step


@pytest.mark.parametrize("threads", [2, 3, 7])
def test_sharded_step_matches_one_thread(threads: int) -> None:
    agent, net = impala_net()
    params = net.init_params(seed=1)
    batch = random_batch(np.random.default_rng(threads), net, params, 12, 9)

    def step(pool: ShardPool | None) -> tuple[np.ndarray, dict]:
        state = agent.init_state(net, params.copy())
        state.pool = pool
        metrics = agent.learn(net, state, batch)
        return state.params, metrics

    one, m1 = step(None)
    with ShardPool(threads, split="shards") as pool:
        assert learner_split(net, pool, batch) == "shards"
        many, m2 = step(pool)
        again, _ = step(pool)
    assert not np.array_equal(one, params)
    np.testing.assert_allclose(many, one, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(many, again)  # a given thread count is reproducible
    assert set(m1) == set(m2)
    for key in m1:
        assert m2[key] == pytest.approx(m1[key], rel=1e-4, abs=1e-5), key


def conv_impala(lstm: int = 0) -> tuple[rlpar.Agent, rlpar.Net, gym.spaces.Box]:
    agent = rlpar.make_agent("impala", {"optim": {"lr": 0.01}, "net": {"lstm": lstm}})
    space = gym.spaces.Box(0, 1, (10, 10, 4), np.uint8)
    return agent, rlpar.Net(agent.net_spec(space, gym.spaces.Discrete(3))), space


def conv_batch(rng: np.random.Generator, net: rlpar.Net, T: int, N: int) -> Batch:
    """A MinAtar-shaped batch [T, N] (uint8 frames) with episode ends and an LSTM's stored
    start state when the net has one."""
    obs = rng.integers(0, 2, (T + 1, N, *net.input_shape), dtype=np.uint8)
    done = rng.random((T, N)) < 0.1
    mask = np.ones((T, N), bool)
    mask[1:] = ~done[:-1]
    extra = {}
    if net.recurrent:  # the state each column's unroll started from; resets follow the mask
        extra = {"core_state": rng.standard_normal((N, net.state_size)).astype(np.float32)}
    return Batch(
        obs=obs, actions=rng.integers(0, 3, (T, N)).astype(np.int64),
        rewards=rng.standard_normal((T, N)).astype(np.float32), terminated=done & mask,
        truncated=np.zeros((T, N), bool), mask=mask,
        behaviour=rng.standard_normal((T, N, net.output_size)).astype(np.float32),
        versions=np.array([1]), policy_lag=np.array([0]), learner_version=1, **extra,
    )  # fmt: skip


@pytest.mark.parametrize("lstm", [0, 16])
def test_row_split_step_matches_one_thread(lstm: int) -> None:
    agent, net, _ = conv_impala(lstm)
    params = net.init_params(seed=2)
    batch = conv_batch(np.random.default_rng(lstm), net, 10, 12)

    def step(pool: ShardPool | None) -> tuple[np.ndarray, dict]:
        state = agent.init_state(net, params.copy())
        state.pool = pool
        return state.params, agent.learn(net, state, batch)

    one, m1 = step(None)
    with ShardPool(3) as pool:  # "auto": rows for a conv torso, with or without a core
        assert pool.native is not None and pool.native.threads == 3
        assert learner_split(net, pool, batch) == "rows"
        assert net.torso_parts(pool.native, 11 * 12) == 3
        many, m2 = step(pool)
        again, _ = step(pool)
    assert pool.native is None  # closed
    assert not np.array_equal(one, params)
    np.testing.assert_allclose(many, one, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(many, again)  # a given thread count is reproducible
    for key in m1:
        assert m2[key] == pytest.approx(m1[key], rel=1e-4, abs=1e-5), key
    if _native.simd_kernels() == "avx512":
        # The AVX-512 kernels sum every float in the one-part order whatever the split (net.cc,
        # torso_backward): the built-in step on rows is the one-thread step, bit for bit.
        np.testing.assert_array_equal(many, one)


def test_learner_split_rules() -> None:
    _, mlp = impala_net()
    small = random_batch(np.random.default_rng(0), mlp, mlp.init_params(seed=0), 6, 4)
    _, conv, _ = conv_impala()
    _, conv_lstm, _ = conv_impala(lstm=8)
    lstm_agent = rlpar.make_agent("impala", {"net": {"lstm": 8}})
    env = gym.make("CartPole-v1")
    mlp_lstm = rlpar.Net(lstm_agent.net_spec(env.observation_space, env.action_space))
    rng = np.random.default_rng(1)
    big = conv_batch(rng, conv, 10, 12)
    assert learner_split(conv, None, big) == "none"
    with ShardPool(1) as one:
        assert learner_split(conv, one, big) == "none"
    with ShardPool(2) as pool:
        assert learner_split(conv, pool, big) == "rows"
        assert learner_split(conv_lstm, pool, conv_batch(rng, conv_lstm, 10, 12)) == "rows"
        assert learner_split(mlp_lstm, pool, small) == "shards"  # the core dominates
        assert learner_split(mlp, pool, small) == "shards"  # flat inputs: the loss weighs
        assert learner_split(conv, pool, conv_batch(rng, conv, 1, 1)) == "none"
    with ShardPool(2, split="shards") as pool:
        assert learner_split(conv, pool, big) == "shards"
        assert learner_split(conv, pool, conv_batch(rng, conv, 4, 1)) == "none"  # one column
    with ShardPool(2, split="rows") as pool:
        assert learner_split(mlp_lstm, pool, small) == "none"  # rows, but too small to split
        assert learner_split(mlp, pool, small) == "none"  # 28 rows of a 64-64 MLP
    with pytest.raises(ValueError, match='split: expected "auto", "rows" or "shards", got'):
        ShardPool(2, split="columns")
    with pytest.raises(TypeError, match="split: expected a string, got int 2"):
        ShardPool(2, split=2)  # type: ignore[arg-type]
    with ShardPool(2, split="shards") as pool:
        assert pool.native is None  # no idle native workers when rows are never split
    with pytest.raises(rlpar.ConfigError, match="learner_split: expected"):
        RuntimeConfig(learner_split="columns")


def test_a_failing_shard_fails_the_step_and_releases_every_tape() -> None:
    agent, net = impala_net()
    params = net.init_params(seed=0)
    batch = random_batch(np.random.default_rng(0), net, params, 5, 8)
    batch.actions[3, 6] = 7  # CartPole has 2 actions: the loss of the last shard rejects it
    state = agent.init_state(net, params.copy())
    with ShardPool(4) as pool:
        state.pool = pool
        with pytest.raises(ValueError, match="action 7"):
            agent.learn(net, state, batch)
    np.testing.assert_array_equal(state.params, params)  # no partial update
    stats = net.workspace_stats()
    assert stats["idle"] == stats["workspaces"]  # every tape released


def value_regression(net: rlpar.Net, out: np.ndarray, batch: Batch) -> tuple[np.ndarray, dict]:
    """A loss of a user's own: 0.5 (V(x_t) - r_t)^2, a mean over the valid steps."""
    t_len = batch.unroll_length
    v = out[:t_len, :, net.output_slices["value"].start]
    count = max(1, int(batch.mask.sum()))
    err = (v - batch.rewards) * batch.mask
    dout = np.zeros_like(out)
    dout[:t_len, :, net.output_slices["value"].start] = err / count
    metrics = {"value_error": float(0.5 * (err**2).sum() / count)}
    return dout, {**metrics, "valid_steps": int(batch.mask.sum())}


@pytest.mark.parametrize("split", ["shards", "rows"])
def test_loss_gradient_spreads_any_agents_loss_over_the_threads(split: str) -> None:
    _, net, _ = conv_impala()
    params = net.init_params(seed=3)
    batch = conv_batch(np.random.default_rng(3), net, 6, 8)
    one, m1 = rlpar.loss_gradient(net, params, batch, value_regression)
    assert m1["valid_steps"] == batch.mask.sum() and one.any()
    with ShardPool(3, split=split) as pool:
        assert learner_split(net, pool, batch) == split
        many, m2 = rlpar.loss_gradient(net, params, batch, value_regression, pool)
        if split == "shards":
            assert any(many is b for b in pool.buffers(net.num_params))  # reused, not allocated
    np.testing.assert_allclose(many, one, rtol=1e-5, atol=1e-7)
    assert m2["value_error"] == pytest.approx(m1["value_error"], rel=1e-6)
    assert m2["valid_steps"] == m1["valid_steps"]  # the whole batch's count, not a mean


def test_loss_gradient_says_what_a_loss_returned_wrong() -> None:
    _, net = impala_net()
    params = net.init_params(seed=0)
    batch = random_batch(np.random.default_rng(0), net, params, 4, 6)

    def returning(dout):
        return lambda net, out, batch: (dout(out), {})

    cases = [
        (returning(lambda out: out.astype(np.float64)), TypeError, "got float64"),
        (returning(lambda out: out.tolist()), TypeError, "numpy array, got list"),
        (returning(lambda out: out[:-1]), ValueError, r"\[5, N, 3\], got shape \(4, N, 3\)"),
    ]
    for loss, exc, match in cases:
        for pool, n in ((None, "6"), (ShardPool(2, split="shards"), "3")):  # a shard's N
            with pytest.raises(exc, match=match.replace("N", n)):
                rlpar.loss_gradient(net, params, batch, loss, pool)
            if pool is not None:
                pool.close()
    stats = net.workspace_stats()
    assert stats["idle"] == stats["workspaces"]  # every tape released


def test_pool_buffers_are_made_once_per_size() -> None:
    with ShardPool(3, split="shards") as pool:
        first = pool.buffers(10)
        assert len(first) == 4 and all(b.shape == (10,) and b.dtype == np.float32 for b in first)
        assert all(a is b for a, b in zip(first, pool.buffers(10), strict=True))
        assert pool.buffers(5)[0].shape == (5,)
        with pytest.raises(ValueError, match="size: expected an integer >= 0, got -1"):
            pool.buffers(-1)


# ---------------------------------------------------------------------------- whole runs


def test_learner_threads_in_a_run_leave_no_thread_and_stay_deterministic() -> None:
    def run() -> tuple[np.ndarray, rlpar.RunResult]:
        cfg = RuntimeConfig(
            num_actors=2, envs_per_actor=4, unroll_length=8, batch_rollouts=2,
            total_env_steps=3000, deterministic=True, learner_threads=3,
            checkpoint_interval_s=None,
        )  # fmt: skip
        runner = Runner(rlpar.make_agent("impala"), EnvConfig("CartPole-v1"), cfg)
        result = runner.run()
        assert runner.state.pool is None
        return runner.state.params, result

    (a, ra), (b, rb) = run(), run()
    assert ra.learner_steps == rb.learner_steps >= 40
    np.testing.assert_array_equal(a, b)
    assert ra.stuck_threads == [] and not rlpar_threads()


def test_row_split_run_is_deterministic(monkeypatch: pytest.MonkeyPatch) -> None:
    """A conv net on native Catch frames with two learner threads splitting rows: two runs end
    with the same parameters."""
    import rlpar.learner_step

    splits: list[str] = []

    def recording(*args: object) -> str:
        splits.append(learner_split(*args))  # type: ignore[arg-type]
        return splits[-1]

    monkeypatch.setattr(rlpar.learner_step, "learner_split", recording)

    def run() -> np.ndarray:
        cfg = RuntimeConfig(
            num_actors=2, envs_per_actor=8, unroll_length=10, batch_rollouts=2,
            total_env_steps=2000, deterministic=True, learner_threads=2,
            learner_split="rows", checkpoint_interval_s=None,
        )  # fmt: skip
        agent = rlpar.make_agent("impala", {"net": {"conv": [[8, 3, 1]], "conv_hidden": 64}})
        runner = Runner(agent, EnvConfig("rlpar/Catch-v0"), cfg)
        runner.run()
        return runner.state.params

    np.testing.assert_array_equal(run(), run())
    assert splits and set(splits) == {"rows"}


@pytest.mark.parametrize("bad", [0, 257, -1])
def test_learner_threads_is_validated(bad: int) -> None:
    with pytest.raises(rlpar.ConfigError, match=r"learner_threads: expected an integer from 1 to"):
        RuntimeConfig(learner_threads=bad)


def test_learner_state_pool_is_not_part_of_equality_or_repr() -> None:
    state = LearnerState(params=np.zeros(3, np.float32), optimizer=rlpar.SGD(3, lr=0.1))
    assert state.pool is None and "pool" not in repr(state)


# ------------------------------------------------------------- optimizer and clip in slices


def test_slices_cover_the_range_and_short_vectors_stay_whole() -> None:
    with ShardPool(4) as pool:
        assert pool.slices(1000) == [slice(0, 1000)]
        sl = pool.slices(300_000, min_size=1 << 16)
        assert len(sl) == 4 and sl[0].start == 0 and sl[-1].stop == 300_000
        assert all(a.stop == b.start for a, b in itertools.pairwise(sl))
        assert len(pool.slices(100_000, min_size=1 << 16)) == 1
        assert len(pool.slices(10, min_size=1)) == 4
        assert pool.slices(0) == [slice(0, 0)]
        for bad in ({"n": -1}, {"n": 10, "min_size": 0}):
            with pytest.raises(ValueError, match=r"expected an integer >= [01], got"):
                pool.slices(**bad)
        with pytest.raises(TypeError, match=r"n: expected an integer, got float 2.5"):
            pool.slices(2.5)


def test_pool_map_takes_any_iterable() -> None:
    with ShardPool(2) as pool:
        assert pool.map(str, (x for x in range(3))) == ["0", "1", "2"]


@pytest.mark.parametrize(
    "make",
    [
        lambda n: rlpar.SGD(n, lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01),
        lambda n: rlpar.RMSProp(n, lr=0.01, momentum=0.5, centered=True),
        lambda n: rlpar.Adam(n, lr=0.01, weight_decay=0.001),
    ],
)
def test_optimizer_steps_in_slices_equal_whole_steps(make) -> None:
    n = 300_001
    rng = np.random.default_rng(0)
    p0 = rng.standard_normal(n).astype(np.float32)
    grads = [rng.standard_normal(n).astype(np.float32) for _ in range(3)]
    whole, sliced = make(n), make(n)
    a, b = p0.copy(), p0.copy()
    with ShardPool(3) as pool:
        assert len(pool.slices(n)) == 3
        for g in grads:
            whole.step(a, g)
            sliced.step(b, g, pool)
        np.testing.assert_array_equal(a, b)
        assert whole.steps == sliced.steps == 3
        for key, value in whole.state_dict().items():
            np.testing.assert_array_equal(value, sliced.state_dict()[key])
        with pytest.raises(ValueError, match=r"grad must be a flat .* of 300001 values, got"):
            sliced.step(b, grads[0][:-1], pool)
        with pytest.raises(TypeError, match=r"grad must be a float32 numpy array, got float64"):
            sliced.step(b, grads[0].astype(np.float64), pool)
        strided = np.ones(2 * n, np.float32)[::2]
        with pytest.raises(ValueError, match=r"params must .* got shape \(300001,\) \(not cont"):
            sliced.step(strided, grads[0], pool)
        with pytest.raises(TypeError, match=r"pool must be an rlpar.ShardPool or None, got int"):
            sliced.step(b, grads[0], 4)
        np.testing.assert_array_equal(a, b)  # no failed call changed anything
        assert sliced.steps == 3


def test_clip_in_slices_matches_the_native_clip() -> None:
    g = np.random.default_rng(1).standard_normal(400_000).astype(np.float32)
    with ShardPool(4) as pool:
        for max_norm in (1.0, 1e9):
            a, b = g.copy(), g.copy()
            na = rlpar.clip_grad_norm(a, max_norm)
            nb = rlpar.clip_grad_norm(b, max_norm, pool)
            assert nb == pytest.approx(na, rel=1e-12)
            np.testing.assert_allclose(b, a, rtol=1e-6)
            assert rlpar.global_norm(b, pool) == pytest.approx(min(max_norm, na), rel=1e-5)
        with pytest.raises(TypeError, match="grad must be a float32 numpy array, got float64"):
            rlpar.clip_grad_norm(g.astype(np.float64), 1.0, pool)
        with pytest.raises(TypeError, match="grad must be a float32 numpy array, got list"):
            rlpar.global_norm([1.0, 2.0], pool)
        with pytest.raises(ValueError, match=r"grad must be a flat .* got shape \(2, 200000\)"):
            rlpar.clip_grad_norm(g.reshape(2, -1), 1.0, pool)
        with pytest.raises(TypeError, match=r"pool must be an rlpar\.ShardPool or None, got str"):
            rlpar.global_norm(g, "pool")


def test_sharded_conv_step_matches_one_thread() -> None:
    """A net big enough (1.7M parameters) that the sum, clip and optimizer run in slices."""
    agent = rlpar.make_agent("impala", {"optim": {"lr": 0.01, "max_grad_norm": 0.5}})
    obs_space = gym.spaces.Box(0, 255, (84, 84, 4), np.uint8)
    net = rlpar.Net(agent.net_spec(obs_space, gym.spaces.Discrete(3)))
    params = net.init_params(seed=0)
    rng = np.random.default_rng(0)
    T, N = 2, 5
    obs = rng.integers(0, 256, (T + 1, N, 84, 84, 4), dtype=np.uint8)
    out = net.forward(params, obs.reshape(-1, 84, 84, 4)).reshape(T + 1, N, -1)
    batch = Batch(
        obs=obs, actions=rng.integers(0, 3, (T, N)), rewards=np.ones((T, N), np.float32),
        terminated=np.zeros((T, N), bool), truncated=np.zeros((T, N), bool),
        mask=np.ones((T, N), bool), behaviour=out[:T].copy(), versions=np.array([1]),
        policy_lag=np.array([0]), learner_version=1,
    )  # fmt: skip

    def step(pool: ShardPool | None) -> tuple[np.ndarray, dict]:
        state = agent.init_state(net, params.copy())
        state.pool = pool
        return state.params, agent.learn(net, state, batch)

    one, m1 = step(None)
    with ShardPool(3) as pool:
        assert len(pool.slices(net.num_params)) == 3
        many, m2 = step(pool)
    assert m1["grad_norm"] > 0.5  # the clip is active
    assert m2["grad_norm"] == pytest.approx(m1["grad_norm"], rel=1e-4)
    np.testing.assert_allclose(many, one, rtol=1e-5, atol=1e-6)
