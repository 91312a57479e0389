"""Run experiments over several seeds and print the Markdown rows of experiments/RESULTS.md.

Each run is `rlpar train CONFIG --json --quiet --set runtime.seed=S` in a fresh process, one
after the other (never two at once on this 2-core machine). The run evaluates its final policy
itself (the config's `[eval]`: by default 100 greedy episodes on fresh env seeds), so each row
shows the training window's mean next to the evaluated mean:

    python experiments/run_results.py cartpole_impala cartpole_a3c --seeds 0 1 2 3 4
    python experiments/run_results.py cartpole_impala --set eval.check_target=false

A config counts as solved on a seed when its evaluated mean reaches the config's target return
(for CartPole-v1 that is gymnasium's definition: a 100-episode mean of at least 475).
"""

from __future__ import annotations

import argparse
import json
import platform
import shlex
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def train(config: str, seed: int, logdir: Path, overrides: list[str]) -> dict:
    sets = [x for o in [f"runtime.seed={seed}", *overrides] for x in ("--set", o)]
    cmd = [sys.executable, "-m", "rlpar", "train", str(HERE / f"{config}.toml"), "--json",
           "--quiet", *sets, "--logdir", str(logdir)]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def fmt(x: float | None, digits: int = 2) -> str:
    return "—" if x is None else f"{x:.{digits}f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("configs", nargs="+")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--logdir", type=Path, default=HERE.parent / "runs" / "results")
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="passed to rlpar train"
    )
    args = parser.parse_args()
    sets = " ".join(f"--set {shlex.quote(o)}" for o in args.set)
    print(f"<!-- {platform.processor() or platform.machine()}, {platform.python_version()} -->")
    print(f"<!-- rlpar train experiments/CONFIG.toml --set runtime.seed=SEED {sets} -->")
    print(
        "| config | seed | window mean | evaluated mean ± std (episodes) | env steps | wall (s) "
        "| time to target (s) | target checks |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for config in args.configs:
        solved, times = 0, []
        for seed in args.seeds:
            r = train(config, seed, args.logdir, args.set)
            e = r["evaluation"][0] if r.get("evaluation") else None
            target = r["target_return"]
            if e is not None and target is not None and e["mean_return"] >= target:
                solved += 1
                times.append(r["time_to_target_s"])
            evaluated = (
                "—"
                if e is None
                else f"{fmt(e['mean_return'])} ± {fmt(e['std_return'])} ({e['episodes']} "
                f"{e['policy']})"
            )
            checks = r.get("target_checks", [])
            passed = sum(c["passed"] for c in checks)
            print(
                f"| {config} | {seed} | {fmt(r['mean_return'])} | {evaluated} | "
                f"{r['env_steps']:,} | {fmt(r['wall_s'])} | {fmt(r['time_to_target_s'])} | "
                f"{passed}/{len(checks)} |",
                flush=True,
            )
        done = [t for t in times if t is not None]
        median = fmt(statistics.median(done)) if done and len(done) == len(args.seeds) else "—"
        print(
            f"| **{config}** | {solved}/{len(args.seeds)} solved (evaluated) | | | | | "
            f"median {median} | |"
        )


if __name__ == "__main__":
    main()
