"""The plug-in API: registries, entry points, built-ins use only the public API (the README's
custom agent, examples/custom_agent.py, runs in test_examples.py)."""

from __future__ import annotations

import ast
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

import rlpar
from rlpar import registry

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def clean_registry(monkeypatch):
    monkeypatch.setattr(registry, "_AGENTS", dict(registry.registered_agents()))


def test_unknown_agent_lists_the_registered_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown agent 'impal' \(did you mean 'impala'\?\)"):
        rlpar.make_agent("impal")
    with pytest.raises(ValueError, match=r"registered agents: .*a3c.*impala"):
        rlpar.make_agent("nope")


def test_agent_config_keys_are_checked() -> None:
    with pytest.raises(rlpar.ConfigError, match=r"unknown key 'agent.entropy_cot'.*entropy_cost"):
        rlpar.make_agent("impala", {"entropy_cot": 0.1})
    with pytest.raises(rlpar.ConfigError, match=r"agent.optim.lr: expected a number, got 'fast'"):
        rlpar.make_agent("impala", {"optim": {"lr": "fast"}})
    agent = rlpar.make_agent("impala", {"gamma": 0.9, "optim": {"lr": 0.002}})
    assert agent.config.gamma == 0.9 and agent.config.optim.lr == 0.002


def test_register_agent_needs_a_config_dataclass(clean_registry) -> None:
    with pytest.raises(TypeError, match="config dataclass"):
        rlpar.register_agent("bad", lambda c: None)
    with pytest.raises(ValueError, match="already registered"):
        rlpar.register_agent("impala", rlpar.registered_agents()["impala"].factory)


class EntryPointAgent:
    """Stands in for a class an installed package exposes."""

    from dataclasses import dataclass as _dc

    @_dc(frozen=True)
    class Config:
        x: int = 1


def test_entry_point_agents_are_loaded(clean_registry, monkeypatch) -> None:
    ep = metadata.EntryPoint(
        name="from_a_package", value=f"{__name__}:EntryPointAgent", group="rlpar.agents"
    )
    real = metadata.entry_points
    monkeypatch.setattr(
        registry.metadata,
        "entry_points",
        lambda group=None: [ep] if group == "rlpar.agents" else real(group=group),
    )
    monkeypatch.setattr(registry, "_loaded", False)
    entry = rlpar.registered_agents()["from_a_package"]
    assert entry.factory is EntryPointAgent
    assert entry.source.startswith("entry point")


def test_built_in_agents_import_only_the_public_api() -> None:
    import rlpar.agents as built_in

    for path in Path(built_in.__file__).parent.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            else:
                continue
            for name in names:
                assert not name.startswith("rlpar."), f"{path.name} imports {name}"


class _TupleActions(gym.Env):
    observation_space = gym.spaces.Box(-1, 1, (3,), np.float32)
    action_space = gym.spaces.Tuple((gym.spaces.Discrete(3), gym.spaces.Discrete(4)))

    def reset(self, *, seed=None, options=None):
        return np.zeros(3, np.float32), {}

    def step(self, action):
        return np.zeros(3, np.float32), 0.0, False, False, {}


gym.register("rlpar-test/TupleActions-v0", _TupleActions)


@pytest.mark.parametrize(
    ("env", "match"),
    [
        ("CarRacing-v3", "needs a package that is not installed: Box2D"),
        ("rlpar-test/TupleActions-v0",
         r"unsupported action space Tuple\(Discrete\(3\), Discrete\(4\)\): expected Discrete, "
         "MultiDiscrete or MultiBinary"),
    ],
)  # fmt: skip
def test_a_space_the_agent_cannot_handle_fails_at_start_up(env, match) -> None:
    with pytest.raises(Exception, match=match):
        rlpar.Runner(rlpar.make_agent("impala"), rlpar.EnvConfig(env), rlpar.RuntimeConfig())


def test_the_built_in_agents_are_entry_points_declared_in_pyproject() -> None:
    """rlpar finds its own agents as it finds a user's; the registry's table (for an install
    whose metadata predates a declaration) says what pyproject.toml declares."""
    tomllib = pytest.importorskip("tomllib" if sys.version_info >= (3, 11) else "tomli")
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]
    assert declared[registry.ENTRY_POINT_GROUP] == registry.BUILT_IN_AGENTS
    for name, value in registry.BUILT_IN_AGENTS.items():
        entry = rlpar.registered_agents()[name]
        assert entry.source == "built-in"
        assert f"{entry.factory.__module__}:{entry.factory.__name__}" == value


def test_importing_rlpar_imports_no_agent_until_one_is_looked_up() -> None:
    code = (
        "import sys, rlpar\n"
        "assert not [m for m in sys.modules if m.startswith('rlpar.agents')], 'imported early'\n"
        "assert set(rlpar.registered_agents()) >= {'a3c', 'appo', 'impala'}\n"
        "assert 'rlpar.agents.impala' in sys.modules\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd="/"
    )
    assert proc.returncode == 0, proc.stderr
