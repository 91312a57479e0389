"""Actor-critic losses computed natively (GIL released), with gradients w.r.t. the net outputs.

See ``native/include/rlpar/losses.h`` for the formulas (A3C n-step returns; IMPALA V-trace).
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from rlpar import _native

__all__ = ["actor_critic_loss"]


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
    gamma: float,
    importance_weighting: bool,
    log_std_begin: int = 0,
    rho_bar: float = 1.0,
    c_bar: float = 1.0,
    pg_rho_bar: float = 1.0,
    value_coef: float = 0.5,
    entropy_coef: float = 0.01,
) -> tuple[np.ndarray, dict[str, float]]:
    """Loss gradient ``dout`` float32 [T+1, N, O] and scalar metrics.

    - ``out``: float32 [T+1, N, O], the learner's outputs at x_0..x_T (row T bootstraps)
    - ``behaviour``: float32 [T, N, O], the actors' outputs (read when importance_weighting)
    - ``actions``: int64 [T, N] (categorical) or float32 [T, N, A] (gaussian, unclipped)
    - ``rewards``: float32 [T, N]; ``terminated``, ``truncated``, ``mask``: bool [T, N]
    - ``importance_weighting``: False = A3C n-step returns; True = IMPALA V-trace with
      ``rho_bar``, ``c_bar`` and ``pg_rho_bar`` clipping.
    """
    return _native.actor_critic_loss(
        out, behaviour, actions, rewards, terminated, truncated, mask,
        policy=policy, policy_begin=policy_begin, num_actions=num_actions,
        log_std_begin=log_std_begin, value_col=value_col, gamma=gamma,
        importance_weighting=importance_weighting, rho_bar=rho_bar, c_bar=c_bar,
        pg_rho_bar=pg_rho_bar, value_coef=value_coef, entropy_coef=entropy_coef,
    )  # fmt: skip
