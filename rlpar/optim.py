"""Native optimizers that update one flat float32 parameter vector in place.

Each optimizer keeps its state as flat float32 buffers (``state_dict()``), and ``step`` is one
native pass over memory that releases the GIL for large vectors. Update rules follow PyTorch's
definitions (eps outside the square root)::

    opt = RMSProp(net.num_params, lr=7e-4, alpha=0.99, eps=1e-5)
    norm = clip_grad_norm(grad, 40.0)
    opt.step(params, grad)
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from rlpar import _native
from rlpar.parallel import ShardPool

__all__ = [
    "MAX_NONFINITE_IN_A_ROW",
    "SGD",
    "Adam",
    "Optimizer",
    "RMSProp",
    "clip_grad_norm",
    "global_norm",
    "skip_nonfinite_step",
]


def _check_sliceable(name: str, a: object, n: int | None = None) -> np.ndarray:
    """What the native kernels accept, checked before a vector is cut into slices for a pool
    (a slice of a wrong array could pass the kernels' own checks): as they word it, TypeError
    for the type or dtype, ValueError for the shape or layout."""
    if not isinstance(a, np.ndarray) or a.dtype != np.float32:
        got = f"{a.dtype}" if isinstance(a, np.ndarray) else type(a).__name__
        raise TypeError(f"{name} must be a float32 numpy array, got {got}")
    if a.ndim != 1 or (n is not None and a.shape[0] != n) or not a.flags.c_contiguous:
        size = "" if n is None else f" of {n} values"
        layout = "" if a.flags.c_contiguous else " (not contiguous)"
        raise ValueError(
            f"{name} must be a flat contiguous float32 vector{size}, got shape {a.shape}{layout}"
        )
    return a


def _check_pool(pool: object) -> None:
    if not isinstance(pool, ShardPool):
        raise TypeError(f"pool must be an rlpar.ShardPool or None, got {type(pool).__name__}")


def global_norm(grad: np.ndarray, pool: ShardPool | None = None) -> float:
    """Euclidean norm of a flat float32 vector (accumulated in double); with ``pool``, long
    vectors are summed in slices on the pool's threads."""
    if pool is None:
        return _native.global_norm(grad)
    _check_pool(pool)
    _check_sliceable("grad", grad)
    parts = pool.map(lambda sl: _native.global_norm(grad[sl]) ** 2, pool.slices(len(grad)))
    return math.sqrt(math.fsum(parts))


def clip_grad_norm(grad: np.ndarray, max_norm: float, pool: ShardPool | None = None) -> float:
    """Scale ``grad`` (float32 ``[n]``) in place to norm <= ``max_norm``; return the old norm.
    With ``pool``, long vectors are measured and scaled in slices on the pool's threads.

    A gradient holding NaN or inf has no norm to clip to: it is left as it is and the returned
    norm is not finite. Check it (``math.isfinite``) before an optimizer step; the built-in
    agents then skip the step and count it (`skip_nonfinite_step`)."""
    if pool is None:
        return _native.clip_by_global_norm(grad, float(max_norm))
    norm = global_norm(grad, pool)
    if norm > max_norm and norm > 0.0:
        scale = np.float32(max_norm / norm)
        pool.map(lambda sl: np.multiply(grad[sl], scale, out=grad[sl]), pool.slices(len(grad)))
    return norm


#: A run stops when this many learner steps in a row had a gradient that was not finite.
MAX_NONFINITE_IN_A_ROW = 10


def skip_nonfinite_step(state: Any, grad_norm: float) -> bool:
    """True when the learner step must not be applied because its gradient norm ``grad_norm``
    (from `clip_grad_norm`) is NaN or inf; then the step is counted in ``state.extra``
    (``nonfinite_grad_steps``, saved in checkpoints, logged as a learner metric). After
    `MAX_NONFINITE_IN_A_ROW` such steps in a row, raises FloatingPointError naming the learner
    step: the loss has diverged and skipping more would only hide it."""
    extra = state.extra
    if math.isfinite(grad_norm):
        extra["nonfinite_in_a_row"] = 0
        return False
    extra["nonfinite_grad_steps"] = int(extra.get("nonfinite_grad_steps", 0)) + 1
    extra["nonfinite_in_a_row"] = int(extra.get("nonfinite_in_a_row", 0)) + 1
    if extra["nonfinite_in_a_row"] >= MAX_NONFINITE_IN_A_ROW:
        raise FloatingPointError(
            f"learner step {state.steps + 1}: the gradient was not finite (norm {grad_norm}) "
            f"in {extra['nonfinite_in_a_row']} steps in a row; the parameters keep their last "
            "finite values. Lower the learning rate, or look for NaN/inf in rewards or "
            "observations."
        )
    return True


def _check(
    name: str, value: float, low: float, high: float = math.inf, open_low=False, open_high=False
) -> float:
    value = float(value)
    above = value > low if open_low else value >= low
    below = value < high if open_high else value <= high
    if not (above and below and math.isfinite(value)):
        upper = f" and {'<' if open_high else '<='} {high}" if high < math.inf else ""
        bound = f"{'>' if open_low else '>='} {low}{upper}"
        raise ValueError(f"{name} must be {bound}, got {value}")
    return value


def _cut(a, sl: slice | None):
    return a if sl is None or a is None else a[sl]


class Optimizer:
    """Base: flat state buffers by name, and a learning rate that may change between steps."""

    lr: float

    def __init__(self, num_params: int, buffers: tuple[str, ...]) -> None:
        if num_params < 1:
            raise ValueError(f"num_params must be >= 1, got {num_params}")
        self.num_params = int(num_params)
        self._state = {name: np.zeros(self.num_params, np.float32) for name in buffers}
        self.steps = 0

    def step(self, params: np.ndarray, grad: np.ndarray, pool: ShardPool | None = None) -> None:
        """Update ``params`` (float32 ``[num_params]``) in place from ``grad``. With ``pool``,
        long vectors are updated in slices on the pool's threads (every rule is elementwise,
        so the result is the same)."""
        self._check_params(params)
        if pool is None:
            self._update(params, grad, None)
        else:
            _check_pool(pool)
            _check_sliceable("params", params, self.num_params)
            _check_sliceable("grad", grad, self.num_params)
            pool.map(lambda sl: self._update(params, grad, sl), pool.slices(self.num_params))
        self.steps += 1

    def _update(self, params: np.ndarray, grad: np.ndarray, sl: slice | None) -> None:
        """One native update of ``params[sl]`` from ``grad[sl]`` and the state's ``[sl]``
        (``sl`` None: the whole arrays, passed as they came so the native checks see them)."""
        raise NotImplementedError

    def native_step(self) -> tuple | None:
        """This optimizer's next step as `rlpar.train_step`'s one native call takes it: (kind,
        lr, beta1, beta2, alpha, momentum, eps, weight_decay, nesterov, step, buffer 0, 1, 2),
        or None when its rule has no native twin (a subclass's own `_update`): then
        `train_step` calls `step`."""
        return None

    def _rule_is(self, cls: type[Optimizer]) -> bool:
        """True when this optimizer steps exactly as ``cls`` does (no subclass changed it)."""
        return type(self)._update is cls._update and type(self).step is Optimizer.step

    def _buf(self, name: str, sl: slice | None) -> np.ndarray | None:
        return _cut(self._state.get(name), sl)

    def _check_params(self, params: np.ndarray) -> None:
        # Without state buffers to compare against, a wrong size would otherwise go unnoticed.
        if np.shape(params) != (self.num_params,):
            raise ValueError(
                f"params must have shape ({self.num_params},) (the optimizer's num_params), "
                f"got {np.shape(params)}"
            )

    def state_dict(self) -> dict[str, np.ndarray | int | float]:
        """The state buffers (copies), the step count and the learning rate."""
        d: dict[str, np.ndarray | int | float] = {k: v.copy() for k, v in self._state.items()}
        d["steps"] = self.steps
        d["lr"] = self.lr
        return d

    def load_state_dict(self, state: dict[str, np.ndarray | int | float]) -> None:
        """Restore what `state_dict` returned (shapes and names must match)."""
        for name, buf in self._state.items():
            if name not in state:
                raise ValueError(f"optimizer state is missing '{name}'")
            value = np.asarray(state[name])
            if value.shape != buf.shape:
                raise ValueError(
                    f"optimizer state '{name}' must have shape {buf.shape}, got {value.shape}"
                )
            buf[...] = value
        self.steps = int(state["steps"])
        self.lr = float(state["lr"])


class SGD(Optimizer):
    """SGD with optional (Nesterov) momentum and L2 weight decay."""

    def __init__(
        self,
        num_params: int,
        lr: float,
        momentum: float = 0.0,
        weight_decay: float = 0.0,
        nesterov: bool = False,
    ) -> None:
        super().__init__(num_params, ("momentum_buffer",) if momentum else ())
        self.lr = _check("lr", lr, 0.0, open_low=True)
        self.momentum = _check("momentum", momentum, 0.0, 1.0)
        self.weight_decay = _check("weight_decay", weight_decay, 0.0)
        self.nesterov = bool(nesterov)

    def native_step(self) -> tuple | None:
        if not self._rule_is(SGD):
            return None
        buf = self._buf("momentum_buffer", None)
        return ("sgd", self.lr, 0.0, 0.0, 0.0, self.momentum, 0.0, self.weight_decay,
                self.nesterov, self.steps + 1, buf, None, None)  # fmt: skip

    def _update(self, params: np.ndarray, grad: np.ndarray, sl: slice | None) -> None:
        _native.sgd_step(
            _cut(params, sl),
            _cut(grad, sl),
            self._buf("momentum_buffer", sl),
            self.lr,
            self.momentum,
            self.weight_decay,
            self.nesterov,
        )


class RMSProp(Optimizer):
    """RMSProp (plain or centered), with optional momentum."""

    def __init__(
        self,
        num_params: int,
        lr: float,
        alpha: float = 0.99,
        eps: float = 1e-5,
        momentum: float = 0.0,
        centered: bool = False,
        weight_decay: float = 0.0,
    ) -> None:
        names = ("square_avg",) + (("grad_avg",) if centered else ())
        names += ("momentum_buffer",) if momentum else ()
        super().__init__(num_params, names)
        self.lr = _check("lr", lr, 0.0, open_low=True)
        self.alpha = _check("alpha", alpha, 0.0, 1.0)
        self.eps = _check("eps", eps, 0.0, open_low=True)
        self.momentum = _check("momentum", momentum, 0.0, 1.0)
        self.centered = bool(centered)
        self.weight_decay = _check("weight_decay", weight_decay, 0.0)

    def native_step(self) -> tuple | None:
        if not self._rule_is(RMSProp):
            return None
        return ("rmsprop", self.lr, 0.0, 0.0, self.alpha, self.momentum, self.eps,
                self.weight_decay, False, self.steps + 1, self._buf("square_avg", None),
                self._buf("grad_avg", None), self._buf("momentum_buffer", None))  # fmt: skip

    def _update(self, params: np.ndarray, grad: np.ndarray, sl: slice | None) -> None:
        _native.rmsprop_step(
            _cut(params, sl),
            _cut(grad, sl),
            self._buf("square_avg", sl),
            self._buf("grad_avg", sl),
            self._buf("momentum_buffer", sl),
            self.lr,
            self.alpha,
            self.eps,
            self.momentum,
            self.weight_decay,
        )


class Adam(Optimizer):
    """Adam with bias correction and optional L2 weight decay."""

    def __init__(
        self,
        num_params: int,
        lr: float,
        beta1: float = 0.9,
        beta2: float = 0.999,
        eps: float = 1e-8,
        weight_decay: float = 0.0,
    ) -> None:
        super().__init__(num_params, ("exp_avg", "exp_avg_sq"))
        self.lr = _check("lr", lr, 0.0, open_low=True)
        # beta = 1 would divide by a zero bias correction (1 - beta^t) and make params NaN.
        self.beta1 = _check("beta1", beta1, 0.0, 1.0, open_high=True)
        self.beta2 = _check("beta2", beta2, 0.0, 1.0, open_high=True)
        self.eps = _check("eps", eps, 0.0, open_low=True)
        self.weight_decay = _check("weight_decay", weight_decay, 0.0)

    def native_step(self) -> tuple | None:
        if not self._rule_is(Adam):
            return None
        return ("adam", self.lr, self.beta1, self.beta2, 0.0, 0.0, self.eps, self.weight_decay,
                False, self.steps + 1, self._buf("exp_avg", None), self._buf("exp_avg_sq", None),
                None)  # fmt: skip

    def _update(self, params: np.ndarray, grad: np.ndarray, sl: slice | None) -> None:
        _native.adam_step(
            _cut(params, sl),
            _cut(grad, sl),
            self._buf("exp_avg", sl),
            self._buf("exp_avg_sq", sl),
            self.steps + 1,
            self.lr,
            self.beta1,
            self.beta2,
            self.eps,
            self.weight_decay,
        )
