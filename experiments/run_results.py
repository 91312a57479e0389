"""Run experiments over several seeds and print the Markdown rows of experiments/RESULTS.md.

Each run is `rlpar train CONFIG --json --quiet --set runtime.seed=S` in a fresh process, one
after the other (never two at once on this 2-core machine):

    python experiments/run_results.py cartpole_impala cartpole_a3c --seeds 0 1 2 3 4
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def train(config: str, seed: int, logdir: Path) -> dict:
    cmd = [sys.executable, "-m", "rlpar", "train", str(HERE / f"{config}.toml"), "--json",
           "--quiet", "--set", f"runtime.seed={seed}", "--logdir", str(logdir)]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def fmt(x: float | None, digits: int = 2) -> str:
    return "—" if x is None else f"{x:.{digits}f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("configs", nargs="+")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--logdir", type=Path, default=HERE.parent / "runs" / "results")
    args = parser.parse_args()
    print(f"<!-- {platform.processor() or platform.machine()}, {platform.python_version()} -->")
    print("| config | seed | final mean return | env steps | wall (s) | time to target (s) |")
    print("|---|---|---|---|---|---|")
    for config in args.configs:
        times = []
        for seed in args.seeds:
            r = train(config, seed, args.logdir)
            times.append(r["time_to_target_s"])
            print(
                f"| {config} | {seed} | {fmt(r['mean_return'])} | {r['env_steps']:,} | "
                f"{fmt(r['wall_s'])} | {fmt(r['time_to_target_s'])} |",
                flush=True,
            )
        solved = [t for t in times if t is not None]
        median = fmt(statistics.median(solved)) if len(solved) == len(times) else "—"
        print(f"| **{config}** | {len(solved)}/{len(times)} solved | | | | median {median} |")


if __name__ == "__main__":
    main()
