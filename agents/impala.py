"""IMPALA (Espeholt et al. 2018): decoupled actors, V-trace off-policy correction.

for each learner step:
    batch <- B rollouts, each acted by one (possibly stale) policy version mu
    out = net(x_0..x_T)                                  # current policy pi and V
    rho_t = min(rho_bar, pi/mu), c_t = min(c_bar, pi/mu)
    vs_t = V(x_t) + rho_t delta_t + gamma c_t (vs_{t+1} - V(x_{t+1}))
    L = -rho_pg_t (r_t + gamma vs_{t+1} - V(x_t)) log pi(a_t|x_t)
        + baseline_cost * 0.5 (vs_t - V(x_t))^2 - entropy_cost * H(pi(.|x_t))
    params <- optimizer(clip(grad L))
"""

from __future__ import annotations

from dataclasses import dataclass, field

import rlpar

from .common import (
    ActorCriticAgent,
    NetConfig,
    OptimConfig,
    RewardsAndBounds,
    actor_critic_step,
)


@dataclass(frozen=True)
class ImpalaConfig(RewardsAndBounds):
    """IMPALA hyper-parameters (defaults: the paper's, with Adam for small problems)."""

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
    passes: int = 1
    """Optimizer steps on each batch (1: IMPALA as published). More reuse every sample: from
    the second pass on the batch is off-policy for the moved policy too, which V-trace's
    clipped importance weights correct, as for a stale actor."""
    net: NetConfig = field(default_factory=NetConfig)
    """The network torso."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """The optimizer."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.passes < 1:
            raise rlpar.ConfigError(f"passes: expected an integer >= 1, got {self.passes}")
        for key in ("rho_bar", "c_bar", "pg_rho_bar"):
            if getattr(self, key) <= 0:
                raise rlpar.ConfigError(f"{key}: expected a number > 0, got {getattr(self, key)}")


class Impala(ActorCriticAgent):
    """IMPALA with V-trace, computed natively inside the GIL-free learner step."""

    Config = ImpalaConfig

    def learn(self, net: rlpar.Net, state: rlpar.LearnerState, batch: rlpar.Batch) -> dict:
        self.config.optim.schedule(state, batch)
        for _ in range(self.config.passes - 1):
            self._step(net, state, batch)
        return self._step(net, state, batch)

    def _step(self, net: rlpar.Net, state: rlpar.LearnerState, batch: rlpar.Batch) -> dict:
        c = self.config
        return actor_critic_step(
            net,
            state,
            batch,
            self.layout,
            c.optim,
            c.reward_scale,
            self._grad_scratch,
            action_bound_cost=c.action_bound_cost,
            reward_clip=c.reward_clip,
            gamma=c.gamma,
            importance_weighting=True,
            rho_bar=c.rho_bar,
            c_bar=c.c_bar,
            pg_rho_bar=c.pg_rho_bar,
            value_coef=c.baseline_cost,
            entropy_coef=c.entropy_cost,
        )
