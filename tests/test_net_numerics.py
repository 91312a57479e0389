"""Native net and optimizers against the slow float64 references in `reference.py`.

Forward outputs are compared at float32 tolerance; gradients against central finite differences of
the reference forward under a random projection loss ``L = sum(out * R)``, whose gradient with
respect to the output is ``R`` itself, so ``net.backward(tape, R)`` must equal ``dL/dparams``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import reference as ref
from hypothesis import given, settings
from hypothesis import strategies as st

import rlpar
from rlpar import (
    SGD,
    Adam,
    Categorical,
    Conv2d,
    Flatten,
    Gaussian,
    Linear,
    Net,
    NetSpec,
    PyLayer,
    ReLU,
    RMSProp,
    Tanh,
    Value,
    _native,
)

FWD_TOL = {"rtol": 1e-4, "atol": 1e-5}


# ------------------------------------------------------------------------------------ helpers


class Square(PyLayer):
    """y = x^2, elementwise."""

    def forward(self, x: np.ndarray) -> np.ndarray:
        return x * x

    def backward(self, x: np.ndarray, y: np.ndarray, dy: np.ndarray) -> np.ndarray:
        return 2.0 * x * dy


class FixedMap(PyLayer):
    """y = x @ M for a fixed matrix M [in, out]: a Python layer that changes the shape."""

    def __init__(self, n_in: int, n_out: int, seed: int = 0) -> None:
        self.m = np.random.default_rng(seed).standard_normal((n_in, n_out)) / math.sqrt(n_in)

    def output_shape(self, input_shape: tuple[int, ...]) -> tuple[int, ...]:
        return (self.m.shape[1],)

    def forward(self, x: np.ndarray) -> np.ndarray:
        return (x @ self.m).astype(x.dtype)

    def backward(self, x: np.ndarray, y: np.ndarray, dy: np.ndarray) -> np.ndarray:
        return (dy @ self.m.T).astype(np.float32)


def random_params(net: Net, seed: int) -> np.ndarray:
    """Well-scaled random float32 params: every block contributes O(1) to the gradient."""
    rng = np.random.default_rng(seed)
    params = np.empty(net.num_params, np.float32)
    for _name, role, offset, shape, _index, _in_head in net.param_info:
        size = math.prod(shape)
        fan_in = math.prod(shape[:-1]) if role == "weight" else 1
        std = {"weight": 1.0 / math.sqrt(fan_in), "bias": 0.3, "log_std": 0.5, "gain": 0.5}[role]
        mean = 1.0 if role == "gain" else 0.0
        params[offset : offset + size] = rng.normal(mean, std, size)
    return params


def random_obs(spec: NetSpec, batch: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    shape = (batch, *spec.input_shape)
    if spec.input_dtype == "uint8":
        return rng.integers(0, 256, shape, dtype=np.uint8)
    return rng.standard_normal(shape).astype(np.float32)


def ref_forward(net: Net, params: np.ndarray, obs: np.ndarray) -> np.ndarray:
    return ref.forward(net.spec, net.param_info, params, obs)


def assert_away_from_relu_kinks(net: Net, params: np.ndarray, obs: np.ndarray) -> None:
    """Finite differences and float32/float64 agreement need every ReLU input away from 0."""
    acts = ref.activations(net.spec, net.param_info, params, obs)
    for i, layer in enumerate(net.spec.layers):
        if isinstance(layer, ReLU):
            assert np.abs(acts[i]).min() > 1e-4, f"pick another seed: layer {i} input near 0"


def projection_fd_grad(net, params, obs, r, coords=None) -> np.ndarray:
    def loss(p: np.ndarray) -> float:
        return float(np.sum(ref_forward(net, p, obs) * r))

    return ref.numerical_grad(loss, params, coords)


def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-12))


def check_backward(net: Net, batch: int = 5, seed: int = 0, per_block: int | None = None) -> None:
    """Native grad of sum(out * R) == finite differences, as a whole and block by block.

    ``per_block``: check only that many random coordinates of each parameter block (big nets).
    """
    rng = np.random.default_rng(seed)
    params = random_params(net, seed)
    obs = random_obs(net.spec, batch, seed + 1)
    assert_away_from_relu_kinks(net, params, obs)
    r = rng.standard_normal((batch, net.output_size))
    _, tape = net.forward_train(params, obs)
    grad = net.backward(tape, r.astype(np.float32))
    assert grad.dtype == np.float32 and grad.shape == (net.num_params,)

    coords = None
    if per_block is not None:
        coords = []
        for _name, _role, offset, shape, _index, _in_head in net.param_info:
            size = math.prod(shape)
            coords += list(offset + rng.choice(size, min(size, per_block), replace=False))
    fd = projection_fd_grad(net, params, obs, r, coords)
    mask = np.zeros(net.num_params, bool)
    mask[coords if coords is not None else slice(None)] = True

    assert rel_err(grad[mask], fd[mask]) < 1e-3
    for name, _role, offset, shape, _index, _in_head in net.param_info:
        block = np.zeros(net.num_params, bool)
        block[offset : offset + math.prod(shape)] = True
        block &= mask
        assert rel_err(grad[block], fd[block]) < 3e-3, f"gradient of {name}"


# ------------------------------------------------------------------------------------ forward

BATCHES = [1, 7, 64]

CONV_CASES = {
    "k3s1p0": [Conv2d(4, 3)],
    "k3s2p1": [Conv2d(4, 3, stride=2, padding=1)],
    "k4s3p2": [Conv2d(5, 4, stride=3, padding=2)],
    "k1": [Conv2d(3, 1)],
    "stacked": [Conv2d(4, 3, 2, 1), ReLU(), Conv2d(6, 2, 1, 1), Tanh()],
    # More than one 64-channel tile, partial (masked) tiles, padded and strided after a fused ReLU.
    "wide": [Conv2d(80, 3), ReLU(), Conv2d(37, 2, 2, 1), ReLU(), Conv2d(16, 3, 1, 1)],
    # The Nature torso's first kernel (8 x 8, stride 4); channel counts with one-lane tails on
    # 8-float (AVX2) vectors: 17 = 16 + 1, 25 = 16 + 8 + 1, patch runs of 2 x 9 = 18 columns.
    "k8s4": [Conv2d(17, 8, stride=4)],
    "odd_tails": [Conv2d(9, 3, 2), ReLU(), Conv2d(25, 2, 1, 1)],
}


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("activation", ["tanh", "relu"])
def test_mlp_forward_matches_reference(activation: str, batch: int) -> None:
    net = Net(rlpar.mlp_spec(5, [Categorical(3), Value()], hidden=(32, 16), activation=activation))
    params = random_params(net, 1)
    obs = random_obs(net.spec, batch, 2)
    out = net.forward(params, obs)
    assert out.shape == (batch, net.output_size) and out.dtype == np.float32
    np.testing.assert_allclose(out, ref_forward(net, params, obs), **FWD_TOL)


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("dtype", ["uint8", "float32"])
@pytest.mark.parametrize("case", sorted(CONV_CASES))
def test_conv_forward_matches_reference(case: str, dtype: str, batch: int) -> None:
    layers = [*CONV_CASES[case], Flatten(), Linear(8), ReLU()]
    spec = NetSpec((9, 10, 3), layers, [Categorical(4), Value()], input_dtype=dtype)
    net = Net(spec)
    params = random_params(net, 3)
    obs = random_obs(spec, batch, 4)
    np.testing.assert_allclose(net.forward(params, obs), ref_forward(net, params, obs), **FWD_TOL)


@pytest.mark.parametrize("batch", BATCHES)
def test_wide_linear_forward_matches_reference(batch: int) -> None:
    # 600 inputs: two blocks of the K-blocked kernel; 70 and 600 outputs: partial column tiles.
    net = Net(rlpar.mlp_spec(5, [Categorical(3), Value()], hidden=(600, 70), activation="relu"))
    params = random_params(net, 1)
    obs = random_obs(net.spec, batch, 2)
    np.testing.assert_allclose(net.forward(params, obs), ref_forward(net, params, obs), **FWD_TOL)


@pytest.mark.parametrize("batch", BATCHES)
def test_gaussian_head_forward_matches_reference(batch: int) -> None:
    net = Net(rlpar.mlp_spec(3, [Gaussian(2, init_log_std=-0.5)], hidden=(16,)))
    params = random_params(net, 5)
    obs = random_obs(net.spec, batch, 6)
    out = net.forward(params, obs)
    np.testing.assert_allclose(out, ref_forward(net, params, obs), **FWD_TOL)
    log_std = net.param_views(params)["heads.0.log_std"]
    np.testing.assert_array_equal(net.split(out)["log_std"], np.broadcast_to(log_std, (batch, 2)))


@pytest.mark.parametrize("batch", BATCHES)
def test_several_heads_forward_in_spec_order(batch: int) -> None:
    heads = [Value(), Gaussian(3), Categorical(4), Categorical(2)]
    spec = NetSpec((6,), [Linear(12), Tanh()], heads, input_scale=0.5)
    net = Net(spec)
    params = random_params(net, 7)
    obs = random_obs(spec, batch, 8)
    out = net.forward(params, obs)
    assert [(name, b, n) for name, _h, b, n in net.outputs] == [
        ("value", 0, 1),
        ("mean", 1, 3),
        ("log_std", 4, 3),
        ("logits", 7, 4),
        ("logits", 11, 2),
    ]
    np.testing.assert_allclose(out, ref_forward(net, params, obs), **FWD_TOL)


def test_pylayer_forward_matches_reference() -> None:
    spec = NetSpec((6,), [Linear(8), Square(), FixedMap(8, 5), Tanh()], [Categorical(2)])
    net = Net(spec)
    params = random_params(net, 9)
    obs = random_obs(spec, 7, 10)
    np.testing.assert_allclose(net.forward(params, obs), ref_forward(net, params, obs), **FWD_TOL)


def test_forward_train_output_equals_forward() -> None:
    net = Net(rlpar.mlp_spec(4, [Categorical(2), Value()]))
    params = random_params(net, 11)
    obs = random_obs(net.spec, 9, 12)
    out, tape = net.forward_train(params, obs)
    assert tape.batch == 9
    np.testing.assert_array_equal(out, net.forward(params, obs))


def test_forward_writes_into_out() -> None:
    net = Net(rlpar.mlp_spec(4, [Categorical(2), Value()]))
    params = random_params(net, 13)
    obs = random_obs(net.spec, 3, 14)
    out = np.full((3, net.output_size), np.nan, np.float32)
    result = net.forward(params, obs, out=out)
    assert np.shares_memory(result, out)
    np.testing.assert_array_equal(out, net.forward(params, obs))


@settings(max_examples=40, deadline=None)
@given(
    obs_dim=st.integers(1, 8),
    hidden=st.lists(st.integers(1, 12), min_size=0, max_size=3),
    activation=st.sampled_from(["tanh", "relu"]),
    heads=st.lists(
        st.one_of(
            st.builds(Categorical, st.integers(1, 5)),
            st.builds(Value),
            st.builds(Gaussian, st.integers(1, 3), st.floats(-2, 1)),
        ),
        min_size=1,
        max_size=3,
    ),
    batch=st.integers(1, 9),
    seed=st.integers(0, 2**16),
)
def test_random_mlp_forward_matches_reference(obs_dim, hidden, activation, heads, batch, seed):
    net = Net(rlpar.mlp_spec(obs_dim, heads, hidden=hidden, activation=activation))
    params = random_params(net, seed)
    obs = random_obs(net.spec, batch, seed + 1)
    np.testing.assert_allclose(net.forward(params, obs), ref_forward(net, params, obs), **FWD_TOL)


# ----------------------------------------------------------------------------------- backward
# Every layer whose input gradient is under test sits above a layer with parameters, so a wrong
# input gradient shows up in that layer's parameter gradient.

BACKWARD_CASES = {
    "linear": NetSpec((6,), [Linear(7), Linear(5)], [Value()]),
    "conv2d_padding_stride": NetSpec(
        (7, 7, 2),
        [Conv2d(3, 3, stride=2, padding=1), Conv2d(4, 2, padding=1), Flatten()],
        [Categorical(3)],
    ),
    "conv2d_uint8": NetSpec(
        (6, 5, 2), [Conv2d(3, 2, stride=2), Tanh(), Flatten()], [Value()], input_dtype="uint8"
    ),
    "relu": NetSpec((6,), [Linear(8), ReLU(), Linear(6), ReLU()], [Value()]),
    "tanh": NetSpec((6,), [Linear(8), Tanh(), Linear(6), Tanh()], [Value()]),
    "flatten": NetSpec((5, 4, 2), [Conv2d(3, 2), Flatten(), Linear(4)], [Value()]),
    "pylayer_square": NetSpec((6,), [Linear(6), Square(), Linear(4)], [Value()]),
    "pylayer_fixed_map": NetSpec((6,), [Linear(6), FixedMap(6, 3), Tanh()], [Value()]),
    "pylayer_at_bottom": NetSpec((6,), [Square(), Linear(4)], [Value()]),
    "categorical": NetSpec((5,), [Linear(6), Tanh()], [Categorical(4)]),
    "value": NetSpec((5,), [Linear(6), Tanh()], [Value()]),
    "gaussian": NetSpec((5,), [Linear(6), Tanh()], [Gaussian(3)]),
    "all_heads": NetSpec((5,), [Linear(6), Tanh()], [Gaussian(2), Value(), Categorical(3)]),
    "no_torso": NetSpec((5,), [], [Categorical(2), Value()]),
    # A ReLU's backward taken by the layer above it, through a Flatten (the MinAtar torso's shape).
    "relu_flatten_linear": NetSpec(
        (5, 4, 2), [Conv2d(3, 2), ReLU(), Flatten(), Linear(5), ReLU()], [Value()]
    ),
    # A ReLU at the bottom: no layer below needs its gradient.
    "relu_first": NetSpec((6,), [ReLU(), Linear(5), ReLU()], [Categorical(3)]),
    # Bias gradients of 24 (16 + 8) and 57 (32 + 16 + 8 + 1) columns.
    "bias_widths": NetSpec((4,), [Linear(24), Tanh(), Linear(57), Tanh()], [Value()]),
}


@pytest.mark.parametrize("case", sorted(BACKWARD_CASES))
def test_backward_matches_finite_differences(case: str) -> None:
    check_backward(Net(BACKWARD_CASES[case]))


def test_backward_big_conv_net_sampled_coordinates() -> None:
    layers = [Conv2d(8, 4, 2, 1), ReLU(), Conv2d(8, 3, 1, 1), Tanh(), Flatten(), Linear(16), Tanh()]
    net = Net(NetSpec((12, 12, 3), layers, [Categorical(4), Value()], input_dtype="uint8"))
    check_backward(net, batch=4, per_block=12)


def test_backward_conv_tails_sampled_coordinates() -> None:
    # Batch 1, an 8 x 8 kernel at stride 4 and 2 x 2 at stride 2, channel counts (17, 9) and patch
    # runs (24, 34) that are not whole register tiles: masked tails in every conv kernel.
    layers = [Conv2d(17, 8, 4), ReLU(), Conv2d(9, 2, 2, 1), Tanh(), Flatten(), Linear(6), Tanh()]
    net = Net(NetSpec((20, 16, 3), layers, [Categorical(3), Value()]))
    check_backward(net, batch=1, per_block=12)


def test_backward_wide_layers_sampled_coordinates() -> None:
    # Several 64-column tiles with masked tails, a K-blocked linear (980 inputs), fused ReLUs.
    layers = [
        Conv2d(70, 3), ReLU(), Conv2d(20, 3, 1, 1), ReLU(), Flatten(),
        Linear(300), ReLU(), Linear(600), Tanh(),
    ]  # fmt: skip
    net = Net(NetSpec((9, 9, 5), layers, [Categorical(4), Value()]))
    check_backward(net, batch=3, per_block=12)


def test_backward_wide_linear_many_rows_sampled_coordinates() -> None:
    # >= 512 outputs at 70 rows: packed weight panels forward, dy panels over two 64-sample passes
    # for the weight gradients, transposed weight panels (a 512 + 18 output split) for dx.
    layers = [Linear(600), Tanh(), Linear(530), Tanh()]
    net = Net(NetSpec((20,), layers, [Categorical(3), Value()]))
    check_backward(net, batch=70, per_block=8)


# Linear widths that are not whole 8-float (AVX2) or 16-float (AVX-512) vectors, down to one
# lane, on one and two inputs (K of 1 and 2): masked tails in every linear kernel and its column
# sums. 521 = 512 + 9 outputs take the wide-weight paths (the few-rows tiles at 4-32 rows).
LINEAR_TAIL_CASES = {
    "k1_w1": NetSpec((1,), [Linear(1), Tanh()], [Value()]),
    "k2_w9_w7": NetSpec((2,), [Linear(9), Tanh(), Linear(7), Tanh()], [Categorical(3)]),
    "k3_w17_w23_w33": NetSpec(
        (3,),
        [Linear(17), Tanh(), Linear(23), Tanh(), Linear(33), Tanh()],
        [Categorical(5), Value()],
    ),
    "k2_w521": NetSpec((2,), [Linear(521), Tanh()], [Categorical(3)]),
}


@pytest.mark.parametrize("batch", [1, 2, 5, 13])
@pytest.mark.parametrize("case", sorted(LINEAR_TAIL_CASES))
def test_linear_tails_match_reference(case: str, batch: int) -> None:
    net = Net(LINEAR_TAIL_CASES[case])
    params = random_params(net, 7)
    obs = random_obs(net.spec, batch, 8)
    np.testing.assert_allclose(net.forward(params, obs), ref_forward(net, params, obs), **FWD_TOL)
    check_backward(net, batch=batch, seed=9, per_block=16)


def test_backward_gaussian_log_std_gradient_is_column_sum() -> None:
    net = Net(NetSpec((3,), [], [Gaussian(2)]))
    params = random_params(net, 0)
    obs = random_obs(net.spec, 6, 1)
    r = np.random.default_rng(2).standard_normal((6, 4)).astype(np.float32)
    _, tape = net.forward_train(params, obs)
    grad = net.backward(tape, r)
    views = net.param_views(grad)
    np.testing.assert_allclose(views["heads.0.log_std"], r[:, 2:].sum(0), rtol=1e-6)


def _grad_setup():
    net = Net(rlpar.mlp_spec(4, [Categorical(3), Value()], hidden=(8,)))
    params = random_params(net, 21)
    obs = random_obs(net.spec, 5, 22)
    dout = np.random.default_rng(23).standard_normal((5, net.output_size)).astype(np.float32)
    _, tape = net.forward_train(params, obs)
    return net, tape, dout


TRAILING_ZERO_NETS = {
    "mlp": lambda: Net(rlpar.mlp_spec(6, [Categorical(3), Value()], hidden=(70, 40))),
    "minatar_conv": lambda: Net(
        rlpar.conv_spec((10, 10, 4), [Categorical(6), Value()], convs=((16, 3, 1),), hidden=128)
    ),
    "gaussian": lambda: Net(rlpar.mlp_spec(5, [Gaussian(2), Value()], hidden=(16,))),
    # Residual blocks keep their skip gradients and LayerNorm its statistics for the kept rows.
    "impala_cnn_layernorm": lambda: Net(
        NetSpec(
            (10, 10, 4),
            [
                *rlpar.impala_cnn_spec((10, 10, 4), [Value()], channels=(8,), hidden=16).layers,
                rlpar.LayerNorm(),
            ],
            [Categorical(6), Value()],
            input_dtype="uint8",
        )
    ),
}


@pytest.mark.parametrize("name", sorted(TRAILING_ZERO_NETS))
@pytest.mark.parametrize("zero_rows", [1, 16, 40])
def test_backward_trailing_zero_rows_add_nothing(name: str, zero_rows: int) -> None:
    # A feed-forward net leaves out the last rows whose output gradient is all zero (an
    # actor-critic loss's bootstrap rows): the gradient is the one of the other rows alone (the
    # same floats with the AVX-512 kernels, within rounding on the Eigen path), and -0.0 counts
    # as zero.
    net = TRAILING_ZERO_NETS[name]()
    params = random_params(net, 31)
    rows = 48
    obs = random_obs(net.spec, rows, 32)
    dout = np.random.default_rng(33).standard_normal((rows, net.output_size)).astype(np.float32)
    dout[rows - zero_rows :] = 0.0
    dout[-1, 0] = -0.0
    _, tape = net.forward_train(params, obs)
    _, head = net.forward_train(params, obs[: rows - zero_rows])
    got, want = net.backward(tape, dout), net.backward(head, dout[: rows - zero_rows].copy())
    if _native.simd_kernels() == "avx512":
        np.testing.assert_array_equal(got, want)
    else:  # Eigen's GEMMs round a batch's last rows in other code: the forwards differ by ulps
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6 * np.abs(want).max())
    # Every row zero: nothing is added; a NaN row is not zero and reaches the gradient.
    grad = np.full(net.num_params, 2.0, np.float32)
    net.backward(tape, np.zeros_like(dout), grad=grad, accumulate=True)
    np.testing.assert_array_equal(grad, 2.0)
    np.testing.assert_array_equal(net.backward(tape, np.zeros_like(dout)), 0.0)
    dout[-1, 0] = np.nan
    assert np.isnan(net.backward(tape, dout)).any()


class RowCounter(Square):
    """Square, recording the rows each forward and backward call sees."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, int]] = []

    def forward(self, x: np.ndarray) -> np.ndarray:
        self.rows.append(("forward", len(x)))
        return super().forward(x)

    def backward(self, x: np.ndarray, y: np.ndarray, dy: np.ndarray) -> np.ndarray:
        self.rows.append(("backward", len(x)))
        return super().backward(x, y, dy)


def test_backward_python_layer_sees_every_row() -> None:
    # A Python layer's backward is promised the forward's rows, trailing zero rows included.
    layer = RowCounter()
    net = Net(NetSpec((6,), [Linear(5), layer, Linear(4)], [Value()]))
    params = random_params(net, 41)
    _, tape = net.forward_train(params, random_obs(net.spec, 9, 42))
    dout = np.zeros((9, net.output_size), np.float32)
    dout[:4] = 1.0
    net.backward(tape, dout)
    assert layer.rows == [("forward", 9), ("backward", 9)]


def test_backward_accumulate_adds_into_grad() -> None:
    net, tape, dout = _grad_setup()
    fresh = net.backward(tape, dout)
    grad = np.full(net.num_params, 3.0, np.float32)
    result = net.backward(tape, dout, grad=grad, accumulate=True)
    assert np.shares_memory(result, grad)
    np.testing.assert_allclose(grad, 3.0 + fresh, rtol=1e-6, atol=1e-6)
    net.backward(tape, dout, grad=grad, accumulate=True)
    np.testing.assert_allclose(grad, 3.0 + 2 * fresh, rtol=1e-6, atol=1e-6)


def test_backward_without_accumulate_overwrites_grad() -> None:
    net, tape, dout = _grad_setup()
    fresh = net.backward(tape, dout)
    grad = np.full(net.num_params, 7.0, np.float32)
    result = net.backward(tape, dout, grad=grad, accumulate=False)
    assert np.shares_memory(result, grad)
    np.testing.assert_array_equal(grad, fresh)


def test_value_and_grad_with_numpy_loss_matches_finite_differences() -> None:
    net = Net(rlpar.mlp_spec(4, [Categorical(3), Value()], hidden=(8, 8)))
    params = random_params(net, 31)
    obs = random_obs(net.spec, 6, 32)
    actions = np.array([0, 2, 1, 1, 0, 2])
    returns = np.linspace(-1.0, 1.0, 6)

    def loss_fn(out: np.ndarray) -> tuple[float, np.ndarray]:
        """Mean softmax cross-entropy on the logits + 0.5 * mean squared value error."""
        out = np.asarray(out, np.float64)
        logits, value = out[:, :3], out[:, 3]
        z = logits - logits.max(axis=1, keepdims=True)
        logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
        n = len(actions)
        loss = -logp[np.arange(n), actions].mean() + 0.5 * np.mean((value - returns) ** 2)
        dout = np.zeros_like(out)
        dout[:, :3] = np.exp(logp) / n
        dout[np.arange(n), actions] -= 1.0 / n
        dout[:, 3] = (value - returns) / n
        return loss, dout

    loss, grad, out = net.value_and_grad(params, obs, loss_fn)
    np.testing.assert_allclose(out, ref_forward(net, params, obs), **FWD_TOL)
    ref_loss, _ = loss_fn(ref_forward(net, params, obs))
    assert loss == pytest.approx(ref_loss, rel=1e-5)
    fd = ref.numerical_grad(lambda p: loss_fn(ref_forward(net, p, obs))[0], params)
    assert rel_err(grad, fd) < 1e-3


# --------------------------------------------------------------------------- params and views


def _init_spec() -> NetSpec:
    layers = [Conv2d(4, 3, 2), ReLU(), Flatten(), Linear(16, init_gain=0.5), ReLU(), Linear(40)]
    heads = [Categorical(3), Value(), Gaussian(2, init_log_std=-0.7, init_gain=0.1)]
    return NetSpec((7, 7, 2), layers, heads, input_dtype="uint8")


def test_init_params_same_seed_same_bits_other_seed_differs() -> None:
    net = Net(_init_spec())
    a, b, c = net.init_params(5), net.init_params(5), net.init_params(6)
    np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))
    weights = [(o, math.prod(s)) for _n, role, o, s, _i, _h in net.param_info if role == "weight"]
    for offset, size in weights:
        assert not np.array_equal(a[offset : offset + size], c[offset : offset + size])


def test_init_params_orthogonal_weights_zero_biases_log_std() -> None:
    spec = _init_spec()
    net = Net(spec)
    params = net.init_params(0)
    assert params.dtype == np.float32 and params.shape == (net.num_params,)
    assert params.ctypes.data % 64 == 0
    expected_gain = {
        "layers.0.weight": math.sqrt(2.0),
        "layers.3.weight": 0.5,
        "layers.5.weight": math.sqrt(2.0),
        "heads.0.weight": 0.01,
        "heads.1.weight": 1.0,
        "heads.2.weight": 0.1,
    }
    seen = set()
    for name, role, offset, shape, _index, _in_head in net.param_info:
        block = params[offset : offset + math.prod(shape)].astype(np.float64)
        if role == "weight":
            w = block.reshape(-1, shape[-1])
            gram = w.T @ w if w.shape[0] >= w.shape[1] else w @ w.T
            gain = expected_gain[name]
            np.testing.assert_allclose(gram / gain**2, np.eye(len(gram)), atol=1e-5, err_msg=name)
            seen.add(name)
        elif role == "bias":
            assert not block.any(), name
        else:
            np.testing.assert_array_equal(block, np.float32(-0.7))
    assert seen == set(expected_gain)


def test_param_views_names_shapes_and_read_only() -> None:
    net = Net(_init_spec())
    params = net.init_params(1)
    views = net.param_views(params)
    assert [(k, v.shape) for k, v in views.items()] == [
        ("layers.0.weight", (3, 3, 2, 4)),
        ("layers.0.bias", (4,)),
        ("layers.3.weight", (36, 16)),
        ("layers.3.bias", (16,)),
        ("layers.5.weight", (16, 40)),
        ("layers.5.bias", (40,)),
        ("heads.0.weight", (40, 3)),
        ("heads.0.bias", (3,)),
        ("heads.1.weight", (40, 1)),
        ("heads.1.bias", (1,)),
        ("heads.2.weight", (40, 2)),
        ("heads.2.bias", (2,)),
        ("heads.2.log_std", (2,)),
    ]
    for name, v in views.items():
        assert np.shares_memory(v, params), name
        with pytest.raises(ValueError, match="read-only"):
            v[...] = 0
    assert params.flags.writeable
    blocks = ref.unpack(net.param_info, params)
    for name, v in views.items():
        np.testing.assert_array_equal(v, blocks[name])


# --------------------------------------------------------------------------------- optimizers

OPTIMIZERS = {
    "sgd": (lambda n: SGD(n, lr=0.1), lambda: ref.SGDRef(0.1)),
    "sgd_weight_decay": (
        lambda n: SGD(n, lr=0.1, weight_decay=0.05),
        lambda: ref.SGDRef(0.1, weight_decay=0.05),
    ),
    "sgd_momentum": (
        lambda n: SGD(n, lr=0.05, momentum=0.9),
        lambda: ref.SGDRef(0.05, momentum=0.9),
    ),
    "sgd_nesterov_weight_decay": (
        lambda n: SGD(n, lr=0.05, momentum=0.8, weight_decay=0.01, nesterov=True),
        lambda: ref.SGDRef(0.05, momentum=0.8, weight_decay=0.01, nesterov=True),
    ),
    "rmsprop": (
        lambda n: RMSProp(n, lr=0.01, alpha=0.9, eps=1e-5),
        lambda: ref.RMSPropRef(0.01, alpha=0.9, eps=1e-5),
    ),
    "rmsprop_centered": (
        lambda n: RMSProp(n, lr=0.01, alpha=0.95, eps=1e-3, centered=True),
        lambda: ref.RMSPropRef(0.01, alpha=0.95, eps=1e-3, centered=True),
    ),
    "rmsprop_momentum_weight_decay": (
        lambda n: RMSProp(n, lr=0.01, alpha=0.99, eps=1e-5, momentum=0.9, weight_decay=0.01),
        lambda: ref.RMSPropRef(0.01, alpha=0.99, eps=1e-5, momentum=0.9, weight_decay=0.01),
    ),
    "rmsprop_centered_momentum": (
        lambda n: RMSProp(n, lr=0.01, alpha=0.9, eps=1e-4, momentum=0.5, centered=True),
        lambda: ref.RMSPropRef(0.01, alpha=0.9, eps=1e-4, momentum=0.5, centered=True),
    ),
    "adam": (lambda n: Adam(n, lr=0.01), lambda: ref.AdamRef(0.01)),
    "adam_weight_decay": (
        lambda n: Adam(n, lr=0.02, beta1=0.8, beta2=0.99, eps=1e-6, weight_decay=0.1),
        lambda: ref.AdamRef(0.02, beta1=0.8, beta2=0.99, eps=1e-6, weight_decay=0.1),
    ),
}

# native state buffer -> attribute of the reference
STATE_NAMES = {
    "momentum_buffer": "buf",
    "square_avg": "square_avg",
    "grad_avg": "grad_avg",
    "exp_avg": "m",
    "exp_avg_sq": "v",
}


def _grads(n: int, steps: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(n).astype(np.float32) for _ in range(steps)]


@pytest.mark.parametrize("case", sorted(OPTIMIZERS))
def test_optimizer_matches_reference(case: str) -> None:
    make, make_ref = OPTIMIZERS[case]
    n = 257
    opt, opt_ref = make(n), make_ref()
    params = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    p_ref = params.astype(np.float64)
    for g in _grads(n, 10, 1):
        opt.step(params, g)
        p_ref = opt_ref.step(p_ref, g.astype(np.float64))
    assert opt.steps == 10
    np.testing.assert_allclose(params, p_ref, rtol=1e-5, atol=1e-6)
    state = opt.state_dict()
    for name, attr in STATE_NAMES.items():
        if name in state:
            np.testing.assert_allclose(state[name], getattr(opt_ref, attr), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("case", sorted(OPTIMIZERS))
def test_optimizer_state_dict_round_trip_continues_identically(case: str) -> None:
    make, _ = OPTIMIZERS[case]
    n = 64
    grads = _grads(n, 8, 2)
    a = make(n)
    pa = np.random.default_rng(3).standard_normal(n).astype(np.float32)
    for g in grads[:4]:
        a.step(pa, g)
    state = a.state_dict()
    assert state["steps"] == 4 and state["lr"] == a.lr
    b = make(n)
    b.load_state_dict(state)
    pb = pa.copy()
    for g in grads[4:]:
        a.step(pa, g)
        b.step(pb, g)
    np.testing.assert_array_equal(pa, pb)
    assert b.steps == 8


def test_state_dict_returns_copies() -> None:
    opt = Adam(8, lr=0.1)
    p = np.zeros(8, np.float32)
    opt.step(p, np.ones(8, np.float32))
    state = opt.state_dict()
    state["exp_avg"][:] = 123.0
    assert not np.any(opt.state_dict()["exp_avg"] == 123.0)


def test_centered_rmsprop_stays_finite_for_nearly_constant_grads() -> None:
    rng = np.random.default_rng(0)
    opt = RMSProp(1000, lr=1e-6, alpha=0.9, eps=1e-8, centered=True)
    params = np.zeros(1000, np.float32)
    for _ in range(200):
        opt.step(params, (1 + 1e-6 * rng.standard_normal(1000)).astype(np.float32))
    assert np.isfinite(params).all()


@pytest.mark.parametrize("n", [0, 1, 15, 16, 17, 1001])
def test_global_norm_matches_numpy(n: int) -> None:
    g = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    assert rlpar.global_norm(g) == pytest.approx(np.linalg.norm(g.astype(np.float64)), rel=1e-12)


def test_clip_grad_norm_scales_to_max_norm_and_returns_old_norm() -> None:
    g = np.random.default_rng(1).standard_normal(500).astype(np.float32) * 3
    before = g.copy()
    norm = np.linalg.norm(before.astype(np.float64))
    assert rlpar.clip_grad_norm(g, 2.0) == pytest.approx(norm, rel=1e-12)
    assert np.linalg.norm(g.astype(np.float64)) == pytest.approx(2.0, rel=1e-6)
    np.testing.assert_allclose(g, before * (2.0 / norm), rtol=1e-6)


def test_clip_grad_norm_below_max_norm_leaves_grad_unchanged() -> None:
    g = np.random.default_rng(2).standard_normal(100).astype(np.float32)
    before = g.copy()
    norm = rlpar.clip_grad_norm(g, 1e3)
    assert norm == pytest.approx(np.linalg.norm(before.astype(np.float64)), rel=1e-12)
    np.testing.assert_array_equal(g, before)
    zero = np.zeros(10, np.float32)
    assert rlpar.clip_grad_norm(zero, 1.0) == 0.0
    assert not zero.any()
