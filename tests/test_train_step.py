"""`rlpar.train_step` and `rlpar.NativeLoss`: the built-in agents' optimizer step as one native
call gives the same numbers as the separate calls (loss_gradient, clip_grad_norm,
optimizer.step) for every built-in agent, policy, net kind and optimizer; it releases the GIL
once per step; bad input is refused before anything is written; a NaN gradient skips the step;
several threads step one shared net at once; Python losses and optimizers keep their path."""

from __future__ import annotations

import functools
import pickle
import threading
from types import SimpleNamespace

import gymnasium as gym
import numpy as np
import pytest

import rlpar
from rlpar import _native

DISCRETE, BOX = gym.spaces.Discrete(3), gym.spaces.Box(-0.01, 0.01, (2,), np.float32)
VECTOR = gym.spaces.Box(-1, 1, (4,), np.float32)
IMAGE = gym.spaces.Box(0, 255, (6, 6, 2), np.uint8)


def setup(name, obs_space=VECTOR, action_space=DISCRETE, t=5, n=8, seed=0, **config):
    """An agent, its net and learner state, and a batch [T, N] acted by perturbed initial
    parameters (ratios not all 1), with episode ends and autoreset steps."""
    agent = rlpar.make_agent(name, config)
    net = rlpar.Net(agent.net_spec(obs_space, action_space))
    state = agent.init_state(net, net.init_params(seed=seed))
    state.rng = np.random.default_rng(seed)
    rng = np.random.default_rng(seed + 1)
    if obs_space.dtype == np.uint8:
        obs = rng.integers(0, 256, (t + 1, n, *obs_space.shape), dtype=np.uint8)
    else:
        obs = rng.uniform(-1, 1, (t + 1, n, *obs_space.shape)).astype(np.float32)
    core = {}
    if net.recurrent:
        core = {"state": rng.normal(0, 0.3, (n, net.state_size)).astype(np.float32)}
    flat = obs.reshape((t + 1) * n, *obs_space.shape)
    starts = np.zeros((t + 1, n), bool)
    out = net.forward_train(state.params, flat, **{**core, **({"resets": starts} if core else {})})[
        0
    ].reshape(t + 1, n, -1)
    done = rng.random((t, n)) < 0.15
    mask = np.ones((t, n), bool)
    mask[1:] = ~done[:-1]
    done &= mask
    if isinstance(action_space, gym.spaces.Discrete):
        actions = rng.integers(0, action_space.n, (t, n))
    else:
        actions = rng.normal(0, 0.5, (t, n, action_space.shape[0])).astype(np.float32)
    batch = rlpar.Batch(
        obs=obs, actions=actions, rewards=rng.normal(0, 1, (t, n)).astype(np.float32),
        terminated=done, truncated=np.zeros((t, n), bool), mask=mask,
        behaviour=out[:t] + rng.normal(0, 0.1, out[:t].shape).astype(np.float32),
        versions=np.array([3, 4]), policy_lag=np.array([2, 1]), learner_version=5,
        core_state=core.get("state"),
    )  # fmt: skip
    return agent, net, state, batch


def learn_twice(monkeypatch, name, steps=3, **kw):
    """``steps`` learner steps of agent ``name`` fused and unfused (``native=False``):
    (fused state, unfused state, fused metrics, unfused metrics)."""
    agent, net, state, batch = setup(name, **kw)
    twin, _, other, _ = setup(name, **kw)
    for _ in range(steps):
        fused = agent.learn(net, state, batch)
    with monkeypatch.context() as m:
        m.setattr(rlpar, "train_step", functools.partial(rlpar.train_step, native=False))
        m.setattr(rlpar, "train_steps", functools.partial(rlpar.train_steps, native=False))
        for _ in range(steps):
            separate = twin.learn(net, other, batch)
    return state, other, fused, separate


def assert_same_state(a: rlpar.LearnerState, b: rlpar.LearnerState) -> None:
    np.testing.assert_array_equal(a.params, b.params)
    sa, sb = a.optimizer.state_dict(), b.optimizer.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        np.testing.assert_array_equal(sa[k], sb[k])
    assert a.rng.bit_generator.state == b.rng.bit_generator.state


CASES = {
    "a3c": {},
    "impala": {"passes": 2},
    "impala-rmsprop": {"optim": {"name": "rmsprop", "lr": 0.01}},
    "appo": {"epochs": 2, "minibatches": 4},
    "appo-gae-valueclip-norm": dict(
        epochs=2,
        minibatches=2,
        advantage="gae",
        gae_lambda=0.9,
        value_clip=0.2,
        normalize_values=True,
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize(
    "net_kind",
    ["mlp", "lstm", "conv", "gaussian"],
)
def test_fused_learn_equals_the_separate_calls_bit_for_bit(monkeypatch, case, net_kind) -> None:
    name = case.split("-")[0]
    config = dict(CASES[case])
    kw: dict = {}
    if net_kind == "lstm":
        config["net"] = {"lstm": 8}
    elif net_kind == "conv":
        kw["obs_space"] = IMAGE
        config["net"] = {"conv": [[4, 3, 1]], "conv_hidden": 16}
    elif net_kind == "gaussian":
        kw["action_space"] = BOX
        config["reward_clip"] = 0.5
        config["reward_scale"] = 0.3
    a, b, fused, separate = learn_twice(monkeypatch, name, **kw, **config)
    assert_same_state(a, b)
    assert fused.keys() == separate.keys()
    for k in fused:  # bound_loss: the same terms, summed in another order
        assert fused[k] == pytest.approx(separate[k], rel=1e-12, abs=1e-12), k
    if net_kind == "gaussian":
        assert fused["bound_loss"] > 0  # the penalty was in the step


@pytest.mark.usefixtures("release_floor")
def test_one_native_call_per_learner_step() -> None:
    """APPO's epochs x minibatches are one train_steps call: the learner releases the GIL once
    a batch and holds it only to enter and leave; with normalised values (the statistics move
    between minibatches) once per optimizer step."""
    agent, net, state, batch = setup("appo", t=16, n=16, epochs=3, minibatches=4)
    agent.learn(net, state, batch)
    calls = _native.gil_meter()[2]
    agent.learn(net, state, batch)
    assert _native.gil_meter()[2] - calls == 1
    agent, net, state, batch = setup(
        "appo", t=16, n=16, epochs=3, minibatches=4, normalize_values=True
    )
    agent.learn(net, state, batch)
    calls = _native.gil_meter()[2]
    agent.learn(net, state, batch)
    assert _native.gil_meter()[2] - calls == 3 * 4


def test_train_steps_is_train_step_in_a_loop_bit_for_bit() -> None:
    """Each entry of ``columns`` (a minibatch's columns, or None: the whole batch) is the step
    `train_step` takes on it, in order, with the optimizer's step count advancing."""
    agent, net, state, batch = setup("appo", n=8, net={"lstm": 4})
    _, _, twin, _ = setup("appo", n=8, net={"lstm": 4})
    cols = [np.array([1, 4, 6, 7]), None, np.array([0, 2, 3, 5]), np.array([2, 7, 0, 1])]
    loss = agent.native_loss
    fused = rlpar.train_steps(net, state, batch, loss, max_grad_norm=0.5, columns=cols)
    loop = [rlpar.train_step(net, twin, batch, loss, max_grad_norm=0.5, columns=c) for c in cols]
    assert_same_state(state, twin)
    assert state.optimizer.steps == twin.optimizer.steps == 4
    assert fused == loop


def test_train_steps_past_a_nan_gradient_is_the_loop_too() -> None:
    """A step whose gradient is not finite ends the native call; it is skipped and counted as
    `train_step` counts it, and the steps after it run as they would one by one."""
    agent, net, state, batch = setup("impala", n=8)
    t, n = np.argwhere(batch.mask[:, :4])[0]
    batch.rewards[t, n] = np.nan  # only the minibatches holding column n read it
    _, _, twin, _ = setup("impala", n=8)
    bad, good = np.array([n, 4, 5, 6]), np.array([4, 5, 6, 7])
    cols = [good, bad, good, None, good]
    loss = agent.native_loss
    fused = rlpar.train_steps(net, state, batch, loss, max_grad_norm=1.0, columns=cols)
    loop = [rlpar.train_step(net, twin, batch, loss, max_grad_norm=1.0, columns=c) for c in cols]
    assert [np.isfinite(m["grad_norm"]) for m in fused] == [True, False, True, False, True]
    np.testing.assert_array_equal(state.params, twin.params)
    assert state.optimizer.steps == twin.optimizer.steps == 3
    assert state.extra["nonfinite_grad_steps"] == twin.extra["nonfinite_grad_steps"] == 2
    assert state.extra["nonfinite_in_a_row"] == 0
    assert len(fused) == len(loop) == 5


class Boom(rlpar.PyLayer):
    """The identity, whose ``fail_at``-th forward raises (the count is the test's, per net)."""

    def __init__(self, fail_at: int) -> None:
        self.calls, self.fail_at = 0, fail_at

    def forward(self, x: np.ndarray) -> np.ndarray:
        self.calls += 1
        if self.calls == self.fail_at:
            raise RuntimeError("boom in the Python layer")
        return x

    def backward(self, x: np.ndarray, y: np.ndarray, dy: np.ndarray) -> np.ndarray:
        return dy


def test_a_step_that_raises_leaves_the_steps_before_it_counted() -> None:
    """A Python layer that raises in the third step: the exception comes through, and the two
    steps before it are applied and counted, as one call per step leaves them."""

    def run(fused: bool) -> rlpar.LearnerState:
        spec = rlpar.NetSpec(
            input_shape=(4,), layers=[rlpar.Linear(8), Boom(fail_at=3), rlpar.Tanh()],
            heads=[rlpar.Categorical(3), rlpar.Value()],
        )  # fmt: skip
        net = rlpar.Net(spec)
        state = rlpar.LearnerState(net.init_params(seed=0), rlpar.Adam(net.num_params, lr=1e-2))
        state.extra["nonfinite_in_a_row"] = 1  # a finite step resets it
        _, _, _, batch = setup("appo", n=8)
        loss = rlpar.NativeLoss.for_net(net, rlpar.PpoOptions())
        cols = [np.array([0, 1, 2, 3]), np.array([4, 5, 6, 7]), None, np.array([1, 3, 5, 7])]
        with pytest.raises(RuntimeError, match="boom in the Python layer"):
            if fused:
                rlpar.train_steps(net, state, batch, loss, max_grad_norm=1.0, columns=cols)
            else:
                for c in cols:
                    rlpar.train_step(net, state, batch, loss, max_grad_norm=1.0, columns=c)
        return state

    fused, loop = run(True), run(False)
    assert fused.optimizer.steps == loop.optimizer.steps == 2
    assert fused.extra["nonfinite_in_a_row"] == loop.extra["nonfinite_in_a_row"] == 0
    np.testing.assert_array_equal(fused.params, loop.params)


def test_train_steps_refuses_bad_columns_before_any_step() -> None:
    agent, net, state, batch = setup("appo", n=8)
    before = state.params.copy()

    def steps(cols):
        return rlpar.train_steps(
            net, state, batch, agent.native_loss, max_grad_norm=1.0, columns=cols
        )

    with pytest.raises(ValueError, match=r"columns\[1\]: expected indices in \[0, 8\), got 8"):
        steps([np.array([0, 1]), np.array([2, 8])])
    with pytest.raises(TypeError, match=r"columns\[0\] must be int64"):
        steps([np.array([0.0, 1.0]), None])
    with pytest.raises(ValueError, match="expected at least one step's columns"):
        steps([])
    with pytest.raises(TypeError, match="expected a list with one entry per step"):
        steps(np.array([[0, 1], [2, 3]]))
    np.testing.assert_array_equal(state.params, before)
    assert state.optimizer.steps == 0


@pytest.mark.parametrize("name", ["impala", "appo"])
def test_an_agent_with_its_native_loss_pickles_and_steps_as_before(name) -> None:
    """A Ray actor process receives the agent pickled: its `NativeLoss` travels as its options
    (and PPO's value statistics) and is built again on the other side, stepping identically."""
    agent, net, state, batch = setup(name)
    agent.native_loss.value_mean, agent.native_loss.value_std = 0.25, 2.0
    copy = pickle.loads(pickle.dumps(agent))
    assert copy.native_loss.native is not agent.native_loss.native
    assert (copy.native_loss.value_mean, copy.native_loss.value_std) == (0.25, 2.0)
    _, _, other, _ = setup(name)
    (loss, data), (twin, _) = agent.step_loss(batch), copy.step_loss(batch)
    m1 = rlpar.train_step(net, state, data, loss, max_grad_norm=1.0)
    m2 = rlpar.train_step(net, other, data, twin, max_grad_norm=1.0)
    np.testing.assert_array_equal(state.params, other.params)
    assert m1 == m2


def test_train_step_with_columns_is_the_step_on_those_columns() -> None:
    agent, net, state, batch = setup("impala")
    _, _, other, _ = setup("impala")
    loss, data = agent.step_loss(batch)
    cols = np.array([6, 0, 3], np.int64)
    m1 = rlpar.train_step(net, state, data, loss, max_grad_norm=1.0, columns=cols)
    m2 = rlpar.train_step(net, other, data.columns(cols), loss, max_grad_norm=1.0)
    np.testing.assert_array_equal(state.params, other.params)
    assert m1 == m2 and m1["valid_steps"] == data.mask[:, cols].sum()


@pytest.mark.parametrize(
    "make",
    [
        lambda n: rlpar.SGD(n, lr=0.05, momentum=0.9, weight_decay=0.01, nesterov=True),
        lambda n: rlpar.SGD(n, lr=0.05),
        lambda n: rlpar.RMSProp(n, lr=0.01, momentum=0.5, centered=True, weight_decay=0.01),
        lambda n: rlpar.Adam(n, lr=0.01, weight_decay=0.02),
    ],
)
def test_every_builtin_optimizer_steps_natively_as_in_python(make) -> None:
    agent, net, state, batch = setup("impala")
    _, _, other, _ = setup("impala")
    state.optimizer, other.optimizer = make(net.num_params), make(net.num_params)
    loss, data = agent.step_loss(batch)
    for _ in range(3):
        rlpar.train_step(net, state, data, loss, max_grad_norm=0.5)
        rlpar.train_step(net, other, data, loss, max_grad_norm=0.5, native=False)
    assert_same_state(state, other)
    assert state.optimizer.steps == other.optimizer.steps == 3


def test_python_losses_and_optimizers_take_the_separate_calls() -> None:
    """A loss written in Python, or an optimizer whose rule is a subclass's own, still works:
    train_step runs it as loss_gradient, clip_grad_norm and optimizer.step."""
    agent, net, state, batch = setup("impala")
    seen = []

    def my_loss(net, out, b):
        seen.append(out.shape)
        return agent.loss(net, out, b)

    class Halved(rlpar.SGD):
        def _update(self, params, grad, sl):
            params -= 0.5 * self.lr * grad

    before = state.params.copy()
    state.optimizer = Halved(net.num_params, lr=0.1)
    rlpar.train_step(net, state, batch, agent.native_loss, max_grad_norm=10.0)
    rlpar.train_step(net, state, batch, my_loss, max_grad_norm=10.0)
    assert seen == [(6, 8, net.output_size)]
    assert state.optimizer.steps == 2 and not np.array_equal(state.params, before)


def test_a_nan_gradient_skips_the_step_and_is_counted() -> None:
    agent, net, state, batch = setup("impala")
    t, n = np.argwhere(batch.mask)[3]
    batch.rewards[t, n] = np.nan  # on a valid step, so the loss reads it
    before = state.params.copy()
    m = rlpar.train_step(net, state, batch, agent.native_loss, max_grad_norm=1.0)
    assert not np.isfinite(m["grad_norm"])
    np.testing.assert_array_equal(state.params, before)
    assert state.extra["nonfinite_grad_steps"] == 1 and state.optimizer.steps == 0
    with pytest.raises(FloatingPointError, match="not finite"):
        for _ in range(rlpar.optim.MAX_NONFINITE_IN_A_ROW):
            rlpar.train_step(net, state, batch, agent.native_loss, max_grad_norm=1.0)


def test_bad_input_is_refused_before_anything_is_written() -> None:
    agent, net, state, batch = setup("appo", epochs=1, minibatches=2, net={"lstm": 4})
    loss = agent.native_loss
    before = state.params.copy()

    def step(b=batch, **kw):
        return rlpar.train_step(net, state, b, loss, **{"max_grad_norm": 1.0, **kw})

    with pytest.raises(ValueError, match="column 8 is outside the batch's 8 columns"):
        step(columns=np.array([0, 8]))
    with pytest.raises(TypeError, match="columns must be int64"):
        step(columns=np.array([0.0, 1.0]))
    with pytest.raises(ValueError, match="max_grad_norm must be > 0"):
        step(max_grad_norm=0.0)
    with pytest.raises(ValueError, match=r"batch\.core_state: this net has an LSTM core"):
        step(b=rlpar.Batch(**{**batch.__dict__, "core_state": None}))
    with pytest.raises(TypeError, match=r"batch\.obs must be float32, got float64"):
        step(b=rlpar.Batch(**{**batch.__dict__, "obs": batch.obs.astype(np.float64)}))
    with pytest.raises(ValueError, match=r"batch\.mask must have shape \(5, 8\), got \(5, 4\)"):
        step(b=rlpar.Batch(**{**batch.__dict__, "mask": batch.mask[:, :4]}))
    # the one converter of a batch (native/bindings/batch_py.h) names a missing field
    optim = state.optimizer.native_step()
    grad = np.empty(net.num_params, np.float32)
    partial = SimpleNamespace(**{k: v for k, v in batch.__dict__.items() if k != "behaviour"})
    with pytest.raises(TypeError, match="got SimpleNamespace without 'behaviour'"):
        _native.train_step(net, state.params, grad, loss.native, partial, None,
                           value_mean=0.0, value_std=1.0, max_grad_norm=1.0, optimizer=optim,
                           pool=None)  # fmt: skip
    np.testing.assert_array_equal(state.params, before)
    assert state.optimizer.steps == 0


def test_native_loss_refuses_bad_options() -> None:
    net = rlpar.Net(rlpar.mlp_spec(3, [rlpar.Categorical(2), rlpar.Value()]))
    with pytest.raises(TypeError, match=r"expected rlpar\.LossOptions or rlpar\.PpoOptions"):
        rlpar.NativeLoss.for_net(net, {"gamma": 0.9})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="ratio_clip must be 'symmetric' or 'reciprocal'"):
        rlpar.NativeLoss.for_net(net, rlpar.PpoOptions(ratio_clip="both"))
    no_value = rlpar.Net(rlpar.mlp_spec(3, [rlpar.Categorical(2)]))
    with pytest.raises(ValueError, match="expected a net with a Categorical or Gaussian head"):
        rlpar.NativeLoss.for_net(no_value, rlpar.LossOptions())


def test_threads_step_their_own_states_on_one_net_at_once() -> None:
    """Four learners share one net, each with its own params and optimizer; stepping at once
    they end where each ends alone."""
    agent, net, _, batch = setup("appo", t=8, n=8, epochs=1, minibatches=2)
    loss, data = agent.step_loss(batch)

    def fresh(i):
        return agent.init_state(net, net.init_params(seed=10 + i))

    def run(state, out, i):
        for k in range(30):
            cols = np.array([(i + k) % 8, (i + 3 * k + 1) % 8], np.int64)
            rlpar.train_step(net, state, data, loss, max_grad_norm=0.5, columns=cols)
        out[i] = state.params.copy()

    alone: dict = {}
    for i in range(4):
        run(fresh(i), alone, i)
    together: dict = {}
    threads = [threading.Thread(target=run, args=(fresh(i), together, i)) for i in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    for i in range(4):
        np.testing.assert_array_equal(together[i], alone[i])


@pytest.mark.usefixtures("release_floor")
def test_the_rows_split_steps_natively_close_to_the_separate_calls() -> None:
    """On the learner's threads (a conv torso splits its rows), the fused step's clipping
    norm is summed on one thread, the separate calls' in slices: the same step up to rounding."""
    pool = rlpar.ShardPool(2)
    try:
        cfg = {"net": {"conv": [[16, 3, 1]], "conv_hidden": 32}}
        image = gym.spaces.Box(0, 255, (10, 10, 2), np.uint8)
        agent, net, state, batch = setup("impala", obs_space=image, t=8, n=8, **cfg)
        _, _, other, _ = setup("impala", obs_space=image, t=8, n=8, **cfg)
        state.pool = other.pool = pool
        assert rlpar.learner_split(net, pool, batch) == "rows"
        loss, data = agent.step_loss(batch)
        calls = _native.gil_meter()[2]
        rlpar.train_step(net, state, data, loss, max_grad_norm=40.0)
        assert _native.gil_meter()[2] - calls == 1
        rlpar.train_step(net, other, data, loss, max_grad_norm=40.0, native=False)
        np.testing.assert_allclose(state.params, other.params, rtol=1e-5, atol=1e-7)
    finally:
        pool.close()
