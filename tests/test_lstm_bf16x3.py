"""`LSTM(matmul="bf16x3")`: the learner's products on AMX tiles, each float32 split into two
bfloat16 halves. Against the float64 reference and its finite differences, against the float32
net on shapes with partial tiles; actors' steps, from an array or from weights packed once per
snapshot, against each other and the learner, under a publishing learner; clear errors. test_lstm.py
checks that gradients are bit-identical whatever the thread, and native/tests/test_amx.cc the
products themselves (and that a row's floats do not depend on the batch). Skipped where the CPU
has no AMX: the option then refuses to build, which the error test checks."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import numpy as np
import pytest
import reference as ref
from rlpar.agents.common import NetConfig

import rlpar
from rlpar import LSTM, Categorical, Linear, Net, NetSpec, Tanh, Value

needs_amx = pytest.mark.skipif(not rlpar.amx_available(), reason="no AMX-BF16 tiles here")

T, N, D = 5, 3, 4


def make_net(hidden: int, matmul: str, layers: tuple = (Linear(8), Tanh()), d: int = D) -> Net:
    core = LSTM(hidden, matmul=matmul)
    return Net(NetSpec((d,), list(layers), [Categorical(3), Value()], core=core))


def sequence(seed: int, t_len: int, n: int, d: int, hidden: int):
    rng = np.random.default_rng(seed)
    obs = rng.standard_normal((t_len, n, d)).astype(np.float32)
    state0 = (0.5 * rng.standard_normal((n, 2 * hidden))).astype(np.float32)
    resets = rng.random((t_len, n)) < 0.25
    return obs, state0, resets


def random_params(net: Net, seed: int = 1, scale: float = 0.5) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (scale * rng.standard_normal(net.num_params)).astype(np.float32)


def learner_step(net: Net, params, obs, state0, resets, dout):
    t_len, n = resets.shape
    out, tape = net.forward_train(params, obs.reshape(t_len * n, -1), state=state0, resets=resets)
    grad = net.backward(tape, dout)
    tape.release()
    return out, grad


@needs_amx
def test_forward_matches_reference() -> None:
    net = make_net(6, "bf16x3")
    params = random_params(net)
    obs, state0, resets = sequence(0, T, N, D, 6)
    out, tape = net.forward_train(params, obs.reshape(T * N, D), state=state0, resets=resets)
    tape.release()
    want, _ = ref.recurrent_forward(net.spec, net.param_info, params, obs, state0, resets)
    np.testing.assert_allclose(out.reshape(T, N, -1), want, rtol=2e-4, atol=2e-5)


@needs_amx
@pytest.mark.parametrize("layers", [(Linear(8), Tanh()), ()], ids=["torso", "no-torso"])
def test_backward_through_time_matches_finite_differences(layers) -> None:
    net = make_net(6, "bf16x3", layers)
    params = random_params(net)
    obs, state0, resets = sequence(3, T, N, D, 6)
    proj = np.random.default_rng(4).standard_normal((T * N, net.output_size)).astype(np.float32)
    _, grad = learner_step(net, params, obs, state0, resets, proj)

    def loss(p: np.ndarray) -> float:
        out, _ = ref.recurrent_forward(net.spec, net.param_info, p, obs, state0, resets)
        return float(np.sum(out.reshape(T * N, -1) * proj))

    np.testing.assert_allclose(grad, ref.numerical_grad(loss, params), rtol=1e-3, atol=1e-4)


@needs_amx
def test_close_to_float32_with_partial_tiles() -> None:
    """Widths that leave partial 16 x 32 tiles on every side (rows 7 x 19, 70 inputs, 50
    hidden, gates 200), with the torso's gradient (dx) needed: outputs and every gradient within
    ~1e-5 of the float32 net's, relative to their largest."""
    t_len, n, d, hidden = 7, 19, 70, 50
    layers = (Linear(70), Tanh())
    f32, bf = make_net(hidden, "float32", layers, d), make_net(hidden, "bf16x3", layers, d)
    params = random_params(f32, seed=2, scale=0.2)
    obs, state0, resets = sequence(5, t_len, n, d, hidden)
    dout = np.random.default_rng(6).standard_normal((t_len * n, f32.output_size))
    dout = dout.astype(np.float32)
    out32, grad32 = learner_step(f32, params, obs, state0, resets, dout)
    out16, grad16 = learner_step(bf, params, obs, state0, resets, dout)
    assert np.max(np.abs(out16 - out32)) <= 5e-5 * np.max(np.abs(out32))
    for name, view in f32.param_views(grad32).items():
        other = bf.param_views(grad16)[name]
        assert np.max(np.abs(other - view)) <= 5e-5 * np.max(np.abs(view)), name
    assert not np.array_equal(out16, out32)  # the option did take effect


def step(net: Net, params, obs: np.ndarray, state0: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One actor step from ``state0``: (outputs, new state)."""
    state = state0.copy()
    return net.forward(params, obs, state=state), state


@needs_amx
def test_actor_steps_match_the_learner_and_the_snapshot_path() -> None:
    """An actor's step runs bf16x3 too: given a pinned snapshot, from the core's weights packed
    once for that snapshot; given an array, packed in the call. Both give the same floats, and
    the learner's sequence recomputes them (to the heads' rounding, which depends on the rows)."""
    net, f32 = make_net(24, "bf16x3"), make_net(24, "float32")
    params = random_params(net)
    store = rlpar.SnapshotStore(net.num_params, num_slots=4)
    store.publish(params)
    obs, state0, resets = sequence(7, T, 16, D, 24)
    with store.pin() as snap:
        for t in range(T):
            want = step(net, params, obs[t], state0)
            got = step(net, snap, obs[t], state0)
            np.testing.assert_array_equal(got[0], want[0])
            np.testing.assert_array_equal(got[1], want[1])
    state = state0.copy()
    outs = [net.forward(params, obs[t], state=state, resets=resets[t]) for t in range(T)]
    seq_out, tape = net.forward_train(params, obs.reshape(T * 16, D), state=state0, resets=resets)
    tape.release()
    np.testing.assert_allclose(np.stack(outs), seq_out.reshape(T, 16, -1), rtol=1e-5, atol=1e-6)
    f32_out, _ = step(f32, params, obs[0], state0)
    assert not np.array_equal(step(net, params, obs[0], state0)[0], f32_out)


@needs_amx
def test_packed_weights_follow_the_snapshot_version_and_store() -> None:
    """Each (store, version) gets its own packed weights: a newer version, an older one still
    pinned, and another store whose versions have the same numbers all give what their own
    parameters give."""
    net = make_net(32, "bf16x3")
    p1, p2 = random_params(net, seed=1), random_params(net, seed=2)
    obs, state0, _ = sequence(8, 1, 16, D, 32)
    want1, want2 = step(net, p1, obs[0], state0), step(net, p2, obs[0], state0)
    a, b = (rlpar.SnapshotStore(net.num_params, num_slots=4) for _ in range(2))
    a.publish(p1, version=1)
    b.publish(p2, version=1)
    with a.pin() as a1, b.pin() as b1:
        np.testing.assert_array_equal(step(net, a1, obs[0], state0)[1], want1[1])
        np.testing.assert_array_equal(step(net, b1, obs[0], state0)[1], want2[1])
        a.publish(p2, version=2)
        with a.pin() as a2:
            np.testing.assert_array_equal(step(net, a2, obs[0], state0)[1], want2[1])
            np.testing.assert_array_equal(step(net, a1, obs[0], state0)[1], want1[1])
    for version in range(3, 12):  # more versions than the net keeps packed
        a.publish(p1 if version % 2 else p2, version=version)
        with a.pin() as snap:
            want = want1 if version % 2 else want2
            np.testing.assert_array_equal(step(net, snap, obs[0], state0)[1], want[1])


@needs_amx
def test_actors_on_snapshots_while_the_learner_publishes() -> None:
    """Four actor threads step from whatever snapshot they pin while the main thread publishes
    new versions (two parameter vectors, alternating; each version is published once an actor
    has stepped from the previous one): every step gives the state its version's parameters
    give."""
    net = make_net(32, "bf16x3")
    params = [random_params(net, seed=s) for s in (3, 4)]
    obs, state0, _ = sequence(9, 1, 16, D, 32)
    wants = [step(net, p, obs[0], state0)[1] for p in params]
    store = rlpar.SnapshotStore(net.num_params, num_slots=8)
    store.publish(params[0], version=2)
    errors: list[BaseException] = []
    seen: set[int] = set()
    stepped = threading.Condition()
    stop = threading.Event()

    def actor() -> None:
        try:
            while not stop.is_set():
                with store.pin() as snap:
                    got = step(net, snap, obs[0], state0)[1]
                    if not np.array_equal(got, wants[snap.version % 2]):
                        raise AssertionError(f"version {snap.version}: wrong state")
                    with stepped:
                        seen.add(snap.version)
                        stepped.notify_all()
        except BaseException as e:  # re-raised below
            errors.append(e)
            with stepped:
                stepped.notify_all()

    threads = [threading.Thread(target=actor) for _ in range(4)]
    for th in threads:
        th.start()
    try:
        for version in range(3, 40):
            with stepped:
                assert stepped.wait_for(lambda v=version: v - 1 in seen or errors, timeout=60)
            store.publish(params[version % 2], version=version)
    finally:
        stop.set()
        for th in threads:
            th.join()
    assert not errors, errors[0]
    assert len(seen) >= 37


def test_errors_name_what_was_expected() -> None:
    with pytest.raises(ValueError, match=r"LSTM.matmul must be 'float32' or 'bf16x3', got 'bf16'"):
        LSTM(8, matmul="bf16")
    with pytest.raises(ValueError, match=r"LSTM.matmul must be 'float32' or 'bf16x3', got 3"):
        LSTM(8, matmul=3)  # type: ignore[arg-type]
    with pytest.raises(rlpar.ConfigError, match="lstm_matmul: expected 'float32' or 'bf16x3'"):
        NetConfig(lstm=8, lstm_matmul="fp16")


REFUSED = """
import pytest, rlpar
from rlpar import LSTM, Net, NetSpec, Value
from rlpar.agents.common import NetConfig
assert not rlpar.amx_available()
with pytest.raises(ValueError, match=r"needs Intel AMX-BF16 tiles .* RLPAR_DISABLE_AMX is set"):
    Net(NetSpec((4,), [], [Value()], core=LSTM(8, matmul="bf16x3")))
with pytest.raises(rlpar.ConfigError, match=r"lstm_matmul: 'bf16x3' needs Intel AMX-BF16 tiles"):
    NetConfig(lstm=8, lstm_matmul="bf16x3")
Net(NetSpec((4,), [], [Value()], core=LSTM(8)))  # float32 still builds
NetConfig(lstm=8)
print("refused")
"""


@pytest.mark.parametrize("value", ["1", "yes"])
def test_without_tiles_the_option_is_refused(tmp_path, value: str) -> None:
    """Where rlpar sees no AMX tiles (here: hidden by RLPAR_DISABLE_AMX, in a child process),
    the net and the config refuse bf16x3 with the reason, and float32 is unaffected."""
    env = {**os.environ, "RLPAR_DISABLE_AMX": value}
    done = subprocess.run(
        [sys.executable, "-c", REFUSED], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 0 and "refused" in done.stdout, done.stderr


def test_amx_hidden_only_by_a_set_variable(tmp_path) -> None:
    """RLPAR_DISABLE_AMX empty or "0" leaves rlpar seeing what the CPU has."""

    def available(value: str | None) -> str:
        env = {k: v for k, v in os.environ.items() if k != "RLPAR_DISABLE_AMX"}
        if value is not None:
            env["RLPAR_DISABLE_AMX"] = value
        done = subprocess.run(
            [sys.executable, "-c", "import rlpar; print(rlpar.amx_available())"],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    unset = available(None)
    assert available("") == unset and available("0") == unset
    assert available("1") == "False"
