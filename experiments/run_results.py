"""The Markdown of experiments/RESULTS.md's tables from ``rlpar train CONFIG --seeds`` runs.

Each config trains once per seed with ``rlpar train experiments/CONFIG.toml --seeds SEEDS``
(one seed after another, each in a fresh process, as the command does), which writes its
``aggregate.json`` and ``aggregate.md``. This prints a row per config from the aggregate
(seeds solved by their evaluated return, the evaluated return's mean with its 95 % bootstrap
interval and IQM, the median time to target) and then each config's per-seed table, with the
CPU and commit it ran on:

    python experiments/run_results.py cartpole_impala cartpole_a3c --seeds 0-4
    python experiments/run_results.py cartpole_impala --seeds 0 1 2 --set eval.check_target=false

With ``--parents DIR...`` (one per config) it trains nothing and prints the tables of runs that
finished, their aggregates written again by `rlpar.app.seeds.reaggregate`. Where the configs
evaluate several policies (``eval.policies``), the first is "evaluated return" and the others
get a column of their own.

A seed counts as solved when its final evaluation reaches the config's target return (for
CartPole-v1 gymnasium's definition: a 100-episode mean of at least 475).
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

from rlpar.app.seeds import reaggregate

HERE = Path(__file__).resolve().parent


def cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def commit() -> str:
    out = subprocess.run(
        ["git", "-C", str(HERE), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    return out.stdout.strip() or "unknown commit"


def train_seeds(config: str, seeds: str, logdir: Path, overrides: list[str]) -> dict[str, Any]:
    """``rlpar train CONFIG --seeds SEEDS --json``: its report (rows and the aggregate)."""
    sets = [x for o in overrides for x in ("--set", o)]
    cmd = [sys.executable, "-m", "rlpar", "train", str(HERE / f"{config}.toml"), "--seeds", seeds,
           "--json", "--logdir", str(logdir), *sets]  # fmt: skip
    out = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)  # progress goes to stderr
    if out.returncode not in (0, 1):  # 1: a seed crashed, and the report says which
        raise SystemExit(f"{config}: rlpar train --seeds exited {out.returncode}")
    report: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return report


def report_of(parent: Path) -> dict[str, Any]:
    """The report of a finished ``--seeds`` run, its aggregate written again (`reaggregate`)."""
    rows, agg = reaggregate(parent)
    return {"parent": str(parent.resolve()), "rows": rows, **agg}


def fmt(x: float | None, digits: int = 2) -> str:
    return "—" if x is None else f"{x:.{digits}f}"


def mean_ci(stats: dict[str, Any]) -> str:
    """``mean [lo, hi]`` of one of the aggregate's statistics."""
    ci = f" [{fmt(stats['ci95'][0])}, {fmt(stats['ci95'][1])}]" if stats["ci95"] else ""
    return f"{fmt(stats['mean'])}{ci}"


def further_policies(r: dict[str, Any]) -> str:
    """The other evaluation policies' returns (greedy beside sampled, ...), or "—"."""
    by_policy = r.get("eval_return_by_policy") or {}
    further = [f"{p}: {mean_ci(s)}" for p, s in list(by_policy.items())[1:]]
    return "; ".join(further) or "—"


def summary_row(config: str, r: dict[str, Any]) -> str:
    ret, ttt, solved = r["eval_return"], r["time_to_target_s"], r["solved"]
    reached = f" ({ttt['n']} of {ttt['of']})" if ttt["of"] else ""
    solved_text = f"{solved['n']}/{solved['of']}" if solved["of"] else "—"
    crashed = f", crashed: {r['crashed']}" if r["crashed"] else ""
    steps = r["env_steps"]["mean"]
    return (
        f"| {config} | {solved_text}{crashed} | {mean_ci(ret)} | {fmt(ret['iqm'])} | "
        f"{further_policies(r)} | {fmt(ttt['median'])}{reached} | "
        f"{f'{steps:,.0f}' if steps is not None else '—'} | {fmt(r['wall_s']['mean'], 1)} |"
    )


def seed_table(parent: Path) -> list[str]:
    """The per-seed table of ``aggregate.md`` (its first table)."""
    lines = (parent / "aggregate.md").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| seed "))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return lines[start:end]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("configs", nargs="+", help="names of experiments/*.toml")
    parser.add_argument(
        "--seeds", nargs="+", default=["0-4"], help="as rlpar train --seeds (0-4, 0,3,7 or 0 1 2)"
    )
    parser.add_argument("--logdir", type=Path, default=HERE.parent / "runs" / "results")
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="passed to rlpar train"
    )
    parser.add_argument(
        "--parents",
        nargs="+",
        type=Path,
        metavar="DIR",
        help="train nothing: print the tables of these finished --seeds parent directories (one "
        "per config, in order), their aggregates written again by this rlpar (reaggregate)",
    )
    args = parser.parse_args()
    seeds = ",".join(args.seeds)
    sets = "".join(f" --set {shlex.quote(o)}" for o in args.set)
    if args.parents is not None:
        if len(args.parents) != len(args.configs):
            parser.error("--parents: expected one directory per config")
        reports = {c: report_of(p) for c, p in zip(args.configs, args.parents, strict=True)}
    else:
        reports = {c: train_seeds(c, seeds, args.logdir, args.set) for c in args.configs}
    if args.parents is not None:
        print(f"<!-- the --seeds runs in {' '.join(map(str, args.parents))}, aggregated again "
              f"at commit {commit()} -->")  # fmt: skip
    else:
        print(f"<!-- {cpu()}, commit {commit()}; per config: "
              f"rlpar train experiments/CONFIG.toml --seeds {seeds}{sets} -->")  # fmt: skip
    print()
    print(
        "| config | seeds solved | evaluated return: mean [95 % CI] | IQM | other policies "
        "| time to target (s): median (seeds) | env steps (mean) | wall (s, mean) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for config, report in reports.items():
        print(summary_row(config, report))
    for config, report in reports.items():
        print(f"\n`{config}` ({report['parent']}/aggregate.md):\n")
        print("\n".join(seed_table(Path(report["parent"]))))


if __name__ == "__main__":
    main()
