"""Deterministic mode resumes exactly: a run killed after any periodic checkpoint, or stopped
while its actors have run ahead of the learner, and resumed from its newest checkpoint ends with
the parameters of the same run uninterrupted, bit for bit.

The kill is simulated without wall-clock luck: every learner step writes a checkpoint and all
are kept (each one is what a run killed right after it would resume from), and each checkpoint
is read only once the actors have made the next version's rollouts, the timing that let a
checkpoint hold actor states one unroll ahead of its learner step."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest

import rlpar
from rlpar.checkpoint import checkpoint_path, latest_checkpoint
from rlpar.config import EnvConfig, RuntimeConfig
from rlpar.runtime import Runner

ENV = EnvConfig("rlpar/CartPole-v1")  # native envs: the actors' episodes are saved too
# B * T * K = 4 * 8 * 4 = 128 env steps a learner step
STEPS = 40


def runtime(**kw: object) -> RuntimeConfig:
    base: dict = dict(
        num_actors=2, envs_per_actor=4, unroll_length=8, batch_rollouts=4, buffers_per_actor=2,
        deterministic=True, total_env_steps=STEPS * 128, checkpoint_interval_s=None, seed=5,
    )  # fmt: skip
    base.update(kw)
    return RuntimeConfig(**base)


def agent(lstm: int) -> rlpar.Agent:
    net: dict = {"hidden": [16]} | ({"lstm": lstm} if lstm else {})
    return rlpar.make_agent("impala", {"net": net})


def actors_run_ahead(runner: Runner, stop_at: int | None = None) -> None:
    """Every checkpoint the learner writes waits, before it reads the run, until the actors have
    queued the next version's rollouts (at most 10 s); with ``stop_at``, the run is then
    stopped at that learner step (its final checkpoint follows, with the actors still ahead)."""
    checkpoints = runner._checkpoints
    save = checkpoints.save
    batch = runner.cfg.batch_rollouts

    def late_save() -> Path | None:
        if threading.current_thread().name == "rlpar-learner":
            deadline = time.monotonic() + 10.0
            while runner.queue.qsize() < batch and time.monotonic() < deadline:
                time.sleep(0.001)
            assert runner.queue.qsize() == batch, "the actors did not run ahead"
            if runner.state.steps == stop_at:
                runner.stop.set()
        return save()

    checkpoints.save = late_save  # type: ignore[method-assign]


def finish(lstm: int, **kw: object) -> tuple[np.ndarray, tuple[int, int, int]]:
    """(the final parameters, (learner steps, env steps, episodes)) of a run to ``STEPS``."""
    runner = Runner(agent(lstm), ENV, runtime(), **kw)  # type: ignore[arg-type]
    result = runner.run()
    return runner.params, (result.learner_steps, result.env_steps, result.episodes)


def same_run(resumed: tuple, reference: tuple, what: str) -> None:
    np.testing.assert_array_equal(resumed[0], reference[0], err_msg=what)
    assert resumed[1] == reference[1], what


@pytest.mark.parametrize("lstm", [0, 4])
def test_a_run_killed_after_any_periodic_checkpoint_resumes_to_the_same_parameters(
    tmp_path: Path, lstm: int
) -> None:
    reference = finish(lstm)
    assert reference[1][0] == STEPS
    checkpointed = Runner(
        agent(lstm), ENV, runtime(checkpoint_interval_s=1e-9), checkpoint_dir=tmp_path,
        keep_checkpoints=STEPS + 1,
    )  # fmt: skip
    # deterministic mode's paths: fused unrolls one at a time, the learner's Python take
    assert all(getattr(a, "fused", False) for a in checkpointed.actors)
    assert checkpointed.learner.inbox is None
    actors_run_ahead(checkpointed)
    checkpointed.run()
    np.testing.assert_array_equal(checkpointed.params, reference[0])
    for step in (1, 9, 26):
        path = checkpoint_path(tmp_path, step)
        same_run(finish(lstm, resume=path), reference, str(path))


def test_a_run_stopped_while_its_actors_ran_ahead_resumes_to_the_same_parameters(
    tmp_path: Path,
) -> None:
    """A stop from outside the learner (a signal, the wall clock) can come while the actors have
    made rollouts the learner never took: the final checkpoint still pairs the learner's step
    with the actors as that step left them."""
    reference = finish(0)
    stopped = Runner(agent(0), ENV, runtime(checkpoint_interval_s=1e-9), checkpoint_dir=tmp_path)
    actors_run_ahead(stopped, stop_at=13)
    result = stopped.run()
    assert result.learner_steps == 13
    path = latest_checkpoint(tmp_path)
    assert path == checkpoint_path(tmp_path, 13)
    same_run(finish(0, resume=path), reference, str(path))
