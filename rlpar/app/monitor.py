"""TensorBoard logging of a run, written with the `tensorboard` package alone (no TensorFlow,
no torch): `EventFileWriter` frames the events, the plugins' ``*_pb`` functions build the
histograms, text and hparams. Curves are plain scalar summaries (``simple_value``, as
``SummaryWriter.add_scalar`` writes them), so TensorBoard's scalars dashboard and its
`EventAccumulator`'s ``Scalars(tag)`` both read them. The x-axis of every curve is env steps.

::

    monitor = TensorBoardMonitor(run_dir, runner, config)
    monitor.start()                         # the config as text, the hparams
    runner.run(on_progress=monitor.update)  # scalars, histograms when they are due
    monitor.finish(result)                  # last point, histograms, the final return
    monitor.close()

`SCALAR_TAGS` and `OTHER_TAGS` list every tag with what it tells (the tag table of
docs/cli.md is generated from them).
"""

from __future__ import annotations

import json
import logging
import math
import numbers
import time
import typing
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.plugins.histogram import summary_v2 as histogram_summary
from tensorboard.plugins.hparams import summary_v2 as hparams_summary
from tensorboard.plugins.text import summary_v2 as text_summary
from tensorboard.summary.writer.event_file_writer import EventFileWriter

from rlpar.app.experiment import to_toml

if TYPE_CHECKING:
    from rlpar.app.clips import TrainingClips
    from rlpar.runtime import Progress, Runner, RunResult

__all__ = ["OTHER_TAGS", "SCALAR_TAGS", "EventWriter", "TensorBoardMonitor", "metric_value"]

log = logging.getLogger("rlpar")

SCALAR_TAGS: dict[str, str] = {
    "return/mean": "Mean return of the last `runtime.return_window` episodes: the learning curve.",
    "return/min": "Worst return in that window: a wide min-max band means an unstable policy.",
    "return/max": "Best return in that window.",
    "episode/length": "Mean episode length in that window.",
    "episode/count": "Episodes finished since the run began.",
    "throughput/env_steps_per_s": "Env steps per second, all actors, since the previous point.",
    "throughput/learner_steps_per_s": "Learner steps (optimizer updates) per second.",
    "throughput/samples_per_s": "Env steps consumed by the learner per second. Below "
    "`env_steps_per_s` when stale rollouts are dropped.",
    "policy_lag/mean": "Learner version minus the version that acted each rollout of the last "
    "batch: how off-policy the data is. It grows when actors outrun the learner.",
    "policy_lag/max": "The largest lag in the last batch (compare with `runtime.max_policy_lag`).",
    "runtime/dropped_rollouts": "Rollouts dropped for a lag above `runtime.max_policy_lag` "
    "(a running total).",
    "runtime/lost_rollouts": "Rollouts lost with a Ray actor process that died (Ray backend; "
    "0 with threads).",
    "runtime/skipped_publishes": "Parameter publishes skipped because every snapshot slot was "
    "pinned (a running total; should stay 0).",
    "runtime/queue_depth": "Rollouts waiting for the learner. Near full: the learner is the "
    "bottleneck; near 0: the actors are.",
    "runtime/snapshot_version": "Version of the parameters the learner last published "
    "(learner steps + 1).",
    "loss/total": "The loss the optimizer minimised at the last learner step.",
    "loss/policy": "Its policy-gradient term.",
    "loss/value": "Its value (baseline) term.",
    "loss/entropy": "Mean entropy of the policy. A collapse to 0 early means it stopped exploring.",
    "optim/grad_norm": "Global gradient norm before clipping (`agent.optim.max_grad_norm`).",
    "optim/learning_rate": "The optimizer's learning rate.",
    "time_fraction/env_step": "Share of the run's thread time spent stepping envs (actors). "
    "With native envs and the fused unroll it includes the forward passes and sampling, which "
    "run inside the same native call.",
    "time_fraction/inference": "Share spent in the actors' forward passes and sampling (0 on "
    "the fused path).",
    "time_fraction/queue_wait": "Share spent waiting on the rollout queue, by actors (queue "
    "full: the learner is the bottleneck) or by the learner (empty: the actors are).",
    "time_fraction/learn": "Share spent in the learner step (forward, loss, backward, update).",
    "time_fraction/publish": "Share spent publishing parameters to the snapshot store.",
    "time/gil_held/actors": "Share of the actor threads' wall time they held the GIL "
    "(their CPU time outside rlpar's GIL-free calls: Python, and native work under the GIL). "
    "Serial: the GIL serves at most 1 / held threads (docs/runtime.md, The GIL meter).",
    "time/gil_wait/actors": "Share they waited to take the GIL back after a GIL-free native "
    "call (another thread held it): the convoy effect.",
    "time/gil_native/actors": "Share they spent in rlpar's native calls with the GIL released.",
    "time/gil_held/learner": "The same shares for the learner thread: held,",
    "time/gil_wait/learner": "waiting to re-take it,",
    "time/gil_native/learner": "and in native calls without it.",
    "time/gil_actor_ceiling": "Actor threads the GIL could serve at these shares beside the "
    "learner ((1 - learner held) / actor held): the predicted thread ceiling on enough cores.",
    "eval/return_mean": "Mean return of an evaluation of one parameter version (`[eval]`, first "
    "of `eval.policies`): every `eval.interval_env_steps` (`eval.interval_episodes` episodes, a "
    "pinned snapshot) and once at the end (`eval.episodes` episodes, the final parameters). "
    "The policy's real quality, unlike the training window of `return/mean`.",
    "eval/return_std": "Standard deviation of the returns in that evaluation.",
}

OTHER_TAGS: dict[str, str] = {
    "eval/<policy>/return_mean": "The same for the other policies of `eval.policies` "
    "(e.g. `eval/sampled/return_mean` after greedy).",
    "eval/<policy>/return_std": "Their standard deviation.",
    "time/gil_<share>/actor_<i>": "`time/gil_held`, `gil_wait` and `gil_native` of each actor "
    "thread.",
    "eval/target_check": "Evaluated mean return of each `eval.check_target` evaluation (the run "
    "stops at the first that reaches `runtime.target_return`).",
    "learner/<metric>": "Every other metric the agent's learner step returns (IMPALA: `mean_rho`, "
    "`rho_clipped_fraction`, `mean_advantage`, `mean_value`, `valid_steps`).",
    "hparams/final_return": "`return/mean` at the end of the run: a metric of the hparams "
    "dashboard.",
    "hparams/final_eval_return": "`eval/return_mean` of the final evaluation: the other metric.",
    "params/<name>": "Histograms of each parameter tensor (e.g. `params/layers.0.weight`), every "
    "`log.histogram_interval` learner steps.",
    "actions": "Histogram of the actions in the last learner batch (`actions/<i>` per dimension "
    "for continuous actions), at the same interval.",
    "video/<policy>": "Animated image: a clip of one episode every "
    "`eval.video_interval_env_steps` env steps (also `videos/<env steps>.gif` in the run "
    "directory).",
    "config": "Text: the resolved config (`config.toml` of the run directory).",
    "hparams dashboard": "The config, flattened (`agent.optim.lr`, ...), against the final return.",
}

# Learner metric name -> tag; other metrics go to learner/<name>.
_METRIC_TAGS = {
    "loss": "loss/total",
    "policy_loss": "loss/policy",
    "value_loss": "loss/value",
    "entropy": "loss/entropy",
    "grad_norm": "optim/grad_norm",
    "learning_rate": "optim/learning_rate",
}
_STAGE_TAGS = {name: f"time_fraction/{name}" for name in ("env_step", "inference", "queue_wait")}
_STAGE_TAGS |= {"learn": "time_fraction/learn", "publish": "time_fraction/publish"}
FINAL_RETURN = "hparams/final_return"
FINAL_EVAL_RETURN = "hparams/final_eval_return"


def eval_tags(policy_index: int, policy: str, mean: float, std: float) -> dict[str, float]:
    """The eval scalars of one policy's evaluation (the first policy has the short tags)."""
    prefix = "eval" if policy_index == 0 else f"eval/{policy}"
    return {f"{prefix}/return_mean": mean, f"{prefix}/return_std": std}


def metric_value(value: object) -> float | None:
    """A learner metric as a float: a Python or numpy number (``np.float32(0.5)``) or a 0-d
    numeric array; None for anything else (a string, an array of several values, None)."""
    if isinstance(value, np.ndarray):
        return float(value) if value.ndim == 0 and value.dtype.kind in "biuf" else None
    return float(value) if isinstance(value, numbers.Real) else None


def gil_tags(gil: dict[str, Any]) -> dict[str, float]:
    """The ``time/gil_*`` scalars of a `Progress.gil` report."""
    values: dict[str, float] = {}
    for thread, shares in gil.items():
        if isinstance(shares, dict):
            for share, value in shares.items():
                values[f"time/gil_{share}/{thread}"] = value
    if gil.get("actor_ceiling") is not None:
        values["time/gil_actor_ceiling"] = gil["actor_ceiling"]
    return values


class EventWriter:
    """Summaries into one TensorBoard event file in ``logdir``; ``step`` is the x-axis."""

    def __init__(self, logdir: str | Path) -> None:
        self._writer = EventFileWriter(str(logdir), flush_secs=10)

    def write(self, summary: summary_pb2.Summary, step: int) -> None:
        self._writer.add_event(event_pb2.Event(wall_time=time.time(), step=step, summary=summary))

    def scalars(self, values: dict[str, float], step: int) -> None:
        """One point of each curve ``tag -> value``, as ``simple_value`` scalars."""
        summary = summary_pb2.Summary(
            value=[
                summary_pb2.Summary.Value(tag=t, simple_value=float(v)) for t, v in values.items()
            ]
        )
        self.write(summary, step)

    def histogram(self, tag: str, values: np.ndarray, step: int, buckets: int = 30) -> None:
        data = np.asarray(values, np.float64).ravel()
        self.write(histogram_summary.histogram_pb(tag, data, buckets=buckets), step)

    def text(self, tag: str, text: str, step: int = 0) -> None:
        self.write(text_summary.text_pb(tag, text), step)

    def hparams(self, values: dict[str, Any], metrics: list[str]) -> None:
        """The hparams dashboard's experiment (one value per key) and this run's values."""
        hps = {
            hparams_summary.HParam(k, hparams_summary.Discrete([v])): v for k, v in values.items()
        }
        config = hparams_summary.hparams_config_pb(
            hparams=list(hps), metrics=[hparams_summary.Metric(m) for m in metrics]
        )
        self.write(config, 0)
        self.write(hparams_summary.hparams_pb(hps, start_time_secs=time.time()), 0)

    def image(self, tag: str, encoded: bytes, height: int, width: int, step: int) -> None:
        """An image summary of ``encoded`` (PNG or GIF bytes; TensorBoard animates a GIF)."""
        image = summary_pb2.Summary.Image(
            height=height, width=width, colorspace=3, encoded_image_string=encoded
        )
        value = summary_pb2.Summary.Value(tag=tag, image=image)
        self.write(summary_pb2.Summary(value=[value]), step)

    def flush(self) -> None:
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


def flatten_hparams(config: dict[str, Any], prefix: str = "") -> dict[str, bool | float | str]:
    """``{"agent": {"optim": {"lr": 0.003}}}`` -> ``{"agent.optim.lr": 0.003}``; values the
    hparams plugin cannot hold (None, lists, tables) become text."""
    out: dict[str, bool | float | str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out |= flatten_hparams(value, f"{name}.")
        elif isinstance(value, (bool, str)):
            out[name] = value
        elif isinstance(value, (int, float)):
            out[name] = float(value)
        else:
            out[name] = "none" if value is None else json.dumps(value)
    return out


class TensorBoardMonitor:
    """Writes a run's curves, histograms, config and hparams to ``run_dir``.

    ``config``: the resolved experiment config (plain data); the hparams are its env, agent
    and runtime keys. ``update`` is the runner's progress callback (main thread): it writes
    the scalars once ``scalar_interval_steps`` env steps or ``scalar_interval_s`` seconds have
    passed since it last did, whichever comes first, and histograms once ``histogram_interval``
    learner steps have passed (0: never).
    """

    def __init__(
        self,
        run_dir: str | Path,
        runner: Runner,
        config: dict[str, Any],
        scalar_interval_steps: int = 1000,
        scalar_interval_s: float = 10.0,
        histogram_interval: int = 1000,
        clips: TrainingClips | None = None,
    ) -> None:
        self.runner = runner
        self.clips = clips
        self._clips_written = 0
        self.config = config
        self.scalar_interval_steps = scalar_interval_steps
        self.scalar_interval_s = scalar_interval_s
        self.histogram_interval = histogram_interval
        self.writer = EventWriter(run_dir)
        self._last: Progress | None = None
        self._written: Progress | None = None
        self._next_scalars = (0.0, 0)  # (wall clock, env steps) when the scalars are due
        self._histogram_at: int | None = None  # learner steps due for the next histograms
        self._histogram_step = -1  # env steps of the last ones
        self._evals_written = 0  # of runner.evaluations
        self._eval_step: int | None = None  # env steps of the last evaluation point written
        self._checks_written = 0  # of runner.target_checks
        self._unwritable: set[str] = set()  # learner metrics already warned about

    def start(self) -> None:
        self.writer.text("config", "    " + to_toml(self.config).replace("\n", "\n    "))
        hparams = {k: v for k, v in self.config.items() if k in ("env", "agent", "runtime")}
        self.writer.hparams(flatten_hparams(hparams), [FINAL_RETURN, FINAL_EVAL_RETURN])
        self.writer.flush()

    def update(self, p: Progress) -> None:
        self._last = p
        now = time.perf_counter()
        due_time, due_steps = self._next_scalars
        if now >= due_time or p.env_steps >= due_steps:
            self._next_scalars = (
                now + self.scalar_interval_s,
                p.env_steps + self.scalar_interval_steps,
            )
            self._write_scalars(p)
            self.writer.flush()
        if self.histogram_interval > 0 and (
            self._histogram_at is None or p.learner_steps >= self._histogram_at
        ):
            self._write_histograms(p.env_steps)
            self._histogram_at = p.learner_steps + self.histogram_interval
        self._write_evaluations()

    def finish(self, result: RunResult) -> None:
        """The run's last point (the progress the runner reported after stopping) and result."""
        p = self._last
        if p is not None:
            if self._written is None or p.env_steps > self._written.env_steps:
                # The threads have stopped: a rate over this last interval would count the
                # shutdown as slow steps, so the rate curves end at the previous point.
                self._write_scalars(p, rates=self._written is None)
            if self.histogram_interval > 0 and self._histogram_step != p.env_steps:
                self._write_histograms(p.env_steps)
        self._write_evaluations()
        step = p.env_steps if p is not None else result.env_steps
        if result.mean_return is not None:
            self.writer.scalars({FINAL_RETURN: result.mean_return}, step)
        if result.evaluation:
            values: dict[str, float] = {}
            if self._eval_step is None or step > self._eval_step:
                # a periodic evaluation of the last version may already sit at this env step:
                # each eval curve keeps one point per step
                for i, e in enumerate(result.evaluation):
                    values |= eval_tags(i, e["policy"], e["mean_return"], e["std_return"])
            values[FINAL_EVAL_RETURN] = result.evaluation[0]["mean_return"]
            self.writer.scalars(values, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()

    # -------------------------------------------------------------------------------- parts

    def _write_evaluations(self) -> None:
        """The evaluator's points and the target checks that came since the last call."""
        points, self._evals_written = self.runner.evaluations.since(self._evals_written)
        for point in points:
            values: dict[str, float] = {}
            for i, e in enumerate(point.results):
                values |= eval_tags(i, e.policy, e.mean_return, e.std_return)
            self.writer.scalars(values, point.env_steps)
            self._eval_step = max(self._eval_step or 0, point.env_steps)
        checks, self._checks_written = self.runner.target_checks.since(self._checks_written)
        for c in checks:
            self.writer.scalars({"eval/target_check": c.eval_mean}, c.env_steps)
        if self.clips is not None:
            clips, self._clips_written = self.clips.clips.since(self._clips_written)
            for clip in clips:
                self.writer.image(f"video/{clip.policy}", clip.gif, clip.height, clip.width,
                                  clip.env_steps)  # fmt: skip
            if clips:
                self.writer.flush()

    def _write_scalars(self, p: Progress, rates: bool = True) -> None:
        values: dict[str, float] = {}
        if p.mean_return is not None:
            values["return/mean"] = p.mean_return
            values["return/min"] = typing.cast(float, p.min_return)  # set with the mean
            values["return/max"] = typing.cast(float, p.max_return)
        if p.mean_length is not None:
            values["episode/length"] = p.mean_length
        values["episode/count"] = p.episodes
        if rates:
            values |= self._rates(p)
        values["policy_lag/mean"] = p.policy_lag_mean
        values["policy_lag/max"] = p.policy_lag_max
        values["runtime/dropped_rollouts"] = p.dropped_rollouts
        values["runtime/skipped_publishes"] = p.skipped_publishes
        values["runtime/lost_rollouts"] = p.lost_rollouts
        values["runtime/queue_depth"] = p.queue_depth
        values["runtime/snapshot_version"] = p.version
        for name, value in p.metrics.items():
            number = metric_value(value)
            if number is None:
                self._warn_unwritable(name, value)
            elif math.isfinite(number):
                values[_METRIC_TAGS.get(name, f"learner/{name}")] = number
        for stage, fraction in p.stage_fractions.items():
            values[_STAGE_TAGS.get(stage, f"time_fraction/{stage}")] = fraction
        values |= gil_tags(p.gil)
        self.writer.scalars(values, p.env_steps)
        self._written = p

    def _warn_unwritable(self, name: str, value: object) -> None:
        """One warning per metric ``name`` whose value is no single number."""
        if name in self._unwritable:
            return
        self._unwritable.add(name)
        got = type(value).__name__
        if isinstance(value, np.ndarray):
            got = f"ndarray {value.dtype} {list(value.shape)}"
        log.warning(
            "learner metric %r: expected one number (a Python or numpy scalar, or a 0-d array), "
            "got %s %s; it is not written to TensorBoard (this warning is given once)",
            name,
            got,
            _short_repr(value),
        )

    def _rates(self, p: Progress) -> dict[str, float]:
        """Rates since the previously written point (the Progress rates are run averages)."""
        names = ("env_steps_per_s", "learner_steps_per_s", "samples_per_s")
        prev = self._written
        rates = {}
        for name in names:
            rate = getattr(p, name)
            if prev is not None and p.wall_s > prev.wall_s:
                done = rate * p.wall_s - getattr(prev, name) * prev.wall_s
                rate = done / (p.wall_s - prev.wall_s)
            rates[f"throughput/{name}"] = rate
        return rates

    def _write_histograms(self, step: int) -> None:
        net, writer = self.runner.net, self.writer
        self._histogram_step = step
        with self.runner.store.pin() as snap:  # a consistent, read-only view of one version
            for name, values in net.param_views(snap.params).items():
                writer.histogram(f"params/{name}", values, step)
        actions = self.runner.learner.stats.last_actions
        if actions is None or actions.size == 0:
            return
        if actions.ndim == 1:  # discrete: one bucket per action
            writer.histogram("actions", actions, step, buckets=int(actions.max()) + 1)
        else:
            for i in range(actions.shape[1]):
                writer.histogram(f"actions/{i}", actions[:, i], step)


def _short_repr(value: object, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
