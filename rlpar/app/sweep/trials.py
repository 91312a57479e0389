"""What runs in a Ray worker for each trial of ``rlpar sweep``: one training run (`trial`),
or a PBT member trained segment by segment (`pbt_trial`)."""

from __future__ import annotations

import dataclasses
import itertools
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from rlpar.app.experiment import load_experiment, toml_value
from rlpar.app.sweep.space import METRIC

__all__ = ["PBT_STATE", "pbt_trial", "trial"]


def trial(tune_config: dict[str, Any], *, config: str, overrides: list[str], root: str) -> None:
    """One trial, in a Ray worker: train ``config`` with the trial's values, reporting each
    evaluated return to Tune."""
    from ray import tune

    from rlpar.app.train import Training

    ctx = tune.get_context()
    values = [f"{k}={toml_value(v)}" for k, v in tune_config.items()]
    exp = load_experiment(config, [*overrides, *values])
    run_dir = Path(root) / f"trial-{ctx.get_trial_id()}"
    training = Training(exp, run_dir=run_dir)
    seen = 0
    t0, started_at = time.perf_counter(), time.time()

    def on_progress(_: Any) -> None:
        nonlocal seen
        points, seen = training.runner.evaluations.since(seen)
        for point in points:
            tune.report({
                METRIC: point.results[0].mean_return, "env_steps": point.env_steps,
                "wall_s": time.perf_counter() - t0, "final": False, "run_dir": str(run_dir),
                "started_at": started_at, "reported_at": time.time(),
            })  # fmt: skip

    summary = training.run(quiet=True, on_progress=on_progress)
    last = summary.eval_return
    if last is None:  # no final evaluation ([eval] episodes = 0): the last periodic one
        points, _ = training.runner.evaluations.since(0)
        last = points[-1].results[0].mean_return if points else float("nan")
    tune.report({
        METRIC: last, "env_steps": summary.result.env_steps, "wall_s": summary.result.wall_s,
        "final": True, "run_dir": summary.run_dir,
        "started_at": started_at, "reported_at": time.time(),
    })  # fmt: skip


PBT_STATE = "pbt.json"
"""In each PBT checkpoint given to Tune, beside the rlpar checkpoint ``rlpar.ckpt``: the trial
that wrote it, the segments done, its env steps and the schedule that led to it."""


def pbt_trial(
    tune_config: dict[str, Any], *, config: str, overrides: list[str], root: str, every: int
) -> None:
    """One PBT trial, in a Ray worker: train ``config`` with the trial's values in segments of
    ``every`` env steps, each resumed from the last one's checkpoint (or, after an exploit,
    from the checkpoint Tune hands over: another trial's), reporting each segment's final
    evaluation with its checkpoint. Tune's clock (``pbt_env_steps``) is the segment ends'
    ``k * every``; the last report repeats the previous end, so no perturbation follows the
    budget's end."""
    from ray import tune

    from rlpar.app.train import Training

    trial_id = tune.get_context().get_trial_id()
    trial_dir = Path(root) / f"trial-{trial_id}"
    trial_dir.mkdir(parents=True, exist_ok=True)
    values = [f"{k}={toml_value(v)}" for k, v in tune_config.items()]
    exp = load_experiment(config, [*overrides, *values])
    total = exp.runtime.total_env_steps
    done, resume, history, source, started_at = _restored(tune, trial_dir, trial_id)
    while True:
        end = min(total, (done + 1) * every)
        runtime = dataclasses.replace(exp.runtime, total_env_steps=end)
        training = Training(
            dataclasses.replace(exp, runtime=runtime),
            resume=resume,
            run_dir=_unique(trial_dir / f"segment-{done + 1}"),
        )
        summary = training.run(quiet=True)
        result, run_dir = summary.result, summary.run_dir
        done += 1
        score = summary.eval_return
        history.append({
            "trial": trial_id, "config": dict(tune_config), "env_steps": result.env_steps,
            METRIC: score, "wall_s": result.wall_s, "run_dir": run_dir,
            "continued_from": source,
        })  # fmt: skip
        source = None
        if result.checkpoint is None:
            raise RuntimeError(f"PBT segment {done} of trial {trial_id} wrote no checkpoint")
        resume = Path(result.checkpoint)
        final = result.env_steps >= total or result.stopped_by != "total_env_steps"
        with tempfile.TemporaryDirectory() as d:
            shutil.copyfile(resume, Path(d) / "rlpar.ckpt")
            state = {"trial": trial_id, "segments": done, "env_steps": result.env_steps,
                     "history": history, "started_at": started_at}  # fmt: skip
            (Path(d) / PBT_STATE).write_text(json.dumps(state))
            tune.report(
                {
                    METRIC: score, "env_steps": result.env_steps,
                    "pbt_env_steps": (done - 1 if final else done) * every,
                    "wall_s": sum(h["wall_s"] for h in history), "final": final,
                    "run_dir": run_dir, "history": json.dumps(history),
                    "started_at": started_at, "reported_at": time.time(),
                },
                checkpoint=tune.Checkpoint.from_directory(d),
            )  # fmt: skip
        if final:
            return


def _restored(
    tune: Any, trial_dir: Path, trial_id: str
) -> tuple[int, Path | None, list[dict[str, Any]], dict[str, Any] | None, float]:
    """Where a PBT trial starts: segments done, the checkpoint to resume, the history, the
    trial it continues (after an exploit) and when it started. Fresh, or from the checkpoint
    Tune hands over: this trial's own (a pause keeps the time it first started) or another's."""
    given = tune.get_checkpoint()
    if given is None:
        return 0, None, [], None, time.time()
    with given.as_directory() as d:
        state = json.loads((Path(d) / PBT_STATE).read_text())
        done, history = int(state["segments"]), list(state["history"])
        resume = _unique(trial_dir / f"resume-{state['trial']}-{done}.ckpt")
        shutil.copyfile(Path(d) / "rlpar.ckpt", resume)
    if state["trial"] != trial_id:
        source = {"trial": state["trial"], "env_steps": state["env_steps"]}
        return done, resume, history, source, time.time()
    return done, resume, history, None, state["started_at"]


def _unique(path: Path) -> Path:
    """``path``, or ``path`` with ``-r2``, ``-r3``, ... added to its stem when that exists (a
    segment run again after a restart keeps the first one's files)."""
    for i in itertools.count(1):
        candidate = path if i == 1 else path.with_name(f"{path.stem}-r{i}{path.suffix}")
        if not candidate.exists():
            return candidate
    raise AssertionError("unreachable")
