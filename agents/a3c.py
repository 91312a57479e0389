"""A3C (Mnih et al. 2016), learner-central as in GA3C: actors act, one learner updates.

for each learner step:
    batch <- B rollouts of T steps
    out = net(x_0..x_T)                                   # pi and V
    R_t = r_t + gamma R_{t+1}, R_T = V(x_T)               # n-step returns; bootstrap from
                                                          # V at truncation and unroll end,
                                                          # 0 at termination
    L = -(R_t - V(x_t)) log pi(a_t|x_t) + baseline_cost * 0.5 (R_t - V(x_t))^2
        - entropy_cost * H(pi(.|x_t))
    params <- optimizer(clip(grad L))
"""

from __future__ import annotations

from dataclasses import dataclass, field

import rlpar

from .common import ActorCriticAgent, ActorCriticConfig, NetConfig, OptimConfig


@dataclass(frozen=True)
class A3CConfig(ActorCriticConfig):
    """A3C hyper-parameters."""

    net: NetConfig = field(default_factory=NetConfig)
    """The network torso."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """The optimizer."""


class A3C(ActorCriticAgent):
    """Advantage actor-critic on n-step returns (no off-policy correction)."""

    Config = A3CConfig

    def learn(self, net: rlpar.Net, state: rlpar.LearnerState, batch: rlpar.Batch) -> dict:
        c = self.config
        c.optim.schedule(state, batch)  # this batch's learning rate
        loss, batch = self.step_loss(batch)  # the native n-step loss, the loss's rewards
        # out = net(x_0..x_T) -> n-step returns -> losses -> backward -> clip -> optimizer, one
        # native call; a NaN/inf gradient skips the step and is counted
        metrics = rlpar.train_step(net, state, batch, loss, max_grad_norm=c.optim.max_grad_norm)
        metrics["nonfinite_grad_steps"] = state.extra.get("nonfinite_grad_steps", 0)
        metrics["learning_rate"] = state.optimizer.lr
        return metrics

    def native_learn(self, net: rlpar.Net, state: rlpar.LearnerState) -> rlpar.NativeLearn | None:
        """`learn` as the runtime's native loop may run it (`native_plan`); not for a
        subclass with its own `learn`."""
        if type(self).learn is not A3C.learn:
            return None
        return self.native_plan(state, 1)
