"""A run's counters (env steps, episodes), continued across resumes from a checkpoint's."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rlpar.runtime.common import ActorHandle, EpisodeLog
from rlpar.runtime.learner import LearnerStats

__all__ = ["RunCounters"]


class RunCounters:
    """Env steps and episodes of the whole run, the runs it resumed included. ``resumed``: the
    counters of the checkpoint it resumed from ({} for a new run); ``learned``: the learner's
    stats in deterministic mode, where env steps count what the learner consumed (None: what
    the actors stepped)."""

    def __init__(
        self,
        resumed: dict[str, Any],
        actors: Sequence[ActorHandle],
        learned: LearnerStats | None = None,
    ) -> None:
        self.base_env_steps = int(resumed.get("env_steps", 0))
        self.base_episodes = int(resumed.get("episodes", 0))
        self.actors, self.learned = actors, learned
        #: this run's finished episodes, each with the run's env steps when it ended
        self.episodes = EpisodeLog(env_steps=self.env_steps)

    def env_steps(self) -> int:
        """Env steps so far, across all actors (and before a resume). In deterministic mode, the
        steps the learner consumed: an unroll in flight when the run stops is not counted."""
        if self.learned is not None:
            return self.base_env_steps + self.learned.samples
        return self.base_env_steps + sum(a.stats.env_steps for a in self.actors)

    def episode_count(self) -> int:
        """Episodes finished so far (and before a resume)."""
        return self.base_episodes + self.episodes.count
