"""The results of ``rlpar sweep``: one row per trial, ranked, written as ``results.json``,
``results.md`` and ``best.toml``."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

from rlpar.app.experiment import apply_overrides, read_toml, to_toml, toml_value
from rlpar.app.seeds import error_line
from rlpar.app.sweep.space import METRIC, SweepSpec
from rlpar.files import write_atomically

__all__ = ["ranked", "trial_rows", "write_results"]

log = logging.getLogger("rlpar")


def trial_rows(grid: Any, spec: SweepSpec) -> list[dict[str, Any]]:
    """One row per trial of Tune's result ``grid``: its values, last return, env steps and
    how it ended (PBT: its schedule), unranked."""
    rows = []
    for i, result in enumerate(grid):
        m = result.metrics or {}
        keys = [d.key for d in spec.dimensions]
        row: dict[str, Any] = {
            "trial": i,
            "trial_id": m.get("trial_id"),
            "config": {k: result.config.get(k) for k in keys},
            METRIC: m.get(METRIC),
            "env_steps": m.get("env_steps"),
            "wall_s": m.get("wall_s"),
            "run_dir": m.get("run_dir"),
            # Unix times: when the trial started, and its last report (its end, or its stop).
            "started_at": m.get("started_at"),
            "ended_at": m.get("reported_at"),
        }
        if result.error is not None:
            row["status"] = f"crashed: {error_line(str(result.error))}"
        elif m.get("final"):
            row["status"] = "finished"
        elif spec.scheduler == "pbt":  # PBT stops no trial: this one did not report its end
            row["status"] = f"ended at {m.get('env_steps') or 0:,} env steps"
        else:
            row["status"] = f"stopped by ASHA at {m.get('env_steps') or 0:,} env steps"
        if spec.scheduler == "pbt":
            row["schedule"] = json.loads(m["history"]) if m.get("history") else []
        if isinstance(row[METRIC], float) and math.isnan(row[METRIC]):
            row[METRIC] = None
        rows.append(row)
    return rows


def ranked(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Finished trials first, then stopped ones, then crashed; each by return, best first."""

    def key(r: dict[str, Any]) -> tuple[int, float]:
        order = 0 if r["status"] == "finished" else 2 if r["status"].startswith("crashed") else 1
        value = r[METRIC]
        return order, -(value if value is not None else -math.inf)

    return sorted(rows, key=key)


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return "" if v is None else str(v)


def _schedules(rows: list[dict[str, Any]], keys: list[str]) -> list[str]:
    """results.md's PBT part: each trial's segments, in order, with the values each ran with
    and the trial whose checkpoint a segment continued from."""
    lines = ["", "## Schedules", ""]
    for rank, r in enumerate(rows, 1):
        lines += [
            f"### {rank}. trial {r.get('trial_id')}", "",
            "| segment | ran in trial | " + " | ".join(f"`{k}`" for k in keys)
            + " | env steps | evaluated return | continued from |",
            "|---" * (len(keys) + 5) + "|",
        ]  # fmt: skip
        for i, seg in enumerate(r.get("schedule", []), 1):
            source = seg.get("continued_from")
            came = f"trial {source['trial']} at {source['env_steps']:,}" if source else ""
            cells = " | ".join(_fmt(seg["config"].get(k)) for k in keys)
            lines.append(
                f"| {i} | {seg['trial']} | {cells} | {seg['env_steps']:,} "
                f"| {_fmt(seg[METRIC])} | {came} |"
            )
        lines.append("")
    return lines


def write_results(
    root: Path, name: str, spec: SweepSpec, rows: list[dict[str, Any]], config: str,
    overrides: list[str],
) -> None:  # fmt: skip
    keys = [d.key for d in spec.dimensions]
    best = next((r for r in rows if r["status"] == "finished"), None)
    write_atomically(
        root / "results.json",
        json.dumps({"metric": METRIC, "mode": "max", "trials": rows, "best": best}, indent=2),
    )
    lines = [
        f"# Sweep of {name}: {len(rows)} trials, ranked by the evaluated return",
        "",
        "| rank | " + " | ".join(f"`{k}`" for k in keys) + " | evaluated return | env steps "
        "| wall s | status |",
        "|---" * (len(keys) + 5) + "|",
    ]
    for rank, r in enumerate(rows, 1):
        cells = [_fmt(r["config"][k]) for k in keys]
        lines.append(
            f"| {rank} | " + " | ".join(cells)
            + f" | {_fmt(r[METRIC])} | {_fmt(r['env_steps'])} | {_fmt(r['wall_s'])} "
            f"| {r['status']} |"
        )  # fmt: skip
    if spec.scheduler == "pbt":
        lines += _schedules(rows, keys)
    write_atomically(root / "results.md", "\n".join(lines) + "\n")
    if best is None:
        log.warning("sweep: no trial finished, so no best.toml")
        return
    file_data = read_toml(Path(config), str(config), "no such experiment file")
    values = [f"{k}={toml_value(v)}" for k, v in best["config"].items()]
    data = apply_overrides(file_data, [*overrides, *values])
    header = (
        f"# {Path(config).name} with the best values of the sweep in {root}\n"
        f"# ({', '.join(values)}: evaluated return {_fmt(best[METRIC])} after "
        f"{_fmt(best['env_steps'])} env steps)\n"
    )
    if spec.scheduler == "pbt":
        header += "# PBT: the best trial's last values; its schedule is in results.md\n"
    write_atomically(root / "best.toml", header + to_toml(data))
