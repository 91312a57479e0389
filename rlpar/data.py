"""Rollouts (one actor's unroll) and batches (what one learner step consumes).

Time runs along axis 0. ``obs[t]`` is what the policy saw before acting at step ``t``, and
``obs[t + 1]`` is what the env returned; ``obs[T]`` is there to bootstrap the unroll's end.

Episode boundaries follow gymnasium's default autoreset (NEXT_STEP): when an episode ends at
step ``t`` (``terminated[t]`` or ``truncated[t]``), ``obs[t + 1]`` is the episode's real final
observation, and step ``t + 1`` is the env's reset step (the action is ignored, the reward is 0):
``mask[t + 1]`` is False there. So a loss must (a) ignore steps where ``mask`` is False,
(b) bootstrap from ``V(obs[t + 1])`` at a truncation and not at a termination, and (c) never carry
a return or a trace across a step where ``terminated | truncated``. No fake transition crosses
an episode boundary. Both flags can be set at once (a time limit hit on the terminal step):
termination wins, there is no bootstrap.

Recurrent nets (an `rlpar.LSTM` core): ``core_state`` is the core's state fed into step 0 of the
unroll, one row per env. Inside the unroll the state is zeroed where an episode starts: at step
``t >= 1`` when step ``t - 1`` was the env's reset step (``mask[t - 1]`` False: ``obs[t]`` is a
new episode's first observation), which is `episode_starts`. A learner re-runs the unroll from
``core_state`` with those resets (`Batch.core_args`), so it sees what the actor saw.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from rlpar._checks import check_int
from rlpar.parallel import even_slices

__all__ = ["ARRAY_FIELDS", "ENV_AXIS", "Batch", "Rollout", "episode_starts"]


@dataclass
class Rollout:
    """One unroll of ``T`` steps over an actor's ``K`` envs. Preallocated once and reused.

    - ``obs``: [T + 1, K, *obs_shape] (the env's dtype: float32 or uint8)
    - ``actions``: [T, K] int64 (Discrete) or [T, K, A] float32 (Box, unclipped samples)
    - ``rewards``: [T, K] float32
    - ``terminated``, ``truncated``: [T, K] bool, the episode ended after step t
    - ``mask``: [T, K] bool, False on the env's autoreset step
    - ``behaviour``: [T, K, output_size] float32, the net outputs the actions were drawn from
    - ``core_state``: [K, state_size] float32, a recurrent net's state fed into step 0
      (``state_size`` 0 for a feed-forward net)
    - ``version``: the parameter snapshot version used for the whole unroll
    - ``actor``, ``seq``: which actor produced it and its running count there
    - ``ended``: (return, length) of the episodes that ended in it, deterministic mode only
      (the learner logs them in batch order, so the episode log does not depend on timing)
    - ``stamp``: int64 [2] or None: ``version`` and ``seq`` where native code reads and writes
      them (the runtime's actors write it with every rollout, a native actor loop
      `rlpar._native.FusedActorLoop` only there; `read_stamp` copies it to the fields)
    """

    obs: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    mask: np.ndarray
    behaviour: np.ndarray
    core_state: np.ndarray
    version: int = 0
    actor: int = 0
    seq: int = 0
    ended: list[tuple[float, int]] = field(default_factory=list)
    stamp: np.ndarray | None = None

    @classmethod
    def allocate(
        cls,
        unroll_length: int,
        num_envs: int,
        obs_shape: tuple[int, ...],
        obs_dtype: np.dtype,
        action_shape: tuple[int, ...],
        action_dtype: np.dtype,
        output_size: int,
        actor: int = 0,
        state_size: int = 0,
    ) -> Rollout:
        t, k = unroll_length, num_envs
        return cls(
            obs=np.zeros((t + 1, k, *obs_shape), obs_dtype),
            actions=np.zeros((t, k, *action_shape), action_dtype),
            rewards=np.zeros((t, k), np.float32),
            terminated=np.zeros((t, k), bool),
            truncated=np.zeros((t, k), bool),
            mask=np.zeros((t, k), bool),
            behaviour=np.zeros((t, k, output_size), np.float32),
            core_state=np.zeros((k, state_size), np.float32),
            actor=actor,
        )

    def read_stamp(self) -> None:
        """Copy what a native actor loop wrote into ``stamp`` to ``version`` and ``seq`` (the
        reader of a queue such rollouts come through calls it; nothing without a stamp)."""
        if self.stamp is not None:
            self.version, self.seq = self.stamp.tolist()

    @property
    def env_steps(self) -> int:
        """Env transitions in this rollout (T * K, autoreset steps included)."""
        return int(self.rewards.size)


_SCALARS = ("version", "actor", "seq", "ended", "stamp")  # not the batch's arrays
ARRAY_FIELDS = tuple(f.name for f in fields(Rollout) if f.name not in _SCALARS)
# The env (column) axis of each array: time comes first, except in the per-env core state.
ENV_AXIS = {name: 0 if name == "core_state" else 1 for name in ARRAY_FIELDS}


def episode_starts(mask: np.ndarray) -> np.ndarray:
    """Where a recurrent state restarts from zeros: bool ``[T + 1, N]`` for the ``T + 1``
    observations of an unroll with ``mask [T, N]``: False at step 0 (the stored state is already
    the one fed in), ``~mask[t - 1]`` at step ``t`` (a new episode's first observation)."""
    starts = np.zeros((mask.shape[0] + 1, *mask.shape[1:]), bool)
    np.logical_not(mask, out=starts[1:])
    return starts


@dataclass
class Batch:
    """``B`` rollouts side by side: the same arrays with ``N = B * K`` columns ([T, N, ...]).

    ``versions``: [B] snapshot version of each rollout; ``policy_lag``: [B] learner version
    minus rollout version at the time of the learner step; ``learner_version``: that version.
    """

    obs: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    mask: np.ndarray
    behaviour: np.ndarray
    versions: np.ndarray
    policy_lag: np.ndarray
    learner_version: int
    core_state: np.ndarray | None = None

    @classmethod
    def stack(cls, rollouts: Sequence[Rollout], learner_version: int) -> Batch:
        """Concatenate rollouts along the env axis (copies: the rollouts go back to the actors)."""
        if len(rollouts) == 1:  # the common batch of one: a plain copy, a third of the cost
            arrays = {name: getattr(rollouts[0], name).copy() for name in ARRAY_FIELDS}
        else:
            arrays = {
                name: np.concatenate([getattr(r, name) for r in rollouts], axis=ENV_AXIS[name])
                for name in ARRAY_FIELDS
            }
        versions = np.array([r.version for r in rollouts], np.int64)
        return cls(
            **arrays,
            versions=versions,
            policy_lag=learner_version - versions,
            learner_version=learner_version,
        )

    def split(self, parts: int) -> list[Batch]:
        """The columns in ``min(parts, N)`` contiguous, nearly equal shards (copies, each array
        C-contiguous), for a learner step spread over threads (`rlpar.ShardPool`).
        ``versions``, ``policy_lag`` and ``learner_version`` are the whole batch's in each."""
        check_int("parts", parts, minimum=1)
        return [
            self.columns(cols)
            for cols in even_slices(self.num_columns, min(parts, self.num_columns))
        ]

    def columns(self, cols: slice | np.ndarray) -> Batch:
        """The batch of columns ``cols`` (a slice, or int indices [M]): whole unrolls, each
        with its core state (copies, each array C-contiguous). ``versions``, ``policy_lag``
        and ``learner_version`` are the whole batch's."""
        return Batch(
            **{
                name: np.ascontiguousarray(
                    getattr(self, name)[(slice(None),) * ENV_AXIS[name] + (cols,)]
                )
                for name in ARRAY_FIELDS
                if getattr(self, name) is not None
            },
            versions=self.versions,
            policy_lag=self.policy_lag,
            learner_version=self.learner_version,
        )

    def core_args(self, bootstrap: bool = True) -> dict[str, Any]:
        """Keyword arguments of ``Net.forward_train`` on ``obs`` reshaped to ``[(T + 1) N, ...]``
        (``bootstrap=False``: on ``obs[:-1]``, ``[T N, ...]``): ``state`` (``core_state``) and
        ``resets`` (`episode_starts` of ``mask``) for a recurrent net, nothing for a
        feed-forward one (``state_size`` 0)."""
        if self.core_state is None or self.core_state.shape[1] == 0:
            return {}
        starts = episode_starts(self.mask)
        return {"state": self.core_state, "resets": starts if bootstrap else starts[:-1]}

    @property
    def unroll_length(self) -> int:
        return int(self.rewards.shape[0])

    @property
    def num_columns(self) -> int:
        return int(self.rewards.shape[1])
