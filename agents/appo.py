"""APPO: PPO's clipped surrogate on IMPALA's asynchronous actors (Schulman et al. 2017;
Sample Factory; IMPACT, Luo et al. 2019), with V-trace or GAE(lambda) advantages.

for each learner step:
    batch <- B rollouts, each acted by one (possibly stale) policy version mu
    for epoch in 1..epochs:
        for minibatch in minibatches(batch, minibatches):   # whole unrolls, reshuffled per epoch
            out = net(x_0..x_T)                              # current policy pi and V
            r_t = pi(a_t|x_t) / mu(a_t|x_t)                  # against the policy that acted
            vs_t, A_t = V-trace targets and advantages (or GAE(lambda) on clipped traces)
            Â_t = normalise(A_t)                             # over the minibatch's valid steps
            L = -min(r_t Â_t, clip(r_t, 1-eps, 1+eps) Â_t)
                + baseline_cost * 0.5 (vs_t - V(x_t))^2 [clipped around the actor's V]
                - entropy_cost * H(pi(.|x_t))
            params <- optimizer(clip(grad L))

The ratio is taken against the behaviour policy mu that acted, as Sample Factory's APPO takes
it, so a stale rollout's steps are clipped as the policy moves away from it, and a minibatch
needs nothing beyond itself: every epoch's targets are computed with the current values.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import rlpar

from .common import ActorCriticAgent, ActorCriticConfig, NetConfig, OptimConfig

__all__ = ["Appo", "AppoConfig", "AppoOptimConfig", "RunningStats"]

VALUE_NORM_KEY = "value_norm"  # in LearnerState.extra: running statistics of the value targets


@dataclass(frozen=True)
class AppoOptimConfig(OptimConfig):
    """The learner's optimizer, with PPO's defaults (a table that sets some keys keeps these
    for the others)."""

    lr: float = 2.5e-4
    """Learning rate (CleanRL's PPO: 2.5e-4)."""
    max_grad_norm: float = 0.5
    """Global gradient-norm clipping (PPO's 0.5: the loss is a mean over the minibatch's
    steps, as in CleanRL)."""


@dataclass(frozen=True)
class AppoConfig(ActorCriticConfig):
    """APPO hyper-parameters. Defaults: CleanRL's PPO (clip 0.2, 4 epochs x 4 minibatches,
    advantage normalisation, gradient norm 0.5, lr 2.5e-4) on Sample Factory's V-trace
    advantages."""

    clip_eps: float = rlpar.PpoOptions.clip_eps
    """The surrogate's clip epsilon (> 0)."""
    ratio_clip: str = rlpar.PpoOptions.ratio_clip
    """"symmetric": the ratio is clipped to [1 - clip_eps, 1 + clip_eps] (PPO's and CleanRL's
    form); "reciprocal": to [1 / (1 + clip_eps), 1 + clip_eps] (Sample Factory's)."""
    advantage: str = rlpar.PpoOptions.advantage
    """"vtrace": A_t = r_t + gamma vs_{t+1} - V(x_t) on V-trace targets (Sample Factory's
    APPO); "gae": GAE(gae_lambda) on the truncated importance weights (on-policy: PPO's GAE)."""
    gae_lambda: float = rlpar.PpoOptions.gae_lambda
    """lambda of the traces, in [0, 1] (1 with "vtrace": V-trace as published; CleanRL's GAE
    uses 0.95)."""
    rho_bar: float = rlpar.PpoOptions.rho_bar
    """Clip of the importance weights in the V-trace targets."""
    c_bar: float = rlpar.PpoOptions.c_bar
    """Clip of the trace-cutting coefficients."""
    normalize_advantages: bool = rlpar.PpoOptions.normalize_advantages
    """Normalise the advantages over each minibatch's valid steps (mean 0, std 1)."""
    value_clip: float = rlpar.PpoOptions.value_clip
    """> 0: the value loss is the larger of the plain one and that of the value clipped to
    within this of the actor's value (PPO2's value clipping, in the value head's units: the
    normalised ones with `normalize_values`). 0: none."""
    normalize_values: bool = False
    """The value head predicts normalised values: targets are standardised with running
    statistics of the V-trace targets (mean and variance over every target the learner has
    seen, updated on each batch's first epoch), saved in checkpoints; V(x) = mean + std * head.
    For rewards far from unit size (Atari without reward_clip)."""
    epochs: int = 4
    """Passes over each learner batch (>= 1)."""
    minibatches: int = 4
    """Minibatches per epoch: the batch's N = runtime.batch_rollouts x runtime.envs_per_actor
    columns cut into this many sets of whole unrolls (must divide N), reshuffled each epoch."""
    net: NetConfig = field(default_factory=NetConfig)
    """The network torso."""
    optim: AppoOptimConfig = field(default_factory=lambda: AppoOptimConfig())
    """The optimizer (CleanRL's PPO: Adam, lr 2.5e-4, gradient norm clipped to 0.5)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        for key in ("epochs", "minibatches"):
            if getattr(self, key) < 1:
                raise rlpar.ConfigError(
                    f"{key}: expected an integer >= 1, got {getattr(self, key)}"
                )
        for key in ("clip_eps", "rho_bar", "c_bar"):
            if not getattr(self, key) > 0:
                raise rlpar.ConfigError(f"{key}: expected a number > 0, got {getattr(self, key)}")
        if not 0.0 <= self.gae_lambda <= 1.0:
            raise rlpar.ConfigError(
                f"gae_lambda: expected a number in [0, 1], got {self.gae_lambda}"
            )
        if not self.value_clip >= 0:
            raise rlpar.ConfigError(
                f"value_clip: expected a number >= 0 (0: off), got {self.value_clip}"
            )
        if self.ratio_clip not in ("symmetric", "reciprocal"):
            raise rlpar.ConfigError(
                f"ratio_clip: expected 'symmetric' or 'reciprocal', got {self.ratio_clip!r}"
            )
        if self.advantage not in ("vtrace", "gae"):
            raise rlpar.ConfigError(
                f"advantage: expected 'vtrace' or 'gae', got {self.advantage!r}"
            )

    def ppo_options(self) -> rlpar.PpoOptions:
        """The options of `rlpar.ppo_loss` this config spells."""
        return rlpar.PpoOptions(
            gamma=self.gamma, clip_eps=self.clip_eps, ratio_clip=self.ratio_clip,
            advantage=self.advantage, gae_lambda=self.gae_lambda, rho_bar=self.rho_bar,
            c_bar=self.c_bar, normalize_advantages=self.normalize_advantages,
            value_clip=self.value_clip, baseline_cost=self.baseline_cost,
            entropy_cost=self.entropy_cost,
        )  # fmt: skip


@dataclass
class RunningStats:
    """Mean and variance of every value seen, merged batch by batch (Chan et al.'s parallel
    update); JSON-serialisable through `as_dict` for `rlpar.LearnerState.extra`."""

    mean: float = 0.0
    var: float = 1.0
    count: float = 1e-4  # a prior of (almost) no weight on mean 0, variance 1

    def update(self, mean: float, sq_mean: float, count: float) -> None:
        """Merge ``count`` values with that ``mean`` and mean square ``sq_mean``."""
        if count <= 0:
            return
        var = max(0.0, sq_mean - mean * mean)
        total = self.count + count
        delta = mean - self.mean
        m2 = self.var * self.count + var * count + delta * delta * self.count * count / total
        self.mean += delta * count / total
        self.var, self.count = m2 / total, total

    @property
    def std(self) -> float:
        return math.sqrt(max(self.var, 1e-4))

    def as_dict(self) -> dict[str, float]:
        return {"mean": self.mean, "var": self.var, "count": self.count}


# What a metric of several minibatches is: their mean, except for these.
_EXTREMES = {"ratio_min": min, "ratio_max": max}


class Appo(ActorCriticAgent):
    """APPO: PPO's clipped surrogate on asynchronous rollouts, V-trace or GAE advantages,
    epochs x minibatches per batch."""

    Config = AppoConfig

    def __init__(self, config: AppoConfig) -> None:
        super().__init__(config)
        self.ppo_options = config.ppo_options()

    def check_runtime(self, runtime: rlpar.RuntimeConfig) -> None:
        n = runtime.batch_columns
        if n % self.config.minibatches:
            raise rlpar.ConfigError(
                f"agent.minibatches: expected a divisor of the batch's {n} columns "
                f"(runtime.batch_rollouts {runtime.batch_rollouts} x runtime.envs_per_actor "
                f"{runtime.envs_per_actor}), so that each minibatch holds whole unrolls, got "
                f"{self.config.minibatches}"
            )

    def native_options(self) -> rlpar.PpoOptions:
        return self.ppo_options

    def learn(self, net: rlpar.Net, state: rlpar.LearnerState, batch: rlpar.Batch) -> dict:
        c = self.config
        c.optim.schedule(state, batch)  # this batch's learning rate
        stats = self._restore_value_stats(state)
        loss, data = self.step_loss(batch)  # the native PPO loss, the loss's rewards
        if stats is None:
            # every epoch's minibatches drawn up front (the same draws in the same order as
            # one epoch at a time), then all the optimizer steps as one native call: out =
            # net(x_0..x_T) -> targets, clipped surrogate -> backward -> clip -> optimizer on
            # each minibatch's columns in turn
            steps: list[np.ndarray | None] = []
            for _ in range(c.epochs):
                order = rlpar.minibatch_columns(
                    batch, c.minibatches, state.rng, key="agent.minibatches"
                )
                steps += order if len(order) > 1 else [None]
            self.native_loss.value_mean, self.native_loss.value_std = 0.0, 1.0
            parts = rlpar.train_steps(
                net, state, data, loss, max_grad_norm=c.optim.max_grad_norm, columns=steps
            )
        else:
            # normalised values: each minibatch of the first epoch updates the statistics
            # the next one's targets are scaled by, so one native call per minibatch
            parts = []
            for epoch in range(c.epochs):
                order = rlpar.minibatch_columns(
                    batch, c.minibatches, state.rng, key="agent.minibatches"
                )
                for cols in order:
                    self.native_loss.value_mean, self.native_loss.value_std = stats.mean, stats.std
                    metrics = rlpar.train_step(
                        net, state, data, loss, max_grad_norm=c.optim.max_grad_norm,
                        columns=cols if len(order) > 1 else None,
                    )  # fmt: skip
                    if epoch == 0:  # each target counted once
                        stats.update(
                            metrics["target_mean"], metrics["target_sq_mean"],
                            metrics["valid_steps"],
                        )  # fmt: skip
                    parts.append(metrics)
        if stats is not None:
            state.extra[VALUE_NORM_KEY] = stats.as_dict()
        out = _combine(parts)
        out["valid_steps"] = float(batch.mask.sum())
        out["policy_lag_mean"] = float(np.mean(batch.policy_lag))
        out["policy_lag_max"] = float(np.max(batch.policy_lag))
        if stats is not None:
            out["value_norm_mean"], out["value_norm_std"] = stats.mean, stats.std
        out["nonfinite_grad_steps"] = state.extra.get("nonfinite_grad_steps", 0)
        out["learning_rate"] = state.optimizer.lr
        return out

    def _restore_value_stats(self, state: rlpar.LearnerState) -> RunningStats | None:
        """The running value statistics (None without `normalize_values`); a resumed state
        that lacks them is refused rather than restarted from nothing."""
        if not self.config.normalize_values:
            return None
        saved: dict[str, Any] | None = state.extra.get(VALUE_NORM_KEY)
        if saved is None:
            if state.steps > 0:
                raise rlpar.ConfigError(
                    "agent.normalize_values: expected the learner state to hold the running "
                    f"value statistics ('{VALUE_NORM_KEY}') after {state.steps} learner steps, "
                    "got none: the checkpoint was written without value normalisation. Resume "
                    "with agent.normalize_values = false, or start a new run"
                )
            return RunningStats()
        return RunningStats(**{k: float(saved[k]) for k in ("mean", "var", "count")})


def _combine(parts: list[dict[str, float]]) -> dict[str, float]:
    """The metrics of a batch's minibatch steps: each key's mean over them (minimum or maximum
    for the ratio's extremes)."""
    keys = parts[0].keys()
    return {
        k: float(_EXTREMES[k](p[k] for p in parts)) if k in _EXTREMES
        else math.fsum(p[k] for p in parts) / len(parts)
        for k in keys
    }  # fmt: skip
