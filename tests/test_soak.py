"""Memory stays flat over a long run: no leaked pins, rollouts, snapshots or tapes.

Runs IMPALA on CartPole for RLPAR_SOAK_S seconds (default 120) in a subprocess, sampling the
process RSS every second. After the first quarter (warm-up), the median RSS of the last quarter
may exceed the median of the second quarter by at most 5 % (medians, because the allocator's
churn moves single samples by a megabyte or two either way).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np

SOAK_S = float(os.environ.get("RLPAR_SOAK_S", "120"))

SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    import rlpar

    page = os.sysconf("SC_PAGE_SIZE")

    def rss() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * page

    samples = []
    agent = rlpar.make_agent("impala", {"optim": {"lr": 0.003}})
    runtime = rlpar.RuntimeConfig(num_actors=2, envs_per_actor=16, unroll_length=8,
                                  batch_rollouts=1, total_env_steps=10**12,
                                  max_wall_s=float(sys.argv[1]), checkpoint_interval_s=None)
    runner = rlpar.Runner(agent, rlpar.EnvConfig("CartPole-v1"), runtime)
    result = runner.run(on_progress=lambda p: samples.append((p.wall_s, rss(), p.env_steps)),
                        progress_interval_s=1.0)
    print(json.dumps({"samples": samples, "env_steps": result.env_steps}))
    """
)


def test_rss_stays_flat_during_a_long_run(tmp_path) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(SOAK_S)],
        capture_output=True,
        text=True,
        timeout=SOAK_S + 120,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    samples = report["samples"]
    assert len(samples) >= SOAK_S * 0.8
    second = [rss for t, rss, _ in samples if SOAK_S / 4 <= t < SOAK_S / 2]
    last = [rss for t, rss, _ in samples if t >= 3 * SOAK_S / 4]
    baseline, final = float(np.median(second)), float(np.median(last))
    growth = (final - baseline) / baseline
    assert growth <= 0.05, f"RSS grew {growth:.1%} after warm-up: {baseline:.0f} -> {final:.0f} B"
    assert report["env_steps"] > 100_000
