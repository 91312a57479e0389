"""A3C (Mnih et al. 2016), learner-central as in GA3C: actors act, one learner updates.

for each learner step:
    batch <- B rollouts of T steps
    out = net(x_0..x_T)                                   # pi and V
    R_t = r_t + gamma R_{t+1}, R_T = V(x_T)               # n-step returns; bootstrap from
                                                          # V at truncation and unroll end,
                                                          # 0 at termination
    L = -(R_t - V(x_t)) log pi(a_t|x_t) + value_coef * 0.5 (R_t - V(x_t))^2
        - entropy_coef * H(pi(.|x_t))
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
class A3CConfig(RewardsAndBounds):
    """A3C hyper-parameters."""

    value_coef: float = 0.5
    """Weight of the value loss."""
    entropy_coef: float = 0.01
    """Weight of the entropy bonus."""
    net: NetConfig = field(default_factory=NetConfig)
    """The network torso."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """The optimizer."""


class A3C(ActorCriticAgent):
    """Advantage actor-critic on n-step returns (no off-policy correction)."""

    Config = A3CConfig

    def learn(self, net: rlpar.Net, state: rlpar.LearnerState, batch: rlpar.Batch) -> dict:
        c = self.config
        c.optim.schedule(state, batch)
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
            importance_weighting=False,
            value_coef=c.value_coef,
            entropy_coef=c.entropy_coef,
        )
