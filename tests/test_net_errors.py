"""Bad inputs: one test per case, each checking the exception type and that the message names
what was expected and what came."""

from __future__ import annotations

import re

import numpy as np
import pytest

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
    Value,
)

B = 3


@pytest.fixture
def net() -> Net:
    """An MLP on float32 obs [B, 4] with outputs [B, 3] (2 logits, 1 value)."""
    return Net(rlpar.mlp_spec(4, [Categorical(2), Value()], hidden=(8,)))


@pytest.fixture
def params(net: Net) -> np.ndarray:
    return net.init_params(0)


@pytest.fixture
def obs() -> np.ndarray:
    return np.random.default_rng(0).standard_normal((B, 4)).astype(np.float32)


@pytest.fixture
def image_net() -> Net:
    """A conv net on uint8 frames [B, 8, 8, 2]."""
    spec = NetSpec((8, 8, 2), [Conv2d(4, 3, 2), ReLU(), Flatten()], [Value()], input_dtype="uint8")
    return Net(spec)


def lit(text: str) -> str:
    """A regex matching ``text`` literally."""
    return re.escape(text)


# ---------------------------------------------------------------------------------------- obs


def test_obs_without_batch_axis(net, params) -> None:
    with pytest.raises(ValueError, match=lit("obs must have shape [B, 4] with B >= 1, got (4,)")):
        net.forward(params, np.zeros(4, np.float32))


def test_obs_wrong_trailing_shape(net, params) -> None:
    with pytest.raises(ValueError, match=lit("[B, 4]") + ".*" + lit("got (3, 5)")):
        net.forward(params, np.zeros((3, 5), np.float32))


def test_obs_empty_batch(net, params) -> None:
    with pytest.raises(ValueError, match=lit("B >= 1, got (0, 4)")):
        net.forward(params, np.zeros((0, 4), np.float32))


def test_obs_image_wrong_shape(image_net) -> None:
    frames = np.zeros((2, 8, 2, 8), np.uint8)
    with pytest.raises(ValueError, match=lit("[B, 8, 8, 2]") + ".*" + lit("(2, 8, 2, 8)")):
        image_net.forward(image_net.init_params(0), frames)


def test_obs_float64(net, params, obs) -> None:
    with pytest.raises(TypeError, match=r"obs must be float32.*got float64"):
        net.forward(params, obs.astype(np.float64))


def test_obs_float32_to_uint8_net(image_net) -> None:
    frames = np.zeros((2, 8, 8, 2), np.float32)
    with pytest.raises(TypeError, match=r"obs must be uint8.*got float32"):
        image_net.forward(image_net.init_params(0), frames)


def test_obs_list(net, params) -> None:
    with pytest.raises(TypeError, match=lit("obs must be a numpy array, got list")):
        net.forward(params, [[0.0, 0.0, 0.0, 0.0]])


def test_obs_non_contiguous_is_copied(net, params) -> None:
    wide = np.random.default_rng(1).standard_normal((B, 8)).astype(np.float32)
    strided = wide[:, ::2]
    assert not strided.flags.c_contiguous
    np.testing.assert_array_equal(
        net.forward(params, strided), net.forward(params, np.ascontiguousarray(strided))
    )


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_obs_not_finite_with_check(net, params, obs, bad) -> None:
    obs[1, 2] = bad
    with pytest.raises(ValueError, match=f"obs must be finite, but element 6 is {bad}"):
        net.forward(params, obs, check_finite=True)


def test_obs_not_finite_without_check_passes_through(net, params, obs) -> None:
    obs[1, 2] = np.nan
    out = net.forward(params, obs)
    assert np.isnan(out[1]).any() and np.isfinite(out[[0, 2]]).all()


def test_release_gil_not_a_bool(net, params, obs) -> None:
    with pytest.raises(TypeError, match=lit("release_gil must be True, False or None, got str")):
        net.forward(params, obs, release_gil="yes")


# ------------------------------------------------------------------------------------- params


def test_params_wrong_size(net, params, obs) -> None:
    n = net.num_params
    with pytest.raises(
        ValueError,
        match=f"params must be a flat float32 vector of {n} values, "
        + lit(f"got shape ({n - 1},)"),
    ):
        net.forward(params[:-1].copy(), obs)


def test_params_wrong_dtype(net, params, obs) -> None:
    with pytest.raises(
        TypeError, match=lit("params must be a Snapshot or a float32 array, got dtype float64")
    ):
        net.forward(params.astype(np.float64), obs)


def test_params_wrong_rank(net, params, obs) -> None:
    with pytest.raises(ValueError, match=lit(f"got shape (1, {net.num_params})")):
        net.forward(params[None], obs)


def test_params_non_contiguous(net, params, obs) -> None:
    strided = np.repeat(params, 2)[::2]
    with pytest.raises(ValueError, match=lit("params must be contiguous")):
        net.forward(strided, obs)


def test_params_not_finite_with_check(net, params, obs) -> None:
    params[5] = np.nan
    with pytest.raises(ValueError, match=lit("params must be finite, but element 5 is nan")):
        net.forward(params, obs, check_finite=True)


# ---------------------------------------------------------------------------------- out, dout


def test_out_wrong_shape(net, params, obs) -> None:
    with pytest.raises(ValueError, match=lit(f"out must have shape ({B}, 3), got ({B}, 2)")):
        net.forward(params, obs, out=np.zeros((B, 2), np.float32))


def test_out_wrong_dtype(net, params, obs) -> None:
    with pytest.raises(TypeError, match=lit("out must be float32, got float64")):
        net.forward(params, obs, out=np.zeros((B, 3), np.float64))


def test_out_non_contiguous(net, params, obs) -> None:
    out = np.zeros((B, 6), np.float32)[:, ::2]
    with pytest.raises(ValueError, match=lit("out must be a contiguous, writable float32 array")):
        net.forward(params, obs, out=out)


def test_dout_wrong_shape(net, params, obs) -> None:
    _, tape = net.forward_train(params, obs)
    with pytest.raises(
        ValueError, match=lit(f"dout must have shape ({B}, 3)") + ".*" + lit(f"got ({B + 1}, 3)")
    ):
        net.backward(tape, np.zeros((B + 1, 3), np.float32))


def test_dout_wrong_dtype(net, params, obs) -> None:
    _, tape = net.forward_train(params, obs)
    with pytest.raises(TypeError, match=lit("dout must be float32, got float64")):
        net.backward(tape, np.zeros((B, 3)))


def test_dout_non_contiguous_is_copied(net, params, obs) -> None:
    _, tape = net.forward_train(params, obs)
    wide = np.random.default_rng(2).standard_normal((B, 6)).astype(np.float32)
    np.testing.assert_array_equal(
        net.backward(tape, wide[:, ::2]), net.backward(tape, np.ascontiguousarray(wide[:, ::2]))
    )


def test_dout_not_finite_with_check(net, params, obs) -> None:
    _, tape = net.forward_train(params, obs)
    dout = np.zeros((B, 3), np.float32)
    dout[2, 1] = np.nan
    with pytest.raises(ValueError, match=lit("dout must be finite, but element 7 is nan")):
        net.backward(tape, dout, check_finite=True)


# ------------------------------------------------------------------------------ tape and grad


def test_backward_tape_from_another_net(net, params, obs) -> None:
    other = Net(net.spec)
    _, tape = other.forward_train(other.init_params(0), obs)
    with pytest.raises(ValueError, match=lit("this tape was recorded by another net")):
        net.backward(tape, np.zeros((B, 3), np.float32))


def test_backward_released_tape(net, params, obs) -> None:
    _, tape = net.forward_train(params, obs)
    tape.release()
    with pytest.raises(ValueError, match=lit("this tape was released; record a new one")):
        net.backward(tape, np.zeros((B, 3), np.float32))


def test_backward_accumulate_without_grad(net, params, obs) -> None:
    _, tape = net.forward_train(params, obs)
    with pytest.raises(ValueError, match=lit("accumulate=True needs a grad buffer")):
        net.backward(tape, np.zeros((B, 3), np.float32), accumulate=True)


def test_backward_grad_wrong_size(net, params, obs) -> None:
    _, tape = net.forward_train(params, obs)
    n = net.num_params
    with pytest.raises(
        ValueError,
        match=f"grad must be a flat float32 vector of {n} values, " + lit(f"got shape ({n + 1},)"),
    ):
        net.backward(tape, np.zeros((B, 3), np.float32), grad=np.zeros(n + 1, np.float32))


def test_backward_grad_read_only(net, params, obs) -> None:
    _, tape = net.forward_train(params, obs)
    grad = np.zeros(net.num_params, np.float32)
    grad.flags.writeable = False
    with pytest.raises(ValueError, match=lit("grad must be writable")):
        net.backward(tape, np.zeros((B, 3), np.float32), grad=grad)


# -------------------------------------------------------------------------------------- specs


def test_spec_layer_is_a_string() -> None:
    with pytest.raises(TypeError, match=r"layer 1 must be one of Linear.*got str"):
        NetSpec((4,), [Linear(4), "relu"], [Value()])


def test_spec_layer_is_a_dict() -> None:
    with pytest.raises(TypeError, match=r"layer 0 must be one of Linear.*got dict"):
        NetSpec((4,), [{"type": "linear", "out": 4}], [Value()])


def test_spec_head_is_a_layer() -> None:
    with pytest.raises(
        TypeError, match=lit("head 0 must be Categorical, Value or Gaussian, got Linear")
    ):
        NetSpec((4,), [], [Linear(2)])


def test_linear_zero_features() -> None:
    msg = "Linear.out_features: expected an integer >= 1, got 0"
    with pytest.raises(ValueError, match=lit(msg)):
        Linear(0)


def test_conv_zero_kernel() -> None:
    with pytest.raises(ValueError, match=lit("Conv2d.kernel: expected an integer >= 1, got 0")):
        Conv2d(4, 0)


def test_conv_negative_padding() -> None:
    with pytest.raises(ValueError, match=lit("Conv2d.padding: expected an integer >= 0, got -1")):
        Conv2d(4, 3, padding=-1)


def test_conv_zero_stride() -> None:
    with pytest.raises(ValueError, match=lit("Conv2d.stride: expected an integer >= 1, got 0")):
        Conv2d(4, 3, stride=0)


def test_categorical_zero_actions() -> None:
    with pytest.raises(ValueError, match=lit("Categorical.n: expected an integer >= 1, got 0")):
        Categorical(0)


def test_linear_float_size() -> None:
    msg = "Linear.out_features: expected an integer, got float 2.5"
    with pytest.raises(TypeError, match=lit(msg)):
        Linear(2.5)


def test_linear_bool_size() -> None:
    msg = "Linear.out_features: expected an integer, got bool True"
    with pytest.raises(TypeError, match=lit(msg)):
        Linear(True)


def test_gaussian_non_finite_log_std() -> None:
    with pytest.raises(ValueError, match=lit("Gaussian.init_log_std must be finite, got nan")):
        Gaussian(2, init_log_std=float("nan"))


def test_non_finite_init_gain() -> None:
    with pytest.raises(
        ValueError, match=lit("Linear.init_gain must be a finite number or None, got inf")
    ):
        Linear(4, init_gain=float("inf"))


def test_conv_empty_output() -> None:
    spec = NetSpec((4, 4, 1), [Conv2d(2, 5), Flatten()], [Value()])
    with pytest.raises(
        ValueError,
        match=lit("kernel 5, stride 1, padding 0 on input (4, 4, 1) would have an empty"),
    ):
        Net(spec)


def test_conv_on_flat_input() -> None:
    with pytest.raises(
        ValueError, match=lit("layer 0 (conv2d) expects an image input (H, W, C), got (16,)")
    ):
        Net(NetSpec((16,), [Conv2d(2, 3)], [Value()]))


def test_linear_on_image_without_flatten() -> None:
    spec = NetSpec((4, 4, 2), [Linear(8)], [Value()])
    with pytest.raises(
        ValueError,
        match=lit("layer 0 (linear) expects a flat input (D,), got (4, 4, 2): add a Flatten layer"),
    ):
        Net(spec)


def test_heads_missing() -> None:
    with pytest.raises(ValueError, match=lit("a net needs at least one head")):
        NetSpec((4,), [Linear(4)], [])


def test_heads_on_image_features() -> None:
    spec = NetSpec((6, 6, 1), [Conv2d(2, 3)], [Value()])
    with pytest.raises(
        ValueError,
        match=lit(
            "heads expect flat features (F,), but the last layer outputs (4, 4, 2): add a Flatten"
        ),
    ):
        Net(spec)


def test_input_shape_two_dims() -> None:
    with pytest.raises(ValueError, match=lit("input_shape must be (D,) or (H, W, C), got (4, 4)")):
        NetSpec((4, 4), [], [Value()])


def test_input_shape_zero() -> None:
    msg = "NetSpec.input_shape: expected an integer >= 1, got 0"
    with pytest.raises(ValueError, match=lit(msg)):
        NetSpec((0,), [], [Value()])


def test_input_shape_float() -> None:
    msg = "NetSpec.input_shape: expected an integer, got float 4.0"
    with pytest.raises(TypeError, match=lit(msg)):
        NetSpec((4.0,), [], [Value()])


def test_input_dtype_unknown() -> None:
    with pytest.raises(
        ValueError, match=lit("input_dtype must be 'float32' or 'uint8', got 'float64'")
    ):
        NetSpec((4,), [], [Value()], input_dtype="float64")


def test_input_scale_zero() -> None:
    with pytest.raises(ValueError, match=lit("input_scale must be finite and non-zero, got 0")):
        NetSpec((4,), [], [Value()], input_scale=0.0)


def test_net_needs_a_spec() -> None:
    with pytest.raises(TypeError, match=lit("Net expects a NetSpec, got dict")):
        Net({"input_shape": (4,)})


def test_the_core_gets_the_spec_as_its_own_types() -> None:
    """The Python spec reaches the core as bound LayerSpec/HeadSpec/NetSpec values, field for
    field (no string tuples parsed in the bindings)."""
    spec = NetSpec(
        (8, 8, 2),
        [Conv2d(4, 3, 2, 1), ReLU(), Flatten(), Linear(16), _Returns(None)],
        [Categorical(3), Value(), Gaussian(2)],
        input_dtype="uint8",
        core=rlpar.LSTM(5),
    )
    native = Net(spec).native_spec
    assert [repr(layer) for layer in native.layers] == [
        "LayerSpec.conv2d(4, 3, 2, 1)",
        "LayerSpec.relu()",
        "LayerSpec.flatten()",
        "LayerSpec.linear(16)",
        "LayerSpec.python()",
    ]
    assert [(h.kind, h.size) for h in native.heads] == [
        ("categorical", 3),
        ("value", 1),
        ("gaussian", 2),
    ]
    assert native.input_shape == [8, 8, 2] and native.input_uint8
    assert native.input_scale == pytest.approx(1 / 255)
    assert (native.lstm_hidden, native.lstm_bf16x3) == (5, False)


def test_a_native_spec_is_checked_by_the_core() -> None:
    """A spec built from the native types directly, bypassing rlpar.nn's checks, still gets a
    ValueError from the core naming the layer and what it needs."""
    n = rlpar._native
    with pytest.raises(ValueError, match=lit("layer 0 (linear) needs out_features >= 1, got 0")):
        n.Net(n.NetSpec([4], layers=[n.LayerSpec.linear(0)], heads=[n.HeadSpec.value()]))
    with pytest.raises(ValueError, match=lit("head 0 needs size >= 1, got -1")):
        n.Net(n.NetSpec([4], heads=[n.HeadSpec.gaussian(-1)]))
    with pytest.raises(TypeError, match="incompatible constructor arguments"):
        n.NetSpec([4], layers=[("linear", 4)])


# --------------------------------------------------------------------------------- PyLayers


class _Returns(PyLayer):
    """A layer whose forward returns a fixed object."""

    def __init__(self, result) -> None:
        self.result = result

    def forward(self, x: np.ndarray):
        return self.result


def _pylayer_net(layer: PyLayer) -> Net:
    return Net(NetSpec((4,), [Linear(4), layer], [Value()]))


def _run(n: Net) -> np.ndarray:
    return n.forward(n.init_params(0), np.zeros((2, 4), np.float32))


def test_pylayer_forward_wrong_shape() -> None:
    n = _pylayer_net(_Returns(np.zeros((2, 3), np.float32)))
    with pytest.raises(
        ValueError, match=lit("_Returns.forward returned shape (2, 3), expected (2, 4)")
    ):
        _run(n)


def test_pylayer_forward_returns_string() -> None:
    n = _pylayer_net(_Returns("abc"))
    with pytest.raises(TypeError, match=lit("_Returns.forward must return a numpy array, got str")):
        _run(n)


def test_pylayer_forward_returns_none() -> None:
    n = _pylayer_net(_Returns(None))
    with pytest.raises(
        TypeError, match=lit("_Returns.forward must return a numpy array, got NoneType")
    ):
        _run(n)


@pytest.mark.parametrize("release_gil", [False, True])
def test_pylayer_forward_raises_propagates(release_gil: bool) -> None:
    class Boom(PyLayer):
        def forward(self, x: np.ndarray) -> np.ndarray:
            raise KeyError("no such key in my layer")

    n = _pylayer_net(Boom())
    with pytest.raises(KeyError, match=lit("no such key in my layer")):
        n.forward(n.init_params(0), np.zeros((2, 4), np.float32), release_gil=release_gil)
    # The net is still usable: the workspace went back to the pool.
    assert n.workspace_stats()["idle"] == n.workspace_stats()["workspaces"]


def test_pylayer_backward_wrong_shape() -> None:
    class BadGrad(PyLayer):
        def forward(self, x: np.ndarray) -> np.ndarray:
            return x

        def backward(self, x: np.ndarray, y: np.ndarray, dy: np.ndarray) -> np.ndarray:
            return dy[:, :2]

    n = _pylayer_net(BadGrad())
    _, tape = n.forward_train(n.init_params(0), np.zeros((2, 4), np.float32))
    with pytest.raises(
        ValueError, match=lit("BadGrad.backward returned shape (2, 2), expected (2, 4)")
    ):
        n.backward(tape, np.zeros((2, 1), np.float32))


def test_pylayer_backward_not_implemented() -> None:
    class NoBackward(PyLayer):
        def forward(self, x: np.ndarray) -> np.ndarray:
            return x

    n = _pylayer_net(NoBackward())
    _, tape = n.forward_train(n.init_params(0), np.zeros((2, 4), np.float32))
    with pytest.raises(NotImplementedError):
        n.backward(tape, np.zeros((2, 1), np.float32))


def test_pylayer_output_shape_not_a_tuple() -> None:
    class IntShape(PyLayer):
        def output_shape(self, input_shape: tuple[int, ...]):
            return 3

    with pytest.raises(
        TypeError, match=lit("IntShape.output_shape must return a tuple of ints, got 3")
    ):
        _pylayer_net(IntShape())


def test_pylayer_output_shape_non_positive() -> None:
    class ZeroShape(PyLayer):
        def output_shape(self, input_shape: tuple[int, ...]) -> tuple[int, ...]:
            return (0,)

    with pytest.raises(
        ValueError,
        match=lit(
            "layer 1 (python layer) must declare an output shape with positive sizes, got (0,)"
        ),
    ):
        _pylayer_net(ZeroShape())


# ------------------------------------------------------------------------------- optimizers


def test_sgd_lr_zero() -> None:
    with pytest.raises(ValueError, match=lit("lr must be > 0.0, got 0.0")):
        SGD(4, lr=0.0)


def test_sgd_negative_momentum() -> None:
    with pytest.raises(ValueError, match=lit("momentum must be >= 0.0 and <= 1.0, got -0.1")):
        SGD(4, lr=0.1, momentum=-0.1)


def test_sgd_negative_weight_decay() -> None:
    with pytest.raises(ValueError, match=lit("weight_decay must be >= 0.0, got -1.0")):
        SGD(4, lr=0.1, weight_decay=-1.0)


def test_rmsprop_alpha_above_one() -> None:
    with pytest.raises(ValueError, match=lit("alpha must be >= 0.0 and <= 1.0, got 1.5")):
        RMSProp(4, lr=0.1, alpha=1.5)


def test_rmsprop_eps_zero() -> None:
    with pytest.raises(ValueError, match=lit("eps must be > 0.0, got 0.0")):
        RMSProp(4, lr=0.1, eps=0.0)


def test_adam_lr_nan() -> None:
    with pytest.raises(ValueError, match=lit("lr must be > 0.0, got nan")):
        Adam(4, lr=float("nan"))


def test_adam_beta1_one() -> None:
    with pytest.raises(ValueError, match=lit("beta1 must be >= 0.0 and < 1.0, got 1.0")):
        Adam(4, lr=0.1, beta1=1.0)


def test_adam_beta2_one() -> None:
    with pytest.raises(ValueError, match=lit("beta2 must be >= 0.0 and < 1.0, got 1.0")):
        Adam(4, lr=0.1, beta2=1.0)


def test_optimizer_zero_params() -> None:
    with pytest.raises(ValueError, match=lit("num_params must be >= 1, got 0")):
        Adam(0, lr=0.1)


def test_optimizer_grad_wrong_size() -> None:
    opt = Adam(4, lr=0.1)
    with pytest.raises(
        ValueError, match=lit("grad must be a flat float32 vector of 4 values, got shape (5,)")
    ):
        opt.step(np.zeros(4, np.float32), np.zeros(5, np.float32))


def test_optimizer_grad_wrong_dtype() -> None:
    opt = RMSProp(4, lr=0.1)
    with pytest.raises(TypeError, match=lit("grad must be float32, got float64")):
        opt.step(np.zeros(4, np.float32), np.zeros(4))


def test_optimizer_params_wrong_size() -> None:
    opt = SGD(4, lr=0.1)
    with pytest.raises(
        ValueError, match=lit("params must have shape (4,) (the optimizer's num_params), got (8,)")
    ):
        opt.step(np.zeros(8, np.float32), np.zeros(8, np.float32))


def test_optimizer_params_read_only() -> None:
    opt = SGD(4, lr=0.1, momentum=0.9)
    params = np.zeros(4, np.float32)
    params.flags.writeable = False
    with pytest.raises(ValueError, match=lit("params must be writable")):
        opt.step(params, np.zeros(4, np.float32))


def test_adam_load_state_dict_size_mismatch() -> None:
    state = Adam(4, lr=0.1).state_dict()
    with pytest.raises(
        ValueError, match=lit("optimizer state 'exp_avg' must have shape (6,), got (4,)")
    ):
        Adam(6, lr=0.1).load_state_dict(state)


def test_adam_load_state_dict_from_rmsprop() -> None:
    state = RMSProp(4, lr=0.1).state_dict()
    with pytest.raises(ValueError, match=lit("optimizer state is missing 'exp_avg'")):
        Adam(4, lr=0.1).load_state_dict(state)


def test_clip_max_norm_zero() -> None:
    with pytest.raises(ValueError, match=lit("max_norm must be > 0, got 0")):
        rlpar.clip_grad_norm(np.ones(4, np.float32), 0.0)


def test_clip_max_norm_negative() -> None:
    with pytest.raises(ValueError, match=lit("max_norm must be > 0, got -1")):
        rlpar.clip_grad_norm(np.ones(4, np.float32), -1.0)


def test_clip_grad_float64() -> None:
    with pytest.raises(TypeError, match=lit("grad must be float32, got float64")):
        rlpar.clip_grad_norm(np.ones(4), 1.0)


def test_global_norm_list() -> None:
    with pytest.raises(TypeError, match=lit("grad must be a numpy array, got list")):
        rlpar.global_norm([1.0, 2.0])
