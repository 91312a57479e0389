"""`rlpar bench soak`: does a long ``rlpar train`` keep its memory flat?

Runs ``rlpar train`` as a user does (a child process, its TensorBoard files, periodic
evaluations, checkpoints) on IMPALA CartPole with no target return, once on gymnasium's
CartPole (the Python path) and once on rlpar's native CartPole (the fused path), each for
``seconds`` of wall time, and samples the child's resident set size (RSS) from /proc every
``interval_s``. After a warm-up (the first quarter of the run), the least-squares slope of RSS
over time, divided by the run's env steps per second, is the growth per million env steps.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from rlpar.runtime.child_command import rlpar_command

__all__ = ["PATHS", "bench_soak", "rss_growth"]

#: path name -> env id; the rest of the experiment is experiments/cartpole_impala.toml's.
PATHS = {"python_env": "CartPole-v1", "native_fused": "rlpar/CartPole-v1"}

_EXPERIMENT = """name = "soak"

[env]
id = "{env_id}"

[agent]
name = "impala"
entropy_cost = 0.01

[agent.optim]
name = "adam"
lr = 0.003

[runtime]
num_actors = 2
envs_per_actor = 16
unroll_length = 8
batch_rollouts = 1
total_env_steps = 1_000_000_000_000
max_wall_s = {seconds}
checkpoint_interval_s = 60.0
seed = 0

[eval]
episodes = 10
interval_env_steps = 50_000
interval_episodes = 10
"""

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _rss_bytes(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return None


def rss_growth(
    samples: list[tuple[float, float]], env_steps: int, wall_s: float, warmup: float = 0.25
) -> float | None:
    """MB of RSS per million env steps: the least-squares slope of ``samples`` ((seconds, MB)
    pairs) after the first ``warmup`` share of their time span, times ``wall_s / env_steps``
    (the run's seconds per env step). None when fewer than 3 samples are left or no env step
    was taken."""
    span = samples[-1][0] if samples else 0.0
    kept = [(t, mb) for t, mb in samples if t >= warmup * span]
    if len(kept) < 3 or env_steps <= 0 or wall_s <= 0:
        return None
    t, mb = np.array(kept).T
    slope_per_s = float(np.polyfit(t, mb, 1)[0])
    return slope_per_s * wall_s / env_steps * 1e6


def _soak_one(env_id: str, seconds: float, interval_s: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="rlpar-soak-") as tmp:
        config = Path(tmp) / "soak.toml"
        config.write_text(_EXPERIMENT.format(env_id=env_id, seconds=seconds))
        cmd = rlpar_command("train", str(config), "--quiet", "--logdir", str(Path(tmp) / "runs"))
        log_file = Path(tmp) / "stderr.log"
        samples: list[tuple[float, float]] = []
        with open(log_file, "wb") as stderr:
            start = time.perf_counter()
            proc = subprocess.Popen(
                cmd, cwd=tmp, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr
            )
            try:
                while proc.poll() is None:
                    rss = _rss_bytes(proc.pid)
                    if rss is not None:
                        samples.append((time.perf_counter() - start, rss / 2**20))
                    time.sleep(interval_s)
            finally:
                if proc.poll() is None:
                    proc.kill()
                proc.wait()
        if proc.returncode != 0:
            tail = log_file.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"rlpar bench soak: rlpar train of {env_id} failed:\n{tail}")
        (summary_file,) = (Path(tmp) / "runs" / "soak").glob("*/summary.json")
        summary = json.loads(summary_file.read_text())
    wall, steps = float(summary["wall_s"]), int(summary["env_steps"])
    span = samples[-1][0] if samples else 0.0

    def median_mb(lo: float, hi: float) -> float | None:
        kept = [mb for t, mb in samples if lo * span <= t <= hi * span]
        return float(np.median(kept)) if kept else None

    return {
        "env_id": env_id,
        "wall_s": wall,
        "env_steps": steps,
        "episodes": int(summary["episodes"]),
        "samples": len(samples),
        "rss_after_warmup_mb": median_mb(0.25, 0.5),  # medians: the allocator's churn moves
        "rss_end_mb": median_mb(0.75, 1.0),  # single samples by a megabyte either way
        "rss_max_mb": max(mb for _, mb in samples) if samples else None,
        "growth_mb_per_million_env_steps": rss_growth(samples, steps, wall),
    }


def bench_soak(
    seconds: float = 300.0, quick: bool = False, interval_s: float | None = None
) -> dict[str, Any]:
    """RSS over a ``seconds``-long ``rlpar train`` on each of `PATHS` (``quick``: 8 s each,
    sampled every 0.5 s, to check that it runs). Returns {path: report} plus the settings."""
    if not seconds > 0:
        raise ValueError(f"--seconds: expected a number > 0, got {seconds}")
    if quick:
        seconds, interval_s = min(seconds, 8.0), 0.5
    every = interval_s if interval_s is not None else max(0.5, min(5.0, seconds / 60))
    result: dict[str, Any] = {"seconds": seconds, "interval_s": every}
    for name, env_id in PATHS.items():
        result[name] = _soak_one(env_id, seconds, every)
    return result
