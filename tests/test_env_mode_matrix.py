"""Every env mode trains, evaluates and resumes as a whole, the way a user runs it.

Each cell of the matrix (env mode x feed-forward / LSTM) is one experiment file: a short
training run with an evaluation during the run and at its end, then ``rlpar eval RUN_DIR``'s
`evaluate`, then ``rlpar train --resume RUN_DIR`` for a few steps more. A combination that
cannot run is refused when the config is read, naming the key to change. Ray is one cell of
its own in tests/test_ray.py (it needs the `rlpar[ray]` extra).
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import rlpar
from rlpar.app.evaluate import evaluate
from rlpar.app.experiment import load_experiment
from rlpar.app.train import Training
from rlpar.checkpoint import CheckpointError
from rlpar.config import ConfigError, EnvConfig, RuntimeConfig
from rlpar.runtime import Progress, Runner, RunResult

# mode name -> ([env] keys, env id, module the mode needs or None)
MODES: dict[str, tuple[dict[str, object], str, str | None]] = {
    "sync": ({"vectorization": "sync"}, "CartPole-v1", None),
    "async": ({"vectorization": "async"}, "CartPole-v1", None),
    "async-workers": ({"vectorization": "async", "workers_per_actor": 2}, "CartPole-v1", None),
    "async-double-buffer": (
        {"vectorization": "async", "workers_per_actor": 2, "double_buffer": True},
        "CartPole-v1",
        None,
    ),
    "sync-double-buffer": ({"vectorization": "sync", "double_buffer": True}, "CartPole-v1", None),
    "native": ({"vectorization": "sync"}, "rlpar/CartPole-v1", None),
    "ale": ({"vectorization": "ale"}, "ALE/Pong-v5", "ale_py"),
    "ale-double-buffer": ({"vectorization": "ale", "double_buffer": True}, "ALE/Pong-v5", "ale_py"),
    "envpool": ({"vectorization": "envpool"}, "CartPole-v1", "envpool"),
    "envpool-double-buffer": (
        {"vectorization": "envpool", "double_buffer": True},
        "CartPole-v1",
        "envpool",
    ),
}


def _toml_value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return f'"{v}"'
    return str(v)


def write_config(folder: Path, mode: str, lstm: bool, steps: int, runtime: str = "") -> Path:
    """One cell's experiment file (Atari cells get a small conv net); ``runtime``: more lines
    for its [runtime] table."""
    env_keys, env_id, _ = MODES[mode]
    atari = env_id.startswith("ALE/")
    env = "\n".join(f"{k} = {_toml_value(v)}" for k, v in env_keys.items())
    net = "conv = [[8, 8, 4], [16, 4, 2]]\nhidden = [32]\n" if atari else "hidden = [32]\n"
    if lstm:
        net += "lstm = 16\n"
    path = folder / f"{mode}-{'lstm' if lstm else 'ff'}.toml"
    path.write_text(
        f"""name = "matrix"

[env]
id = "{env_id}"
{env}

[agent]
name = "impala"

[agent.net]
{net}
[runtime]
num_actors = 2
envs_per_actor = 4
unroll_length = 8
batch_rollouts = 1
total_env_steps = 100_000_000
max_wall_s = 120.0
checkpoint_interval_s = 3600.0
seed = 0
{runtime}

[eval]
episodes = {1 if atari else 2}
max_envs = {1 if atari else 2}
policies = ["greedy"]
interval_env_steps = {steps // 2}
interval_episodes = 1

[log]
logdir = "{folder / "runs"}"
histogram_interval = 0
"""
    )
    return path


def _atari_episode_cap(path: Path) -> None:
    """Pong episodes last thousands of steps: cap them, so evaluations finish in seconds."""
    text = path.read_text()
    path.write_text(
        text.replace("[agent]", "kwargs = { max_num_frames_per_episode = 400 }\n\n[agent]", 1)
    )


def stop_after_an_evaluation(training: Training, min_env_steps: int) -> None:
    """Let ``training`` run until the evaluator has finished an evaluation and the actors have
    taken ``min_env_steps`` steps, however long an evaluation of this mode takes (worker
    processes start in seconds); `runtime.max_wall_s` bounds it."""
    runner = training.runner
    run = runner.run

    def run_until_evaluated(on_progress: Callable[[Progress], None], **kw: Any) -> RunResult:
        def check(p: Progress) -> None:
            on_progress(p)
            if runner.evaluations and p.env_steps >= min_env_steps:
                runner.stop.set()

        return run(on_progress=check, **kw)

    runner.run = run_until_evaluated  # type: ignore[method-assign]


CELLS = [(mode, lstm) for mode in MODES for lstm in (False, True)]


@pytest.mark.parametrize(
    ("mode", "lstm"), CELLS, ids=[f"{m}-{'lstm' if lstm else 'ff'}" for m, lstm in CELLS]
)
def test_each_env_mode_trains_evaluates_and_resumes(tmp_path: Path, mode: str, lstm: bool):
    needs = MODES[mode][2]
    if needs is not None and importlib.util.find_spec(needs) is None:
        pytest.skip(f"{needs} is not installed (an optional extra)")
    config = write_config(tmp_path, mode, lstm, steps=2000)
    if MODES[mode][1].startswith("ALE/"):
        _atari_episode_cap(config)
    train_evaluate_resume(config)


@pytest.mark.parametrize("mode", list(MODES), ids=[f"{m}-appo-lstm" for m in MODES])
def test_appo_trains_evaluates_and_resumes_on_each_env_mode(tmp_path: Path, mode: str) -> None:
    """APPO's epochs x minibatches (whole unrolls of an LSTM) on every env mode, the same whole
    path as IMPALA's cells."""
    needs = MODES[mode][2]
    if needs is not None and importlib.util.find_spec(needs) is None:
        pytest.skip(f"{needs} is not installed (an optional extra)")
    config = write_config(tmp_path, mode, True, steps=2000)
    text = config.read_text().replace(
        'name = "impala"', 'name = "appo"\nepochs = 2\nminibatches = 2'
    )
    config.write_text(text)
    if MODES[mode][1].startswith("ALE/"):
        _atari_episode_cap(config)
    train_evaluate_resume(config)


def train_evaluate_resume(config: Path) -> None:
    """Train (until an evaluation during the run has finished), evaluate the run directory,
    resume from it for a few hundred env steps more."""
    first = Training(load_experiment(config))
    stop_after_an_evaluation(first, min_env_steps=2000)
    summary = first.run(quiet=True)
    trained = summary.result
    assert trained.stopped_by == "stop", summary
    assert trained.checkpoint is not None
    assert first.runner.evaluations, "the evaluator ran no evaluation during training"
    assert summary.evaluation[0]["episodes"] >= 1

    run_dir = Path(summary.run_dir)
    result = evaluate(run_dir, episodes=3)
    assert result.episodes == 3 and result.checkpoint == trained.checkpoint

    more = load_experiment(config, [f"runtime.total_env_steps={trained.env_steps + 500}"])
    second = Training(more, resume=run_dir)
    assert second.runner.resumed_from == Path(trained.checkpoint)
    resumed = second.run(quiet=True).result
    assert resumed.env_steps > trained.env_steps
    assert resumed.learner_steps > trained.learner_steps
    assert "# resumed from " + trained.checkpoint in (second.run_dir / "config.toml").read_text()


@pytest.mark.parametrize(
    ("keys", "match"),
    [
        ({"vectorization": "threads"}, "env.vectorization"),
        ({"vectorization": "async", "workers_per_actor": 0}, "env.workers_per_actor"),
    ],
)
def test_combinations_that_cannot_run_are_refused_when_the_config_is_read(
    tmp_path: Path, keys: dict, match: str
) -> None:
    MODES["refused"] = (keys, "CartPole-v1", None)
    try:
        config = write_config(tmp_path, "refused", False, steps=1000)
    finally:
        del MODES["refused"]
    with pytest.raises(ConfigError, match=match):
        load_experiment(config)


def test_the_whole_path_from_the_command_line(tmp_path: Path) -> None:
    """The issue's failing row as a user typed it: "async" + double buffering, then
    ``rlpar eval RUN_DIR`` and ``rlpar train --resume RUN_DIR``."""
    config = write_config(tmp_path, "async-double-buffer", False, steps=2000)

    def cli(*args: str) -> subprocess.CompletedProcess:
        proc = subprocess.run(
            [sys.executable, "-m", "rlpar", *args],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=300,
            stdin=subprocess.DEVNULL,
        )
        assert proc.returncode == 0, proc.stderr
        return proc

    budget = ["--set", "runtime.total_env_steps=20000"]
    cli("train", str(config), "--quiet", *budget)
    (run_dir,) = (tmp_path / "runs" / "matrix").iterdir()
    assert "over 3 episodes" in cli("eval", str(run_dir), "--episodes", "3").stdout
    more = ["--set", "runtime.total_env_steps=25000"]
    resumed = cli("train", str(config), "--resume", str(run_dir), *more)
    assert "resuming from " + str(run_dir / "checkpoints") in resumed.stderr


@pytest.mark.parametrize(
    ("env", "envs_per_actor", "match"),
    [
        (EnvConfig(vectorization="async", workers_per_actor=3), 4, "divisor of runtime.envs"),
        (EnvConfig(vectorization="async", workers_per_actor=6, double_buffer=True), 4,
         "divisor of runtime.envs_per_actor \\(4, halved by env.double_buffer\\), got 6"),
        (EnvConfig(vectorization="async", workers_per_actor=3, double_buffer=True), 6,
         "env.workers_per_actor: expected an even number"),
        (EnvConfig(vectorization="ale", double_buffer=True), 5, "runtime.envs_per_actor"),
        (EnvConfig(double_buffer=True), 5,
         "runtime.envs_per_actor: expected an even number with env.double_buffer"),
    ],
)  # fmt: skip
def test_a_layout_that_does_not_fit_the_envs_is_refused_before_any_env_starts(
    monkeypatch, env: EnvConfig, envs_per_actor: int, match: str
) -> None:
    from rlpar.runtime import actor as actor_module

    def no_envs(*args: Any) -> None:
        raise AssertionError("an env was built before the layout was checked")

    monkeypatch.setattr(actor_module, "make_actor_envs", no_envs)
    agent = rlpar.make_agent("impala")
    with pytest.raises(ConfigError, match=match):
        Runner(agent, env, RuntimeConfig(envs_per_actor=envs_per_actor))


def test_resume_from_a_directory_without_checkpoints_says_so(tmp_path: Path) -> None:
    agent = rlpar.make_agent("impala")
    with pytest.raises(CheckpointError, match="no checkpoint in this directory"):
        Runner(agent, EnvConfig(), RuntimeConfig(), resume=tmp_path)


def test_rlpar_train_refuses_a_layout_that_does_not_fit_when_it_reads_the_file(
    tmp_path: Path,
) -> None:
    config = write_config(tmp_path, "async-workers", False, steps=1000)
    with pytest.raises(ConfigError, match=r"env\.workers_per_actor: expected a divisor"):
        load_experiment(config, ["runtime.envs_per_actor=3"])
