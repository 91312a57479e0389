"""``rlpar train CONFIG --seeds 0-4``: one experiment over several seeds, and honest aggregates.

::

    <log.logdir>/<name>/seeds-<timestamp>/
        seed-0/ ... seed-4/   one run directory per seed (what ``rlpar train`` makes for one)
        seed-N.log, .json     each seed's progress log and its summary line (with --ray
                              only the summary: the log is the Ray worker's)
        aggregate.json        per-seed rows and the statistics across seeds
        aggregate.md          the same as a Markdown table

The seeds run one after another, or ``parallel`` at a time, each in a child ``rlpar train``
process that imports this process's rlpar (`rlpar_command`). A seed whose run fails is
reported as crashed (with its exception line, `error_line`) and the others still run. Across
seeds: the mean, the interquartile mean (the mean of the middle half, less moved by one
outlier seed than the mean) and a 95 % percentile-bootstrap confidence
interval of the mean, of the evaluated return (the final evaluation's first policy; each
further policy of ``eval.policies``, e.g. greedy beside sampled, gets the same statistics of its
own) and of the time to the target return (over the seeds that reached it, with how many did).
`reaggregate` writes the aggregate of a parent directory again from its seeds' summaries.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rlpar.app.experiment import Experiment, load_experiment
from rlpar.app.summary import TrainingSummary
from rlpar.app.train import make_run_dir
from rlpar.config import ConfigError, is_ray_address
from rlpar.files import write_atomically
from rlpar.runtime.child_command import rlpar_command

__all__ = [
    "aggregate",
    "bootstrap_ci",
    "error_line",
    "format_aggregate",
    "iqm",
    "parse_seeds",
    "reaggregate",
    "run_seeds",
    "train_seed",
]

_RANGE = re.compile(r"(\d+)-(\d+)")
_TRACEBACK = "Traceback (most recent call last):"
# "RuntimeError: message", "ray.exceptions.RayTaskError(ValueError): message", "KeyboardInterrupt"
_EXCEPTION_LINE = re.compile(r"([A-Za-z_][\w.]*)?(Error|Exception|Interrupt|Exit)(\(\w+\))?(:|$)")
MAX_SEEDS = 1000


def parse_seeds(text: str) -> list[int]:
    """``"0-4"`` -> [0, 1, 2, 3, 4]; ``"0,3,7"`` -> [0, 3, 7]; ``"5"`` -> [5]. Ranges and
    lists mix (``"0-2,9"``); duplicates are an error. `ConfigError` naming what came."""
    seeds: list[int] = []
    expected = "a range like 0-4 or a list like 0,3,7 of integers >= 0"
    for part in text.split(","):
        part = part.strip()
        m = _RANGE.fullmatch(part)
        if m:
            lo, hi = int(m.group(1)), int(m.group(2))
            if hi < lo:
                raise ConfigError(f"--seeds: the range {part!r} ends before it starts")
            seeds += range(lo, hi + 1)
        elif part.isdigit():
            seeds.append(int(part))
        else:
            raise ConfigError(f"--seeds: expected {expected}, got {text!r}")
        if len(seeds) > MAX_SEEDS:
            raise ConfigError(f"--seeds: expected at most {MAX_SEEDS} seeds, got more in {text!r}")
    if len(set(seeds)) != len(seeds):
        raise ConfigError(f"--seeds: expected each seed once, got {text!r}")
    return seeds


def iqm(values: Sequence[float]) -> float:
    """Interquartile mean: the mean of the middle 50 % of ``values`` (sorted; a quarter
    trimmed from each end, fractional ends weighted, as rliable's IQM and scipy's
    ``trim_mean(x, 0.25)`` take it for n divisible by 4)."""
    x = np.sort(np.asarray(values, np.float64))
    n = len(x)
    if n == 0:
        return math.nan
    lo, hi = 0.25 * n, 0.75 * n
    # Weight each sorted value by how much of it lies inside [lo, hi) on the index axis.
    weights = np.clip(np.minimum(np.arange(1, n + 1), hi) - np.maximum(np.arange(n), lo), 0, 1)
    return float(np.sum(weights * x) / np.sum(weights))


def bootstrap_ci(
    values: Sequence[float], confidence: float = 0.95, resamples: int = 10_000, seed: int = 0
) -> tuple[float, float]:
    """Percentile-bootstrap confidence interval of the mean of ``values`` (resampled with
    replacement ``resamples`` times from a generator seeded ``seed``, so it is reproducible).
    One value: (value, value); none: (nan, nan)."""
    x = np.asarray(values, np.float64)
    if len(x) == 0:
        return math.nan, math.nan
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, len(x), size=(resamples, len(x)))].mean(axis=1)
    tail = (1 - confidence) / 2 * 100
    lo, hi = np.percentile(means, [tail, 100 - tail])
    return float(lo), float(hi)


def _stats(values: list[float]) -> dict[str, Any]:
    lo, hi = bootstrap_ci(values)
    return {
        "n": len(values),
        "mean": float(np.mean(values)) if values else None,
        "median": float(np.median(values)) if values else None,
        "iqm": iqm(values) if values else None,
        "ci95": [lo, hi] if values else None,
        "min": min(values) if values else None,
        "max": max(values) if values else None,
    }


def _policies(rows: list[dict[str, Any]]) -> list[str]:
    """The evaluation policies of ``rows`` (``eval_returns``' keys), in the order first seen."""
    return list(dict.fromkeys(p for r in rows for p in r.get("eval_returns") or {}))


def aggregate(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Statistics across seeds of per-seed rows (``seed``, ``status`` "ok" | "crashed",
    ``eval_return``, ``time_to_target_s``, ``env_steps``, ``wall_s``, optionally ``solved``:
    whether the evaluated return reached the target, None without one, and ``eval_returns``:
    {policy: evaluated return} of every policy evaluated, whose statistics go to
    ``eval_return_by_policy``)."""
    ok = [r for r in rows if r["status"] == "ok"]
    returns = [r["eval_return"] for r in ok if r.get("eval_return") is not None]
    times = [r["time_to_target_s"] for r in ok if r.get("time_to_target_s") is not None]
    judged = [r for r in ok if r.get("solved") is not None]
    return {
        "seeds": [r["seed"] for r in rows],
        "finished": len(ok),
        "crashed": [r["seed"] for r in rows if r["status"] != "ok"],
        # Seeds whose final evaluation reached the target return, of those that had one.
        "solved": {"n": sum(bool(r["solved"]) for r in judged), "of": len(judged)},
        "eval_return": _stats(returns),
        "eval_return_by_policy": {
            policy: _stats([r["eval_returns"][policy] for r in ok if policy in r["eval_returns"]])
            for policy in _policies(ok)
        },
        "time_to_target_s": {**_stats(times), "reached": len(times), "of": len(ok)},
        "wall_s": _stats([r["wall_s"] for r in ok]),
        "env_steps": _stats([float(r["env_steps"]) for r in ok]),
    }


def _fmt(x: Any, digits: int = 2) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    return f"{x:.{digits}f}" if isinstance(x, float) else str(x)


def format_aggregate(name: str, rows: list[dict[str, Any]], agg: dict[str, Any]) -> str:
    """The Markdown report: a row per seed, then the statistics across seeds."""
    policies = _policies(rows)
    further = policies[1:]  # beside the first policy's "evaluated return"
    first = f"evaluated return ({policies[0]})" if further else "evaluated return"
    lines = [
        f"# {name}: {len(rows)} seeds",
        "",
        f"| seed | status | {first} | "
        + "".join(f"evaluated, {p} | " for p in further)
        + "window return | solved | time to target (s) | target checks | env steps | wall (s) |",
        "|---|---|---|" + "---|" * len(further) + "---|---|---|---|---|---|",
    ]
    for r in rows:
        status = r["status"] if r["status"] == "ok" else f"crashed: {r.get('error', '')}"
        solved = "—" if r.get("solved") is None else "yes" if r["solved"] else "no"
        steps = r.get("env_steps")
        by_policy = r.get("eval_returns") or {}
        lines.append(
            f"| {r['seed']} | {status} | {_fmt(r.get('eval_return'))} | "
            + "".join(f"{_fmt(by_policy.get(p))} | " for p in further)
            + f"{_fmt(r.get('window_return'))} | {solved} | "
            f"{_fmt(r.get('time_to_target_s'), 2)} | {r.get('target_checks') or '—'} | "
            f"{f'{steps:,}' if isinstance(steps, int) else '—'} | {_fmt(r.get('wall_s'), 1)} |"
        )
    if agg.get("solved", {}).get("of"):
        target = next((r.get("target_return") for r in rows if r.get("solved") is not None), None)
        lines += ["", f"Solved (evaluated return >= {target}): {agg['solved']['n']} of "
                  f"{agg['solved']['of']} seeds."]  # fmt: skip
    lines += ["", "| across seeds | n | mean | median | IQM | 95 % CI of the mean | min | max |"]
    lines.append("|---|---|---|---|---|---|---|---|")
    stats = {first: agg["eval_return"]}
    by_policy = agg.get("eval_return_by_policy") or {}
    stats.update({f"evaluated, {p}": by_policy[p] for p in further if p in by_policy})
    stats["time to target (s)"] = agg["time_to_target_s"]
    stats["wall (s)"] = agg["wall_s"]
    for label, s in stats.items():
        ci = s["ci95"]
        n = f"{s['n']}" + (f" of {s['of']} reached" if "reached" in s else "")
        ci_text = f"[{_fmt(ci[0])}, {_fmt(ci[1])}]" if ci else "—"
        lines.append(
            f"| {label} | {n} | {_fmt(s['mean'])} | {_fmt(s['median'])} | {_fmt(s['iqm'])} | "
            f"{ci_text} | {_fmt(s['min'])} | {_fmt(s['max'])} |"
        )
    if agg["crashed"]:
        lines += ["", f"Crashed seeds (left out of the statistics): {agg['crashed']}"]
    return "\n".join(lines) + "\n"


def _row(seed: int, summary: TrainingSummary) -> dict[str, Any]:
    """A seed's row of ``aggregate.json`` from its run's summary."""
    r, evaluation = summary.result, summary.evaluation
    eval_return, target = summary.eval_return, summary.target_return
    checks = r.target_checks
    return {
        "seed": seed,
        "status": "ok",
        "eval_return": eval_return,
        "eval_policy": evaluation[0]["policy"] if evaluation else None,
        "eval_episodes": evaluation[0]["episodes"] if evaluation else None,
        "eval_returns": {e["policy"]: e["mean_return"] for e in evaluation},
        "window_return": r.mean_return,
        "target_return": target,
        "solved": None if target is None or eval_return is None else eval_return >= target,
        "target_checks": f"{sum(c['passed'] for c in checks)}/{len(checks)}" if checks else None,
        "time_to_target_s": r.time_to_target_s,
        "env_steps": r.env_steps,
        "wall_s": r.wall_s,
        "stopped_by": r.stopped_by,
        "run_dir": summary.run_dir,
    }


def _child_command(config: str, overrides: Sequence[str], seed: int, run_dir: Path) -> list[str]:
    cmd = ["train", config, "--quiet", "--json"]
    for o in (*overrides, f"runtime.seed={seed}"):
        cmd += ["--set", o]
    return rlpar_command(*cmd, "--run-dir", str(run_dir))


def error_line(text: str) -> str:
    """The line of ``text`` (a child's log, or the text of a Ray task's error) that says what
    went wrong: the exception line of its last traceback (``RuntimeError: message``, not the
    notes or log lines printed after it), else its last line that reads like one, else its
    last line ("no output" if none); at most 300 characters."""
    lines = [line for line in text.splitlines() if line.strip()]
    tracebacks = [i for i, line in enumerate(lines) if line.startswith(_TRACEBACK)]
    if tracebacks:
        # A traceback's frames are indented; the exception line is the first that is not.
        after = lines[tracebacks[-1] + 1 :]
        if (line := next((x for x in after if not x[:1].isspace()), None)) is not None:
            return line[:300]
    named = [line for line in lines if _EXCEPTION_LINE.match(line)]
    return (named or lines or ["no output"])[-1][:300]


def run_seeds(
    config: str,
    overrides: Sequence[str],
    seeds: Sequence[int],
    parallel: int | None = 1,
    logdir: str | None = None,
    on_done: Callable[[dict[str, Any]], None] | None = None,
    ray_address: str | None = None,
    cpus_per_seed: float | None = None,
) -> tuple[Path, list[dict[str, Any]], dict[str, Any]]:
    """Train ``config`` (with ``overrides``) once per seed, each in a child ``rlpar train``
    process, ``parallel`` at a time; write ``aggregate.json`` and ``aggregate.md`` into the
    parent directory. Returns (parent directory, per-seed rows, aggregate). ``on_done`` is
    called with each seed's row as it finishes.

    With ``ray_address`` ("local": a Ray instance on this machine; "auto" or host:port: a
    cluster) each seed is a Ray task of ``cpus_per_seed`` CPUs (None: 1) instead, training in a Ray
    worker process (``parallel`` None: as many at once as the cluster's CPUs take); the run
    directories are written where the workers run, so on a cluster of several machines the
    log directory must be on storage they share."""
    if parallel is None and ray_address is None:
        parallel = 1
    if parallel is not None and (
        isinstance(parallel, bool) or not isinstance(parallel, int) or parallel < 1
    ):
        raise ConfigError(f"--parallel: expected an integer >= 1, got {parallel!r}")
    if ray_address is not None and not (ray_address == "local" or is_ray_address(ray_address)):
        raise ConfigError(
            f'--ray: expected "local", "auto" or host:port of a Ray cluster, got {ray_address!r}'
        )
    if cpus_per_seed is not None and ray_address is None:
        raise ConfigError("--cpus-per-seed: expected --ray with it")
    cpus_per_seed = 1.0 if cpus_per_seed is None else cpus_per_seed
    if not cpus_per_seed > 0:
        raise ConfigError(f"--cpus-per-seed: expected a number > 0, got {cpus_per_seed!r}")
    exp: Experiment = load_experiment(config, [*overrides, f"runtime.seed={seeds[0]}"])
    if logdir is not None:
        exp = dataclasses.replace(exp, log=dataclasses.replace(exp.log, logdir=logdir))
    if ray_address is not None:
        ray, owned = _connect_ray(ray_address)
        try:
            parent = make_run_dir(Path(exp.log.logdir).resolve() / exp.name, prefix="seeds-")
            rows = _seeds_on_ray(ray, config, overrides, seeds, parallel, parent, on_done,
                                 cpus_per_seed)  # fmt: skip
        finally:
            if owned:
                ray.shutdown()
    else:
        parent = make_run_dir(Path(exp.log.logdir).resolve() / exp.name, prefix="seeds-")
        rows = _seeds_in_processes(config, overrides, seeds, parallel or 1, parent, on_done)
    ordered = [rows[s] for s in seeds]
    agg = aggregate(ordered)
    write_atomically(parent / "aggregate.json", json.dumps({"rows": ordered, **agg}, indent=2))
    write_atomically(parent / "aggregate.md", format_aggregate(exp.name, ordered, agg))
    return parent, ordered, agg


def _seeds_in_processes(
    config: str,
    overrides: Sequence[str],
    seeds: Sequence[int],
    parallel: int,
    parent: Path,
    on_done: Callable[[dict[str, Any]], None] | None,
) -> dict[int, dict[str, Any]]:
    pending = list(seeds)
    running: list[tuple[int, subprocess.Popen, Path]] = []
    rows: dict[int, dict[str, Any]] = {}
    try:
        while pending or running:
            while pending and len(running) < parallel:
                seed = pending.pop(0)
                log_path = parent / f"seed-{seed}.log"
                with open(log_path, "wb") as err, open(log_path.with_suffix(".json"), "wb") as out:
                    proc = subprocess.Popen(
                        _child_command(config, overrides, seed, parent / f"seed-{seed}"),
                        stdin=subprocess.DEVNULL,
                        stdout=out,
                        stderr=err,
                    )
                running.append((seed, proc, log_path))
            time.sleep(0.05)
            for item in [r for r in running if r[1].poll() is not None]:
                running.remove(item)
                seed, proc, log_path = item
                rows[seed] = _finished(seed, proc, log_path)
                if on_done is not None:
                    on_done(rows[seed])
    finally:
        for _, proc, _ in running:  # interrupted: no child outlives the command
            proc.terminate()
            proc.wait()
    return rows


def _connect_ray(address: str) -> tuple[Any, bool]:
    try:
        from rlpar.runtime.ray import connect_ray

        return connect_ray(None if address == "local" else address, what="--ray")
    except ImportError as e:
        raise ConfigError(f'--ray needs Ray: pip install "rlpar[ray]" ({e})') from None


def train_seed(config: str, overrides: list[str], seed: int, run_dir: str) -> TrainingSummary:
    """One seed's run (``runtime.seed = seed``) in ``run_dir``, as ``rlpar train --run-dir``
    makes it, also writing its summary beside it as ``seed-<seed>.json``; returns the
    summary. What a Ray task of ``--seeds ... --ray`` runs."""
    from rlpar.app.train import Training

    exp = load_experiment(config, [*overrides, f"runtime.seed={seed}"])
    summary = Training(exp, run_dir=run_dir).run(quiet=True)
    text = json.dumps(summary.to_dict())
    write_atomically(Path(run_dir).parent / f"seed-{seed}.json", text + "\n")
    return summary


def _seeds_on_ray(
    ray: Any,
    config: str,
    overrides: Sequence[str],
    seeds: Sequence[int],
    parallel: int | None,
    parent: Path,
    on_done: Callable[[dict[str, Any]], None] | None,
    cpus: float,
) -> dict[int, dict[str, Any]]:
    task = ray.remote(num_cpus=cpus, max_retries=0)(train_seed)
    config_abs = str(Path(config).resolve())
    pending = list(seeds)
    running: dict[Any, int] = {}  # task reference -> seed
    rows: dict[int, dict[str, Any]] = {}
    try:
        while pending or running:
            while pending and (parallel is None or len(running) < parallel):
                seed = pending.pop(0)
                ref = task.remote(config_abs, list(overrides), seed, str(parent / f"seed-{seed}"))
                running[ref] = seed
            done, _ = ray.wait(list(running), num_returns=1)
            for ref in done:
                seed = running.pop(ref)
                try:
                    rows[seed] = _row(seed, ray.get(ref))
                except Exception as e:  # the task's error: its traceback and exception
                    error = error_line(str(e))
                    rows[seed] = {"seed": seed, "status": "crashed", "error": error}
                if on_done is not None:
                    on_done(rows[seed])
    finally:
        for ref in running:  # interrupted: no task goes on training
            ray.cancel(ref, force=True)
    return rows


def _finished(seed: int, proc: subprocess.Popen, log_path: Path) -> dict[str, Any]:
    """The row of a child that ended: its summary (the last line of its ``--json`` output),
    or "crashed" with the exception line of its log."""
    return _seed_row(seed, log_path, proc.returncode)


def _seed_row(seed: int, log_path: Path, returncode: int | None) -> dict[str, Any]:
    """A seed's row from its files: ``seed-N.json``'s summary line, or "crashed" with the
    exception line of ``seed-N.log`` (``returncode`` None: not known, only the files say)."""
    summary = log_path.with_suffix(".json")
    lines = summary.read_text(errors="replace").strip().splitlines() if summary.is_file() else []
    if returncode in (0, None) and lines:
        try:
            return _row(seed, TrainingSummary.from_dict(json.loads(lines[-1])))
        except (json.JSONDecodeError, KeyError, TypeError):
            pass
    error = error_line(log_path.read_text(errors="replace")) if log_path.is_file() else ""
    exit_text = "no summary" if returncode is None else f"exit {returncode}"
    return {"seed": seed, "status": "crashed", "error": f"{exit_text}: {error}"}


def _earlier_rows(path: Path) -> list[dict[str, Any]]:
    """The per-seed rows of an existing ``aggregate.json`` (none if it is missing or unreadable)."""
    try:
        rows = json.loads(path.read_text()).get("rows", [])
    except (OSError, ValueError, AttributeError):
        return []
    return [r for r in rows if isinstance(r, dict) and isinstance(r.get("seed"), int)]


def reaggregate(parent: str | Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Write ``aggregate.json`` and ``aggregate.md`` of a finished ``--seeds`` parent
    directory again, from its seeds' summaries (``seed-N.json``), with the statistics this
    version computes: for runs made by an older one. Returns (per-seed rows, aggregate).
    ValueError if ``parent`` holds no seed."""
    parent = Path(parent)
    # A seed that crashed in a Ray task left no file: its row in the earlier aggregate says so.
    earlier = {r["seed"]: r for r in _earlier_rows(parent / "aggregate.json")}
    files = {int(m.group(1)) for f in parent.glob("seed-*.*")
             if (m := re.fullmatch(r"seed-(\d+)\.(json|log)", f.name))}  # fmt: skip
    seeds = sorted(files | set(earlier))
    if not seeds:
        raise ValueError(f"{parent}: expected the parent directory of an rlpar train --seeds "
                         "run (seed-N.json files), found none")  # fmt: skip
    rows = [
        _seed_row(s, parent / f"seed-{s}.log", None) if s in files else earlier[s] for s in seeds
    ]
    agg = aggregate(rows)
    name = parent.resolve().parent.name  # <logdir>/<name>/seeds-<timestamp>/
    write_atomically(parent / "aggregate.json", json.dumps({"rows": rows, **agg}, indent=2))
    write_atomically(parent / "aggregate.md", format_aggregate(name, rows, agg))
    return rows, agg
