"""`LSTM(matmul="bf16x3")`: the learner's products on AMX tiles, each float32 split into two
bfloat16 halves. Against the float64 reference and its finite differences, against the float32
net on shapes with partial tiles, actors' steps unchanged (float32); clear errors. test_lstm.py
checks that gradients are bit-identical whatever the thread, and native/tests/test_amx.cc the
products themselves (and that a row's floats do not depend on the batch). Skipped where the CPU
has no AMX: the option then refuses to build, which the error test checks."""

from __future__ import annotations

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


@needs_amx
def test_actor_steps_stay_float32() -> None:
    """`forward` (an actor's step) is the float32 net's, bit for bit."""
    f32, bf = make_net(24, "float32"), make_net(24, "bf16x3")
    params = random_params(f32)
    obs, state0, _ = sequence(7, 1, 16, D, 24)
    s32, s16 = state0.copy(), state0.copy()
    np.testing.assert_array_equal(
        bf.forward(params, obs[0], state=s16), f32.forward(params, obs[0], state=s32)
    )
    np.testing.assert_array_equal(s16, s32)


def test_errors_name_what_was_expected() -> None:
    with pytest.raises(ValueError, match=r"LSTM.matmul must be 'float32' or 'bf16x3', got 'bf16'"):
        LSTM(8, matmul="bf16")
    with pytest.raises(rlpar.ConfigError, match="lstm_matmul: expected 'float32' or 'bf16x3'"):
        NetConfig(lstm=8, lstm_matmul="fp16")
    if rlpar.amx_available():
        assert make_net(8, "bf16x3").lstm_bf16x3
        spec = NetSpec((D,), [], [Value()], core=LSTM(8, matmul="bf16x3"))
        assert Net(spec).lstm_bf16x3 and not make_net(8, "float32").lstm_bf16x3
    else:
        with pytest.raises(ValueError, match="needs Intel AMX-BF16 tiles"):
            make_net(8, "bf16x3")
        with pytest.raises(rlpar.ConfigError, match="needs Intel AMX-BF16 tiles"):
            NetConfig(lstm=8, lstm_matmul="bf16x3")
