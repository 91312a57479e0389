"""`TorchLoss`: a learner's loss written with PyTorch's autodiff, on rlpar's native net.

An agent's ``loss`` (`rlpar.Loss`) returns the gradient of its loss with respect to the net's
output; deriving it by hand is where a new objective costs the most. `TorchLoss` takes a
function that returns the loss itself, as a scalar tensor, written with torch ops::

    def reinforce(out, batch):                     # out: tensor [T + 1, N, output_size]
        heads = batch.heads(out)                   # {"logits": [T + 1, N, n], "value": [T + 1, N]}
        logp = heads["logits"][:-1].log_softmax(-1)
        ...
        return loss, {"entropy": entropy}          # a scalar tensor (and metrics, optional)

    self.loss = rlpar.TorchLoss(reinforce)         # use it as any loss: loss_gradient, train_step

rlpar runs the net's forward and backward natively, as for any loss: the forward's output
becomes a tensor without a copy (``torch.from_numpy``), torch differentiates the function with
respect to it, and that gradient (a float32 array, again without a copy) goes into the native
backward. Torch is imported on the first call, so built-in agents and every other loss never
need it (``pip install "rlpar[torch]"``).

The function must return a **mean over the batch's valid steps** (``batch.mask``), as every
`rlpar.Loss` must: with ``runtime.learner_threads`` > 1 the batch may be cut into column shards
whose gradients are added with weights (`rlpar.learner_split`). It may run on several learner
threads at once, each call with its own tensors; it holds the GIL only for its own duration
(torch's kernels let go of it inside), while actors keep stepping."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from rlpar.data import Batch
from rlpar.nn import Net

if TYPE_CHECKING:
    import torch

__all__ = ["TorchBatch", "TorchLoss"]

_FIELDS = ("obs", "actions", "rewards", "terminated", "truncated", "mask", "behaviour")


def _torch() -> Any:
    try:
        return importlib.import_module("torch")
    except ImportError as e:
        raise ImportError(
            f'rlpar.TorchLoss needs PyTorch: pip install "rlpar[torch]" ({e})'
        ) from None


class TorchBatch:
    """A `rlpar.Batch` seen as tensors, each made on first use without a copy
    (``torch.from_numpy``; don't write to them: they are the learner's batch): ``obs``
    [T + 1, N, ...], ``actions`` [T, N] (or [T, N, A]), ``rewards`` [T, N], ``terminated``,
    ``truncated``, ``mask`` (bool [T, N]), ``behaviour`` [T, N, output_size]; ``batch`` is the
    numpy batch itself. `heads` names the parts of the net's output."""

    def __init__(self, batch: Batch, net: Net, torch_module: Any) -> None:
        self.batch = batch
        self._net = net
        self._torch = torch_module
        self._tensors: dict[str, torch.Tensor] = {}

    def __getattr__(self, name: str) -> torch.Tensor:
        if name not in _FIELDS:
            raise AttributeError(
                f"TorchBatch has no field {name!r}; fields: {', '.join(_FIELDS)} (and .batch)"
            )
        tensor = self._tensors.get(name)
        if tensor is None:
            tensor = self._tensors[name] = self._torch.from_numpy(getattr(self.batch, name))
        return tensor

    def heads(self, out: torch.Tensor) -> dict[str, torch.Tensor]:
        """Named views of ``out`` [..., output_size] (`rlpar.Net.output_slices`): ``value`` is
        [...], the others [..., n]; differentiable, like any slice of ``out``."""
        parts = {}
        for name, sl in self._net.output_slices.items():
            parts[name] = out[..., sl.start] if name == "value" else out[..., sl]
        return parts


LossFunction = Callable[[Any, TorchBatch], Any]
"""``fn(out, batch) -> loss`` or ``(loss, metrics)``: ``out`` a float32 tensor [T + 1, N,
output_size] that requires grad, ``batch`` a `TorchBatch`, ``loss`` a scalar tensor, ``metrics``
a mapping of names to numbers or scalar tensors."""


class TorchLoss:
    """An `rlpar.Loss` from ``fn``, a loss written with torch ops (see the module's docstring).
    Returns ``d loss / d out`` as float32 [T + 1, N, output_size] and the metrics: ``fn``'s own,
    plus ``loss`` (its value) unless ``fn`` names one."""

    def __init__(self, fn: LossFunction) -> None:
        if not callable(fn):
            raise TypeError(f"TorchLoss: expected a function (out, batch) -> loss, got {fn!r}")
        self.fn = fn

    def __call__(
        self, net: Net, out: np.ndarray, batch: Batch
    ) -> tuple[np.ndarray, dict[str, float]]:
        torch = _torch()
        name = getattr(self.fn, "__qualname__", repr(self.fn))
        if not out.flags.writeable:  # torch.from_numpy shares memory; it wants a writable array
            out = out.copy()
        tensor = torch.from_numpy(out).requires_grad_(True)
        with torch.enable_grad():
            result = self.fn(tensor, TorchBatch(batch, net, torch))
            loss, metrics = result if isinstance(result, tuple) else (result, {})
            if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
                got = f"shape {list(loss.shape)}" if isinstance(loss, torch.Tensor) else type(loss)
                raise ValueError(f"TorchLoss {name}: expected a scalar loss tensor, got {got}")
            if not isinstance(metrics, Mapping):
                raise TypeError(
                    f"TorchLoss {name}: expected (loss, metrics) with metrics a mapping, got "
                    f"{type(metrics).__name__}"
                )
            dout = None
            if loss.requires_grad:
                (dout,) = torch.autograd.grad(loss.reshape(()), tensor, allow_unused=True)
        if dout is None:
            raise ValueError(f"TorchLoss {name}: the loss does not depend on out (no gradient)")
        grad = dout.detach().numpy()
        if grad.dtype != np.float32 or not grad.flags.c_contiguous:
            grad = np.ascontiguousarray(grad, np.float32)
        # A metric may be a tensor that carries grad (e.g. the KL a loss also penalizes).
        values = {
            str(k): float(v.detach() if isinstance(v, torch.Tensor) else v)
            for k, v in metrics.items()
        }
        values.setdefault("loss", float(loss.detach()))
        return grad, values
