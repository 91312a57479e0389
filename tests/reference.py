"""Slow, obviously-correct float64 references of the native net and optimizers.

Written close to the maths and with no attention to speed, so that every fast native kernel has a
twin to be checked against (forward outputs, finite-difference gradients, optimizer trajectories).

Conventions (those of `rlpar.nn`): a batch is ``[B, *input_shape]``; images are channels-last
``[B, H, W, C]``; a Linear weight is ``[in, out]``; a Conv2d weight is ``[K, K, C, OC]`` applied
with zero padding; the output is ``[B, output_size]`` with the heads' columns in spec order.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

import rlpar

ParamInfo = Sequence[tuple[str, str, int, tuple[int, ...], int, bool]]


def unpack(param_info: ParamInfo, params: np.ndarray) -> dict[str, np.ndarray]:
    """Named float64 copies of the blocks of a flat ``params [num_params]`` vector."""
    blocks = {}
    for name, _role, offset, shape, _index, _in_head in param_info:
        size = math.prod(shape)
        blocks[name] = np.asarray(params[offset : offset + size], np.float64).reshape(shape)
    return blocks


def linear(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``y[n, o] = sum_i x[n, i] w[i, o] + b[o]``."""
    return np.einsum("ni,io->no", x, w) + b


def conv2d(x: np.ndarray, w: np.ndarray, b: np.ndarray, stride: int, padding: int) -> np.ndarray:
    """``x [B, H, W, C]``, ``w [K, K, C, OC]`` -> ``y [B, OH, OW, OC]``, zero padding.

    ``y[n, oy, ox, o] = b[o] + sum_{ky, kx, c} xpad[n, oy*s + ky, ox*s + kx, c] w[ky, kx, c, o]``.
    """
    batch, h, wd, c = x.shape
    k = w.shape[0]
    xpad = np.zeros((batch, h + 2 * padding, wd + 2 * padding, c))
    xpad[:, padding : padding + h, padding : padding + wd, :] = x
    oh = (h + 2 * padding - k) // stride + 1
    ow = (wd + 2 * padding - k) // stride + 1
    y = np.empty((batch, oh, ow, w.shape[3]))
    for oy in range(oh):
        for ox in range(ow):
            patch = xpad[:, oy * stride : oy * stride + k, ox * stride : ox * stride + k, :]
            y[:, oy, ox, :] = np.einsum("nijc,ijco->no", patch, w) + b
    return y


def maxpool2d(x: np.ndarray, kernel: int, stride: int, padding: int) -> np.ndarray:
    """``x [B, H, W, C]`` -> ``y [B, OH, OW, C]``: the largest value of each window, the
    ``padding`` pixels around the image counting as -inf."""
    batch, h, wd, c = x.shape
    xpad = np.full((batch, h + 2 * padding, wd + 2 * padding, c), -np.inf)
    xpad[:, padding : padding + h, padding : padding + wd, :] = x
    oh = (h + 2 * padding - kernel) // stride + 1
    ow = (wd + 2 * padding - kernel) // stride + 1
    y = np.empty((batch, oh, ow, c))
    for oy in range(oh):
        for ox in range(ow):
            window = xpad[:, oy * stride : oy * stride + kernel, ox * stride : ox * stride + kernel]
            y[:, oy, ox, :] = window.max(axis=(1, 2))
    return y


def layernorm(x: np.ndarray, gain: np.ndarray, bias: np.ndarray, eps: float = 1e-5) -> np.ndarray:
    """Each row of the last axis: ``(x - mean) / sqrt(var + eps) * gain + bias``, biased var."""
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * gain + bias


def embedding(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """``x [B, K]`` integer indices, ``w [num, dim]`` -> ``y [B, K dim]``: ``y[n, k dim + d] =
    w[x[n, k], d]``."""
    idx = x.astype(np.int64)
    assert np.array_equal(idx, x) and idx.min() >= 0 and idx.max() < len(w), "bad indices"
    batch, k = x.shape
    y = np.empty((batch, k * w.shape[1]))
    for n in range(batch):
        for j in range(k):
            y[n, j * w.shape[1] : (j + 1) * w.shape[1]] = w[idx[n, j]]
    return y


def concat(layer: rlpar.Concat, x: np.ndarray, p: dict[str, np.ndarray], prefix: str) -> np.ndarray:
    """``x [B, F]`` -> the branches' flattened outputs side by side; branch k reads the next
    ``prod(shape_k)`` columns as ``[B, *shape_k]``, its layer j's parameters ``prefix<k>.<j>.``."""
    outs, off = [], 0
    for k, branch in enumerate(layer.branches):
        h = x[:, off : off + branch.size].reshape(len(x), *branch.shape)
        off += branch.size
        for j, inner in enumerate(branch.layers):
            h = named_layer_forward(inner, h, p, f"{prefix}{k}.{j}.")
        outs.append(h.reshape(len(x), -1))
    return np.concatenate(outs, axis=1)


def named_layer_forward(
    layer: rlpar.Layer, x: np.ndarray, p: dict[str, np.ndarray], prefix: str
) -> np.ndarray:
    """`layer_forward` with the parameters looked up in ``p`` (`unpack`) by the layer's name
    ``prefix`` (``"layers.<i>."``), blocks included."""
    if isinstance(layer, rlpar.Concat):
        return concat(layer, x, p, prefix)
    body = [
        (p.get(f"{prefix}{j}.weight"), p.get(f"{prefix}{j}.bias"))
        for j in range(len(layer.body) if isinstance(layer, rlpar.Residual) else 0)
    ]
    return layer_forward(layer, x, p.get(prefix + "weight"), p.get(prefix + "bias"), body)


def layer_forward(
    layer: rlpar.Layer,
    x: np.ndarray,
    w: np.ndarray | None,
    b: np.ndarray | None,
    body_params: Sequence[tuple[np.ndarray | None, np.ndarray | None]] = (),
):
    """One torso layer on a float64 batch ``x [B, *in_shape]``; a Residual's body layers take
    ``body_params[j] = (weight, bias)``."""
    if isinstance(layer, rlpar.Residual):
        h = x
        for inner, (wj, bj) in zip(layer.body, body_params, strict=True):
            h = layer_forward(inner, h, wj, bj)
        return x + h
    if isinstance(layer, rlpar.MaxPool2d):
        assert layer.stride is not None
        return maxpool2d(x, layer.kernel, layer.stride, layer.padding)
    if isinstance(layer, rlpar.LayerNorm):
        return layernorm(x, w, b)
    if isinstance(layer, rlpar.Embedding):
        return embedding(x, w)
    if isinstance(layer, rlpar.Linear):
        return linear(x, w, b)
    if isinstance(layer, rlpar.Conv2d):
        return conv2d(x, w, b, layer.stride, layer.padding)
    if isinstance(layer, rlpar.ReLU):
        return np.maximum(x, 0.0)
    if isinstance(layer, rlpar.Tanh):
        return np.tanh(x)
    if isinstance(layer, rlpar.Flatten):
        return x.reshape(x.shape[0], -1)
    return np.asarray(layer.forward(x), np.float64)


def activations(
    spec: rlpar.NetSpec, param_info: ParamInfo, params: np.ndarray, obs: np.ndarray
) -> list[np.ndarray]:
    """Float64 activations: ``acts[i]`` is the input of layer i, ``acts[-1]`` the features."""
    p = unpack(param_info, params)
    x = np.asarray(obs, np.float64) * spec.scale
    acts = [x]
    for i, layer in enumerate(spec.layers):
        x = named_layer_forward(layer, x, p, f"layers.{i}.")
        acts.append(x)
    return acts


def heads_forward(
    spec: rlpar.NetSpec, param_info: ParamInfo, params: np.ndarray, features: np.ndarray
) -> np.ndarray:
    """``features [B, F]`` -> ``out [B, output_size]``, heads in spec order."""
    p = unpack(param_info, params)
    batch = features.shape[0]
    cols = []
    for h, head in enumerate(spec.heads):
        cols.append(linear(features, p[f"heads.{h}.weight"], p[f"heads.{h}.bias"]))
        if isinstance(head, rlpar.Gaussian):
            cols.append(np.broadcast_to(p[f"heads.{h}.log_std"], (batch, head.n)))
    return np.concatenate(cols, axis=1)


def forward(
    spec: rlpar.NetSpec, param_info: ParamInfo, params: np.ndarray, obs: np.ndarray
) -> np.ndarray:
    """The net's output ``[B, output_size]`` in float64."""
    features = activations(spec, param_info, params, obs)[-1]
    return heads_forward(spec, param_info, params, features)


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def lstm_sequence(
    x: np.ndarray,
    wx: np.ndarray,
    wh: np.ndarray,
    b: np.ndarray,
    state0: np.ndarray,
    resets: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """``x [T, N, F]``, ``state0 [N, 2H]`` (``[h, c]``), ``resets [T, N]`` -> (``h [T, N, H]``,
    state after the last step ``[N, 2H]``). One step at a time, gates ``[i, f, g, o]``:
    the state is zeroed where an episode starts, then ``c = f c + i g``, ``h = o tanh(c)``."""
    hidden = wh.shape[0]
    h, c = state0[:, :hidden].copy(), state0[:, hidden:].copy()
    outs = []
    for t in range(x.shape[0]):
        keep = ~resets[t, :, None]
        h, c = h * keep, c * keep
        a = x[t] @ wx + h @ wh + b
        i, f = sigmoid(a[:, :hidden]), sigmoid(a[:, hidden : 2 * hidden])
        g, o = np.tanh(a[:, 2 * hidden : 3 * hidden]), sigmoid(a[:, 3 * hidden :])
        c = f * c + i * g
        h = o * np.tanh(c)
        outs.append(h)
    return np.stack(outs), np.concatenate([h, c], axis=1)


def recurrent_forward(
    spec: rlpar.NetSpec,
    param_info: ParamInfo,
    params: np.ndarray,
    obs: np.ndarray,
    state0: np.ndarray,
    resets: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """A net with an LSTM core on ``obs [T, N, *input_shape]``: (``out [T, N, output_size]``,
    state after the last step ``[N, 2H]``)."""
    t_len, n = resets.shape
    torso = activations(spec, param_info, params, obs.reshape(t_len * n, *obs.shape[2:]))[-1]
    p = unpack(param_info, params)
    h, state = lstm_sequence(
        torso.reshape(t_len, n, -1),
        p["core.weight_ih"],
        p["core.weight_hh"],
        p["core.bias"],
        np.asarray(state0, np.float64),
        resets,
    )
    out = heads_forward(spec, param_info, params, h.reshape(t_len * n, -1))
    return out.reshape(t_len, n, -1), state


def numerical_grad(f, params: np.ndarray, coords: Sequence | None = None, eps: float = 1e-6):
    """Central differences of the scalar ``f(params float64)`` at ``coords``, indices into
    ``params`` (default: every element), in ``params``' shape (0 elsewhere)."""
    p = np.asarray(params, np.float64).copy()
    coords = np.ndindex(*p.shape) if coords is None else coords
    grad = np.zeros(p.shape)
    for i in coords:
        old = p[i]
        p[i] = old + eps
        plus = f(p)
        p[i] = old - eps
        minus = f(p)
        p[i] = old
        grad[i] = (plus - minus) / (2 * eps)
    return grad


# ------------------------------------------------------------------------------- optimizers
# Each reference keeps float64 state in a dict and follows PyTorch's documented update rule.


class SGDRef:
    """torch.optim.SGD (dampening 0): momentum buffer starts as the first gradient."""

    def __init__(self, lr: float, momentum=0.0, weight_decay=0.0, nesterov=False) -> None:
        self.lr, self.momentum, self.wd, self.nesterov = lr, momentum, weight_decay, nesterov
        self.buf: np.ndarray | None = None

    def step(self, p: np.ndarray, g: np.ndarray) -> np.ndarray:
        g = g + self.wd * p
        if self.momentum != 0:
            self.buf = g.copy() if self.buf is None else self.momentum * self.buf + g
            g = g + self.momentum * self.buf if self.nesterov else self.buf
        return p - self.lr * g


class RMSPropRef:
    """torch.optim.RMSprop: eps added outside the square root."""

    def __init__(
        self, lr: float, alpha=0.99, eps=1e-8, momentum=0.0, centered=False, weight_decay=0.0
    ) -> None:
        self.lr, self.alpha, self.eps, self.momentum = lr, alpha, eps, momentum
        self.centered, self.wd = centered, weight_decay
        self.square_avg = self.grad_avg = self.buf = 0.0

    def step(self, p: np.ndarray, g: np.ndarray) -> np.ndarray:
        a = self.alpha
        g = g + self.wd * p
        self.square_avg = a * self.square_avg + (1 - a) * g * g
        if self.centered:
            self.grad_avg = a * self.grad_avg + (1 - a) * g
            avg = np.sqrt(self.square_avg - self.grad_avg**2) + self.eps
        else:
            avg = np.sqrt(self.square_avg) + self.eps
        if self.momentum > 0:
            self.buf = self.momentum * self.buf + g / avg
            return p - self.lr * self.buf
        return p - self.lr * g / avg


class AdamRef:
    """torch.optim.Adam: bias-corrected, ``denom = sqrt(v) / sqrt(1 - b2^t) + eps``."""

    def __init__(self, lr: float, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0) -> None:
        self.lr, self.b1, self.b2, self.eps, self.wd = lr, beta1, beta2, eps, weight_decay
        self.m = self.v = 0.0
        self.t = 0

    def step(self, p: np.ndarray, g: np.ndarray) -> np.ndarray:
        self.t += 1
        g = g + self.wd * p
        self.m = self.b1 * self.m + (1 - self.b1) * g
        self.v = self.b2 * self.v + (1 - self.b2) * g * g
        step_size = self.lr / (1 - self.b1**self.t)
        denom = np.sqrt(self.v) / math.sqrt(1 - self.b2**self.t) + self.eps
        return p - step_size * self.m / denom
