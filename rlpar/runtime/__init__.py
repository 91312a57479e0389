"""The actor/learner runtime: actor threads, one learner thread, a supervising runner."""

from rlpar.runtime.rollout import Batch, Rollout
from rlpar.runtime.runner import Progress, Runner, RunResult

__all__ = ["Batch", "Progress", "Rollout", "RunResult", "Runner"]
