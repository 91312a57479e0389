"""``rlpar sweep``: the space file is checked against the config before anything runs (keys
with a did-you-mean, value types and ranges, sweep settings); a two-trial sweep on Ray Tune
(a local Ray on 127.0.0.1, started by the command, its process group killed by the test)
ranks its trials, lets ASHA stop the one that trails, and writes a best.toml that loads."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from rlpar.app.experiment import load_experiment
from rlpar.app.sweep import METRIC, load_space, ranked, trial_rows
from rlpar.checkpoint import latest_checkpoint
from rlpar.config import ConfigError

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "experiments" / "cartpole_impala.toml"
# A small deterministic run: the same trials give the same returns, so ASHA decides the same.
SMALL = [
    "runtime.total_env_steps=20000", "runtime.target_return=none", "runtime.deterministic=true",
    "runtime.num_actors=1", "eval.interval_env_steps=4000", "eval.interval_episodes=5",
    "eval.episodes=10",
]  # fmt: skip


def needs_tune() -> None:
    """Skip the test unless Ray Tune imports. Ray without its "tune" extra raises ImportError
    for ``ray.tune`` (its dependencies are missing, not the module), which
    ``pytest.importorskip`` does not skip."""
    try:
        import ray.tune  # noqa: F401
    except ImportError as e:
        pytest.skip(f'needs Ray Tune (pip install "rlpar[sweep]"): {e}')


def space(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "space.toml"
    path.write_text(text)
    return path


def test_a_space_is_read_with_its_settings_and_dimensions(tmp_path: Path) -> None:
    spec = load_space(
        space(
            tmp_path,
            """
[sweep]
num_samples = 3
seed = 7
scheduler = "fifo"
[space]
"agent.optim.lr" = { loguniform = [1e-4, 1e-2] }
"agent.passes" = { grid = [1, 2] }
[space.runtime]
unroll_length = { randint = [8, 17] }
""",
        ),
        CONFIG,
    )
    kinds = {d.key: (d.kind, d.values) for d in spec.dimensions}
    assert kinds == {
        "agent.optim.lr": ("loguniform", [1e-4, 1e-2]),
        "agent.passes": ("grid", [1, 2]),
        "runtime.unroll_length": ("randint", [8, 17]),
    }
    assert (spec.num_samples, spec.seed, spec.scheduler) == (3, 7, "fifo")
    assert spec.num_trials == 2 * 3


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ('[space]\n"agent.optim.lrr" = { grid = [0.1] }',
         "unknown key 'agent.optim.lrr' (did you mean 'agent.optim.lr'?)"),
        ('[space]\n"agent.optim.lr" = { grid = ["fast"] }', "'agent.optim.lr' = 'fast'"),
        ('[space]\n"agent.optim.lr" = { grid = [0.0] }', "lr: expected a finite number > 0.0"),
        ('[space]\n"agent.optim.lr" = { loguniform = [0, 1] }',
         "loguniform expects [low, high] numbers with 0 < low < high, got [0, 1]"),
        ('[space]\n"runtime.unroll_length" = { randint = [8.5, 16] }',
         "randint expects [low, high) integers with low < high"),
        ('[space]\n"agent.passes" = { grid = [] }', "grid expects a non-empty list, got []"),
        ('[space]\n"agent.passes" = { steps = [1, 2] }', "expected a table with one of grid"),
        ('[space]\n"agent.passes" = 3', "expected a table with one of grid"),
        ("[sweep]\nnum_samples = 2", "expected a [space] table"),
        ('[sweep]\nsamples = 2\n[space]\n"agent.passes" = { grid = [1] }',
         "[sweep] 'samples' is not a sweep setting"),
        ('[sweep]\nnum_samples = 0\n[space]\n"agent.passes" = { grid = [1] }',
         "num_samples: expected an integer >= 1, got 0"),
        ('[sweep]\nscheduler = "pb2"\n[space]\n"agent.passes" = { grid = [1] }',
         'scheduler: expected "asha", "fifo" or "pbt", got \'pb2\''),
        ('[sweep]\nscheduler = "pbt"\n[space]\n"agent.passes" = { grid = [1, 2] }',
         "expected [sweep] perturbation_env_steps, an integer below runtime.total_env_steps"),
        ('[sweep]\nscheduler = "pbt"\nperturbation_env_steps = 1_000_000_000\n'
         '[space]\n"agent.passes" = { grid = [1, 2] }', "got 1000000000"),
        ('[sweep]\nscheduler = "pbt"\nperturbation_env_steps = 1000\n'
         '[space]\n"agent.passes" = { grid = [1] }', "needs a population: expected at least 2"),
        ('[sweep]\nscheduler = "pbt"\nperturbation_env_steps = 1000\nmax_concurrent = 1\n'
         '[space]\n"agent.passes" = { grid = [1, 2] }', "expected no [sweep] max_concurrent"),
        ('[sweep]\nquantile_fraction = 0.75\n[space]\n"agent.passes" = { grid = [1] }',
         "quantile_fraction: expected a number >= 0.01 and <= 0.5, got 0.75"),
        ('[sweep]\nscheduler = "fifo"\ngrace_env_steps = 10\n'
         '[space]\n"agent.passes" = { grid = [1] }',
         '[sweep] grace_env_steps is a setting of scheduler "asha": expected it only with that '
         'scheduler, got scheduler "fifo"'),
        ('[sweep]\nperturbation_env_steps = 10\n[space]\n"agent.passes" = { grid = [1] }',
         'perturbation_env_steps is a setting of scheduler "pbt"'),
        ('[sweep]\nresample_probability = -1\n[space]\n"agent.passes" = { grid = [1] }',
         "resample_probability: expected a number >= 0.0 and <= 1.0, got -1"),
        ('[sweep]\nsynch = 1\n[space]\n"agent.passes" = { grid = [1] }',
         "synch: expected true or false, got 1"),
        ('[space]\n"agent.passes" = { grid = [1, 2] }', "expected eval.interval_env_steps"),
        ("[space\n", "not valid TOML"),
    ],
)  # fmt: skip
def test_a_bad_space_is_a_config_error_naming_the_key(tmp_path: Path, text: str, said: str) -> None:
    with pytest.raises(ConfigError) as e:
        load_space(space(tmp_path, text), CONFIG, ["eval.interval_env_steps=none"])
    assert said in str(e.value)
    assert str(e.value).startswith(f"--space {tmp_path / 'space.toml'}")


def test_a_pbt_space_needs_a_final_evaluation_to_score_its_segments(tmp_path: Path) -> None:
    text = '[sweep]\nscheduler = "pbt"\nperturbation_env_steps = 1000\n'
    text += '[space]\n"agent.passes" = { grid = [1, 2] }'
    with pytest.raises(ConfigError, match=r"expected eval\.episodes >= 1 in the config"):
        load_space(space(tmp_path, text), CONFIG, ["eval.episodes=0", "eval.check_target=false"])
    spec = load_space(space(tmp_path, text), CONFIG, ["eval.episodes=10"])
    assert (spec.scheduler, spec.perturbation_env_steps, spec.synch) == ("pbt", 1000, True)
    assert (spec.quantile_fraction, spec.resample_probability) == (0.25, 0.25)


def test_a_missing_space_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such file"):
        load_space(tmp_path / "nope.toml", CONFIG)


def test_trials_rank_finished_first_then_stopped_then_crashed() -> None:
    rows = [
        {"trial": 0, METRIC: 50.0, "status": "stopped by ASHA at 10 env steps"},
        {"trial": 1, METRIC: None, "status": "crashed: ValueError: x"},
        {"trial": 2, METRIC: 20.0, "status": "finished"},
        {"trial": 3, METRIC: 30.0, "status": "finished"},
        {"trial": 4, METRIC: None, "status": "stopped by ASHA at 5 env steps"},
    ]
    assert [r["trial"] for r in ranked(rows)] == [3, 2, 0, 4, 1]


def test_a_crashed_trial_is_reported_by_its_exception_line() -> None:
    """Not by the note rlpar adds after an exception raised in one of its threads."""
    error = RuntimeError(
        "ray::_trial() (pid=7, ip=127.0.0.1)\n"
        '  File "rlpar/app/sweep/trials.py", line 40, in trial\n'
        "RuntimeError: deliberate crash of a trial\n"
        "(raised in rlpar thread 'actor-0 (env Crashy-v0)'; the run was stopped)"
    )
    result = SimpleNamespace(metrics={}, config={}, error=error)
    (row,) = trial_rows([result], SimpleNamespace(dimensions=[], scheduler="asha"))
    assert row["status"] == "crashed: RuntimeError: deliberate crash of a trial"


def _group_alive(pgid: int) -> list[int]:
    """Processes of group ``pgid`` that still run (a killed zombie not yet reaped does not)."""
    alive = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                if os.getpgid(int(pid)) != pgid:
                    continue
                with open(f"/proc/{pid}/stat") as f:
                    state = f.read().rsplit(")", 1)[1].split()[0]
            except (ProcessLookupError, FileNotFoundError):
                continue
            if state not in ("Z", "X"):
                alive.append(int(pid))
    return alive


def _group_gone(pgid: int, within_s: float = 10.0) -> list[int]:
    """Waits up to ``within_s`` for a process group sent SIGKILL to end (the kill is delivered
    asynchronously: a process can still be exiting when killpg returns); what still runs then."""
    deadline = time.monotonic() + within_s
    while (alive := _group_alive(pgid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return alive


def _sweep(tmp_path: Path, space_path: Path, timeout: float = 240) -> tuple[list, str]:
    """``rlpar sweep CONFIG --space ... --json`` on SMALL in a session of its own: (the ranked
    rows, stderr); its process group is killed after, so no Ray process outlives the test."""
    cmd = [sys.executable, "-m", "rlpar", "sweep", str(CONFIG), "--space", str(space_path),
           "--json", "--logdir", str(tmp_path / "runs"), "--num-cpus", "2"]  # fmt: skip
    for o in SMALL:
        cmd += ["--set", o]
    proc = subprocess.Popen(
        cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert proc.returncode == 0, err[-3000:]
    assert not _group_gone(proc.pid)
    (line,) = out.strip().splitlines()  # stdout holds the JSON alone (Tune's tables: stderr)
    return json.loads(line), err


def test_a_two_trial_sweep_ranks_stops_the_trailing_trial_and_writes_the_best(
    tmp_path: Path,
) -> None:
    needs_tune()
    path = space(
        tmp_path,
        "[sweep]\nmax_concurrent = 1\ngrace_env_steps = 4000\n"
        '[space]\n"agent.optim.lr" = { grid = [0.003, 1e-7] }\n',
    )
    rows, err = _sweep(tmp_path, path)
    assert "will be ignored" not in err  # Tune drops max_concurrent_trials beside a generator
    assert sorted(r["config"]["agent.optim.lr"] for r in rows) == [1e-7, 0.003]
    best, other = rows
    assert best["status"] == "finished" and best["env_steps"] >= 20000
    # Which trial Tune starts first decides whether ASHA has a rung to stop the other at.
    if other["status"] == "finished":
        assert other[METRIC] <= best[METRIC]
    else:
        assert other["status"] == f"stopped by ASHA at {other['env_steps']:,} env steps"
        assert other["env_steps"] < 20000
    # max_concurrent = 1 (Ray has 2 CPUs, a trial asks 1): the second starts after the first.
    first, second = sorted(rows, key=lambda r: r["started_at"])
    assert first["ended_at"] <= second["started_at"]
    (root,) = (tmp_path / "runs" / "cartpole_impala").iterdir()
    results = json.loads((root / "results.json").read_text())
    assert results["best"] == best and results["trials"] == rows
    summary = json.loads((Path(best["run_dir"]) / "summary.json").read_text())
    assert summary["evaluation"][0]["mean_return"] == best[METRIC]
    table = (root / "results.md").read_text()
    assert f"| 1 | {best['config']['agent.optim.lr']:.4g} |" in table
    exp = load_experiment(root / "best.toml")
    assert exp.agent.optim.lr == best["config"]["agent.optim.lr"]
    assert exp.runtime.total_env_steps == 20000
    assert not list(root.glob(".*tmp*"))


def test_pbt_continues_the_trailing_trial_from_the_leaders_exact_checkpoint(
    tmp_path: Path,
) -> None:
    needs_tune()
    path = space(
        tmp_path,
        '[sweep]\nscheduler = "pbt"\nperturbation_env_steps = 10000\nquantile_fraction = 0.5\n'
        "resample_probability = 0.0\ncpus_per_trial = 2\n"  # one trial at a time on 2 CPUs
        '[space]\n"agent.optim.lr" = { grid = [0.003, 1e-7] }\n',
    )
    rows, _ = _sweep(tmp_path, path)
    assert [r["status"] for r in rows] == ["finished", "finished"]
    assert all(r["env_steps"] >= 20000 for r in rows)
    last_ran_in = {r["schedule"][-1]["trial"] for r in rows}  # each trial ran its own end
    (low,) = [r for r in rows if r["trial_id"] != r["schedule"][0]["trial"]]
    (high,) = [r for r in rows if r is not low]
    # The leader ran both segments itself, at its own rate.
    assert [s["trial"] for s in high["schedule"]] == [high["trial_id"]] * 2
    assert [s["config"]["agent.optim.lr"] for s in high["schedule"]] == [0.003, 0.003]
    assert [s["continued_from"] for s in high["schedule"]] == [None, None]
    # The trailing trial (lr 1e-7) was exploited at 10k env steps: its parameters are the
    # leader's segment 1 and its own segment 2, run with the leader's rate or its neighbour.
    first, second = low["schedule"]
    assert first == high["schedule"][0]
    assert second["trial"] == low["trial_id"]
    assert second["continued_from"] == {"trial": high["trial_id"], "env_steps": first["env_steps"]}
    assert second["config"]["agent.optim.lr"] in (0.003, 1e-7)
    assert low["config"] == second["config"] and low[METRIC] == second[METRIC]
    assert last_ran_in == {r["trial_id"] for r in rows}
    root = Path(low["run_dir"]).parents[1]  # <sweep dir>/trial-<id>/segment-2
    own_first = load_experiment(root / f"trial-{low['trial_id']}" / "segment-1" / "config.toml")
    assert own_first.agent.optim.lr == 1e-7  # what it ran before it was exploited
    # Its segment 2 resumed from a byte copy of the leader's final checkpoint of segment 1.
    resumed = root / f"trial-{low['trial_id']}" / f"resume-{high['trial_id']}-1.ckpt"
    leader_ckpt = latest_checkpoint(Path(first["run_dir"]) / "checkpoints")
    assert resumed.read_bytes() == leader_ckpt.read_bytes()
    assert f"# resumed from {resumed}" in (Path(second["run_dir"]) / "config.toml").read_text()
    resumed_exp = load_experiment(Path(second["run_dir"]) / "config.toml")
    assert resumed_exp.agent.optim.lr == second["config"]["agent.optim.lr"]  # the explored one
    summary = json.loads((Path(second["run_dir"]) / "summary.json").read_text())
    assert summary["evaluation"][0]["mean_return"] == second[METRIC]
    results = json.loads((root / "results.json").read_text())
    assert results["trials"] == rows
    table = (root / "results.md").read_text()
    assert "## Schedules" in table
    assert f"trial {high['trial_id']} at {first['env_steps']:,}" in table
    best = load_experiment(root / "best.toml")
    assert best.agent.optim.lr == rows[0]["config"]["agent.optim.lr"]


def test_the_committed_minatar_space_fits_the_suite_config() -> None:
    spec = load_space(
        ROOT / "experiments" / "sweeps" / "minatar_breakout.toml",
        ROOT / "experiments" / "minatar_breakout_suite.toml",
    )
    assert {d.key for d in spec.dimensions} == {"agent.optim.lr", "agent.passes"}
    assert spec.grid_size == 3 and spec.num_samples == 2 and spec.scheduler == "asha"


def test_the_committed_pbt_space_and_its_twin_fit_the_suite_config_as_measured() -> None:
    # The overrides of the command in RESULTS.md ("Population-based training on MinAtar
    # Breakout") and in the space files' headers.
    sets = ["runtime.total_env_steps=3_000_000", "eval.episodes=30",
            'eval.policies=["sampled"]', "eval.interval_env_steps=none"]  # fmt: skip
    suite = ROOT / "experiments" / "minatar_breakout_suite.toml"
    pbt, fifo = (
        load_space(ROOT / "experiments" / "sweeps" / f"minatar_breakout_{name}.toml", suite, sets)
        for name in ("pbt", "fifo")
    )
    assert (pbt.scheduler, pbt.perturbation_env_steps, pbt.num_trials) == ("pbt", 500_000, 4)
    assert (fifo.scheduler, fifo.num_trials, fifo.max_concurrent) == ("fifo", 4, 1)
    # Twins: the same dimensions and Tune seed, so the same four starting values.
    assert (pbt.dimensions, pbt.seed) == (fifo.dimensions, fifo.seed)


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--num-cpus", "0"], "--num-cpus: expected an integer >= 1, got 0"),
        (["--address", "foo"], '--address: expected "auto" or host:port of a Ray cluster'),
    ],
)
def test_bad_sweep_options_exit_2_naming_the_option(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], said: str
) -> None:
    from rlpar.app.cli import main

    path = space(tmp_path, '[space]\n"agent.optim.lr" = { grid = [0.003] }\n')
    argv = ["sweep", str(CONFIG), "--space", str(path), "--logdir", str(tmp_path / "runs"), *args]
    assert main(argv) == 2
    assert said in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


def test_a_ray_address_nobody_answers_at_fails_fast_and_leaves_no_sweep_dir(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    needs_tune()
    import socket

    from rlpar.app.cli import main

    with socket.socket() as s:  # a port nothing listens on once the socket is closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    path = space(tmp_path, '[space]\n"agent.optim.lr" = { grid = [0.003] }\n')
    argv = ["sweep", str(CONFIG), "--space", str(path), "--logdir", str(tmp_path / "runs"),
            "--address", f"127.0.0.1:{port}"]  # fmt: skip
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert f"--address = '127.0.0.1:{port}'" in err and "ray start --head" in err
    assert not (tmp_path / "runs").exists()
