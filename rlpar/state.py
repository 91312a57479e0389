"""`LearnerState`: what the learner step changes, in a module of its own so that the agent
seam (`rlpar.agent`) and the learner step's helpers (`rlpar.learner_step`) both import it
without importing each other."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rlpar.optim import Optimizer
from rlpar.parallel import ShardPool

__all__ = ["LearnerState"]


@dataclass
class LearnerState:
    """Everything the learner step changes: saved by checkpoints, restored on resume.

    ``params``: float32 [num_params]; ``optimizer``: its flat state buffers; ``steps``: learner
    steps taken, counted by the runtime (it adds 1 after each `Agent.learn` returns; `learn`
    only reads it; the published parameters' version is ``steps + 1``); ``extra``: the
    agent's own JSON-serialisable state (e.g. a schedule position).
    ``rng``: the learner's own generator (e.g. to shuffle minibatches, `rlpar.minibatches`):
    the runtime seeds it from the run's seed after `Agent.init_state`, and checkpoints save
    and restore its state, so a deterministic run and a resumed one draw the same numbers.
    ``pool``: not saved; set by the runtime for the run when ``runtime.learner_threads`` > 1,
    a `rlpar.ShardPool` of that many threads that `Agent.learn` may use to split its step
    over column shards (`rlpar.Batch.split`); None otherwise.
    ``grad``: not saved; `rlpar.train_step`'s gradient buffer, float32 [num_params], made at
    its first step and reused.
    """

    params: np.ndarray
    optimizer: Optimizer
    steps: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    rng: np.random.Generator = field(
        default_factory=lambda: np.random.default_rng(0), repr=False, compare=False
    )
    pool: ShardPool | None = field(default=None, repr=False, compare=False)
    grad: np.ndarray | None = field(default=None, repr=False, compare=False)
