"""`LearnerState`: what the learner step changes, in a module of its own so that the agent
seam (`rlpar.agent`) and the learner step's helpers (`rlpar.learner_step`) both import it
without importing each other."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rlpar.optim import Optimizer, skip_nonfinite_step
from rlpar.parallel import ShardPool

__all__ = ["LearnerState"]


@dataclass
class LearnerState:
    """Everything the learner step changes: saved by checkpoints, restored on resume.

    ``params``: float32 [num_params]; ``optimizer``: its flat state buffers; ``steps``: learner
    steps taken, counted by the runtime (it adds 1 after each `Agent.learn` returns; `learn`
    only reads it; the published parameters' version is ``steps + 1``), like every step count
    through `count_steps`; ``extra``: the
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

    def count_steps(
        self, *, applied: int = 0, norms: Sequence[float] = (), learner_steps: int = 0
    ) -> None:
        """The one place the step counts move. ``applied``: optimizer steps applied to
        ``params`` (``optimizer.steps``); ``norms``: the gradient norms of the optimizer steps
        of the current learner step, each checked by `rlpar.skip_nonfinite_step` (a norm that
        is not finite is counted, and raises after too many in a row); ``learner_steps``:
        learner steps that end here (``steps``), the ones before the last with finite
        gradients (a native loop's call ends after a step that was not), the last one's
        ``norms`` checked before it is counted, so that an error names it."""
        self.optimizer.steps += applied
        if learner_steps > 1:
            self.steps += learner_steps - 1
            skip_nonfinite_step(self, 0.0)  # they were finite: no longer "in a row"
        for norm in norms:
            skip_nonfinite_step(self, norm)
        if learner_steps > 0:
            self.steps += 1
