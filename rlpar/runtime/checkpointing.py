"""A run's checkpoints: what one holds, when one is written, and what a resume puts back.

A checkpoint is written while the learner's state is quiet: on the learner thread between two
steps (`PeriodicCheckpoint`, every ``checkpoint_interval_s``), or by the runner once its threads
have stopped (the final one). Each actor's part, its generators and its episodes in progress,
is what the actor copied at the end of one of its finished unrolls (`Actor.checkpoint_state`):
its latest, or in deterministic mode the one that the learner's last step left
(`rlpar.runtime.learner.Learner.actor_states`), so that a run resumed from any checkpoint makes
the rollouts the uninterrupted run made after that step.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from rlpar.agent import LearnerState
from rlpar.checkpoint import (
    Checkpoint,
    CheckpointError,
    check_signature,
    checkpoint_path,
    find_checkpoint,
    load_checkpoint,
    net_signature,
    prune_checkpoints,
    save_checkpoint,
)
from rlpar.nn import Net
from rlpar.runtime.common import ActorHandle, ActorState
from rlpar.runtime.counters import RunCounters

__all__ = [
    "Checkpointer",
    "PeriodicCheckpoint",
    "learner_rng",
    "open_resume",
    "restore_actors",
    "restore_learner",
    "space_layout",
]

log = logging.getLogger("rlpar")


def open_resume(resume: str | Path | None) -> tuple[Path | None, Checkpoint | None]:
    """(the checkpoint file, its contents) a run resumes from: ``resume`` itself, or the newest
    checkpoint of a run or checkpoints directory; (None, None) for a new run."""
    if resume is None:
        return None, None
    path = find_checkpoint(resume)
    ckpt = load_checkpoint(path)
    log.info("resuming from %s", path)
    return path, ckpt


def space_layout(spaces: tuple[gym.Space, gym.Space]) -> dict[str, str]:
    """The (observation, action) spaces of a run as a checkpoint records them: their reprs."""
    return {"observation": repr(spaces[0]), "action": repr(spaces[1])}


def check_spaces(ckpt: Checkpoint, spaces: dict[str, str], path: Path) -> None:
    """`CheckpointError` when ``ckpt`` was written for other spaces than ``spaces`` (a
    `space_layout`): a net of the same size can mean other things, e.g. Discrete(6) against
    MultiDiscrete([2, 3]) actions. Checkpoints written before spaces were recorded pass."""
    recorded = ckpt.extra.get("spaces")
    if recorded is None or recorded == spaces:
        return
    diffs = [
        f"{kind} space {recorded.get(kind)} there, {spaces[kind]} here"
        for kind in ("observation", "action")
        if recorded.get(kind) != spaces[kind]
    ]
    raise CheckpointError(
        f"{path}: written for other env spaces: {'; '.join(diffs)} (resume with the env the "
        "run was trained on)"
    )


def restore_learner(
    state: LearnerState,
    net: Net,
    ckpt: Checkpoint,
    path: Path,
    spaces: dict[str, str] | None = None,
) -> None:
    """Put the checkpoint's parameters, optimizer state, learner steps and agent extras into
    ``state`` (`CheckpointError` first if it was written for another net, or for other
    ``spaces``, a `space_layout`). The learning rate
    stays the one ``state``'s optimizer was made with: a resumed run's agent comes from its
    config (``--set agent.optim.lr=...`` on resume, or a population-based sweep's new value,
    takes effect), and a schedule sets it again from the agent's extras."""
    check_signature(ckpt, net_signature(net), path)
    if spaces is not None:
        check_spaces(ckpt, spaces, path)
    state.params[...] = ckpt.params
    lr = state.optimizer.lr
    state.optimizer.load_state_dict(ckpt.optimizer)
    state.optimizer.lr = lr
    state.steps = int(ckpt.counters["learner_steps"])
    state.extra = dict(ckpt.extra.get("agent", {}))
    if "learner" in ckpt.rng_states:  # checkpoints before LearnerState.rng have none
        state.rng.bit_generator.state = ckpt.rng_states["learner"]


def learner_rng(seed: int) -> np.random.Generator:
    """`LearnerState.rng` of a run with ``seed``: a stream of its own (not an actor's)."""
    return np.random.default_rng([seed, 0x1EA])


def restore_actors(actors: Sequence[ActorHandle], ckpt: Checkpoint) -> None:
    """Give each actor its generators back and, where the checkpoint has them (envs that save
    their state), its episodes in progress; a state that does not fit this run (other envs or
    K) is skipped, loudly. Call it before the actors run."""
    numpy_states = ckpt.rng_states.get("actors", [])
    samplers = ckpt.rng_states.get("samplers", [])
    for i, actor in enumerate(actors):
        actor.set_rng_state(
            numpy_states[i] if i < len(numpy_states) else None,
            samplers[i] if i < len(samplers) else None,
        )
        prefix = f"actors/{i}/"
        arrays = {k.removeprefix(prefix): v for k, v in ckpt.arrays.items() if k.startswith(prefix)}
        if arrays:
            try:
                actor.load_resume_state(arrays)
            except ValueError as e:
                log.warning("resume: %s; actor %d starts new episodes", e, i)


class Checkpointer:
    """Writes a run's checkpoints into ``directory`` (None: writes none), keeping the newest
    ``keep``. It reads the learner's ``state`` as it is: call `save` only where that state is
    quiet (between learner steps, or after the learner stopped). ``actor_states``: what it
    keeps of the actors, read with that state (None: each actor's latest `checkpoint_state`;
    deterministic mode: the learner's `actor_states`, which belong to its last step)."""

    def __init__(
        self,
        directory: Path | None,
        keep: int,
        *,
        state: LearnerState,
        net: Net,
        actors: Sequence[ActorHandle],
        counters: RunCounters,
        config: dict[str, Any],
        generation: int,
        actor_states: Callable[[], Sequence[ActorState]] | None = None,
        spaces: dict[str, str] | None = None,
    ) -> None:
        self.directory, self.keep = directory, keep
        self.state, self.net, self.actors = state, net, actors
        self.counters, self.config, self.generation = counters, config, generation
        self.actor_states = actor_states or (lambda: [a.checkpoint_state() for a in actors])
        self.spaces = spaces

    def prune(self) -> None:
        """Drop all but the newest ``keep`` checkpoints, and what a run killed mid-write left."""
        if self.directory is not None:
            prune_checkpoints(self.directory, keep=self.keep)

    def save(self) -> Path | None:
        """Write a checkpoint of the run as it is now; its path (None without a directory)."""
        if self.directory is None:
            return None
        self.directory.mkdir(parents=True, exist_ok=True)
        path = save_checkpoint(checkpoint_path(self.directory, self.state.steps), self.snapshot())
        self.prune()
        return path

    def snapshot(self) -> Checkpoint:
        """The run as a `Checkpoint` (new arrays, nothing shared with the running state)."""
        # Each actor's generators and episodes as of one of its finished unrolls (one read each).
        saved = self.actor_states()
        state = self.state
        return Checkpoint(
            params=state.params.copy(),
            optimizer=state.optimizer.state_dict(),
            counters={
                "env_steps": self.counters.env_steps(),
                "learner_steps": state.steps,
                "version": state.steps + 1,
                "episodes": self.counters.episode_count(),
                "generation": self.generation,
            },
            rng_states={
                "learner": state.rng.bit_generator.state,
                "actors": [rng["numpy"] for rng, _ in saved],
                "samplers": [rng["sampler"] for rng, _ in saved],
            },
            config=self.config,
            net_signature=net_signature(self.net),
            extra={"agent": dict(state.extra)}
            | ({"spaces": self.spaces} if self.spaces is not None else {}),
            arrays={
                f"actors/{i}/{name}": array
                for i, (_, arrays) in enumerate(saved)
                for name, array in (arrays or {}).items()
            },
        )


class PeriodicCheckpoint:
    """A learner hook: a checkpoint once ``interval_s`` seconds have passed since the last one
    (the first ``interval_s`` after ``start``, the run's start, `time.perf_counter`)."""

    def __init__(self, checkpoints: Checkpointer, interval_s: float, start: float) -> None:
        self.checkpoints, self.interval_s = checkpoints, interval_s
        self.last = start

    def __call__(self) -> None:
        if time.perf_counter() - self.last >= self.interval_s:
            self.checkpoints.save()
            self.last = time.perf_counter()
