"""The runtime's hand-offs in native calls against the Python loops they replace, in one
process, the modes taking turns:

- ``python``: one fused unroll per Python iteration of the actor, the learner's batch taken in
  Python (`Learner._gather`, `Batch.stack`): what the runtime ran before;
- ``native_loop``: the actor's whole loop in native calls (the plan's ``native_loop``);
- ``native``: that, and the learner's batch taken natively (`NativeInbox`), its step in Python;
- ``native_learn``: that, and the learner's whole loop in native calls (`NativeLoop`): take,
  optimizer steps and publish, many learner steps a call.

    python experiments/native_actor_loop_ab.py ROUNDS [SECONDS [CASE ...]]

Each measure is `rlpar.bench.runtime.runtime_measure` (the whole runtime, the IMPALA learner
training) on rlpar's CartPole, T = 20, at 1 x 64, 2 x 64 and 1 x 256 actors x envs, and on
gymnasium's CartPole, T = 16, at 1 x 16 (a Python env: the actor loop is not native there, the
learner's take is). Prints, per case and mode, the medians over the rounds of the env steps/s,
the GIL shares, the GIL-held time per rollout and per learner step, and the actor ceiling, as
JSON. CASE: run only the cases whose name ("ENV AxK") contains one of them.

    python experiments/native_actor_loop_ab.py train ROUNDS SEEDS CONFIG ...

trains each ``experiments/CONFIG.toml`` on seeds 0 .. SEEDS - 1 in modes "python", "native"
and "native_learn", taking turns run by run in this process, and prints per config and mode the runs
that reached the target, the final evaluation's return and the time to target (medians)
and the env steps/s, pooled over the rounds.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import rlpar.runtime.runner
from rlpar.app.cli import main
from rlpar.bench.runtime import runtime_measure
from rlpar.runtime.plan import Choice, ExecutionPlan, plan_run

CASES = ((1, 64, "rlpar/CartPole-v1", 20), (2, 64, "rlpar/CartPole-v1", 20),
         (1, 256, "rlpar/CartPole-v1", 20), (1, 16, "CartPole-v1", 16))  # fmt: skip
MODES = ("python", "native_loop", "native", "native_learn")


def use(mode: str) -> None:
    """Have the runtime run ``mode``'s loops: the run's plan (`plan_run`), cut back to them."""

    def planned(*args: Any) -> ExecutionPlan:
        plan = plan_run(*args)
        actor, learner = plan.actor, plan.learner
        if mode == "python" and actor.loop == "native_loop":
            actor = Choice("fused", f"experiment mode {mode}")
        if mode in ("python", "native_loop"):
            learner = Choice("python", f"experiment mode {mode}")
        elif mode == "native" and learner.loop == "native_learn":
            native_take = actor.loop == "native_loop"  # beside Python envs: the Python take
            learner = Choice("native_inbox" if native_take else "python", f"experiment mode {mode}")
        return ExecutionPlan(actor, learner)

    rlpar.runtime.runner.plan_run = planned  # type: ignore[assignment]


def measure(actors: int, envs: int, env: str, unroll: int, seconds: float) -> dict[str, float]:
    m = runtime_measure(actors, True, seconds, envs, env, unroll_length=unroll)
    thread_s = m["wall_s"] * actors  # the actors' shares are of their summed wall time
    m["actor_held_us_per_rollout"] = 1e6 * m["actor_held"] * thread_s / max(m["rollouts"], 1)
    m["learner_held_us_per_step"] = (
        1e6 * m["learner_held"] * m["wall_s"] / max(m["learner_steps"], 1)
    )
    return m


def run(rounds: int, seconds: float, only: list[str]) -> dict[str, Any]:
    cases = [c for c in CASES if not only or any(o in f"{c[2]} {c[0]}x{c[1]}" for o in only)]
    got: dict[str, dict[str, list[dict[str, float]]]] = {
        f"{env} {a}x{k}": {mode: [] for mode in MODES} for a, k, env, _ in cases
    }
    try:
        for _ in range(rounds):
            for a, k, env, unroll in cases:
                for mode in MODES:
                    use(mode)
                    got[f"{env} {a}x{k}"][mode].append(measure(a, k, env, unroll, seconds))
    finally:
        use("native_learn")
    keys = ("rate", "actor_held", "actor_wait", "actor_native", "actor_held_us_per_rollout",
            "learner_held", "learner_held_us_per_step", "ceiling")  # fmt: skip
    out: dict[str, Any] = {}
    for case, by_mode in got.items():
        out[case] = {
            mode: {key: round(statistics.median(r[key] for r in rs), 4) for key in keys}
            for mode, rs in by_mode.items()
        }
        for mode in ("native", "native_learn"):
            out[case][f"rate_ratio_{mode}_vs_python"] = round(
                out[case][mode]["rate"] / out[case]["python"]["rate"], 3
            )
    return out


TRAIN_MODES = ("python", "native", "native_learn")


def train(rounds: int, seeds: int, configs: list[str]) -> dict[str, Any]:
    rows: dict[str, dict[str, list[dict[str, Any]]]] = {
        c: {mode: [] for mode in TRAIN_MODES} for c in configs
    }
    experiments = Path(__file__).resolve().parent
    with tempfile.TemporaryDirectory() as tmp:
        try:
            for r in range(rounds):
                for config in configs:
                    for seed in range(seeds):
                        for mode in TRAIN_MODES:
                            use(mode)
                            out = Path(tmp) / f"{config}-{mode}-{r}-{seed}"
                            toml = str(experiments / f"{config}.toml")
                            seed_set = f"runtime.seed={seed}"
                            main(
                                ["train", toml, "--quiet", "--run-dir", str(out), "--set", seed_set]
                            )
                            rows[config][mode].append(
                                json.loads((out / "summary.json").read_text())
                            )
        finally:
            use("native_learn")
    result: dict[str, Any] = {}
    for config, by_mode in rows.items():
        result[config] = {}
        for mode, rs in by_mode.items():
            times = [x["time_to_target_s"] for x in rs if x.get("time_to_target_s") is not None]
            result[config][mode] = {
                "runs": len(rs),
                "reached_target": len(times),
                "eval_return_median": statistics.median(
                    x["evaluation"][0]["mean_return"] for x in rs
                ),
                "time_to_target_median_s": round(statistics.median(times), 3) if times else None,
                "env_steps_per_s_median": round(
                    statistics.median(x["env_steps"] / x["wall_s"] for x in rs)
                ),
            }
    return result


if __name__ == "__main__":
    if sys.argv[1] == "train":
        print(json.dumps(train(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]), indent=1))
        sys.exit()
    seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 4.0
    print(json.dumps(run(int(sys.argv[1]), seconds, sys.argv[3:]), indent=1))
