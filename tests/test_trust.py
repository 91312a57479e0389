"""A checkpoint is data: rebuilding a run from one never imports or calls code it names, unless
the user says so (``--set env.setup=...``, ``--trust-checkpoint-setup``, or the config.toml of
a run directory they name). Every command runs in a child process that reports which of the
watched modules it imported, so an import the test process made cannot hide one."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from rlpar.app.evaluate import evaluate
from rlpar.checkpoint import CheckpointError, load_checkpoint, save_checkpoint

ROOT = Path(__file__).resolve().parent.parent
IMPALA = str(ROOT / "experiments" / "cartpole_impala.toml")
HOOK = "hookenvs:register_envs"

# A setup hook shaped like MinAtar's "minatar.gym:register_envs": importing the module registers
# nothing, calling the function registers the env id the run uses.
HOOK_MODULE = """
import gymnasium as gym


def register_envs():
    gym.register(
        "Hooked-v0",
        entry_point="gymnasium.envs.classic_control.cartpole:CartPoleEnv",
        max_episode_steps=50,
    )
"""

# Runs the command line in this process and reports which watched modules are in sys.modules.
PROBE = """
import json, sys
from rlpar.app.cli import main
status = main(sys.argv[2:])
watched = sys.argv[1].split(",")
print(json.dumps({"status": status, "imported": [m for m in watched if m in sys.modules]}))
"""
WATCHED = "hookenvs,this"


def probe(hooks: Path, cwd: Path, *args: str) -> tuple[dict[str, Any], subprocess.CompletedProcess]:
    """Run ``rlpar ARGS`` in a child whose PYTHONPATH holds the hook module; its report."""
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(hooks), os.environ.get("PYTHONPATH", "")])
    )
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, WATCHED, *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc


def resave(src: str | Path, dst: Path, section: str, **values: Any) -> Path:
    """``src`` saved again as ``dst`` with config keys of ``section`` changed: still a valid
    file (the checksum guards against damage, not against an author)."""
    ckpt = load_checkpoint(src)
    ckpt.config[section].update(values)
    return save_checkpoint(dst, ckpt)


@pytest.fixture(scope="module")
def hooked(tmp_path_factory) -> dict[str, Any]:
    """A tiny run trained by the user on an env its setup hook registers: the --json summary,
    with ``hooks`` (the folder holding the hook module) and ``cwd``."""
    hooks = tmp_path_factory.mktemp("hooks")
    (hooks / "hookenvs.py").write_text(HOOK_MODULE)
    cwd = tmp_path_factory.mktemp("train")
    report, proc = probe(
        hooks,
        cwd,
        "train",
        IMPALA,
        "--set",
        "env.id=Hooked-v0",
        "--set",
        f"env.setup={HOOK}",
        "--set",
        "runtime.total_env_steps=2000",
        "--set",
        "runtime.checkpoint_interval_s=none",
        "--set",
        "agent.net.hidden=[16]",
        "--json",
        "--quiet",
    )
    assert report == {"status": 0, "imported": ["hookenvs"]}, proc.stderr
    summary = json.loads(proc.stdout.strip().splitlines()[-2])
    return {**summary, "hooks": hooks, "cwd": cwd}


def eval_json(proc: subprocess.CompletedProcess) -> dict[str, Any]:
    return json.loads(proc.stdout.strip().splitlines()[-2])


# ------------------------------------------------------------------------------- the hook


def test_a_checkpoints_hook_is_refused_and_nothing_is_imported(hooked: dict, tmp_path) -> None:
    report, proc = probe(hooked["hooks"], tmp_path, "eval", hooked["checkpoint"])
    assert report == {"status": 1, "imported": []}
    for needle in (
        "to rebuild env 'Hooked-v0' the checkpoint asks to run env.setup 'hookenvs:register_envs'",
        "(import module 'hookenvs' and call hookenvs.register_envs())",
        "a checkpoint is data",
        f"--set env.setup={HOOK}",
        "--trust-checkpoint-setup",
    ):
        assert needle in proc.stderr, (needle, proc.stderr)


def test_the_issues_crafted_checkpoint_runs_nothing(hooked: dict, tmp_path) -> None:
    """A checkpoint re-saved with env.id "Evil-v0" and env.setup "this" used to print the Zen
    of Python (importing `this`) before failing."""
    evil = resave(hooked["checkpoint"], tmp_path / "evil.rlpar", "env", id="Evil-v0", setup="this")
    report, proc = probe(hooked["hooks"], tmp_path, "eval", str(evil))
    assert report == {"status": 1, "imported": []}
    assert "Beautiful is better than ugly" not in proc.stdout
    assert "env.setup 'this' (import module 'this')" in proc.stderr


def test_the_trust_flag_runs_the_checkpoints_hook_and_says_what_first(
    hooked: dict, tmp_path
) -> None:
    report, proc = probe(
        hooked["hooks"],
        tmp_path,
        "eval",
        hooked["checkpoint"],
        "--trust-checkpoint-setup",
        "--episodes",
        "2",
        "--json",
    )
    assert report == {"status": 0, "imported": ["hookenvs"]}, proc.stderr
    assert "--trust-checkpoint-setup: running" in proc.stderr
    assert "import module 'hookenvs' and call hookenvs.register_envs() to register 'Hooked-v0'" in (
        proc.stderr
    )
    result = eval_json(proc)
    assert result["env"] == "Hooked-v0" and result["episodes"] == 2


def test_a_hook_given_on_the_command_line_replaces_the_checkpoints(hooked: dict, tmp_path) -> None:
    report, proc = probe(
        hooked["hooks"], tmp_path, "eval", hooked["checkpoint"], "--set", f"env.setup={HOOK}"
    )
    assert report == {"status": 0, "imported": ["hookenvs"]}, proc.stderr
    # The user's hook is the one that runs, not the checkpoint's.
    other = resave(hooked["checkpoint"], tmp_path / "other.rlpar", "env", setup="this")
    report, proc = probe(
        hooked["hooks"], tmp_path, "eval", str(other), "--set", f"env.setup={HOOK}", "--json"
    )
    assert report == {"status": 0, "imported": ["hookenvs"]}, proc.stderr
    assert eval_json(proc)["env"] == "Hooked-v0"


def test_a_hook_is_not_wanted_when_the_env_is_registered_without_it(hooked: dict, tmp_path) -> None:
    cartpole = resave(
        hooked["checkpoint"], tmp_path / "cp.rlpar", "env", id="CartPole-v1", setup="this"
    )
    report, proc = probe(hooked["hooks"], tmp_path, "eval", str(cartpole), "--json")
    assert report == {"status": 0, "imported": []}, proc.stderr
    assert eval_json(proc)["env"] == "CartPole-v1"


def test_the_python_api_refuses_by_default(hooked: dict, monkeypatch) -> None:
    monkeypatch.syspath_prepend(str(hooked["hooks"]))
    with pytest.raises(CheckpointError, match=r"trust_setup=True"):
        evaluate(hooked["checkpoint"], episodes=1)
    assert "hookenvs" not in sys.modules


# ----------------------------------------------------------------------- the run directory


def test_eval_of_the_users_run_directory_takes_the_hook_from_its_config_toml(
    hooked: dict, tmp_path
) -> None:
    """The run directory's config.toml is the experiment file the user's own run wrote:
    naming the directory trusts it as `rlpar train RUN_DIR/config.toml` would."""
    run_dir = Path(hooked["run_dir"])
    report, proc = probe(hooked["hooks"], tmp_path, "eval", str(run_dir), "--json")
    assert report == {"status": 0, "imported": ["hookenvs"]}, proc.stderr
    assert (
        f"env.setup of {run_dir / 'config.toml'} (the run's own experiment file): "
        "import module 'hookenvs' and call hookenvs.register_envs()"
    ) in proc.stderr
    assert eval_json(proc)["checkpoint"] == hooked["checkpoint"]


def test_a_run_directory_runs_its_config_tomls_hook_never_the_checkpoints(
    hooked: dict, tmp_path
) -> None:
    run_dir = shutil.copytree(hooked["run_dir"], tmp_path / "run")
    (ckpt,) = (run_dir / "checkpoints").iterdir()
    resave(ckpt, ckpt, "env", setup="this")
    report, proc = probe(hooked["hooks"], tmp_path, "eval", str(run_dir))
    assert report == {"status": 0, "imported": ["hookenvs"]}, proc.stderr
    # Without a hook in config.toml the checkpoint's is refused, as for a bare file.
    config = run_dir / "config.toml"
    config.write_text(config.read_text().replace(f'setup = "{HOOK}"', 'setup = "none"'))
    report, proc = probe(hooked["hooks"], tmp_path, "eval", str(run_dir))
    assert report == {"status": 1, "imported": []}
    assert "asks to run env.setup 'this'" in proc.stderr


def test_an_unreadable_config_toml_is_a_clean_error(hooked: dict, tmp_path) -> None:
    run_dir = shutil.copytree(hooked["run_dir"], tmp_path / "run")
    (run_dir / "config.toml").write_text("[env\n")
    with pytest.raises(CheckpointError, match=r"config.toml: not valid TOML") as e:
        evaluate(run_dir, episodes=1)
    assert "the run's experiment file, for its env.setup" in str(e.value)


@pytest.mark.parametrize(
    ("malform", "needle"),
    [
        (lambda config: [1, 2], "its config is not a table, got list"),
        (lambda config: {**config, "env": "Evil-v0"}, "env: expected a table ([env]), got 'Ev"),
    ],
)
def test_a_malformed_config_is_a_clean_error(
    hooked: dict, tmp_path, malform: Any, needle: str
) -> None:
    ckpt = load_checkpoint(hooked["checkpoint"])
    ckpt.config = malform(ckpt.config)
    path = save_checkpoint(tmp_path / "bad.rlpar", ckpt)
    with pytest.raises(CheckpointError) as e:
        evaluate(path, episodes=1)
    assert needle in str(e.value)


# ----------------------------------------------------------- other values that select code


def test_agent_names_resolve_only_through_the_registry(hooked: dict, tmp_path) -> None:
    crafted = resave(hooked["checkpoint"], tmp_path / "a.rlpar", "agent", name="this")
    report, proc = probe(
        hooked["hooks"], tmp_path, "eval", str(crafted), "--trust-checkpoint-setup"
    )
    assert report == {"status": 1, "imported": []}
    assert "agent.name: unknown agent 'this'" in proc.stderr


def test_a_module_in_the_env_id_is_refused(hooked: dict, tmp_path) -> None:
    """gymnasium answers an id "module:Env-v0" by importing "module"."""
    crafted = resave(hooked["checkpoint"], tmp_path / "id.rlpar", "env", id="this:CartPole-v1")
    report, proc = probe(hooked["hooks"], tmp_path, "eval", str(crafted))
    assert report == {"status": 1, "imported": []}
    assert "env.id 'this:CartPole-v1' would make gymnasium import module 'this'" in proc.stderr


@pytest.mark.parametrize(
    ("env_id", "extra", "imported"),
    [("CartPole-v1", [], []), ("Hooked-v0", ["--set", f"env.setup={HOOK}"], ["hookenvs"])],
)
def test_env_kwargs_are_values_never_code(
    hooked: dict, tmp_path, env_id: str, extra: list[str], imported: list[str]
) -> None:
    """gymnasium.make_vec takes `wrappers` (callables) among its keyword arguments; from a
    checkpoint's JSON they can only be strings, which nothing imports. (CartPole-v1 has a
    vector entry point, Hooked-v0 is wrapped one env at a time: two ways make_vec refuses.)"""
    crafted = resave(
        hooked["checkpoint"], tmp_path / "kw.rlpar", "env", id=env_id, kwargs={"wrappers": ["this"]}
    )
    report, proc = probe(hooked["hooks"], tmp_path, "eval", str(crafted), *extra)
    assert report == {"status": 1, "imported": imported}
    assert f"env {env_id!r} cannot be built with env.kwargs {{'wrappers': ['this']}}" in proc.stderr


def test_resume_takes_nothing_that_selects_code_from_the_checkpoint(hooked: dict, tmp_path) -> None:
    """--resume takes parameters, optimizer, counters and RNG states; the env and agent come
    from the experiment file."""
    evil = resave(hooked["checkpoint"], tmp_path / "evil.rlpar", "env", id="Evil-v0", setup="this")
    report, proc = probe(
        hooked["hooks"],
        tmp_path,
        "train",
        IMPALA,
        "--resume",
        str(evil),
        "--set",
        "agent.net.hidden=[16]",
        "--set",
        "runtime.total_env_steps=3000",
        "--set",
        "runtime.checkpoint_interval_s=none",
        "--logdir",
        str(tmp_path / "runs"),
        "--json",
        "--quiet",
    )
    assert report == {"status": 0, "imported": []}, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-2])["env_steps"] >= 3000
