"""``rlpar train CONFIG --seeds``: seed lists, the statistics against hand computations, and a
whole multi-seed run as a user starts it (one seed crashing, the others still reported)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from rlpar.app.seeds import (
    aggregate,
    bootstrap_ci,
    error_line,
    format_aggregate,
    iqm,
    parse_seeds,
    reaggregate,
)
from rlpar.config import ConfigError

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(
    ("text", "seeds"),
    [("0-4", [0, 1, 2, 3, 4]), ("0,3,7", [0, 3, 7]), ("5", [5]), ("0-2, 9", [0, 1, 2, 9])],
)
def test_seed_lists(text: str, seeds: list[int]) -> None:
    assert parse_seeds(text) == seeds


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("", "expected a range like 0-4 or a list like 0,3,7"),
        ("a-b", "expected a range like 0-4"),
        ("-1", "expected a range like 0-4"),
        ("1.5", "expected a range like 0-4"),
        ("4-2", "the range '4-2' ends before it starts"),
        ("1,1", "expected each seed once"),
        ("0-5000", "expected at most 1000 seeds"),
    ],
)
def test_bad_seed_lists_say_what_was_expected(text: str, said: str) -> None:
    with pytest.raises(ConfigError, match=said):
        parse_seeds(text)


def test_iqm_is_the_mean_of_the_middle_half() -> None:
    assert iqm([1, 2, 3, 4, 5, 6, 7, 8]) == pytest.approx(np.mean([3, 4, 5, 6]))
    assert iqm([100, 1, 2, 3]) == pytest.approx(2.5)  # one outlier seed moves it little
    # n = 5: the middle half is 2.5 values (indices 1.25..3.75): 0.75*x1 + x2 + 0.75*x3.
    assert iqm([0, 10, 20, 30, 40]) == pytest.approx((0.75 * 10 + 20 + 0.75 * 30) / 2.5)
    assert iqm([7]) == 7


def test_the_bootstrap_interval_of_the_mean() -> None:
    assert bootstrap_ci([3.0]) == (3.0, 3.0)
    lo, hi = bootstrap_ci([1.0, 2.0, 3.0, 4.0, 5.0])
    assert 1.0 <= lo < 3.0 < hi <= 5.0
    assert bootstrap_ci([1.0, 2.0, 3.0, 4.0, 5.0]) == (lo, hi)  # seeded: reproducible
    # Against a hand-written bootstrap with the same generator and draws.
    x = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    idx = np.random.default_rng(0).integers(0, 5, size=(10_000, 5))
    means = sorted(float(np.mean(x[i])) for i in idx)
    assert lo == pytest.approx(np.percentile(means, 2.5))
    assert hi == pytest.approx(np.percentile(means, 97.5))


def test_aggregate_leaves_crashed_seeds_out_and_counts_who_reached_the_target() -> None:
    rows = [
        {"seed": 0, "status": "ok", "eval_return": 500.0, "time_to_target_s": 1.0,
         "env_steps": 100, "wall_s": 2.0, "solved": True, "target_return": 475,
         "window_return": 480.0, "target_checks": "1/1"},
        {"seed": 1, "status": "crashed", "error": "exit 1: boom"},
        {"seed": 2, "status": "ok", "eval_return": 300.0, "time_to_target_s": None,
         "env_steps": 300, "wall_s": 4.0, "solved": False, "target_return": 475},
        {"seed": 3, "status": "ok", "eval_return": 490.0, "time_to_target_s": 3.0,
         "env_steps": 200, "wall_s": 6.0, "solved": True, "target_return": 475},
    ]  # fmt: skip
    agg = aggregate(rows)
    assert agg["finished"] == 3 and agg["crashed"] == [1]
    assert agg["eval_return"]["mean"] == 430.0 and agg["eval_return"]["n"] == 3
    assert agg["eval_return"]["median"] == 490.0
    assert agg["time_to_target_s"]["reached"] == 2 and agg["time_to_target_s"]["of"] == 3
    assert agg["time_to_target_s"]["median"] == 2.0
    assert agg["solved"] == {"n": 2, "of": 3}
    assert agg["wall_s"]["mean"] == 4.0
    text = format_aggregate("x", rows, agg)
    assert "| 1 | crashed: exit 1: boom |" in text
    assert "| 0 | ok | 500.00 | 480.00 | yes | 1.00 | 1/1 | 100 | 2.0 |" in text
    assert "| evaluated return | 3 | 430.00 | 490.00 |" in text
    assert "Solved (evaluated return >= 475): 2 of 3 seeds." in text
    assert "Crashed seeds (left out of the statistics): [1]" in text


def summary(seed: int, sampled: float, greedy: float, parent: Path) -> dict:
    """The summary line ``rlpar train --json`` prints, of a run evaluated on two policies."""
    return {
        "name": "two_policies", "mean_return": 10.0 * seed, "env_steps": 1000 + seed,
        "learner_steps": 10, "episodes": 50, "checkpoint": None, "wall_s": 2.0 + seed,
        "time_to_target_s": None, "stopped_by": "total_env_steps",
        "target_return": None, "target_checks": [], "run_dir": str(parent / f"seed-{seed}"),
        "evaluation": [
            {"policy": "sampled", "episodes": 100, "mean_return": sampled},
            {"policy": "greedy", "episodes": 100, "mean_return": greedy},
        ],
    }  # fmt: skip


def test_every_evaluation_policy_gets_its_statistics() -> None:
    """Greedy beside sampled: the first policy stays "evaluated return", each further one has
    its own per-seed column and row of statistics (against a hand computation)."""
    rows = [
        {"seed": s, "status": "ok", "eval_return": r, "eval_returns": {"sampled": r, "greedy": g},
         "window_return": 10.0 * s, "time_to_target_s": None, "env_steps": 1000, "wall_s": 2.0}
        for s, r, g in [(0, 10.0, 20.0), (1, 14.0, 30.0), (2, 12.0, 40.0)]
    ]  # fmt: skip
    agg = aggregate(rows)
    assert agg["eval_return"]["mean"] == 12.0
    assert agg["eval_return_by_policy"]["sampled"] == agg["eval_return"]
    greedy = agg["eval_return_by_policy"]["greedy"]
    assert greedy["mean"] == 30.0 and greedy["median"] == 30.0 and greedy["min"] == 20.0
    text = format_aggregate("two_policies", rows, agg)
    assert (
        "| seed | status | evaluated return (sampled) | evaluated, greedy | window return |" in text
    )
    assert "| 1 | ok | 14.00 | 30.00 | 10.00 |" in text
    assert "| evaluated, greedy | 3 | 30.00 | 30.00 |" in text


def test_reaggregate_rebuilds_a_parent_from_its_seeds_summaries(tmp_path: Path) -> None:
    parent = tmp_path / "two_policies" / "seeds-1"
    parent.mkdir(parents=True)
    with pytest.raises(ValueError, match="expected the parent directory of an rlpar train --seeds"):
        reaggregate(parent)
    for seed, (r, g) in {0: (10.0, 20.0), 2: (14.0, 40.0)}.items():
        line = json.dumps(summary(seed, r, g, parent))
        (parent / f"seed-{seed}.json").write_text(f"progress...\n{line}\n")
    (parent / "seed-1.json").write_text("")  # a seed that crashed: no summary line
    (parent / "seed-1.log").write_text("Traceback ...\nRuntimeError: boom\n")
    # An older version's aggregate, written again; seed 3 crashed in a Ray task (no file).
    ray_crash = {"seed": 3, "status": "crashed", "error": "RayTaskError: lost"}
    (parent / "aggregate.json").write_text(json.dumps({"rows": [ray_crash]}))
    rows, agg = reaggregate(parent)
    assert [r["seed"] for r in rows] == [0, 1, 2, 3] and agg["crashed"] == [1, 3]
    assert rows[3] == ray_crash
    assert rows[1]["status"] == "crashed" and "RuntimeError: boom" in rows[1]["error"]
    assert agg["eval_return"]["mean"] == 12.0
    assert agg["eval_return_by_policy"]["greedy"]["mean"] == 30.0
    saved = json.loads((parent / "aggregate.json").read_text())
    assert saved["rows"] == rows and saved["eval_return_by_policy"] == agg["eval_return_by_policy"]
    md = (parent / "aggregate.md").read_text()
    assert md.startswith("# two_policies: 4 seeds") and "| 1 | crashed: no summary: " in md


# What a crashed child's log holds: the log line, the traceback, the exception, its note.
CHILD_LOG = """rlpar: rlpar train: the run failed
Traceback (most recent call last):
  File "rlpar/app/cli.py", line 357, in _run_train
    summary = training.run(quiet=args.quiet)
              ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
RuntimeError: deliberate crash of run seed 1
(raised in rlpar thread 'actor-0 (env Crashy-v0)'; the run was stopped)
"""
CHAINED = """Traceback (most recent call last):
  File "a.py", line 1, in <module>
KeyError: 'x'

The above exception was the direct cause of the following exception:

Traceback (most recent call last):
  File "a.py", line 3, in <module>
ValueError: env.setup: importing 'walk' failed
  the second line of its message
a log line after it
"""
RAY_TASK = """ray::train_seed() (pid=7, ip=127.0.0.1)
  File "rlpar/app/seeds.py", line 380, in train_seed
RuntimeError: this seed breaks on purpose
(a note)"""


@pytest.mark.parametrize(
    ("text", "line"),
    [
        (CHILD_LOG, "RuntimeError: deliberate crash of run seed 1"),
        (CHAINED, "ValueError: env.setup: importing 'walk' failed"),
        (RAY_TASK, "RuntimeError: this seed breaks on purpose"),
        ("rlpar train: error: runtime.seed: expected an integer\n",
         "rlpar train: error: runtime.seed: expected an integer"),
        ("\n\n", "no output"),
    ],
)  # fmt: skip
def test_a_crash_is_reported_by_its_exception_line(text: str, line: str) -> None:
    assert error_line(text) == line


CONFIG = """name = "seeds"
plugins = ["breaks_on_seed"]

[env]
id = "BreaksOnSeed-v0"
setup = "breaks_on_seed:register"

[agent]
name = "impala"

[runtime]
num_actors = 1
envs_per_actor = 4
unroll_length = 8
batch_rollouts = 1
total_env_steps = 2000

[eval]
episodes = 2
"""

# The env of CONFIG; in the child that trains runtime.seed=1 (it reads its own command line) its
# step raises in the actor thread, so one seed of the run crashes, with the note rlpar adds after
# the exception, and the others must still be reported.
WALK_ENV = """import gymnasium as gym
import numpy as np


class Walk(gym.Env):
    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(2, np.float32), {}

    def step(self, action):
        self.t += 1
        return np.zeros(2, np.float32), float(action), self.t >= 5, False, {}
"""
"""A 5-step env, the source of a plug-in module (tests/test_ray.py's seeds use it too)."""

PLUGIN = (
    "import os\n"
    + WALK_ENV
    + """

class Crashy(Walk):
    steps = 0

    def step(self, action):
        Crashy.steps += 1
        if Crashy.steps > 20:  # in the actor thread: past the check of the first step
            raise RuntimeError("deliberate crash of run seed 1")
        return super().step(action)


def register():
    crash = os.environ.get("RLPAR_TEST_SEED_MARK") and "runtime.seed=1" in " ".join(
        open(f"/proc/{os.getpid()}/cmdline").read().split("\\0")
    )
    if "BreaksOnSeed-v0" not in gym.registry:
        gym.register("BreaksOnSeed-v0", entry_point=Crashy if crash else Walk)
"""
)


def test_a_multi_seed_run_from_the_command_line(tmp_path: Path) -> None:
    folder = tmp_path / "exp"
    folder.mkdir()
    (folder / "seeds.toml").write_text(CONFIG)
    (folder / "breaks_on_seed.py").write_text(PLUGIN)
    proc = subprocess.run(
        [sys.executable, "-m", "rlpar", "train", str(folder / "seeds.toml"), "--seeds", "0-2",
         "--parallel", "2", "--logdir", str(tmp_path / "runs"), "--json"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL,
        env={**__import__("os").environ, "RLPAR_TEST_SEED_MARK": "1"},
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr  # a seed crashed
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["seeds"] == [0, 1, 2] and report["crashed"] == [1]
    by_seed = {r["seed"]: r for r in report["rows"]}
    # The exception itself, not the note after it nor the log line before its traceback.
    crash = "exit 1: RuntimeError: deliberate crash of run seed 1"
    assert by_seed[1]["error"] == crash
    assert f"seed 1: crashed: {crash}" in proc.stderr
    for seed in (0, 2):
        row = by_seed[seed]
        assert row["status"] == "ok" and row["env_steps"] >= 2000
        assert Path(row["run_dir"]) == Path(report["parent"]) / f"seed-{seed}"
        assert (Path(row["run_dir"]) / "summary.json").is_file()
        config = (Path(row["run_dir"]) / "config.toml").read_text()
        assert f"seed = {seed}\n" in config
    parent = Path(report["parent"])
    saved = json.loads((parent / "aggregate.json").read_text())
    assert saved["eval_return"] == report["eval_return"] and saved["eval_return"]["n"] == 2
    returns = [by_seed[s]["eval_return"] for s in (0, 2)]
    assert saved["eval_return"]["mean"] == pytest.approx(np.mean(returns))
    assert f"| 1 | crashed: {crash} |" in (parent / "aggregate.md").read_text()
    assert not list(parent.glob(".*.tmp*")), "a temporary file was left behind"


def test_bad_seed_options_are_one_line_errors(tmp_path: Path) -> None:
    config = str(ROOT / "experiments" / "cartpole_impala.toml")
    for args, said in [
        (["--seeds", "x"], "--seeds: expected a range like 0-4"),
        (["--seeds", "0-1", "--parallel", "0"], "--parallel: expected an integer >= 1, got 0"),
        (["--seeds", "0-1", "--resume", "x"], "--seeds: expected neither --resume nor"),
        (["--parallel", "2"], "--parallel: expected --seeds with it"),
        (["--seeds", "0-1", "--cpus-per-seed", "2"], "--cpus-per-seed: expected --ray with it"),
    ]:
        proc = subprocess.run(
            [sys.executable, "-m", "rlpar", "train", config, *args],
            cwd=tmp_path, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert proc.returncode == 2, proc.stderr
        assert said in proc.stderr and "Traceback" not in proc.stderr


def test_run_dir_refuses_a_folder_that_exists(tmp_path: Path) -> None:
    taken = tmp_path / "taken"
    taken.mkdir()
    config = str(ROOT / "experiments" / "cartpole_impala.toml")
    proc = subprocess.run(
        [sys.executable, "-m", "rlpar", "train", config, "--run-dir", str(taken)],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "--run-dir: expected a directory that does not exist" in proc.stderr
    assert "Traceback" not in proc.stderr and not list(taken.iterdir())
