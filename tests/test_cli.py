"""``rlpar train``, ``rlpar eval`` and ``rlpar agents`` as a user runs them: ``python -m rlpar``
in a subprocess, in a temporary directory (so the installed package is imported), with tiny
step budgets."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

import rlpar
from rlpar import registry
from rlpar.app.evaluate import evaluate

ROOT = Path(__file__).resolve().parent.parent
IMPALA = str(ROOT / "experiments" / "cartpole_impala.toml")
A3C = str(ROOT / "experiments" / "cartpole_a3c.toml")
TINY = ["--set", "runtime.total_env_steps=5000"]


def run_cli(cwd: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rlpar", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def last_json(proc: subprocess.CompletedProcess) -> dict:
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def assert_clean_error(proc: subprocess.CompletedProcess, status: int, *needles: str) -> None:
    assert proc.returncode == status, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    for needle in needles:
        assert needle in proc.stderr, (needle, proc.stderr)


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> dict:
    """One tiny IMPALA run with overrides; its --json summary."""
    cwd = tmp_path_factory.mktemp("train")
    proc = run_cli(
        cwd,
        "train",
        IMPALA,
        *TINY,
        "--set",
        "agent.optim.lr=0.01",
        "--set",
        "agent.net.hidden=[16]",
        "--set",
        "runtime.checkpoint_interval_s=none",
        "--json",
        "--quiet",
    )
    summary = last_json(proc)
    summary["_cwd"] = cwd
    summary["_stderr"] = proc.stderr
    return summary


# ------------------------------------------------------------------------------------- help


@pytest.mark.parametrize(
    ("args", "mentions"),
    [
        ([], ["train", "eval", "agents", "bench"]),
        (["train"], ["CONFIG.toml", "--set", "--logdir", "--json", "--quiet", "--resume"]),
        (
            ["eval"],
            [
                "CHECKPOINT",
                "--episodes",
                "--greedy",
                "--sample",
                "--json",
                "--set",
                "--trust-checkpoint-setup",
            ],
        ),
        (["agents"], ["--json"]),
    ],
)
def test_help(tmp_path: Path, args: list[str], mentions: list[str]) -> None:
    proc = run_cli(tmp_path, *args, "--help")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: rlpar")
    for word in mentions:
        assert word in proc.stdout, word


def test_agents_lists_built_ins_with_their_keys(tmp_path: Path) -> None:
    proc = run_cli(tmp_path, "agents")
    assert proc.returncode == 0, proc.stderr
    assert "impala  (built-in: rlpar.agents.impala.Impala)" in proc.stdout
    assert "a3c  (built-in: rlpar.agents.a3c.A3C)" in proc.stdout
    assert "entropy_cost" in proc.stdout and "optim.lr" in proc.stdout
    agents = last_json(run_cli(tmp_path, "agents", "--json"))
    assert agents["a3c"]["keys"]["entropy_cost"] == {
        "type": "float",
        "default": 0.01,
        "required": False,
        "doc": "Weight of the entropy bonus.",
    }


# --------------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        (
            ["runtime.num_actorz=2"],
            "unknown key 'runtime.num_actorz' (did you mean 'runtime.num_actors'?)",
        ),
        (["agent.optim.lrr=0.1"], "unknown key 'agent.optim.lrr' (did you mean 'agent.optim.lr'?)"),
        (["runtme.seed=1"], "unknown key 'runtme' (did you mean 'runtime'?)"),
        (["runtime.num_actors=two"], "runtime.num_actors: expected an integer, got 'two'"),
        (["runtime.num_actors=0"], "runtime.num_actors: expected an integer >= 1, got 0"),
        (["agent.gamma=2"], "agent.gamma: expected a number in [0, 1], got 2.0"),
        (["agent.net.hidden=64"], "agent.net.hidden: expected a list, got 64"),
        (["agent.name=impalla"], "agent.name: unknown agent 'impalla' (did you mean 'impala'?)"),
        (["runtime.seed"], "expected section.key=value"),
        (["env.id=NoSuchEnv-v9"], "unknown environment id 'NoSuchEnv-v9'"),
    ],
)
def test_bad_overrides_are_clean_errors(tmp_path: Path, overrides: list[str], needle: str) -> None:
    args = [a for o in overrides for a in ("--set", o)]
    proc = run_cli(tmp_path, "train", IMPALA, *args)
    assert_clean_error(proc, 2, needle, "rlpar train: error:")
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").rglob("*.toml"))


def test_bad_keys_in_the_file_name_file_and_key(tmp_path: Path) -> None:
    path = tmp_path / "typo.toml"
    path.write_text('[agent]\nname = "impala"\nentropy_cots = 0.1\n')
    proc = run_cli(tmp_path, "train", str(path))
    assert_clean_error(
        proc, 2, f"{path}: unknown key 'agent.entropy_cots' (did you mean 'agent.entropy_cost'?)"
    )
    proc = run_cli(tmp_path, "train", str(tmp_path / "missing.toml"))
    assert_clean_error(proc, 2, "no such experiment file")


def test_usage_errors_exit_2(tmp_path: Path) -> None:
    assert run_cli(tmp_path, "train").returncode == 2
    assert run_cli(tmp_path, "eval", "x", "--greedy", "--sample").returncode == 2
    assert_clean_error(run_cli(tmp_path, "eval", "x", "--episodes", "0"), 2, "--episodes")


# ------------------------------------------------------------------------------------- train


def test_train_json_summary_is_the_last_line_and_summary_json(trained: dict) -> None:
    run_dir = Path(trained["run_dir"])
    assert run_dir.parent == trained["_cwd"] / "runs" / "cartpole_impala"
    on_disk = json.loads((run_dir / "summary.json").read_text())
    assert on_disk == {k: v for k, v in trained.items() if not k.startswith("_")}
    for key in ("mean_return", "env_steps", "wall_s", "time_to_target_s", "learner_steps"):
        assert key in on_disk
    assert on_disk["env_steps"] >= 5000 and on_disk["learner_steps"] > 0
    assert on_disk["time_to_target_s"] is None and on_disk["stopped_by"] == "total_env_steps"
    assert Path(on_disk["checkpoint"]).is_file()
    assert trained["_stderr"] == ""  # --quiet


def test_train_saves_the_resolved_config_with_the_overrides(trained: dict) -> None:
    text = (Path(trained["run_dir"]) / "config.toml").read_text()
    assert "lr = 0.01\n" in text and "hidden = [16]\n" in text
    assert 'checkpoint_interval_s = "none"' in text and "total_env_steps = 5000" in text
    assert "entropy_cost = 0.01" in text  # defaults filled in
    assert any(Path(trained["run_dir"]).glob("events.out.tfevents.*"))


def test_train_text_output_and_logdir(tmp_path: Path) -> None:
    proc = run_cli(tmp_path, "train", A3C, *TINY, "--logdir", "elsewhere")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("mean return ")
    assert "run directory: " in proc.stdout and "checkpoint: " in proc.stdout
    (run_dir,) = (tmp_path / "elsewhere" / "cartpole_a3c").iterdir()
    assert (run_dir / "summary.json").is_file()


def test_time_to_target_is_reported(tmp_path: Path) -> None:
    summary = last_json(
        run_cli(
            tmp_path,
            "train",
            IMPALA,
            "--set",
            "runtime.target_return=5",
            "--set",
            "runtime.return_window=5",
            "--json",
            "--quiet",
        )
    )
    assert summary["stopped_by"] == "target_return"
    assert summary["time_to_target_s"] > 0 and summary["mean_return"] >= 5


def test_resume_continues_the_counters(trained: dict, tmp_path: Path) -> None:
    summary = last_json(
        run_cli(
            tmp_path,
            "train",
            IMPALA,
            "--set",
            "runtime.total_env_steps=10000",
            "--set",
            "agent.net.hidden=[16]",
            "--resume",
            trained["checkpoint"],
            "--json",
            "--quiet",
        )
    )
    assert summary["env_steps"] >= 10000
    assert summary["learner_steps"] > trained["learner_steps"]
    assert "# resumed from" in (Path(summary["run_dir"]) / "config.toml").read_text()


def test_resume_with_another_architecture_is_a_clean_error(trained: dict, tmp_path: Path) -> None:
    proc = run_cli(tmp_path, "train", IMPALA, "--resume", trained["checkpoint"])
    assert_clean_error(proc, 1, "checkpoint is for a different architecture")
    assert not (tmp_path / "runs" / "cartpole_impala").exists() or not any(
        (tmp_path / "runs" / "cartpole_impala").iterdir()
    )


def test_sigint_stops_with_a_checkpoint_and_status_130(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "rlpar", "train", IMPALA, "--json", "--quiet"),
            *("--set", "runtime.target_return=none"),
            *("--set", "runtime.total_env_steps=100_000_000"),
        ],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not any(  # scalars are written once the runner runs (and handles SIGINT)
            b"episode/count" in f.read_bytes()
            for f in (tmp_path / "runs").rglob("events.out.tfevents.*")
        ):
            assert proc.poll() is None, proc.stderr.read()
            assert time.monotonic() < deadline
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, err
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["stopped_by"] == "SIGINT" and Path(summary["checkpoint"]).is_file()


# -------------------------------------------------------------------------------------- eval


def test_eval_plays_the_checkpoint(trained: dict, tmp_path: Path) -> None:
    result = last_json(
        run_cli(tmp_path, "eval", trained["checkpoint"], "--episodes", "3", "--json")
    )
    assert result["episodes"] == 3 and len(result["returns"]) == 3
    assert result["policy"] == "greedy" and result["agent"] == "impala"
    assert result["min_return"] <= result["mean_return"] <= result["max_return"]
    assert result["trained_env_steps"] == trained["env_steps"]
    assert all(length >= 1 for length in result["lengths"])
    sampled = last_json(
        run_cli(tmp_path, "eval", trained["checkpoint"], "--episodes", "20", "--sample", "--json")
    )
    assert sampled["policy"] == "sampled" and sampled["episodes"] == 20
    text = run_cli(tmp_path, "eval", trained["checkpoint"], "--episodes", "2")
    assert text.returncode == 0, text.stderr
    assert text.stdout.startswith("mean return ") and " ± " in text.stdout


def test_eval_takes_a_run_directory(trained: dict, tmp_path: Path) -> None:
    result = last_json(run_cli(tmp_path, "eval", trained["run_dir"], "--episodes", "1", "--json"))
    assert result["checkpoint"] == trained["checkpoint"]
    assert_clean_error(
        run_cli(tmp_path, "eval", str(tmp_path)), 1, "no checkpoint in this directory"
    )


class NoGreedy(rlpar.registered_agents()["impala"].factory):
    """IMPALA without a greedy policy, as an agent that does not implement one."""

    greedy = rlpar.Agent.greedy


def test_eval_without_greedy_samples_and_says_so(trained: dict, monkeypatch, caplog) -> None:
    monkeypatch.setattr(registry, "_AGENTS", dict(registry.registered_agents()))
    registry.register_agent("impala", NoGreedy, overwrite=True)
    with caplog.at_level("WARNING", logger="rlpar"):
        result = evaluate(trained["checkpoint"], episodes=2)
    assert result.policy == "sampled" and result.episodes == 2
    assert "NoGreedy has no greedy policy: sampling actions instead" in caplog.text


def test_eval_of_a_checkpoint_without_an_agent_config_is_a_clean_error(tmp_path: Path) -> None:
    runner = rlpar.Runner(
        rlpar.make_agent("a3c"),
        rlpar.EnvConfig("CartPole-v1"),
        rlpar.RuntimeConfig(num_actors=1, envs_per_actor=2, total_env_steps=100),
        checkpoint_dir=tmp_path / "ckpt",
    )
    checkpoint = runner.run().checkpoint
    proc = run_cli(tmp_path, "eval", checkpoint)
    assert_clean_error(proc, 1, "its config cannot rebuild the run: agent.name: required")


def test_eval_of_a_corrupt_file_is_a_clean_error(trained: dict, tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.rlpar"
    garbage.write_bytes(b"this is not a checkpoint")
    assert_clean_error(run_cli(tmp_path, "eval", str(garbage)), 1, "not an rlpar checkpoint")
    data = Path(trained["checkpoint"]).read_bytes()
    truncated = tmp_path / "truncated.rlpar"
    truncated.write_bytes(data[: len(data) // 2])
    assert_clean_error(run_cli(tmp_path, "eval", str(truncated)), 1, "truncated")
    flipped = tmp_path / "flipped.rlpar"
    flipped.write_bytes(data[:-10] + bytes([data[-10] ^ 1]) + data[-9:])
    assert_clean_error(run_cli(tmp_path, "eval", str(flipped)), 1, "checksum mismatch")
    assert_clean_error(
        run_cli(tmp_path, "eval", str(tmp_path / "none.rlpar")), 1, "no such checkpoint file"
    )


def test_eval_with_another_architecture_is_a_clean_error(trained: dict, tmp_path: Path) -> None:
    proc = run_cli(tmp_path, "eval", trained["checkpoint"], "--set", "agent.net.hidden=[8]")
    assert_clean_error(
        proc, 1, "checkpoint is for a different architecture", "'layers.0.weight' (4, 16)"
    )


# ---------------------------------------------------------------------------------- progress


def test_progress_off_a_terminal_is_log_lines(tmp_path: Path) -> None:
    proc = run_cli(tmp_path, "train", IMPALA, *TINY, "--set", "log.log_interval_s=0.01")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.splitlines()
    assert any(" INFO run directory: runs/cartpole_impala/" in line for line in lines)
    progress = [line for line in lines if " INFO env steps " in line]
    assert progress and "/5,000 (" in progress[-1] and " steps/s | return " in progress[-1]
    assert " | ended after " in progress[-1] and "\r" not in proc.stderr
    quiet = run_cli(tmp_path, "train", IMPALA, *TINY, "--quiet")
    assert quiet.returncode == 0 and quiet.stderr == ""


def run_on_a_terminal(cwd: Path, *args: str) -> tuple[int, str, str]:
    """Run rlpar with stderr on a pseudo-terminal; returns (status, stdout, terminal output)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 160, 0, 0))  # rows, columns
    proc = subprocess.Popen(
        [sys.executable, "-m", "rlpar", *args],
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=slave,
    )
    os.close(slave)
    chunks = []
    try:
        while True:
            ready, _, _ = select.select([master], [], [], 60)
            assert ready, "no terminal output for 60 s"
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            chunks.append(chunk)
        out, _ = proc.communicate(timeout=60)
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return proc.returncode, out.decode(), b"".join(chunks).decode(errors="replace")


def test_progress_on_a_terminal_is_a_live_bar(tmp_path: Path) -> None:
    status, out, term = run_on_a_terminal(tmp_path, "train", IMPALA, *TINY, "--json")
    assert status == 0, term
    assert "100%|" in term and "env steps [" in term and "\r" in term
    assert re.search(r"steps/s, return [\d.]+ \[\d+, \d+\], lag [\d.]+/\d+\]", term), term
    assert json.loads(out.strip().splitlines()[-1])["env_steps"] >= 5000
    status, out, term = run_on_a_terminal(tmp_path, "train", IMPALA, *TINY, "--quiet")
    assert status == 0 and term == "" and out.startswith("mean return")


def test_the_module_docstring_and_the_help_list_every_command() -> None:
    """A newcomer reads the command list at the top of rlpar/app/cli.py and in ``--help``: both
    name every subcommand and every benchmark the parser has."""
    import argparse

    from rlpar.app import cli
    from rlpar.bench.catalogue import BENCHES

    parser = cli.build_parser()
    (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    doc = cli.__doc__ or ""
    for name in commands.choices:
        assert f"rlpar {name} " in doc, name
    for bench in BENCHES:
        assert f"rlpar bench {bench.name} " in doc, bench.name
    bench_help = commands.choices["bench"].format_help() + parser.format_help()
    for bench in BENCHES:
        assert bench.name in bench_help, bench.name
