"""Actor-critic losses computed natively (GIL released), with gradients w.r.t. the net outputs.

See ``native/include/rlpar/losses.h`` for the formulas (A3C n-step returns; IMPALA V-trace).
`LossOptions` is what the loss discounts, clips and weighs, and its defaults are the only ones
on the Python side: the built-in agents' configs take theirs from it, and `actor_critic_loss`
passes every value to the native core, so the defaults written there (``losses.h``, the
binding's keywords) are never the ones a Python caller gets.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Literal

import numpy as np

from rlpar import _native
from rlpar.config import check_field_types

__all__ = ["LossOptions", "actor_critic_loss"]


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


# The keywords actor_critic_loss took before LossOptions, and the option each one now is.
_KEYWORDS = {
    "gamma": "gamma",
    "importance_weighting": "importance_weighting",
    "rho_bar": "rho_bar",
    "c_bar": "c_bar",
    "pg_rho_bar": "pg_rho_bar",
    "value_coef": "baseline_cost",
    "entropy_coef": "entropy_cost",
}


def actor_critic_loss(
    out: np.ndarray,
    behaviour: np.ndarray,
    actions: np.ndarray,
    rewards: np.ndarray,
    terminated: np.ndarray,
    truncated: np.ndarray,
    mask: np.ndarray,
    *,
    policy: Literal["categorical", "gaussian"],
    policy_begin: int,
    num_actions: int,
    value_col: int,
    log_std_begin: int = 0,
    options: LossOptions | None = None,
    **deprecated: float,
) -> tuple[np.ndarray, dict[str, float]]:
    """Loss gradient ``dout`` float32 [T+1, N, O] and scalar metrics.

    - ``out``: float32 [T+1, N, O], the learner's outputs at x_0..x_T (row T bootstraps)
    - ``behaviour``: float32 [T, N, O], the actors' outputs (read when importance_weighting)
    - ``actions``: int64 [T, N] (categorical) or float32 [T, N, A] (gaussian, unclipped)
    - ``rewards``: float32 [T, N]; ``terminated``, ``truncated``, ``mask``: bool [T, N]
    - ``policy`` .. ``log_std_begin``: where the policy and the value sit in a row of ``out``
    - ``options``: `LossOptions` (None: its defaults).

    The options as keywords (``gamma=``, ``value_coef=``, ...), as before `LossOptions`, still
    work, with a DeprecationWarning naming the option each one is now.
    """
    options = _options(options, deprecated)
    return _native.actor_critic_loss(
        out, behaviour, actions, rewards, terminated, truncated, mask,
        policy=policy, policy_begin=policy_begin, num_actions=num_actions,
        log_std_begin=log_std_begin, value_col=value_col, gamma=options.gamma,
        importance_weighting=options.importance_weighting, rho_bar=options.rho_bar,
        c_bar=options.c_bar, pg_rho_bar=options.pg_rho_bar, value_coef=options.baseline_cost,
        entropy_coef=options.entropy_cost,
    )  # fmt: skip


def _options(options: LossOptions | None, keywords: dict[str, float]) -> LossOptions:
    """``options``, or the `LossOptions` that the old-style ``keywords`` spell (warning)."""
    unknown = sorted(set(keywords) - set(_KEYWORDS))
    if unknown:
        raise TypeError(f"actor_critic_loss() got an unexpected keyword argument {unknown[0]!r}")
    if not keywords:
        return LossOptions() if options is None else options
    if options is not None:
        raise TypeError(
            f"actor_critic_loss: pass the loss options in options=LossOptions(...) only, not "
            f"also as keywords ({', '.join(keywords)})"
        )
    new = {_KEYWORDS[k]: v for k, v in keywords.items()}
    spelled = ", ".join(f"{k}={v!r}" for k, v in new.items())
    warnings.warn(
        f"actor_critic_loss({', '.join(f'{k}=...' for k in keywords)}) is deprecated: pass "
        f"options=rlpar.LossOptions({spelled})",
        DeprecationWarning,
        stacklevel=3,
    )
    return LossOptions(**new)  # type: ignore[arg-type]
