"""Actor-critic losses computed natively (GIL released), with gradients w.r.t. the net outputs.

See ``native/include/rlpar/losses.h`` for the formulas (A3C n-step returns; IMPALA V-trace;
PPO's clipped surrogate on asynchronous rollouts, `ppo_loss`), and `NativeLoss`: either of
them as an `rlpar.Loss` that `rlpar.train_step` runs inside one native call. `LossOptions` (and
`PpoOptions`) are what the losses discount, clip and weigh, and their defaults are the only
ones: the built-in agents' configs take theirs from them, and `actor_critic_loss` passes every
value to the native core (whose binding has no defaults), so the ones written in
``losses.h`` are never the ones a Python caller gets.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np

from rlpar import _native
from rlpar.config import check_field_types

if TYPE_CHECKING:
    from rlpar.data import Batch
    from rlpar.nn import Net

PolicyKind = Literal["categorical", "gaussian", "multi_categorical"]
"""A policy head: one Categorical over the logits, a diagonal Gaussian (means and log-stds),
or one Categorical per action dimension (gymnasium's MultiDiscrete and MultiBinary)."""

__all__ = [
    "LossOptions",
    "NativeLoss",
    "PpoOptions",
    "actor_critic_loss",
    "bound_penalty",
    "ppo_loss",
]


@dataclass(frozen=True)
class LossOptions:
    """The options of `actor_critic_loss` (names as IMPALA's and TorchBeast's)::

    L = mean_t [ -A_t log pi(a_t|x_t) + baseline_cost 0.5 (vs_t - V(x_t))^2
                 - entropy_cost H(pi(.|x_t)) ]      over the valid (mask) steps

    The native core checks the values (``gamma`` in [0, 1], the bars > 0)."""

    gamma: float = 0.99
    """Discount factor."""
    importance_weighting: bool = False
    """False: the targets are A3C's n-step returns (every ratio pi/mu taken as 1). True:
    IMPALA's V-trace targets, with the ratios clipped by the three bars below."""
    rho_bar: float = 1.0
    """Clip of the importance weights in the V-trace targets."""
    c_bar: float = 1.0
    """Clip of the trace-cutting coefficients."""
    pg_rho_bar: float = 1.0
    """Clip of the importance weights in the policy-gradient advantage."""
    baseline_cost: float = 0.5
    """Weight of the value loss."""
    entropy_cost: float = 0.01
    """Weight of the entropy bonus."""

    def __post_init__(self) -> None:
        check_field_types(self)  # LossOptions(gamma="x") fails here, naming the field


def actor_critic_loss(
    out: np.ndarray,
    behaviour: np.ndarray,
    actions: np.ndarray,
    rewards: np.ndarray,
    terminated: np.ndarray,
    truncated: np.ndarray,
    mask: np.ndarray,
    *,
    policy: PolicyKind,
    policy_begin: int,
    num_actions: int,
    value_col: int,
    log_std_begin: int = 0,
    action_dims: Sequence[int] = (),
    options: LossOptions | None = None,
) -> tuple[np.ndarray, dict[str, float]]:
    """Loss gradient ``dout`` float32 [T+1, N, O] and scalar metrics.

    - ``out``: float32 [T+1, N, O], the learner's outputs at x_0..x_T (row T bootstraps)
    - ``behaviour``: float32 [T, N, O], the actors' outputs (read when importance_weighting)
    - ``actions``: int64 [T, N] (categorical), float32 [T, N, A] (gaussian, unclipped) or
      int64 [T, N, D] (multi_categorical: one action per dimension)
    - ``rewards``: float32 [T, N]; ``terminated``, ``truncated``, ``mask``: bool [T, N]
    - ``policy`` .. ``log_std_begin``: where the policy and the value sit in a row of ``out``
    - ``action_dims``: "multi_categorical" only, the logits of each action dimension (D of
      them, consecutive from ``policy_begin``, summing to ``num_actions``): one independent
      Categorical per dimension, log-probabilities and entropies summed over dimensions
    - ``options``: `LossOptions` (None: its defaults).
    """
    options = LossOptions() if options is None else options
    return _native.actor_critic_loss(
        out, behaviour, actions, rewards, terminated, truncated, mask,
        policy=policy, policy_begin=policy_begin, num_actions=num_actions,
        log_std_begin=log_std_begin, value_col=value_col, action_dims=list(action_dims),
        gamma=options.gamma,
        importance_weighting=options.importance_weighting, rho_bar=options.rho_bar,
        c_bar=options.c_bar, pg_rho_bar=options.pg_rho_bar, value_coef=options.baseline_cost,
        entropy_coef=options.entropy_cost,
    )  # fmt: skip


@dataclass(frozen=True)
class PpoOptions:
    """The options of `ppo_loss` (see ``native/include/rlpar/losses.h`` for the formulas)::

    r_t = pi(a_t|x_t) / mu(a_t|x_t)             against the behaviour policy that acted
    L = mean_t [ -min(r_t Â_t, clip(r_t, lo, hi) Â_t) + baseline_cost L_v(t)
                 - entropy_cost H(pi(.|x_t)) ]        over the valid (mask) steps

    The native core checks the values (``gamma`` and ``gae_lambda`` in [0, 1], the bars and
    ``clip_eps`` > 0, ``value_std`` > 0)."""

    gamma: float = 0.99
    """Discount factor."""
    clip_eps: float = 0.2
    """The surrogate's clip: the ratio is clipped to [1 - clip_eps, 1 + clip_eps]
    (``ratio_clip = "symmetric"``, PPO's and CleanRL's form) or to [1 / (1 + clip_eps),
    1 + clip_eps] (``"reciprocal"``, Sample Factory's)."""
    ratio_clip: str = "symmetric"
    """The form of the clip interval (see ``clip_eps``)."""
    advantage: str = "vtrace"
    """"vtrace": A_t = r_t + gamma vs_{t+1} - V(x_t) on V-trace targets (IMPALA's advantage,
    without its rho_pg: the surrogate's ratio weighs step t). "gae": A_t = vs_t - V(x_t) with
    the traces c_i = gae_lambda min(c_bar, r_i), which is GAE(lambda) when on-policy."""
    gae_lambda: float = 1.0
    """lambda of the traces (both advantages; 1: V-trace as published)."""
    rho_bar: float = 1.0
    """Clip of the importance weights in the V-trace targets."""
    c_bar: float = 1.0
    """Clip of the trace-cutting coefficients."""
    normalize_advantages: bool = True
    """Â_t = (A_t - mean) / (std + 1e-8) over the call's valid steps (a minibatch's)."""
    value_clip: float = 0.0
    """> 0: the value loss is the larger of the plain one and the one of the value clipped to
    within ``value_clip`` of the actor's (``behaviour``'s value column), as PPO2 clips it. 0:
    none."""
    baseline_cost: float = 0.5
    """Weight of the value loss."""
    entropy_cost: float = 0.01
    """Weight of the entropy bonus."""

    def __post_init__(self) -> None:
        check_field_types(self)


def ppo_loss(
    out: np.ndarray,
    behaviour: np.ndarray,
    actions: np.ndarray,
    rewards: np.ndarray,
    terminated: np.ndarray,
    truncated: np.ndarray,
    mask: np.ndarray,
    *,
    policy: PolicyKind,
    policy_begin: int,
    num_actions: int,
    value_col: int,
    log_std_begin: int = 0,
    action_dims: Sequence[int] = (),
    options: PpoOptions | None = None,
    value_mean: float = 0.0,
    value_std: float = 1.0,
) -> tuple[np.ndarray, dict[str, float]]:
    """PPO's loss gradient ``dout`` float32 [T+1, N, O] and scalar metrics, natively with the
    GIL released. Arrays as `actor_critic_loss`'s; ``behaviour`` [T, N, O] is always read (it
    is mu, and its value column the old value for ``value_clip``).

    ``value_mean``, ``value_std``: running statistics of the value targets when the value head
    predicts normalised values (V(x) = value_mean + value_std * out_v; the value loss is on
    (vs - value_mean) / value_std); 0 and 1 for a plain value head.

    Metrics: ``loss``, ``policy_loss``, ``value_loss``, ``entropy``, ``approx_kl`` (mean of
    (r - 1) - log r), ``clip_fraction``, ``value_clip_fraction``, ``ratio_mean``/``_min``/
    ``_max``, ``explained_variance`` (1 - Var(vs - V) / Var(vs)), ``mean_advantage`` and
    ``advantage_std`` (before normalisation), ``mean_value``, ``mean_rho``, ``target_mean``
    and ``target_sq_mean`` (of vs), ``valid_steps``."""
    o = PpoOptions() if options is None else options
    return _native.ppo_loss(
        out, behaviour, actions, rewards, terminated, truncated, mask,
        policy=policy, policy_begin=policy_begin, num_actions=num_actions,
        log_std_begin=log_std_begin, value_col=value_col, action_dims=list(action_dims),
        gamma=o.gamma, rho_bar=o.rho_bar,
        c_bar=o.c_bar, value_coef=o.baseline_cost, entropy_coef=o.entropy_cost,
        clip_eps=o.clip_eps, ratio_clip=o.ratio_clip, advantage=o.advantage,
        gae_lambda=o.gae_lambda, normalize_advantages=o.normalize_advantages,
        value_clip=o.value_clip, value_mean=value_mean, value_std=value_std,
    )  # fmt: skip


def bound_penalty(
    mean: np.ndarray, mask: np.ndarray, low: np.ndarray, high: np.ndarray, cost: float
) -> tuple[float, np.ndarray]:
    """How far a Gaussian policy's mean [T, N, A] lies outside the action bounds [A]:
    ``cost * sum_a max(0, |mean - centre| - half_width)^2``, averaged over the valid steps
    (``mask`` [T, N]); returns (loss, its gradient w.r.t. ``mean``, float32 [T, N, A]).

    Why: actions are clipped to the bounds on their way to the env, so where the mean is far
    outside them every sample is clipped, the return no longer depends on the action, and the
    policy gradient is noise there: the mean drifts with nothing pulling it back. This term
    pulls it back to where actions matter."""
    centre = (high + low) / 2
    half = (high - low) / 2
    offset = mean.astype(np.float64) - centre
    excess = np.maximum(np.abs(offset) - half, 0.0) * mask[..., None]
    valid = max(1.0, float(mask.sum()))
    loss = cost * float((excess**2).sum()) / valid
    grad = (2 * cost / valid) * excess * np.sign(offset)
    return loss, grad.astype(np.float32)


_OUTPUT_NAMES = {"categorical": "logits", "gaussian": "mean", "multi_categorical": "logits"}


class NativeLoss:
    """A built-in loss as an `rlpar.Loss`: the actor-critic loss (``options`` a `LossOptions`:
    A3C's n-step returns or IMPALA's V-trace) or PPO's clipped surrogate (a `PpoOptions`), on
    the policy and value columns of the net's output, plus, for a Gaussian policy with finite
    action bounds and ``bound_cost`` > 0, `bound_penalty` on its mean.

    Called as ``loss(net, out, batch)`` it is the native loss call(s) with the GIL released and
    the penalty in numpy, like any `rlpar.Loss`. Handed to `rlpar.train_step`, the whole
    optimizer step (forward, this loss, backward, clipping, the optimizer) is one native call
    instead: the same numbers, with the GIL held only to enter and leave.

    The loss reads ``batch.rewards`` as they are (clip or scale them before, once per batch).
    ``value_mean``, ``value_std``: PPO's running value statistics (see `ppo_loss`), read at
    each call; 0 and 1 for a plain value head."""

    def __init__(
        self,
        options: LossOptions | PpoOptions,
        *,
        policy: PolicyKind,
        policy_begin: int,
        num_actions: int,
        value_col: int,
        log_std_begin: int = 0,
        action_dims: Sequence[int] = (),
        action_low: np.ndarray | None = None,
        action_high: np.ndarray | None = None,
        bound_cost: float = 0.0,
    ) -> None:
        if not isinstance(options, LossOptions | PpoOptions):
            raise TypeError(
                f"options: expected rlpar.LossOptions or rlpar.PpoOptions, got "
                f"{type(options).__name__}"
            )
        self.options = options
        self.policy, self.policy_begin, self.num_actions = policy, policy_begin, num_actions
        self.value_col, self.log_std_begin = value_col, log_std_begin
        self.action_dims = tuple(int(n) for n in action_dims)
        bounded = (
            policy == "gaussian" and bound_cost > 0
            and action_low is not None and action_high is not None
        )  # fmt: skip
        self.bounds = (
            (np.asarray(action_low, np.float64), np.asarray(action_high, np.float64))
            if bounded
            else None
        )
        self.bound_cost = float(bound_cost) if bounded else 0.0
        self.value_mean, self.value_std = 0.0, 1.0
        self.native = self._make_native()

    def _make_native(self) -> _native.TrainLoss:
        options = self.options
        native: dict[str, float | bool | str]
        if isinstance(options, PpoOptions):
            native = {
                "gamma": options.gamma, "rho_bar": options.rho_bar, "c_bar": options.c_bar,
                "value_coef": options.baseline_cost, "entropy_coef": options.entropy_cost,
                "clip_eps": options.clip_eps, "ratio_clip": options.ratio_clip,
                "advantage": options.advantage, "gae_lambda": options.gae_lambda,
                "normalize_advantages": options.normalize_advantages,
                "value_clip": options.value_clip,
            }  # fmt: skip
        else:
            native = {
                "gamma": options.gamma, "importance_weighting": options.importance_weighting,
                "rho_bar": options.rho_bar, "c_bar": options.c_bar,
                "pg_rho_bar": options.pg_rho_bar, "value_coef": options.baseline_cost,
                "entropy_coef": options.entropy_cost,
            }  # fmt: skip
        low, high = self.bounds if self.bounds is not None else (None, None)
        kind = "ppo" if isinstance(options, PpoOptions) else "actor_critic"
        return _native.TrainLoss(
            kind, self.policy, self.policy_begin, self.num_actions, self.log_std_begin,
            self.value_col, list(self.action_dims), native, low, high, self.bound_cost,
        )  # fmt: skip

    def __getstate__(self) -> dict[str, object]:
        """Pickled (a Ray actor process, a copied agent) without the native object, which
        `__setstate__` builds again from the options."""
        state = self.__dict__.copy()
        del state["native"]
        return state

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)
        self.__dict__.setdefault("action_dims", ())
        self.native = self._make_native()

    @classmethod
    def for_net(
        cls,
        net: Net,
        options: LossOptions | PpoOptions,
        *,
        action_low: np.ndarray | None = None,
        action_high: np.ndarray | None = None,
        bound_cost: float = 0.0,
        action_dims: Sequence[int] = (),
    ) -> NativeLoss:
        """The loss on ``net``'s own policy head ("logits", or "mean" and "log_std") and
        "value" output columns (`Net.output_slices`). ``action_dims``: the logits of each
        dimension of a factorized policy over the "logits" columns (a MultiDiscrete action
        space's ``nvec``), which makes it "multi_categorical"."""
        cols = net.output_slices
        if "value" not in cols or not ("logits" in cols or "mean" in cols):
            raise ValueError(
                f"NativeLoss.for_net: expected a net with a Categorical or Gaussian head and a "
                f"Value head, got outputs {sorted(cols)}"
            )
        policy: PolicyKind = "categorical" if "logits" in cols else "gaussian"
        if action_dims:
            policy = "multi_categorical"
        head = cols[_OUTPUT_NAMES[policy]]
        return cls(
            options, policy=policy, policy_begin=head.start, num_actions=head.stop - head.start,
            value_col=cols["value"].start,
            log_std_begin=cols["log_std"].start if policy == "gaussian" else 0,
            action_dims=action_dims, action_low=action_low, action_high=action_high,
            bound_cost=bound_cost,
        )  # fmt: skip

    def __call__(
        self, net: Net, out: np.ndarray, batch: Batch
    ) -> tuple[np.ndarray, dict[str, float]]:
        """The loss on ``out`` float32 [T+1, N, O] (the net at ``batch.obs``): (dout [T+1, N,
        O], metrics), as `rlpar.Loss` says."""
        arrays = (
            out, batch.behaviour, batch.actions, batch.rewards, batch.terminated,
            batch.truncated, batch.mask,
        )  # fmt: skip
        policy, begin, actions, value = (
            self.policy, self.policy_begin, self.num_actions, self.value_col
        )  # fmt: skip
        if isinstance(self.options, PpoOptions):
            dout, metrics = ppo_loss(
                *arrays, policy=policy, policy_begin=begin, num_actions=actions,
                value_col=value, log_std_begin=self.log_std_begin,
                action_dims=self.action_dims, options=self.options,
                value_mean=self.value_mean, value_std=self.value_std,
            )  # fmt: skip
        else:
            dout, metrics = actor_critic_loss(
                *arrays, policy=policy, policy_begin=begin, num_actions=actions,
                value_col=value, log_std_begin=self.log_std_begin,
                action_dims=self.action_dims, options=self.options,
            )  # fmt: skip
        if self.bounds is not None:
            t_len = batch.unroll_length
            cols = slice(self.policy_begin, self.policy_begin + self.num_actions)
            bound_loss, dmean = bound_penalty(
                out[:t_len, :, cols], batch.mask, *self.bounds, self.bound_cost
            )
            dout[:t_len, :, cols] += dmean
            metrics["bound_loss"] = bound_loss
            metrics["loss"] += bound_loss
        return dout, metrics
