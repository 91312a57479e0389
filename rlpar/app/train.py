"""``rlpar train``: one run of an experiment, in a run directory of its own::

    <log.logdir>/<name>/<timestamp>/
        config.toml      the resolved config (every default filled in; trains again as is)
        events.out.tfevents.*   TensorBoard curves, histograms, config text, hparams
        checkpoints/     ckpt-<learner steps>.rlpar, the newest `log.keep_checkpoints`
        summary.json     how it ended (what ``rlpar train --json`` prints)
        videos/          <env steps>.gif clips, with eval.video_interval_env_steps

::

    training = Training(load_experiment("experiments/cartpole_impala.toml"))
    summary = training.run()          # progress on stderr: a bar on a terminal, else log lines
"""

from __future__ import annotations

import dataclasses
import importlib
import itertools
import json
import logging
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from rlpar.app.clips import TrainingClips
from rlpar.app.experiment import Experiment, to_toml
from rlpar.app.monitor import TensorBoardMonitor
from rlpar.app.progress import make_display
from rlpar.app.summary import TrainingSummary
from rlpar.files import write_atomically
from rlpar.runtime import Progress, Runner, RunResult

__all__ = ["Training", "TrainingSummary", "load_env_plugins", "make_run_dir"]

log = logging.getLogger("rlpar")

# How often the runner reports progress; the monitor and the display decide what to do with it
# (taking a Progress costs tens of microseconds of the main thread).
PROGRESS_INTERVAL_S = 0.02


def load_env_plugins() -> None:
    """Register rlpar's own environments (``rlpar/CartPole-v1``, ...) when they are installed."""
    try:
        importlib.import_module("rlpar.envs")
    except ModuleNotFoundError as e:
        if e.name != "rlpar.envs":
            raise


def make_run_dir(root: Path, prefix: str = "") -> Path:
    """A new folder ``root/<prefix><timestamp>`` (``-1``, ``-2``, ... if runs start in one
    second)."""
    stamp = prefix + time.strftime("%Y%m%d-%H%M%S")
    for i in itertools.count():
        path = root / (stamp if i == 0 else f"{stamp}-{i}")
        try:
            path.mkdir(parents=True)
            return path
        except FileExistsError:
            continue
    raise AssertionError("unreachable")


class Training:
    """Build everything a run needs (errors in the config, env, agent or the checkpoint to
    resume from surface here, and leave no run directory behind), then `run` once."""

    def __init__(
        self,
        experiment: Experiment,
        resume: str | Path | None = None,
        run_dir: str | Path | None = None,
    ) -> None:
        """``run_dir``: the run directory itself (it must not exist yet; its parent may), instead
        of a new ``<log.logdir>/<name>/<timestamp>/``."""
        self.experiment = experiment
        self.config = experiment.to_dict()
        load_env_plugins()
        agent = experiment.make_agent()
        if run_dir is None:
            self.run_dir = make_run_dir(Path(experiment.log.logdir) / experiment.name)
        else:
            self.run_dir = Path(run_dir)
            self.run_dir.mkdir(parents=True)  # FileExistsError: never mix two runs' files
        try:
            self.runner = Runner(
                agent,
                experiment.env,
                experiment.runtime,
                checkpoint_dir=self.run_dir / "checkpoints",
                resume=resume,
                config=self.config,
                keep_checkpoints=experiment.log.keep_checkpoints,
                evaluation=experiment.eval,
            )
        except BaseException:
            shutil.rmtree(self.run_dir, ignore_errors=True)
            raise
        self.clips: TrainingClips | None = None
        if experiment.eval.video_interval_env_steps is not None:
            try:
                self.clips = TrainingClips(
                    self.runner, experiment.env, experiment.eval, experiment.runtime.seed,
                    self.run_dir,
                )  # fmt: skip
            except BaseException:
                self.runner.close()
                shutil.rmtree(self.run_dir, ignore_errors=True)
                raise
        source = self.runner.resumed_from
        resumed = f"\n# resumed from {source.resolve()}" if source is not None else ""
        (self.run_dir / "config.toml").write_text(
            f"# The resolved config of this run: `rlpar train config.toml` repeats it.{resumed}\n"
            + to_toml(self.config),
            encoding="utf-8",
        )

    def run(
        self,
        quiet: bool = False,
        stream: TextIO | None = None,
        on_progress: Callable[[Progress], None] | None = None,
    ) -> TrainingSummary:
        """Train until a stop condition; write ``summary.json``; return the summary.
        ``on_progress``: called with each `Progress` too, on the calling thread (as
        `rlpar.Runner.run` calls it)."""
        exp, runner = self.experiment, self.runner
        display = make_display(
            exp.runtime.total_env_steps, quiet, exp.log.log_interval_s, stream, runner.env_steps()
        )
        monitor = self._monitor()
        clips = self.clips

        def update(p: Progress) -> None:
            monitor.update(p)
            display.update(p)
            if on_progress is not None:
                on_progress(p)

        try:
            monitor.start()
            try:
                with display.redirect_logging():
                    log.info("run directory: %s", self.run_dir)
                    if clips is not None:
                        clips.start()
                    result = runner.run(
                        on_progress=update,
                        progress_interval_s=PROGRESS_INTERVAL_S,
                    )
                    if clips is not None:
                        clips.finish()  # the last clip: the final parameters
                    clip_error = clips.failure() if clips is not None else None
            finally:
                display.close()
            monitor.finish(result)
        finally:
            self.close()
            monitor.close()
        summary = self._summary(result, clip_error)
        text = json.dumps(summary.to_dict(), indent=2)
        write_atomically(self.run_dir / "summary.json", text + "\n")
        if clip_error is not None:
            raise clip_error
        return summary

    def _monitor(self) -> TensorBoardMonitor:
        """The run's TensorBoard writer, as the experiment's [log] table asks."""
        exp = self.experiment
        return TensorBoardMonitor(
            self.run_dir,
            self.runner,
            self.config,
            max(1, exp.runtime.total_env_steps // exp.log.scalar_points),
            exp.log.scalar_interval_s,
            exp.log.histogram_interval,
            clips=self.clips,
        )

    def _summary(self, result: RunResult, clip_error: RuntimeError | None) -> TrainingSummary:
        """The run's `TrainingSummary`; with ``clip_error`` (the run itself ended whole), an
        ``error`` that says why the command fails."""
        if result.checkpoint is not None:
            result = dataclasses.replace(result, checkpoint=str(Path(result.checkpoint).resolve()))
        return TrainingSummary(
            name=self.experiment.name,
            result=result,
            target_return=self.experiment.runtime.target_return,
            run_dir=str(self.run_dir.resolve()),
            error=None if clip_error is None else str(clip_error),
        )

    def close(self) -> None:
        """Close the envs (the actors' and the clips' one); `run` does it when it ends, so only
        a Training built and never run needs this. Idempotent."""
        if self.clips is not None:
            self.clips.close()
        self.runner.close()

    def __enter__(self) -> Training:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
