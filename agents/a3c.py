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

from .common import ActorCriticAgent, NetConfig, OptimConfig, actor_critic_step


@dataclass(frozen=True)
class A3CConfig:
    """A3C hyper-parameters."""

    gamma: float = 0.99
    """Discount factor."""
    reward_scale: float = 1.0
    """Rewards are multiplied by this before the loss (keeps value targets near unit size)."""
    reward_clip: float | None = None
    """Rewards are clipped to [-reward_clip, reward_clip] before the loss (and before
    `reward_scale`); Atari: 1.0, as the DQN and IMPALA papers train. None: not clipped. The
    returns the run reports and evaluates stay the env's own."""
    value_coef: float = 0.5
    """Weight of the value loss."""
    entropy_coef: float = 0.01
    """Weight of the entropy bonus."""
    action_bound_cost: float = 1.0
    """Gaussian policies with bounded actions: weight of a penalty on the squared distance of
    the policy's mean beyond the bounds (actions are clipped to them for the env, so out there
    the policy gradient has no signal and the mean drifts). 0: none."""
    net: NetConfig = field(default_factory=NetConfig)
    """The network torso."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """The optimizer."""

    def __post_init__(self) -> None:
        rlpar.check_field_types(self)
        if self.reward_clip is not None and not self.reward_clip > 0:
            raise rlpar.ConfigError(
                f"reward_clip: expected a number > 0 or none, got {self.reward_clip}"
            )
        if self.action_bound_cost < 0:
            raise rlpar.ConfigError(
                f"action_bound_cost: expected a number >= 0, got {self.action_bound_cost}"
            )
        if not 0.0 <= self.gamma <= 1.0:
            raise rlpar.ConfigError(f"gamma: expected a number in [0, 1], got {self.gamma}")


class A3C(ActorCriticAgent):
    """Advantage actor-critic on n-step returns (no off-policy correction)."""

    Config = A3CConfig

    def learn(self, net: rlpar.Net, state: rlpar.LearnerState, batch: rlpar.Batch) -> dict:
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
            importance_weighting=False,
            value_coef=c.value_coef,
            entropy_coef=c.entropy_coef,
        )
