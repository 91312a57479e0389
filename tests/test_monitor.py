"""TensorBoard output read back by TensorBoard itself (its EventAccumulator, and a real server on
127.0.0.1), and the progress display on and off a terminal."""

from __future__ import annotations

import dataclasses
import io
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.util.tensor_util import make_ndarray

from rlpar.app.experiment import load_experiment
from rlpar.app.monitor import (
    FINAL_RETURN,
    SCALAR_TAGS,
    EventWriter,
    TensorBoardMonitor,
    flatten_hparams,
)
from rlpar.app.progress import BarDisplay, LogDisplay, NoDisplay, make_display, status_line
from rlpar.app.train import Training
from rlpar.runtime import Progress

ROOT = Path(__file__).resolve().parent.parent
IMPALA = ROOT / "experiments" / "cartpole_impala.toml"


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> tuple[Path, dict]:
    """A short real run with scalars written every 3000 env steps and histograms every 20
    learner steps."""
    logdir = tmp_path_factory.mktemp("runs")
    exp = load_experiment(
        IMPALA,
        [
            f"log.logdir={json.dumps(str(logdir))}",
            "log.scalar_points=20",
            "log.histogram_interval=20",
            "runtime.total_env_steps=60000",
            "runtime.target_return=none",
            "eval.episodes=4",
            "eval.interval_env_steps=20000",
            "eval.interval_episodes=2",
        ],
    )
    training = Training(exp)
    summary = training.run(quiet=True)
    return training.run_dir, summary


def accumulator(run_dir: Path) -> EventAccumulator:
    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return acc


def scalar_values(acc: EventAccumulator, tag: str) -> tuple[list[int], list[float]]:
    """What `SummaryWriter` users read: ``Scalars(tag)``."""
    events = acc.Scalars(tag)
    return [e.step for e in events], [e.value for e in events]


def test_scalars_are_what_tensorboards_scalar_readers_read(tmp_path: Path) -> None:
    writer = EventWriter(tmp_path)
    writer.scalars({"return/mean": 21.5, "loss/total": np.float32(0.25)}, 100)
    writer.scalars({"return/mean": 30.0}, 200)
    writer.close()
    acc = accumulator(tmp_path)
    assert set(acc.Tags()["scalars"]) == {"return/mean", "loss/total"}
    assert scalar_values(acc, "return/mean") == ([100, 200], [21.5, 30.0])
    assert scalar_values(acc, "loss/total") == ([100], [0.25])


class _NoPoints:
    def since(self, written: int) -> tuple[list, int]:
        return [], written


def test_numpy_metrics_are_written_and_unwritable_ones_warned_about_once(tmp_path, caplog):
    runner = SimpleNamespace(evaluations=_NoPoints(), target_checks=_NoPoints())
    monitor = TensorBoardMonitor(tmp_path, runner, {}, scalar_interval_steps=1,
                                 histogram_interval=0)  # fmt: skip
    metrics = {
        "loss": np.float32(0.5),  # np.float32 is no Python float
        "valid_steps": np.int64(64),
        "mean_rho": np.array(0.25, np.float32),  # 0-d
        "per_env": np.zeros(3, np.float32),
        "note": "text",
    }
    with caplog.at_level(logging.WARNING, logger="rlpar"):
        for steps in (100, 200):
            monitor.update(dataclasses.replace(progress(steps, 1.0), metrics=metrics))
    monitor.close()
    acc = accumulator(tmp_path)
    assert scalar_values(acc, "loss/total") == ([100, 200], [0.5, 0.5])
    assert scalar_values(acc, "learner/valid_steps")[1] == [64.0, 64.0]
    assert scalar_values(acc, "learner/mean_rho")[1] == [0.25, 0.25]
    tags = acc.Tags()["scalars"]
    assert "learner/per_env" not in tags and "learner/note" not in tags
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 2, warned  # once per key, not once per point
    assert "'per_env'" in warned[0] and "ndarray float32 [3]" in warned[0]
    assert "'note'" in warned[1] and "got str 'text'" in warned[1]


def test_every_scalar_tag_is_written_with_env_steps_increasing(run) -> None:
    run_dir, summary = run
    acc = accumulator(run_dir)
    tags = set(acc.Tags()["scalars"])
    missing = set(SCALAR_TAGS) - tags
    assert not missing, f"scalar tags never written: {sorted(missing)}"
    for tag in SCALAR_TAGS:
        steps, values = scalar_values(acc, tag)
        assert steps == sorted(set(steps)), f"{tag}: steps not strictly increasing: {steps}"
        assert all(np.isfinite(values)), tag
    steps, _ = scalar_values(acc, "return/mean")
    assert len(steps) >= 3, "expected several points on the return curve"
    assert steps[-1] == summary.result.env_steps


def test_scalar_values_make_sense(run) -> None:
    run_dir, summary = run
    acc = accumulator(run_dir)
    _, mean = scalar_values(acc, "return/mean")
    _, low = scalar_values(acc, "return/min")
    _, high = scalar_values(acc, "return/max")
    assert all(lo <= m <= hi for lo, m, hi in zip(low, mean, high, strict=True))
    assert mean[-1] == pytest.approx(summary.result.mean_return)
    fractions = [scalar_values(acc, t)[1][-1] for t in SCALAR_TAGS if t.startswith("time_frac")]
    assert sum(fractions) == pytest.approx(1.0, abs=1e-6)
    _, lr = scalar_values(acc, "optim/learning_rate")
    assert lr[-1] == pytest.approx(0.003)
    _, versions = scalar_values(acc, "runtime/snapshot_version")
    assert versions[-1] == summary.result.learner_steps + 1
    _, rates = scalar_values(acc, "throughput/env_steps_per_s")
    assert all(r >= 0 for r in rates)


def test_histograms_text_and_hparams_are_written(run) -> None:
    run_dir, summary = run
    acc = accumulator(run_dir)
    tags = set(acc.Tags()["tensors"])
    params = {t for t in tags if t.startswith("params/")}
    assert params == {
        f"params/{layer}.{kind}"
        for layer in ("layers.0", "layers.2", "heads.0", "heads.1")
        for kind in ("weight", "bias")
    }
    assert len(acc.Tensors("params/layers.0.weight")) >= 2
    actions = acc.Tensors("actions")
    assert actions, "no action histogram"
    buckets = make_ndarray(actions[-1].tensor_proto)  # [k, 3]: left edge, right edge, count
    assert buckets[:, 2].sum() > 0 and buckets[:, 0].min() >= 0 and buckets[:, 1].max() <= 1
    text = make_ndarray(acc.Tensors("config")[0].tensor_proto).item().decode()
    assert 'name = "impala"' in text and "total_env_steps = 60_000" in text
    assert {"_hparams_/experiment", "_hparams_/session_start_info"} <= tags
    assert FINAL_RETURN in acc.Tags()["scalars"]
    (final,) = scalar_values(acc, FINAL_RETURN)[1]
    assert final == pytest.approx(summary.result.mean_return)


def test_the_run_directory_holds_config_checkpoints_and_summary(run) -> None:
    run_dir, summary = run
    assert run_dir.parent.name == "cartpole_impala"
    assert (run_dir / "config.toml").is_file()
    again = load_experiment(run_dir / "config.toml")
    assert again.runtime.total_env_steps == 60000 and again.runtime.target_return is None
    assert json.loads((run_dir / "summary.json").read_text()) == summary.to_dict()
    result = summary.result
    assert Path(result.checkpoint).parent == run_dir / "checkpoints"
    assert result.stopped_by == "total_env_steps" and result.time_to_target_s is None


def test_flatten_hparams() -> None:
    flat = flatten_hparams({"a": {"b": 1, "c": None, "d": [1, 2], "e": {}}, "f": True, "g": "x"})
    assert flat == {"a.b": 1.0, "a.c": "none", "a.d": "[1, 2]", "a.e": "{}", "f": True, "g": "x"}


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_json(url: str):
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


def test_a_real_tensorboard_server_serves_the_return_curve(run) -> None:
    run_dir, summary = run
    logdir = run_dir.parent.parent
    run_name = run_dir.relative_to(logdir).as_posix()
    executable = Path(sys.executable).with_name("tensorboard")
    assert executable.exists(), f"no tensorboard executable next to {sys.executable}"
    port = free_port()
    server = subprocess.Popen(
        [
            *(str(executable), "--logdir", str(logdir)),
            *("--host", "127.0.0.1", "--port", str(port)),
            *("--load_fast=false", "--reload_interval=1"),  # no separate data server process
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        runs: list = []
        while run_name not in runs:
            assert server.poll() is None, server.stderr.read().decode()[-2000:]
            assert time.monotonic() < deadline, f"server never listed {run_name!r}: {runs}"
            try:
                runs = get_json(f"{base}/data/runs")
            except OSError:
                pass
            time.sleep(0.2)
        query = urllib.parse.urlencode({"run": run_name, "tag": "return/mean"})
        curve = get_json(f"{base}/data/plugin/scalars/scalars?{query}")
        steps = [step for _wall, step, _value in curve]
        values = [value for _wall, _step, value in curve]
        expected_steps, expected_values = scalar_values(accumulator(run_dir), "return/mean")
        assert steps == expected_steps
        assert values == pytest.approx(expected_values)
        assert values[-1] == pytest.approx(summary.result.mean_return)
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
        server.stderr.close()


# ------------------------------------------------------------------------------------ progress


def progress(env_steps: int, wall_s: float, mean_return: float | None = 21.5) -> Progress:
    return Progress(
        wall_s=wall_s,
        env_steps=env_steps,
        learner_steps=env_steps // 100,
        version=env_steps // 100 + 1,
        episodes=10,
        mean_return=mean_return,
        min_return=None if mean_return is None else 9.0,
        max_return=None if mean_return is None else 60.0,
        mean_length=None if mean_return is None else 21.5,
        env_steps_per_s=env_steps / wall_s,
        learner_steps_per_s=1.0,
        samples_per_s=1.0,
        policy_lag_mean=0.5,
        policy_lag_max=2,
        dropped_rollouts=0,
        skipped_publishes=0,
        lost_rollouts=0,
        queue_depth=1,
        stage_fractions={},
        metrics={},
    )


def test_status_line_shows_steps_rate_return_lag_and_eta() -> None:
    line = status_line(progress(25_000, 1.0), 100_000, rate=25_000.0)
    assert line == (
        "env steps 25,000/100,000 (25%) | 25.0k steps/s | return 21.5 [9, 60] | lag 0.5/2 | "
        "learner steps 250 | ETA 0:03"
    )
    assert "return - |" in status_line(progress(10, 1.0, None), 100, rate=0.0)
    assert status_line(progress(10, 1.0), 100, rate=0.0).endswith("ETA ?")
    # Once the run has ended: its wall time instead of an ETA.
    assert status_line(progress(10, 75.0), 100, rate=1.0, done=True).endswith("| ended after 1:15")


class FakeStream(io.StringIO):
    def __init__(self, tty: bool) -> None:
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


def test_display_choice_follows_quiet_and_the_terminal() -> None:
    assert type(make_display(100, quiet=True, stream=FakeStream(True))) is NoDisplay
    assert type(make_display(100, stream=FakeStream(False))) is LogDisplay
    bar = make_display(100, stream=FakeStream(True))
    assert type(bar) is BarDisplay
    bar.close()


def test_the_log_display_logs_every_interval_and_at_the_end(caplog) -> None:
    display = LogDisplay(100_000, interval_s=3600)
    with caplog.at_level(logging.INFO, logger="rlpar"):
        display.update(progress(1000, 1.0))
        display.update(progress(2000, 2.0))
        assert caplog.records == []  # the interval has not passed
        display.close()
    (record,) = caplog.records
    assert record.getMessage().startswith("env steps 2,000/100,000 (2%) | 1.0k steps/s")
    assert record.getMessage().endswith("| ended after 0:02")


def test_the_last_log_line_shows_the_runs_rate_not_the_last_intervals(caplog) -> None:
    # A run that stops on its target ends with evaluation episodes: no env steps since the
    # previous line, so that interval's rate is 0, while the run averaged 1,000 steps/s.
    display = LogDisplay(100_000, interval_s=0.0)
    with caplog.at_level(logging.INFO, logger="rlpar"):
        display.update(progress(2000, 2.0))
        display._next = float("inf")  # the next update comes before the interval has passed
        display.update(progress(2000, 3.0))
        display.close()
    first, last = (r.getMessage() for r in caplog.records)
    assert "| 1.0k steps/s |" in first and "| ETA " in first
    assert "| 667 steps/s |" in last  # 2,000 steps over 3.0 s
    assert last.endswith("| ended after 0:03")


def test_the_last_log_line_comes_even_when_the_last_update_was_logged(caplog) -> None:
    display = LogDisplay(100_000, interval_s=0.0)
    with caplog.at_level(logging.INFO, logger="rlpar"):
        display.update(progress(2000, 2.0))
        display.close()
    first, last = (r.getMessage() for r in caplog.records)
    assert "| ETA " in first and last.endswith("| ended after 0:02")


def test_the_bar_shows_steps_return_and_lag() -> None:
    stream = FakeStream(True)
    bar = BarDisplay(100_000, stream)
    bar.update(progress(50_000, 1.0))
    bar.close()
    out = stream.getvalue()
    assert "50.0k/100k env steps" in out and "return 21.5 [9, 60], lag 0.5/2" in out
    assert "\r" in out
