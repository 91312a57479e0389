"""examples/: each file runs as a user would run it, and the README and docs/ show them (and the
experiment file docs/cli.md walks through) as they are."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import rlpar
from rlpar import registry

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "custom_agent.py"
RECURRENT = ROOT / "examples" / "recurrent_agent.py"
ENV_EXAMPLE = ROOT / "examples" / "custom_env.py"


def _load_example():
    spec = importlib.util.spec_from_file_location("custom_agent_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


SHOWN = [
    ("README.md", "custom-agent", EXAMPLE),
    ("README.md", "custom-env", ENV_EXAMPLE),
    ("docs/agents.md", "recurrent-agent", RECURRENT),
    ("docs/agents.md", "custom-agent-torch", ROOT / "examples" / "custom_agent_torch.py"),
    ("docs/cli.md", "cartpole-impala", ROOT / "experiments" / "cartpole_impala.toml"),
]


@pytest.mark.parametrize(("page", "marker", "path"), SHOWN, ids=[m for _, m, _ in SHOWN])
def test_the_docs_show_the_file_as_it_is(page: str, marker: str, path: Path) -> None:
    text = (ROOT / page).read_text()
    blocks = re.findall(rf"<!-- {marker} -->\n```\w+\n(.*?)```", text, re.S)
    assert len(blocks) == 1, f"{page} should show {path.name} once, after <!-- {marker} -->"
    assert blocks[0] == path.read_text()


@pytest.mark.parametrize("path", [EXAMPLE, RECURRENT], ids=["feed-forward", "recurrent"])
def test_the_example_runs_as_a_script(path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(path)], capture_output=True, text=True, timeout=300, cwd="/"
    )
    assert proc.returncode == 0, proc.stderr
    assert re.fullmatch(r"window mean return -?[\d.]+ after \d+ env steps\n", proc.stdout)


def test_the_env_example_runs_as_a_script_and_its_policy_walks_the_corridor() -> None:
    proc = subprocess.run(
        [sys.executable, str(ENV_EXAMPLE)], capture_output=True, text=True, timeout=300, cwd="/"
    )
    assert proc.returncode == 0, proc.stderr
    match = re.fullmatch(r"evaluated return (-?[\d.]+) \(best possible: 0\.94\)\n", proc.stdout)
    assert match, proc.stdout
    assert float(match.group(1)) > 0.9  # walking right at once; a random walk scores below 0


def test_the_env_example_trains_from_an_experiment_file_beside_it(tmp_path: Path) -> None:
    """As the README says: a config beside custom_env.py names its register function, and
    `rlpar train` runs from another folder."""
    folder = tmp_path / "corridor"
    folder.mkdir()
    shutil.copy(ENV_EXAMPLE, folder / "custom_env.py")
    (folder / "corridor.toml").write_text(
        '[agent]\nname = "impala"\n\n[env]\nid = "Corridor-v0"\nsetup = "custom_env:register"\n\n'
        "[runtime]\nnum_actors = 1\nenvs_per_actor = 8\ntotal_env_steps = 5_000\n\n"
        "[eval]\nepisodes = 8\n"
    )
    proc = subprocess.run(
        [sys.executable, "-m", "rlpar", "train", "corridor/corridor.toml", "--json", "--quiet",
         "--logdir", str(tmp_path / "runs")],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.splitlines()[-1])["evaluation"][0]["episodes"] == 8


def test_the_recurrent_example_remembers_in_a_fixed_step_budget(monkeypatch) -> None:
    """On the memory task, where a policy without memory scores 0 (chance)."""
    monkeypatch.setattr(registry, "_AGENTS", dict(registry.registered_agents()))
    monkeypatch.syspath_prepend(str(RECURRENT.parent))
    spec = importlib.util.spec_from_file_location("recurrent_agent_example", RECURRENT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rlpar.register_agent("recurrent-reinforce", module.RecurrentReinforce)
    runtime = rlpar.RuntimeConfig(
        num_actors=2, envs_per_actor=16, unroll_length=20, batch_rollouts=2,
        total_env_steps=100_000, seed=0, deterministic=True, checkpoint_interval_s=None,
        return_window=100,
    )  # fmt: skip
    runner = rlpar.Runner(
        rlpar.make_agent("recurrent-reinforce", {"lr": 0.005}),
        rlpar.EnvConfig("rlpar/MemoryChain-v0"),
        runtime,
    )
    assert runner.net.state_size == 64
    assert runner.run().mean_return > 0.8


def test_the_example_agent_learns_cartpole_in_a_fixed_step_budget(monkeypatch) -> None:
    monkeypatch.setattr(registry, "_AGENTS", dict(registry.registered_agents()))
    module = _load_example()
    rlpar.register_agent("reinforce", module.Reinforce)
    runtime = rlpar.RuntimeConfig(
        num_actors=2, envs_per_actor=8, unroll_length=32, batch_rollouts=2,
        total_env_steps=100_000, seed=0, deterministic=True, checkpoint_interval_s=None,
    )  # fmt: skip
    result = rlpar.Runner(
        rlpar.make_agent("reinforce"), rlpar.EnvConfig("CartPole-v1"), runtime
    ).run()
    assert result.mean_return > 60  # a random policy averages ~22


def test_the_example_config_checks_types() -> None:
    module = _load_example()
    with pytest.raises(rlpar.ConfigError, match="lr: expected a number, got 'x'"):
        module.ReinforceConfig(lr="x")
