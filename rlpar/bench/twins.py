"""Twins of a native `rlpar.Net` for the benchmarks to race: the same maths in numpy and in
torch, reading the same flat parameters, and the check that a twin agrees before it is timed.

- `numpy_forward(net, params)`: ``f(obs [B, *input_shape]) -> out float32 [B, output_size]``;
- `torch_twin(net, params, torch)`: a ``torch.nn.Sequential`` with the net's weights, fed by
  `torch_input` (NCHW float32 for image nets);
- `check_twin`: raises when a twin's output differs from the native net's.

Layers: Linear, Conv2d, ReLU, Tanh, Flatten (torch's twin also MaxPool2d, Residual, LayerNorm
on flat inputs, Concat and Embedding); heads: Categorical and Value.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

import rlpar
from rlpar.nn import Layer

__all__ = ["check_twin", "numpy_forward", "torch_input", "torch_twin"]


def _affine(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    return x @ w + b


def _conv_nhwc(w: np.ndarray, b: np.ndarray, stride: int, padding: int) -> Callable:
    """``x [B, H, W, C] -> [B, OH, OW, OC]`` by im2col and one matmul; ``w [K, K, C, OC]``."""
    k, _, c, oc = w.shape
    # sliding_window_view puts the window axes last: patches are [B, OH, OW, C, K, K].
    w_cols = np.ascontiguousarray(w.transpose(2, 0, 1, 3)).reshape(c * k * k, oc)

    def conv(x: np.ndarray) -> np.ndarray:
        if padding:
            x = np.pad(x, ((0, 0), (padding, padding), (padding, padding), (0, 0)))
        patches = sliding_window_view(x, (k, k), axis=(1, 2))[:, ::stride, ::stride]
        batch, oh, ow = patches.shape[:3]
        cols = patches.reshape(batch * oh * ow, c * k * k)
        return (cols @ w_cols + b).reshape(batch, oh, ow, oc)

    return conv


def _head_matrix(net: rlpar.Net, views: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """All heads as one ``[F, output_size]`` weight and bias (Categorical and Value heads)."""
    for head in net.spec.heads:
        if isinstance(head, rlpar.Gaussian):
            raise NotImplementedError("the benchmark twins cover Categorical and Value heads")
    n = len(net.spec.heads)
    w = np.concatenate([views[f"heads.{h}.weight"] for h in range(n)], axis=1)
    b = np.concatenate([views[f"heads.{h}.bias"] for h in range(n)])
    return w, b


def numpy_forward(net: rlpar.Net, params: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    """The net's forward in float32 numpy, reading the same flat ``params``.

    Returns ``f(obs [B, *input_shape]) -> out [B, output_size]``.
    """
    views = net.param_views(params)
    steps: list[Callable[[np.ndarray], np.ndarray]] = []
    for i, layer in enumerate(net.spec.layers):
        if isinstance(layer, rlpar.Linear):
            w, b = views[f"layers.{i}.weight"], views[f"layers.{i}.bias"]
            steps.append(partial(_affine, w=w, b=b))
        elif isinstance(layer, rlpar.Conv2d):
            w, b = views[f"layers.{i}.weight"], views[f"layers.{i}.bias"]
            steps.append(_conv_nhwc(w, b, layer.stride, layer.padding))
        elif isinstance(layer, rlpar.ReLU):
            steps.append(lambda x: np.maximum(x, 0, out=x))
        elif isinstance(layer, rlpar.Tanh):
            steps.append(lambda x: np.tanh(x, out=x))
        elif isinstance(layer, rlpar.Flatten):
            steps.append(lambda x: x.reshape(len(x), -1))
        else:
            raise NotImplementedError(f"no numpy twin for {type(layer).__name__}")
    head_w, head_b = _head_matrix(net, views)
    scale = np.float32(net.spec.scale)

    def forward(obs: np.ndarray) -> np.ndarray:
        x = obs.astype(np.float32) * scale
        for step in steps:
            x = step(x)
        return x @ head_w + head_b

    return forward


def torch_twin(net: rlpar.Net, params: np.ndarray, torch):
    """A ``torch.nn.Sequential`` with the net's weights (torch layouts: NCHW, weight ``[out, in]``).

    Its input is ``[B, C, H, W]`` float32 for image nets (see `torch_input`), ``[B, D]`` otherwise.
    A Residual is a module whose forward is ``x + body(x)``; a LayerNorm is covered on flat
    inputs only (on images it normalizes channels, which torch's layout puts first). A Concat
    slices its flat input per branch (an image branch permuted to NCHW), runs each branch's
    modules and concatenates their outputs flattened in rlpar's (H, W, C) order; an Embedding
    is ``nn.Embedding`` on the indices, its outputs side by side.
    """
    nn = torch.nn
    views = net.param_views(params)
    shapes = net.activation_shapes  # per-sample input of each layer as run, channels last

    class Residual(nn.Module):  # type: ignore[name-defined]
        def __init__(self, body) -> None:
            super().__init__()
            self.body = nn.Sequential(*body)

        def forward(self, x):
            return x + self.body(x)

    class Concat(nn.Module):  # type: ignore[name-defined]
        def __init__(self, branches: list[tuple[tuple[int, ...], list]]) -> None:
            super().__init__()
            self.shapes = [shape for shape, _ in branches]
            self.branches = nn.ModuleList(nn.Sequential(*body) for _, body in branches)

        def forward(self, x):
            outs, off = [], 0
            for shape, body in zip(self.shapes, self.branches, strict=True):
                size = int(np.prod(shape))
                h = x[:, off : off + size].reshape(len(x), *shape)
                off += size
                h = body(h.permute(0, 3, 1, 2) if len(shape) == 3 else h)
                outs.append((h.permute(0, 2, 3, 1) if h.dim() == 4 else h).reshape(len(x), -1))
            return torch.cat(outs, dim=1)

    class Embedding(nn.Module):  # type: ignore[name-defined]
        def __init__(self, w: np.ndarray) -> None:
            super().__init__()
            self.table = nn.Embedding(*w.shape)
            with torch.no_grad():
                self.table.weight.copy_(torch.tensor(w))

        def forward(self, x):
            return self.table(x.long()).reshape(len(x), -1)

    def load(module, w: np.ndarray, b: np.ndarray):
        with torch.no_grad():  # copies: the views are read-only
            module.weight.copy_(torch.tensor(w))
            module.bias.copy_(torch.tensor(b))
        return module

    def module(layer: Layer, name: str, in_shape: tuple[int, ...], flat_from: tuple):
        """``flat_from``: the image a Flatten right below flattened (else empty)."""
        if isinstance(layer, rlpar.Linear):
            w, b = views[name + "weight"], views[name + "bias"]
            w = _rows_nhwc_to_nchw(w, flat_from)
            return load(nn.Linear(w.shape[0], w.shape[1]), w.T, b)
        if isinstance(layer, rlpar.Conv2d):
            w, b = views[name + "weight"], views[name + "bias"]
            k, _, c, oc = w.shape
            conv = nn.Conv2d(c, oc, k, layer.stride, layer.padding)
            return load(conv, w.transpose(3, 2, 0, 1), b)
        if isinstance(layer, rlpar.MaxPool2d):
            return nn.MaxPool2d(layer.kernel, layer.stride, layer.padding)
        if isinstance(layer, rlpar.LayerNorm) and len(in_shape) == 1:
            return load(nn.LayerNorm(in_shape[0]), views[name + "weight"], views[name + "bias"])
        if isinstance(layer, rlpar.Embedding):
            return Embedding(views[name + "weight"])
        simple = {rlpar.ReLU: nn.ReLU, rlpar.Tanh: nn.Tanh, rlpar.Flatten: nn.Flatten}
        if type(layer) in simple:
            return simple[type(layer)]()
        raise NotImplementedError(f"no torch twin for {type(layer).__name__} on {in_shape}")

    def sequence(layers, prefix: str, run: int) -> tuple[list, int]:
        """Modules of ``layers`` named ``prefix<j>.``, the first run as layer ``run``; and the
        index as run after them."""
        modules = []
        flat_from: tuple[int, ...] = ()  # the image a Flatten just flattened
        for j, layer in enumerate(layers):
            name = f"{prefix}{j}."
            if isinstance(layer, rlpar.Residual):
                body = [
                    module(inner, f"{name}{m}.", shapes[run + m], ())
                    for m, inner in enumerate(layer.body)
                ]
                modules.append(Residual(body))
                run += len(layer.body) + 1
                continue
            if isinstance(layer, rlpar.Concat):
                branches = []
                run += 1  # each branch: its slice, then its layers; then the join
                for k, branch in enumerate(layer.branches):
                    body, run = sequence(branch.layers, f"{name}{k}.", run)
                    # Concat flattens an image branch itself, in rlpar's order.
                    while body and isinstance(body[-1], nn.Flatten):
                        body.pop()
                    branches.append((branch.shape, body))
                    run += 1
                modules.append(Concat(branches))
                continue
            modules.append(module(layer, name, shapes[run], flat_from))
            flat_from = tuple(shapes[run]) if isinstance(layer, rlpar.Flatten) else ()
            run += 1
        return modules, run

    modules, _ = sequence(net.spec.layers, "layers.", 0)
    head_w, head_b = _head_matrix(net, views)
    modules.append(load(nn.Linear(*head_w.shape), head_w.T, head_b))
    return nn.Sequential(*modules)


def _rows_nhwc_to_nchw(w: np.ndarray, image_shape: tuple[int, ...]) -> np.ndarray:
    """Reorder the rows of a Linear after Flatten: rlpar flattens (H, W, C), torch (C, H, W)."""
    if len(image_shape) != 3:
        return w
    h, wd, c = image_shape
    return w.reshape(h, wd, c, -1).transpose(2, 0, 1, 3).reshape(h * wd * c, -1)


def torch_input(net: rlpar.Net, obs: np.ndarray, torch):
    """``obs [B, *input_shape]`` of the net's dtype -> float32 torch input, NCHW for images."""
    x = torch.from_numpy(obs)
    if len(net.input_shape) == 3:
        x = x.permute(0, 3, 1, 2)
    return x.float() * net.spec.scale if net.input_uint8 else x


def check_twin(name: str, got: np.ndarray, want: np.ndarray) -> None:
    """Raise RuntimeError when the ``name`` twin's output ``got`` differs from the native
    net's ``want`` (both float32 [B, output_size]): timing other maths would mean nothing."""
    tol = 1e-3 * (1.0 + float(np.abs(want).max()))
    err = float(np.abs(got - want).max())
    if err > tol:
        raise RuntimeError(
            f"the {name} twin differs from the native net by {err:.3g} (> {tol:.3g})"
        )
