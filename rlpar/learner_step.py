"""The gradient of a learner step, on one thread or on the learner's several.

An agent's `learn` reads as the paper's update::

    grad, metrics = rlpar.loss_gradient(net, state.params, batch, self.loss, state.pool)
    norm = rlpar.clip_grad_norm(grad, max_norm, state.pool)          # clip
    if not rlpar.skip_nonfinite_step(state, norm):
        state.optimizer.step(state.params, grad, state.pool)         # step

`loss_gradient` runs the net on the unroll (x_0..x_T), calls the agent's ``loss`` on its
outputs, and backpropagates the output gradient that ``loss`` returns. With
``runtime.learner_threads`` > 1 the runtime hands the agent a `rlpar.ShardPool`
(``state.pool``) and `loss_gradient` spreads the step over its threads, in one of two ways
(`learner_split` picks):

- ``"rows"``: the net's forward and backward split the torso's batch rows over the threads
  inside each native call (``pool.native``); ``loss`` and a recurrent core run once.
- ``"shards"``: the N columns are cut into one shard per thread (`rlpar.Batch.split`); each
  shard's forward, ``loss`` and backward run on its own thread into a gradient buffer of its
  own (`rlpar.ShardPool.buffers`), its output gradient weighted by its share of the batch's
  valid steps; the buffers are then summed, in slices on the pool.

The shards' gradients add up to the whole batch's because ``loss`` is a mean over the valid
steps (``batch.mask``): that is the one thing `loss_gradient` asks of it.

Several optimizer steps on one batch (PPO's epochs x minibatches) are `minibatches`::

    for epoch in range(epochs):
        for mb in rlpar.minibatches(batch, count, state.rng):      # reshuffled each epoch
            grad, metrics = rlpar.loss_gradient(net, state.params, mb, self.loss, state.pool)
            ...                                                    # clip, step, as above

`train_step` is those three lines (gradient, clip, step) as one call; with a built-in loss
(`rlpar.NativeLoss`) it runs as one native call that holds the GIL only to enter and leave,
so the learner takes nothing from the actors' Python between its pieces::

    metrics = rlpar.train_step(net, state, batch, loss, max_grad_norm=40.0)
    for cols in rlpar.minibatch_columns(batch, count, state.rng):  # PPO: columns, no copies
        metrics = rlpar.train_step(net, state, batch, loss, max_grad_norm=0.5, columns=cols)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from rlpar import _native
from rlpar.config import ConfigError
from rlpar.data import Batch
from rlpar.losses import NativeLoss, PpoOptions
from rlpar.nn import Conv2d, Net, Tape
from rlpar.optim import clip_grad_norm, skip_nonfinite_step
from rlpar.parallel import ShardPool, ThreadPool
from rlpar.state import LearnerState

__all__ = [
    "Loss",
    "NativeLearn",
    "learner_split",
    "loss_gradient",
    "minibatch_columns",
    "minibatches",
    "splits_into_shards",
    "train_step",
    "train_steps",
]

#: ``loss(net, out, batch) -> (dout, metrics)``: ``out`` float32 [T+1, N, output_size] is the
#: net at ``batch.obs`` (row T bootstraps); ``dout`` is the loss's gradient w.r.t. ``out``
#: (float32, the same T+1 x N x output_size values; the step may scale it in place); the loss
#: is a mean over the valid steps (``batch.mask``); ``metrics`` are scalars.
Loss = Callable[[Net, np.ndarray, Batch], tuple[np.ndarray, dict[str, float]]]


@dataclass(frozen=True)
class NativeLearn:
    """What a built-in agent's `rlpar.Agent.learn` does on each batch, said so that the runtime
    may run it in its own native loop (`rlpar.Agent.native_learn`): ``passes`` optimizer steps
    of ``loss`` (an actor-critic `NativeLoss`) on the whole batch as it came, each
    `train_step` with ``max_grad_norm`` and the learner state's optimizer at its current
    learning rate. The runtime's loop then takes each batch, steps and publishes with the GIL
    released, many learner steps a call; its metrics are the last step's: ``loss``'s,
    ``grad_norm``, ``learning_rate`` and ``nonfinite_grad_steps``, as the built-in agents'
    `learn` reports them. ``passes = 0`` is a learner that takes each batch and publishes its
    parameters unchanged (metrics: ``learning_rate`` alone), for an agent whose `learn` does
    nothing: what the runtime costs the actors around a learner step (`rlpar bench
    runtime`'s idle learner)."""

    loss: NativeLoss
    passes: int = 1
    max_grad_norm: float = 40.0

    def __post_init__(self) -> None:
        if not isinstance(self.loss, NativeLoss) or isinstance(self.loss.options, PpoOptions):
            raise TypeError(
                "NativeLearn.loss: expected an actor-critic rlpar.NativeLoss (IMPALA's, A3C's), "
                f"got {self.loss!r}"
            )
        if isinstance(self.passes, bool) or not isinstance(self.passes, int) or self.passes < 0:
            raise ValueError(f"NativeLearn.passes: expected an integer >= 0, got {self.passes!r}")
        if not self.max_grad_norm > 0:
            raise ValueError(
                f"NativeLearn.max_grad_norm: expected a number > 0, got {self.max_grad_norm!r}"
            )


def loss_gradient(
    net: Net,
    params: np.ndarray,
    batch: Batch,
    loss: Loss,
    pool: ShardPool | None = None,
) -> tuple[np.ndarray, dict[str, float]]:
    """The gradient of ``loss`` on ``batch`` w.r.t. ``params`` (float32 [num_params]) and
    ``loss``'s metrics: forward (a recurrent net from ``batch.core_state``), ``loss``,
    backward, all natively with the GIL released but for ``loss``'s own Python; with ``pool``,
    spread over its threads as `learner_split` says.

    Split into shards, the metrics are the shards', averaged with the weights of their valid
    steps (a ``valid_steps`` metric is the whole batch's count), and the gradient is one of
    ``pool.buffers``, overwritten by the next sharded step. A given thread count is
    reproducible; its sums round differently from one thread's."""
    split = learner_split(net, pool, batch)
    if split == "shards":
        assert pool is not None  # learner_split says "shards" only with a pool
        return _sharded_gradient(net, params, batch, loss, pool)
    native = pool.native if pool is not None and split == "rows" else None
    tape, dout, metrics = _forward_loss(net, params, batch, loss, native)
    try:
        grad = net.backward(tape, dout, pool=native)
    finally:
        tape.release()
    return grad, metrics


def train_step(
    net: Net,
    state: LearnerState,
    batch: Batch,
    loss: Loss,
    *,
    max_grad_norm: float,
    columns: np.ndarray | None = None,
    native: bool = True,
) -> dict[str, float]:
    """One optimizer step of ``loss`` on ``batch`` (or on its ``columns``, int64 [M]: a
    minibatch of whole unrolls, `minibatch_columns`): the gradient (`loss_gradient`, on
    ``state.pool``), its norm clipped to ``max_grad_norm`` (`clip_grad_norm`), and
    ``state.optimizer``'s step on ``state.params``, skipped and counted when the norm is not
    finite (`skip_nonfinite_step`). Returns ``loss``'s metrics and ``grad_norm`` (before
    clipping).

    With a `rlpar.NativeLoss` and one of rlpar's optimizers the whole step is one native call
    with the GIL released (the columns gathered there too), unless the step is split into
    column shards (`learner_split`) or ``native`` is False: then it is the separate calls
    above, which give the same numbers. Any other ``loss`` (an agent's Python) takes that path."""
    pool = state.pool
    if native and isinstance(loss, NativeLoss):
        optim = state.optimizer.native_step()
        split = (
            learner_split(net, pool, batch)
            if columns is None
            else _split(net, pool, batch.obs.shape[0], len(columns))
        )
        if optim is not None and split != "shards":
            return _fused_step(net, state, batch, loss, max_grad_norm, columns, optim, split)
    mb = batch if columns is None else batch.columns(columns)
    grad, metrics = loss_gradient(net, state.params, mb, loss, pool)
    metrics["grad_norm"] = norm = clip_grad_norm(grad, max_grad_norm, pool)
    if not skip_nonfinite_step(state, norm):
        state.optimizer.step(state.params, grad, pool)
    return metrics


def train_steps(
    net: Net,
    state: LearnerState,
    batch: Batch,
    loss: Loss,
    *,
    max_grad_norm: float,
    columns: Sequence[np.ndarray | None],
    native: bool = True,
) -> list[dict[str, float]]:
    """`train_step` on each of ``columns`` in turn (int64 [M] each, or None for all the
    batch's columns): PPO's epochs x minibatches, one optimizer step per entry, in order.
    Returns each step's metrics.

    Where `train_step` would be one native call, the whole sequence is one native call that
    holds the GIL only to enter and leave (a learner that lets go of the GIL once a batch
    instead of once a minibatch: each time it takes it back while an actor steps a Python env,
    that actor waits for it). Bit for bit the same steps as calling `train_step` on each entry;
    a step whose gradient is not finite is skipped and counted as `train_step` does, and the
    steps after it then run one call each."""
    if isinstance(columns, np.ndarray) or not isinstance(columns, Sequence):
        raise TypeError(
            "columns: expected a list with one entry per step (int64 [M] column indices or "
            f"None), got {type(columns).__name__}"
        )
    if not columns:
        raise ValueError("columns: expected at least one step's columns, got none")
    optim, native_pool = _one_call(net, state, batch, loss, columns) if native else (None, None)
    if optim is None or len(columns) == 1:
        return [
            train_step(net, state, batch, loss, max_grad_norm=max_grad_norm, columns=c,
                       native=native)
            for c in columns
        ]  # fmt: skip
    assert isinstance(loss, NativeLoss)  # optim is set only for a NativeLoss
    grad = _grad_buffer(net, state)
    done = np.zeros(1, np.int64)
    try:
        results = _native.train_steps(
            net, state.params, grad, loss.native, batch, list(columns), done=done,
            value_mean=loss.value_mean, value_std=loss.value_std,
            max_grad_norm=float(max_grad_norm), optimizer=optim, pool=native_pool,
        )  # fmt: skip
    except BaseException:
        # A step raised (a Python layer's error): the steps before it were applied, each with
        # a finite gradient (a non-finite one ends the call without raising). Count them, so
        # the optimizer's step count matches its buffers, as one call per step would leave it.
        state.count_steps(applied=int(done[0]), norms=(0.0,) if done[0] else ())
        raise
    out = [_record_step(state, metrics, norm, applied) for metrics, norm, applied in results]
    rest = columns[len(results) :]  # after a step that was not finite: one call each
    return out + [
        train_step(net, state, batch, loss, max_grad_norm=max_grad_norm, columns=c) for c in rest
    ]


def _one_call(
    net: Net, state: LearnerState, batch: Batch, loss: Loss, columns: Sequence[np.ndarray | None]
) -> tuple[tuple | None, ThreadPool | None]:
    """(the optimizer's native step, the native calls' pool) where `train_steps` can run as one
    native call (a `NativeLoss`, each step sharing the pool as `train_step` would on its own
    columns, all alike and none in shards), else (None, None)."""
    pool = state.pool
    splits = {
        _split(net, pool, batch.obs.shape[0], batch.num_columns if c is None else len(c))
        for c in columns
    }
    if not isinstance(loss, NativeLoss) or len(splits) != 1 or "shards" in splits:
        return None, None
    native_pool = pool.native if pool is not None and splits == {"rows"} else None
    return state.optimizer.native_step(), native_pool


def _fused_step(
    net: Net,
    state: LearnerState,
    batch: Batch,
    loss: NativeLoss,
    max_grad_norm: float,
    columns: np.ndarray | None,
    optim: tuple,
    split: str,
) -> dict[str, float]:
    """`train_step` as one native call (rlpar/train_step.h)."""
    grad = _grad_buffer(net, state)
    native_pool = state.pool.native if state.pool is not None and split == "rows" else None
    metrics, norm, applied = _native.train_step(
        net, state.params, grad, loss.native, batch, columns,
        value_mean=loss.value_mean, value_std=loss.value_std,
        max_grad_norm=float(max_grad_norm), optimizer=optim, pool=native_pool,
    )  # fmt: skip
    return _record_step(state, metrics, norm, applied)


def _grad_buffer(net: Net, state: LearnerState) -> np.ndarray:
    """The learner state's gradient buffer, float32 [num_params], made on first use."""
    grad = state.grad
    if grad is None or grad.shape != (net.num_params,):
        grad = state.grad = np.empty(net.num_params, np.float32)
    return grad


def _record_step(
    state: LearnerState, metrics: dict[str, float], norm: float, applied: bool
) -> dict[str, float]:
    """A native step's outcome on the Python side: ``grad_norm`` in its metrics, the optimizer's
    step count, a skipped non-finite step counted (raises after too many in a row)."""
    metrics["grad_norm"] = norm
    state.count_steps(applied=int(applied), norms=(norm,))
    return metrics


def learner_split(
    net: Net, pool: ShardPool | None, batch: Batch
) -> Literal["none", "rows", "shards"]:
    """How a learner step on ``batch`` uses ``pool``: ``"none"`` (no pool, one thread, or too
    little work to split), ``"rows"`` (the native calls split the torso's batch rows) or
    ``"shards"`` (one column shard per thread); ``pool.split`` chooses, and "auto" picks:

    rows for nets with a conv torso, which is nearly all of their step (measured on 2 cores,
    Nature torso [20, 32]: rows x1.4-2.0 of one thread, shards within noise of it, while rows
    runs the step's Python once);
    shards for nets on flat inputs, where the loss and the heads (which rows run once) or an
    LSTM core (sequential in time) are a large share of the step (an MLP on [20, 256]: shards
    x1.5-1.9, rows x1.2)."""
    return _split(net, pool, batch.obs.shape[0], batch.num_columns)


def _split(
    net: Net, pool: ShardPool | None, steps: int, columns: int
) -> Literal["none", "rows", "shards"]:
    """`learner_split` of a step on ``columns`` unrolls of ``steps`` observations each."""
    if pool is None or pool.threads == 1:
        return "none"
    if splits_into_shards(net, pool.threads, pool.split, columns):
        return "shards"
    if _resolve(net, pool.split) == "shards":
        return "none"
    return "rows" if net.torso_parts(pool.native, steps * columns) > 1 else "none"


def splits_into_shards(net: Net, threads: int, split: str, columns: int) -> bool:
    """Whether a learner step on ``columns`` unrolls is cut into column shards (`learner_split`
    ``"shards"``) with ``threads`` learner threads and ``split`` (`RuntimeConfig.learner_split`):
    known before the run's pool exists, for the run's plan (`rlpar.runtime.plan`)."""
    return threads > 1 and _resolve(net, split) == "shards" and columns >= 2


def _resolve(net: Net, split: str) -> str:
    """``split`` with "auto" resolved (the `learner_split` docstring): rows for a conv torso."""
    if split != "auto":
        return split
    return "rows" if any(isinstance(layer, Conv2d) for layer in net.spec.layers) else "shards"


def _forward_loss(
    net: Net, params: np.ndarray, batch: Batch, loss: Loss, native: ThreadPool | None
) -> tuple[Tape, np.ndarray, dict[str, float]]:
    """The forward's tape (the caller releases it), ``loss``'s output gradient as
    [(T+1) N, output_size], and its metrics. ``native``: the forward's intra-op threads."""
    t_len, n = batch.rewards.shape
    obs = batch.obs.reshape((t_len + 1) * n, *batch.obs.shape[2:])
    # A recurrent net re-runs the unroll from the actor's stored state (truncated BPTT).
    out, tape = net.forward_train(params, obs, pool=native, **batch.core_args())
    try:
        dout, metrics = loss(net, out.reshape(t_len + 1, n, -1), batch)
        if not isinstance(dout, np.ndarray) or dout.dtype != np.float32:
            got = dout.dtype if isinstance(dout, np.ndarray) else type(dout).__name__
            raise TypeError(f"loss: dout must be a float32 numpy array, got {got}")
        if dout.size != out.size:
            raise ValueError(
                f"loss: dout must hold the gradient of out [T+1, N, output_size] = "
                f"[{t_len + 1}, {n}, {net.output_size}], got shape {dout.shape}"
            )
    except BaseException:
        tape.release()
        raise
    return tape, dout.reshape(out.shape), metrics


def _sharded_gradient(
    net: Net, params: np.ndarray, batch: Batch, loss: Loss, pool: ShardPool
) -> tuple[np.ndarray, dict[str, float]]:
    """`loss_gradient` shard by shard on ``pool``."""
    shards = batch.split(pool.threads)
    # The loss is a mean over valid (mask) steps: each shard's output gradient is scaled by its
    # share of them, so the shards' parameter gradients simply add up.
    valid = np.array([s.mask.sum() for s in shards], np.float64)
    total = valid.sum()
    weights = valid / total if total > 0 else np.full(len(shards), 1.0 / len(shards))
    grad, *parts = pool.buffers(net.num_params)

    def shard_gradient(i: int) -> dict[str, float]:
        tape, dout, metrics = _forward_loss(net, params, shards[i], loss, None)
        try:
            dout *= np.float32(weights[i])
            net.backward(tape, dout, grad=parts[i])
        finally:
            tape.release()
        return metrics

    shard_metrics = pool.map(shard_gradient, range(len(shards)))

    def reduce(sl: slice) -> None:
        acc = grad[sl]
        np.copyto(acc, parts[0][sl])
        for g in parts[1 : len(shards)]:
            np.add(acc, g[sl], out=acc)

    pool.map(reduce, pool.slices(net.num_params))
    metrics = {
        key: float(sum(w * m[key] for m, w in zip(shard_metrics, weights, strict=True)))
        for key in shard_metrics[0]
    }
    if "valid_steps" in metrics:
        metrics["valid_steps"] = float(total)
    return grad, metrics


def minibatch_columns(
    batch: Batch, count: int, rng: np.random.Generator | None = None, *, key: str = "minibatches"
) -> list[np.ndarray]:
    """The columns of `minibatches`, int64 [N / count] each (sorted), without copying the
    batch: for `train_step`'s ``columns``. The same draws from ``rng`` as `minibatches`."""
    n = batch.num_columns
    if isinstance(count, bool) or not isinstance(count, int) or count < 1 or n % count:
        raise ConfigError(
            f"{key}: expected a divisor of the batch's {n} columns (runtime.batch_rollouts x "
            f"runtime.envs_per_actor), so that each minibatch holds whole unrolls, got {count!r}"
        )
    order = np.arange(n) if rng is None else rng.permutation(n)
    size = n // count
    return [np.sort(order[i * size : (i + 1) * size]) for i in range(count)]


def minibatches(
    batch: Batch, count: int, rng: np.random.Generator | None = None, *, key: str = "minibatches"
) -> list[Batch]:
    """``batch``'s N columns cut into ``count`` minibatches of N / count columns each: whole
    unrolls [T, N / count], each column with its core state (a recurrent net re-runs each
    unroll from the state its actor stored). The columns are in a fresh random order drawn from
    ``rng`` (pass ``state.rng``: the runtime seeds it and checkpoints save it, so a
    deterministic run and a resumed one cut the same minibatches), in order when None.

    Raises `ConfigError` naming ``key`` when ``count`` does not divide N (an agent checks it
    up front in `Agent.check_runtime`, against ``runtime.batch_columns``)."""
    if count == 1 and rng is None and batch.num_columns >= 1:
        minibatch_columns(batch, count, rng, key=key)  # the same checks
        return [batch]
    return [batch.columns(cols) for cols in minibatch_columns(batch, count, rng, key=key)]
