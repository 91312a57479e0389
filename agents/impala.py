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

import dataclasses
from dataclasses import dataclass, field

import rlpar

from .common import ActorCriticAgent, ActorCriticConfig, NetConfig, OptimConfig


@dataclass(frozen=True)
class ImpalaConfig(ActorCriticConfig):
    """IMPALA hyper-parameters (defaults: the paper's, with Adam for small problems)."""

    rho_bar: float = rlpar.LossOptions.rho_bar
    """Clip of the importance weights in the V-trace targets."""
    c_bar: float = rlpar.LossOptions.c_bar
    """Clip of the trace-cutting coefficients."""
    pg_rho_bar: float = rlpar.LossOptions.pg_rho_bar
    """Clip of the importance weights in the policy-gradient advantage."""
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

    def loss_options(self) -> rlpar.LossOptions:
        """V-trace targets with this config's clips and weights."""
        return dataclasses.replace(
            super().loss_options(),
            importance_weighting=True,
            rho_bar=self.rho_bar,
            c_bar=self.c_bar,
            pg_rho_bar=self.pg_rho_bar,
        )


class Impala(ActorCriticAgent):
    """IMPALA with V-trace, computed natively inside the GIL-free learner step."""

    Config = ImpalaConfig

    def learn(self, net: rlpar.Net, state: rlpar.LearnerState, batch: rlpar.Batch) -> dict:
        c = self.config
        c.optim.schedule(state, batch)  # this batch's learning rate
        loss, batch = self.step_loss(batch)  # the native V-trace loss, the loss's rewards
        # out = net(x_0..x_T) -> V-trace targets -> losses -> backward -> clip -> optimizer,
        # every pass in one native call; a NaN/inf gradient skips the step and is counted
        metrics = rlpar.train_steps(
            net, state, batch, loss, max_grad_norm=c.optim.max_grad_norm, columns=[None] * c.passes
        )[-1]
        metrics["nonfinite_grad_steps"] = state.extra.get("nonfinite_grad_steps", 0)
        metrics["learning_rate"] = state.optimizer.lr
        return metrics

    def native_learn(self, net: rlpar.Net, state: rlpar.LearnerState) -> rlpar.NativeLearn | None:
        """`learn` as the runtime's native loop may run it (`native_plan`); not for a
        subclass with its own `learn`."""
        if type(self).learn is not Impala.learn:
            return None
        return self.native_plan(state, self.config.passes)
