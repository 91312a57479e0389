"""An actor's recurrent core state, carried from step to step and from unroll to unroll.

The conventions are `rlpar.data`'s: each rollout stores the state fed into its step 0
(``core_state``), and the state restarts from zeros at a new episode's first observation, the
step after the env's reset step. The learner re-runs the unroll from the stored state with the
same resets (`rlpar.Batch.core_args`).
"""

from __future__ import annotations

import numpy as np

from rlpar.data import Rollout
from rlpar.nn import Net
from rlpar.snapshot import Snapshot

__all__ = ["CoreState"]

_ALL = slice(None)


class CoreState:
    """``state`` float32 [K, state_size] of one actor's K envs (its own thread's only)."""

    def __init__(self, net: Net, num_envs: int) -> None:
        self.net = net
        self.state = net.initial_state(num_envs)  # the envs were just reset: zeros
        self.starts = np.zeros(num_envs, bool)  # the next observation begins an episode

    def begin_unroll(self, r: Rollout) -> None:
        """Apply the pending episode starts and store the state fed into step 0 in ``r``."""
        self.state[self.starts] = 0.0
        self.starts[:] = False
        np.copyto(r.core_state, self.state)

    def forward(
        self, params: Snapshot, obs: np.ndarray, out: np.ndarray, cols: slice = _ALL
    ) -> None:
        """``out [k, output_size]`` for ``obs [k, ...]`` of the envs ``cols`` (k of the K; all
        by default); their state advances one step."""
        self.net.forward(params, obs, out, state=self.state[cols], resets=self.starts[cols])

    def after_step(self, mask: np.ndarray, cols: slice = _ALL) -> None:
        """``mask [k]`` of the step the envs ``cols`` just took: where it was the env's reset
        step, the next observation is a new episode's first."""
        np.logical_not(mask, out=self.starts[cols])
