"""What a `RemoteActor` (the driver) and its `ActorProcess` say to each other, typed.

One call, ``ActorProcess.next_rollouts(request, params)``: the request names the actor thread
and carries what its first start needs; ``params`` is a separate argument so that Ray resolves
its object reference (the parameters put once per version) before the call. The answer is a
`RolloutReply`, or `NeedParams` from a process that has no parameters yet (a new process,
asked before the driver knew the old one died).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from rlpar.runtime.common import ActorState

__all__ = ["NeedParams", "RolloutReply", "RolloutRequest", "canonical"]


@dataclass(frozen=True)
class RolloutRequest:
    """The next rollouts of actor thread ``thread``, whose driver holds parameters of
    ``version``. Read when the thread first starts in its process: ``rng_state`` (its numpy
    generator's state), ``restarts`` (the process deaths seen: a restarted process seeds its
    envs anew), ``sampler_state`` and ``resume`` (a checkpoint's episodes in progress)."""

    thread: int
    version: int
    rng_state: dict[str, Any]
    restarts: int
    sampler_state: list[int] | None = None
    resume: dict[str, np.ndarray] | None = None


@dataclass(frozen=True)
class NeedParams:
    """The process has no parameters yet: the driver sends them with its next request."""


@dataclass(frozen=True)
class RolloutReply:
    """Every rollout the thread has finished since its last reply, and what came with them.

    - ``arrays``: the `Rollout` arrays stacked, ``{name: [n, ...]}``; ``versions``, ``seqs``:
      [n] each
    - ``saved``: `Actor.checkpoint_state` after the last of them (its generators and, with
      resume state kept, its episodes in progress)
    - ``resumed`` / ``resume_refused``: on a first start with ``resume``, whether the episodes
      were loaded, or why not
    - ``episodes``: (return, length) of the process's episodes that ended since its last reply
    - ``pid``: the process; ``times``: the thread's (env, inference, queue wait) seconds so far
    """

    arrays: dict[str, np.ndarray]
    versions: list[int]
    seqs: list[int]
    saved: ActorState
    resumed: bool
    resume_refused: str | None
    episodes: list[tuple[float, int]]
    pid: int
    times: tuple[float, float, float]


def canonical(a: np.ndarray) -> np.ndarray:
    """``a`` with numpy's own dtype object (a view). An unpickled array's dtype is equal to,
    not the same object as, ``np.dtype(np.float32)``, and the native bindings test identity."""
    return a.view(np.dtype(a.dtype.str))
