"""What a run reports: `Progress` while it runs, `RunResult` at its end, and the GIL meter's
view of its threads (`gil_shares`, and `GilBoundCheck`'s one warning)."""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rlpar.config import EnvConfig
from rlpar.runtime.actor import Actor
from rlpar.runtime.common import ActorHandle
from rlpar.runtime.counters import RunCounters
from rlpar.runtime.env_modes import GIL_CHECK_AFTER_S, gil_bound_warning
from rlpar.runtime.gil_meter import GilTimes, actor_ceiling
from rlpar.runtime.learner import Learner, LearnerStats

__all__ = ["GilBoundCheck", "Progress", "RunResult", "gil_shares", "measure_progress"]

log = logging.getLogger("rlpar")


@dataclass
class Progress:
    """A consistent-enough view of a running run, taken by the main thread."""

    wall_s: float
    env_steps: int
    learner_steps: int
    version: int
    episodes: int
    mean_return: float | None
    min_return: float | None
    max_return: float | None
    mean_length: float | None
    env_steps_per_s: float
    learner_steps_per_s: float
    samples_per_s: float
    policy_lag_mean: float
    policy_lag_max: int
    dropped_rollouts: int
    skipped_publishes: int
    lost_rollouts: int
    queue_depth: int
    stage_fractions: dict[str, float]
    metrics: dict[str, float]
    gil: dict[str, Any] = field(default_factory=dict)
    """The GIL meter (`rlpar.runtime.gil_meter`) since the threads started: {"actor_<i>",
    "actors" (all local actors together), "learner": {"held", "wait", "native": shares of
    that thread's wall time}, "actor_ceiling": actor threads the GIL could serve at these
    shares (Amdahl over the held share; null when no actor holds it)}. Ray actors are not
    metered (they run in processes of their own)."""


@dataclass
class RunResult:
    """What `Runner.run` returns (also the summary the CLI prints as JSON)."""

    mean_return: float | None
    env_steps: int
    learner_steps: int
    episodes: int
    wall_s: float
    time_to_target_s: float | None
    stopped_by: str
    checkpoint: str | None
    stuck_threads: list[str] = field(default_factory=list)
    evaluation: list[dict[str, Any]] | None = None
    """The final evaluation, one entry per `EvalConfig.policies` (policy, episodes, mean_return,
    std_return, min_return, max_return, mean_length, seed), of the final parameters; None
    without an `EvalConfig` with episodes > 0 (or when the learner did not stop)."""
    target_checks: list[dict[str, Any]] = field(default_factory=list)
    """The `EvalConfig.check_target` evaluations: env_steps, learner_steps, window_mean,
    eval_mean, passed."""
    gil: dict[str, Any] = field(default_factory=dict)
    """The GIL meter over the whole run, as in `Progress.gil`."""
    plan: dict[str, Any] = field(default_factory=dict)
    """How the run executed (`rlpar.runtime.plan.ExecutionPlan.to_dict`): {"actor": {"loop",
    "reason"}, "learner": {"loop", "reason"}}."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def measure_progress(
    wall_s: float,
    *,
    counters: RunCounters,
    learner: Learner,
    actors: Sequence[ActorHandle],
    return_window: int,
    queue_depth: int,
    lost_rollouts: int,
) -> Progress:
    """`Progress` after ``wall_s`` seconds, read from the threads' stats without a lock (each
    number is whole; together they may be a few steps apart)."""
    recent = counters.episodes.recent(return_window)
    rets = [e[0] for e in recent]
    ls = learner.stats
    run_steps = sum(a.stats.env_steps for a in actors)
    rate = 1.0 / wall_s if wall_s > 0 else 0.0
    return Progress(
        wall_s=wall_s,
        env_steps=counters.env_steps(),
        learner_steps=learner.state.steps,
        version=learner.version,
        episodes=counters.episode_count(),
        mean_return=float(np.mean(rets)) if rets else None,
        min_return=float(np.min(rets)) if rets else None,
        max_return=float(np.max(rets)) if rets else None,
        mean_length=float(np.mean([e[1] for e in recent])) if recent else None,
        env_steps_per_s=run_steps * rate,
        learner_steps_per_s=ls.steps * rate,
        samples_per_s=ls.samples * rate,
        policy_lag_mean=ls.lag_mean,
        policy_lag_max=ls.lag_max,
        dropped_rollouts=ls.dropped_rollouts,
        skipped_publishes=ls.skipped_publishes,
        lost_rollouts=lost_rollouts,
        queue_depth=queue_depth,
        stage_fractions=_stage_fractions(actors, ls),
        metrics=dict(ls.metrics),
        gil=gil_shares(actors, ls),
    )


def _stage_fractions(actors: Sequence[ActorHandle], ls: LearnerStats) -> dict[str, float]:
    """Each stage's share of the time all threads spent: env steps, inference, queue waits
    (actors' and learner's), learn, publish."""
    acts = [a.stats for a in actors]
    stages = {
        "env_step": sum(a.env_s for a in acts),
        "inference": sum(a.inference_s for a in acts),
        "queue_wait": sum(a.queue_wait_s for a in acts) + ls.queue_wait_s,
        "learn": ls.learn_s,
        "publish": ls.publish_s,
    }
    total = sum(stages.values())
    return {k: (v / total if total > 0 else 0.0) for k, v in stages.items()}


def gil_shares(actors: Sequence[ActorHandle], learner: LearnerStats) -> dict[str, Any]:
    """`Progress.gil`: each local actor thread's GIL shares since it started, theirs together,
    the learner's, and the actor ceiling."""
    local = [a for a in actors if isinstance(a, Actor)]
    report: dict[str, Any] = {f"actor_{a.index}": a.stats.gil.shares() for a in local}
    total = sum((a.stats.gil for a in local), GilTimes())
    shares = learner.gil.shares()
    report["actors"] = total.shares()
    report["learner"] = shares
    ceiling = actor_ceiling(report["actors"]["held"], shares["held"]) if local else None
    report["actor_ceiling"] = ceiling if ceiling is None or math.isfinite(ceiling) else None
    return report


class GilBoundCheck:
    """Warns once when the actor threads take turns on the GIL (`gil_bound_warning`): called
    by the main thread at every tick, it looks once the actors have been measured for
    `GIL_CHECK_AFTER_S` seconds (``done`` then)."""

    def __init__(self, env: EnvConfig, actors: Sequence[ActorHandle]) -> None:
        self.env = env
        # the actors that step their envs from Python, holding the GIL (not the fused path)
        self.looping = [a for a in actors if isinstance(a, Actor) and a.sampler is None]
        # nothing to find with one such thread, or envs that step outside the GIL
        self.done = len(self.looping) < 2 or env.vectorization != "sync"

    def __call__(self) -> None:
        if self.done:
            return
        env_s = sum(a.stats.env_s for a in self.looping)
        inference_s = sum(a.stats.inference_s for a in self.looping)
        if env_s + inference_s < GIL_CHECK_AFTER_S:
            return  # not measured long enough yet
        self.done = True
        warning = gil_bound_warning(self.env, len(self.looping), env_s, inference_s)
        if warning is not None:
            log.warning(warning)
