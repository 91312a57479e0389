"""MaxPool2d, LayerNorm and Residual blocks of the native net, and `impala_cnn_spec`.

Forward against the float64 numpy twins in `reference.py` (``maxpool2d``, ``layernorm``, the
residual add in ``layer_forward``), backward against central finite differences of that twin
(`check_backward` of test_net_numerics), bad specs against their messages, and many threads or a
thread pool on one net against one thread.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import reference as ref
from test_net_numerics import FWD_TOL, check_backward, random_obs, random_params
from test_net_threads import _run_threads
from test_thread_pool import assert_same_gradient, assert_same_output

import rlpar
from rlpar import (
    Categorical,
    Conv2d,
    Flatten,
    LayerNorm,
    Linear,
    MaxPool2d,
    Net,
    NetSpec,
    ReLU,
    Residual,
    Tanh,
    ThreadPool,
    Value,
)

HEADS = [Categorical(3), Value()]


def block(c: int) -> Residual:
    """The IMPALA residual block: x + Conv(ReLU(Conv(ReLU(x))))."""
    return Residual([ReLU(), Conv2d(c, 3, 1, 1), ReLU(), Conv2d(c, 3, 1, 1)])


# ------------------------------------------------------------------------------- numpy twins


def test_maxpool_reference_by_hand() -> None:
    # One 3x3 image, kernel 3, stride 2, padding 1: windows centred on (0,0), (0,2), (2,0), (2,2),
    # each covering the 2x2 corner of the image that is not padding.
    x = np.arange(9, dtype=np.float64).reshape(1, 3, 3, 1)
    y = ref.maxpool2d(x, kernel=3, stride=2, padding=1)
    np.testing.assert_array_equal(y[0, :, :, 0], [[4, 5], [7, 8]])


def test_layernorm_reference_by_hand() -> None:
    x = np.array([[1.0, 3.0]])  # mean 2, var 1
    y = ref.layernorm(x, np.array([2.0, 1.0]), np.array([0.5, 0.0]), eps=0.0)
    np.testing.assert_allclose(y, [[-1.5, 1.0]])


# ----------------------------------------------------------------------------------- forward

FORWARD_CASES = {
    "maxpool_k3s2p1": NetSpec((9, 10, 3), [MaxPool2d(3, 2, 1), Flatten()], HEADS),
    "maxpool_k2": NetSpec((8, 7, 2), [Conv2d(4, 3), MaxPool2d(2), Flatten()], HEADS),
    "maxpool_k3s1p0": NetSpec((6, 6, 5), [Conv2d(3, 1), MaxPool2d(3, 1), Flatten()], HEADS),
    "layernorm_flat": NetSpec((6,), [Linear(16), LayerNorm(16), Tanh()], HEADS),
    "layernorm_pixels": NetSpec((5, 4, 3), [Conv2d(6, 2), LayerNorm(), Flatten()], HEADS),
    "residual_conv": NetSpec(
        (7, 7, 2), [Conv2d(4, 3, 1, 1), block(4), block(4), ReLU(), Flatten()], HEADS
    ),
    "residual_mlp": NetSpec(
        (6,), [Linear(8), ReLU(), Residual([Linear(8), Tanh(), LayerNorm()]), Linear(5)], HEADS
    ),
    "residual_first": NetSpec((6,), [Residual([ReLU(), Linear(6)]), Linear(4)], HEADS),
    "impala_small": rlpar.impala_cnn_spec((10, 10, 4), HEADS, channels=(4, 6), hidden=16),
}


@pytest.mark.parametrize("batch", [1, 7, 64])
@pytest.mark.parametrize("case", sorted(FORWARD_CASES))
def test_forward_matches_float64_twin(case: str, batch: int) -> None:
    net = Net(FORWARD_CASES[case])
    assert_forward_matches_float64_twin(net, random_params(net, 1), random_obs(net.spec, batch, 2))


def assert_forward_matches_float64_twin(net: Net, params: np.ndarray, obs: np.ndarray) -> None:
    """forward == the float64 twin at float32 tolerance, and forward_train == forward."""
    want = ref.forward(net.spec, net.param_info, params, obs)
    np.testing.assert_allclose(net.forward(params, obs), want, **FWD_TOL)
    out, tape = net.forward_train(params, obs)
    tape.release()
    np.testing.assert_array_equal(out, net.forward(params, obs))


def test_maxpool_padding_is_minus_infinity() -> None:
    # All inputs negative: zero padding would win every border window; -inf padding never does.
    net = Net(NetSpec((4, 4, 1), [MaxPool2d(3, 2, 1), Flatten()], [Value()]))
    w = np.zeros(net.num_params, np.float32)
    w[:4] = [1, 10, 100, 1000]  # heads.0.weight [4, 1]: the value reads each pooled pixel
    obs = -1.0 - np.arange(16, dtype=np.float32).reshape(1, 4, 4, 1)
    pooled = ref.maxpool2d(obs.astype(np.float64), 3, 2, 1)[0, :, :, 0]
    np.testing.assert_array_equal(pooled, [[-1, -2], [-5, -6]])
    value = net.forward(w, obs)[0, 0]
    assert value == pytest.approx(-1 - 20 - 500 - 6000)


# ---------------------------------------------------------------------------------- backward
# Each new layer sits above a layer with parameters, so a wrong input gradient shows in them.

BACKWARD_CASES = {
    "maxpool_k3s2p1": NetSpec(
        (7, 7, 2), [Conv2d(3, 3, 1, 1), MaxPool2d(3, 2, 1), Conv2d(4, 2), Flatten()], HEADS
    ),
    "maxpool_k2_first": NetSpec((6, 6, 2), [MaxPool2d(2), Conv2d(3, 2), Flatten()], HEADS),
    "layernorm_flat": NetSpec((6,), [Linear(8), LayerNorm(), Linear(5), Tanh()], [Value()]),
    "layernorm_first": NetSpec((6,), [LayerNorm(6), Linear(4)], [Value()]),
    "layernorm_pixels": NetSpec(
        (5, 4, 3), [Conv2d(4, 2), LayerNorm(), Flatten(), Linear(3)], [Value()]
    ),
    # The ReLU opening the block must not be fused into the conv below it (its input is the skip).
    "residual_after_conv": NetSpec(
        (6, 6, 3), [Conv2d(4, 3, 1, 1), block(4), ReLU(), Flatten(), Linear(5)], HEADS
    ),
    # A ReLU below a block that opens with a layer with parameters: its backward waits for the skip.
    "residual_after_relu": NetSpec(
        (6,), [Linear(8), ReLU(), Residual([Linear(8), Tanh()]), Linear(4)], HEADS
    ),
    "residual_two_blocks_pool": NetSpec(
        (7, 7, 2),
        [Conv2d(4, 3, 1, 1), MaxPool2d(3, 2, 1), block(4), block(4), ReLU(), Flatten(), Linear(6)],
        HEADS,
    ),
    "residual_prenorm": NetSpec(
        (6,), [Linear(8), Residual([LayerNorm(), Linear(8), ReLU()]), Linear(4)], HEADS
    ),
    "residual_first": NetSpec((6,), [Residual([Tanh(), Linear(6)]), Linear(4)], [Value()]),
}


def away_from_kinks(net: Net, params: np.ndarray, obs: np.ndarray) -> bool:
    """Whether every ReLU input (nested ones too) is away from 0, as finite differences need."""
    p = ref.unpack(net.param_info, params)
    x = np.asarray(obs, np.float64) * net.spec.scale
    for i, layer in enumerate(net.spec.layers):
        if isinstance(layer, Residual):
            subs = [(sub, f"layers.{i}.{j}.") for j, sub in enumerate(layer.body)]
        else:
            subs = [(layer, f"layers.{i}.")]
        h = x
        for sub, name in subs:
            if isinstance(sub, ReLU) and np.abs(h).min() <= 1e-4:
                return False
            h = ref.layer_forward(sub, h, p.get(name + "weight"), p.get(name + "bias"))
        x = x + h if isinstance(layer, Residual) else h
    return True


@pytest.mark.parametrize("case", sorted(BACKWARD_CASES))
def test_backward_matches_finite_differences(case: str) -> None:
    net = Net(BACKWARD_CASES[case])
    # The first seed whose params (seed) and obs (seed + 1, as check_backward draws them) keep
    # every ReLU input away from 0.
    seed = next(
        s
        for s in range(20)
        if away_from_kinks(net, random_params(net, s), random_obs(net.spec, 5, s + 1))
    )
    check_backward(net, seed=seed)


def test_backward_impala_cnn_sampled_coordinates() -> None:
    net = Net(rlpar.impala_cnn_spec((10, 10, 2), HEADS, channels=(3, 4), hidden=8))
    check_backward(net, batch=3, per_block=6)


def test_maxpool_gradient_goes_to_the_first_of_tied_inputs() -> None:
    # A 1x1 conv of weight 0 and bias 1 makes every pooled value 1: each window is all ties. The
    # conv weight's gradient is then sum over positions of dpool * x, with dpool nonzero only at
    # the first (row-major) position of each window, as torch's CPU kernel picks.
    net = Net(NetSpec((4, 4, 1), [Conv2d(1, 1), MaxPool2d(2), Flatten()], [Value()]))
    views = {name: (off, shape) for name, _r, off, shape, _i, _h in net.param_info}
    params = np.zeros(net.num_params, np.float32)
    params[views["layers.0.bias"][0]] = 1.0
    head = views["heads.0.weight"][0]
    params[head : head + 4] = [1.0, 2.0, 3.0, 4.0]  # dvalue/dpool of each 2x2 window
    obs = np.random.default_rng(0).standard_normal((1, 4, 4, 1)).astype(np.float32)
    _, tape = net.forward_train(params, obs)
    grad = net.backward(tape, np.ones((1, 1), np.float32))
    firsts = obs[0, ::2, ::2, 0].ravel()  # the top-left input of each window
    want = float(np.dot([1.0, 2.0, 3.0, 4.0], firsts))
    assert grad[views["layers.0.weight"][0]] == pytest.approx(want, rel=1e-6)


# ------------------------------------------------------------------------------------ errors


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            NetSpec((2, 2, 1), [MaxPool2d(5, 1, 1), Flatten()], [Value()]),
            r"layer 0 \(maxpool2d\): kernel 5 is larger than the input \(2, 2, 1\) padded by 1",
        ),
        (
            NetSpec((6,), [MaxPool2d(2)], [Value()]),
            r"layer 0 \(maxpool2d\) expects an image input \(H, W, C\), got \(6,\)",
        ),
        (
            NetSpec((5, 5, 4), [block(8), Flatten()], [Value()]),
            r"layer 0 \(residual\) must output its input's shape \(5, 5, 4\) .*body outputs "
            r"\(5, 5, 8\)",
        ),
        (
            NetSpec((6,), [Linear(4), Residual([Linear(3)])], [Value()]),
            r"layer 1 \(residual\) must output its input's shape \(4,\).*\(3,\)",
        ),
        (
            NetSpec((6,), [Linear(4), LayerNorm(8)], [Value()]),
            r"layer 1 \(layernorm\) normalizes the last dimension, of size 8 as declared, but its "
            r"input is \(4,\)",
        ),
        (
            NetSpec((6,), [Linear(1), LayerNorm()], [Value()]),
            r"layer 1 \(layernorm\) needs at least 2 features",
        ),
        (
            NetSpec((6,), [Residual([Linear(6), LayerNorm(5)])], [Value()]),
            r"layer 0 \(residual\) body layer 1 \(layernorm\) normalizes",
        ),
    ],
)
def test_bad_specs_are_refused_when_the_net_is_built(spec: NetSpec, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Net(spec)


def test_bad_block_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="nest one level only"):
        Residual([Linear(4), Residual([Linear(4)])])
    with pytest.raises(ValueError, match="at least one layer"):
        Residual([])
    with pytest.raises(TypeError, match="Residual body layer 0 must be a layer"):
        Residual([Categorical(2)])  # type: ignore[list-item]
    with pytest.raises(ValueError, match=r"padding must be at most kernel // 2 = 1"):
        MaxPool2d(3, 2, 2)
    with pytest.raises(ValueError, match=r"LayerNorm\.features"):
        LayerNorm(1)
    # The core refuses a nested block too (a spec built without the dataclasses).
    inner = rlpar._native.LayerSpec.residual([rlpar._native.LayerSpec.relu()])
    spec = rlpar._native.NetSpec(
        input_shape=[4],
        layers=[rlpar._native.LayerSpec.residual([inner])],
        heads=[rlpar._native.HeadSpec.value()],
    )
    with pytest.raises(ValueError, match="residual blocks nest one level only"):
        rlpar._native.Net(spec)


# ----------------------------------------------------------------------- parameters and init


def test_parameters_of_blocks_are_named_and_initialised() -> None:
    spec = NetSpec(
        (6,),
        [Linear(8), Residual([LayerNorm(), Linear(8, init_gain=0.5)]), LayerNorm(8)],
        [Value()],
    )
    net = Net(spec)
    names = [name for name, *_ in net.param_info]
    assert names == [
        "layers.0.weight", "layers.0.bias",
        "layers.1.0.weight", "layers.1.0.bias", "layers.1.1.weight", "layers.1.1.bias",
        "layers.2.weight", "layers.2.bias", "heads.0.weight", "heads.0.bias",
    ]  # fmt: skip
    views = net.param_views(net.init_params(seed=0))
    for norm in ("layers.1.0", "layers.2"):
        np.testing.assert_array_equal(views[f"{norm}.weight"], np.ones(8, np.float32))
        np.testing.assert_array_equal(views[f"{norm}.bias"], np.zeros(8, np.float32))
    # Orthogonal with the nested layer's own gain: w w^T = gain^2 I.
    w = views["layers.1.1.weight"].astype(np.float64)
    np.testing.assert_allclose(w @ w.T, 0.25 * np.eye(8), atol=1e-5)


# -------------------------------------------------------------------------------- impala_cnn


def impala_param_count(h: int, w: int, c_in: int, n_actions: int) -> int:
    """By hand, channels (16, 32, 32), hidden 256."""
    # Section 1: conv 3x3 c_in -> 16 (9 c_in 16 weights + 16 biases), then two blocks of two
    # 3x3 16 -> 16 convs: 4 (9 16 16 + 16) = 4 2320 = 9280.
    # Section 2: 9 16 32 + 32 = 4640, blocks 4 (9 32 32 + 32) = 4 9248 = 36992.
    # Section 3: 9 32 32 + 32 = 9248, blocks 36992.
    convs = (9 * c_in * 16 + 16) + 9280 + 4640 + 36992 + 9248 + 36992
    # Each MaxPool2d(3, 2, 1) maps a side n to (n + 2 - 3) // 2 + 1.
    for _ in range(3):
        h, w = (h - 1) // 2 + 1, (w - 1) // 2 + 1
    features = h * w * 32
    # Linear(256), then the heads: Categorical 256 n + n, Value 256 + 1.
    return convs + (features * 256 + 256) + (256 * n_actions + n_actions) + (256 + 1)


@pytest.mark.parametrize(
    ("shape", "n_actions", "want"),
    [
        # MinAtar: sides 10 -> 5 -> 3 -> 2, features 2 2 32 = 128;
        # 97744 convs + 33024 linear + 1542 + 257 heads.
        ((10, 10, 4), 6, 132_567),
        # Atari: sides 84 -> 42 -> 21 -> 11, features 11 11 32 = 3872;
        # 97744 convs + 991488 linear + 1542 + 257 heads.
        ((84, 84, 4), 6, 1_091_031),
    ],
)
def test_impala_cnn_spec_builds_with_the_counted_parameters(shape, n_actions, want) -> None:
    assert impala_param_count(*shape, n_actions) == want
    spec = rlpar.impala_cnn_spec(shape, [Categorical(n_actions), Value()])
    assert spec.input_dtype == "uint8"
    net = Net(spec)
    assert net.num_params == want
    assert net.output_size == n_actions + 1
    obs = np.random.default_rng(0).integers(0, 256, (2, *shape), dtype=np.uint8)
    out = net.forward(net.init_params(seed=0), obs)
    assert out.shape == (2, n_actions + 1) and np.isfinite(out).all()


def test_impala_cnn_spec_layers() -> None:
    spec = rlpar.impala_cnn_spec((10, 10, 4), HEADS, channels=(8,), hidden=32)
    assert spec.layers == (
        Conv2d(8, 3, 1, 1), MaxPool2d(3, 2, 1), block(8), block(8),
        ReLU(), Flatten(), Linear(32), ReLU(),
    )  # fmt: skip


# ------------------------------------------------------------------------------------ threads


def impala_data(batch: int) -> tuple[Net, np.ndarray, np.ndarray, np.ndarray]:
    net = Net(rlpar.impala_cnn_spec((10, 10, 4), HEADS, channels=(8, 8), hidden=32))
    rng = np.random.default_rng(0)
    obs = rng.integers(0, 256, (batch, 10, 10, 4), dtype=np.uint8)
    dout = rng.standard_normal((batch, net.output_size)).astype(np.float32)
    return net, net.init_params(seed=1), obs, dout


def assert_many_threads_give_one_threads_bits(
    net: Net, params: np.ndarray, obs: np.ndarray, dout: np.ndarray
) -> None:
    """8 threads each train 5 times on one net, the GIL released: one thread's bits."""

    def compute(_i: int) -> list[tuple[np.ndarray, np.ndarray]]:
        res = []
        for _ in range(5):
            out, tape = net.forward_train(params, obs, release_gil=True)
            res.append((out, net.backward(tape, dout, release_gil=True)))
            tape.release()
        return res

    want = compute(0)
    for got in _run_threads(8, compute):
        for (out, grad), (ref_out, ref_grad) in zip(got, want, strict=True):
            np.testing.assert_array_equal(out, ref_out)
            np.testing.assert_array_equal(grad, ref_grad)


def assert_pool_split_matches_the_whole_call(
    net: Net, params: np.ndarray, obs: np.ndarray, dout: np.ndarray, pool: ThreadPool | None
) -> None:
    """Forward and backward split by ``pool`` give the output and gradient of no pool."""

    def train(p: ThreadPool | None) -> tuple[np.ndarray, np.ndarray]:
        out, tape = net.forward_train(params, obs, pool=p)
        grad = net.backward(tape, dout, pool=p)
        tape.release()
        return out, grad

    out1, g1 = train(None)
    out2, g2 = train(pool)
    assert_same_output(out2, out1)
    assert_same_gradient(g2, g1)
    assert np.abs(g2).sum() > 0 and math.isfinite(float(np.abs(g2).sum()))


def test_many_threads_on_one_net_give_one_threads_bits() -> None:
    assert_many_threads_give_one_threads_bits(*impala_data(12))


@pytest.mark.parametrize("threads", [2, 3])
def test_thread_pool_split_matches_the_whole_call(threads: int) -> None:
    net, params, obs, dout = impala_data(96)
    pool = ThreadPool(threads)
    assert net.torso_parts(pool, 96) == threads
    assert_pool_split_matches_the_whole_call(net, params, obs, dout, pool)


def test_forward_matches_torch_where_torch_is_installed() -> None:
    """The IMPALA ResNet and a pre-norm MLP block against torch's modules (nn.MaxPool2d,
    nn.LayerNorm, a residual add) holding the same weights: the benchmark's twins."""
    torch = pytest.importorskip("torch")
    from rlpar.bench.twins import check_twin, torch_input, torch_twin

    specs = [
        rlpar.impala_cnn_spec((12, 11, 3), HEADS, channels=(6, 8), hidden=16),
        NetSpec((6,), [Linear(8), Residual([LayerNorm(), Linear(8), ReLU()]), Tanh()], HEADS),
    ]
    for spec in specs:
        net = Net(spec)
        params = random_params(net, 3)
        obs = random_obs(spec, 5, 4)
        with torch.no_grad():
            got = torch_twin(net, params, torch)(torch_input(net, obs, torch)).numpy()
        check_twin("torch", got, net.forward(params, obs))
        np.testing.assert_allclose(got, net.forward(params, obs), rtol=1e-4, atol=1e-4)
