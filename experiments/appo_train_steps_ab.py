"""APPO's learner with `rlpar.train_steps` (a batch's epochs x minibatches as one native call)
against the per-minibatch loop (one `rlpar.train_step` call each: what APPO ran before), in one
process, the two taking turns:

    python experiments/appo_train_steps_ab.py ROUNDS CONFIG ENV_STEPS [--set KEY=VALUE ...]

e.g. ``python experiments/appo_train_steps_ab.py 3 cartpole_appo 400000``. Each run is ``rlpar
train experiments/CONFIG.toml`` for ENV_STEPS env steps (no target stop, 10 evaluation
episodes at the end); prints per mode the env steps/s of each round and their median, and the
runs' GIL shares (learner held and re-take wait, actors held) as JSON.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import rlpar
from rlpar.app.cli import main

EXPERIMENTS = Path(__file__).resolve().parent
FUSED = rlpar.train_steps


def per_minibatch(
    net: rlpar.Net,
    state: rlpar.LearnerState,
    batch: rlpar.Batch,
    loss: rlpar.Loss,
    *,
    max_grad_norm: float,
    columns: list,
    native: bool = True,
) -> list[dict[str, float]]:
    """`train_steps` as the loop of one `train_step` call per entry."""
    return [
        rlpar.train_step(net, state, batch, loss, max_grad_norm=max_grad_norm, columns=c)
        for c in columns
    ]


def run(rounds: int, config: str, env_steps: int, sets: list[str]) -> dict[str, Any]:
    runs: dict[str, list[dict[str, float]]] = {"per_minibatch": [], "train_steps": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(rounds):
            for mode in runs:
                rlpar.train_steps = FUSED if mode == "train_steps" else per_minibatch
                run_dir = Path(tmp) / f"{mode}-{r}"
                args = ["train", str(EXPERIMENTS / f"{config}.toml"), "--quiet", "--run-dir"]
                args += [str(run_dir), "--set", f"runtime.total_env_steps={env_steps}"]
                for s in [
                    "runtime.target_return=none",
                    "eval.episodes=10",
                    "eval.check_target=false",
                    "eval.interval_env_steps=none",
                    *sets,
                ]:
                    args += ["--set", s]  # fmt: skip
                main(args)
                s = json.loads((run_dir / "summary.json").read_text())
                gil = s["gil"]
                runs[mode].append({
                    "env_steps_per_s": s["env_steps"] / s["wall_s"],
                    "learner_held": gil["learner"]["held"],
                    "learner_wait": gil["learner"]["wait"],
                    "actors_held": gil["actors"]["held"],
                })  # fmt: skip
    rlpar.train_steps = FUSED
    out: dict[str, Any] = {}
    for mode, rs in runs.items():
        out[mode] = {k: [round(x[k], 3) for x in rs] for k in rs[0]}
        out[mode]["median_env_steps_per_s"] = round(
            statistics.median(x["env_steps_per_s"] for x in rs)
        )
    out["ratio"] = round(
        out["train_steps"]["median_env_steps_per_s"]
        / out["per_minibatch"]["median_env_steps_per_s"],
        3,
    )
    return out


if __name__ == "__main__":
    rest = sys.argv[4:]
    sets = [rest[i + 1] for i in range(len(rest) - 1) if rest[i] == "--set"]
    print(json.dumps(run(int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sets), indent=1))
