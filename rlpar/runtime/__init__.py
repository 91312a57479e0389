"""The actor/learner runtime: actor threads, one learner thread, a supervising runner."""

from rlpar.runtime.runner import Progress, Runner, RunResult

__all__ = ["Progress", "RunResult", "Runner"]
