"""examples/: each file runs as a user would run it, and the README shows them as they are."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

import rlpar
from rlpar import registry

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "custom_agent.py"
RECURRENT = ROOT / "examples" / "recurrent_agent.py"


def _load_example():
    spec = importlib.util.spec_from_file_location("custom_agent_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("marker", "path"), [("custom-agent", EXAMPLE), ("recurrent-agent", RECURRENT)]
)
def test_the_readme_shows_the_example_as_it_is(marker: str, path: Path) -> None:
    readme = (ROOT / "README.md").read_text()
    match = re.search(rf"<!-- {marker} -->\n```python\n(.*?)```", readme, re.S)
    assert match, f"the README lost its {marker} example"
    assert match.group(1) == path.read_text()


@pytest.mark.parametrize("path", [EXAMPLE, RECURRENT], ids=["feed-forward", "recurrent"])
def test_the_example_runs_as_a_script(path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(path)], capture_output=True, text=True, timeout=300, cwd="/"
    )
    assert proc.returncode == 0, proc.stderr
    assert re.fullmatch(r"window mean return -?[\d.]+ after \d+ env steps\n", proc.stdout)


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
