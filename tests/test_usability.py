"""The rough edges a new user hit, each pinned down: clear messages instead of confusing ones."""

from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from tiny_agent import TinyAgent

import rlpar
from rlpar import registry
from rlpar.app.experiment import load_experiment
from rlpar.app.reference import agent_reference, format_agents
from rlpar.checkpoint import STALE_TEMP_S, prune_checkpoints
from rlpar.runtime.envs import ActionAdapter, make_actor_envs

ROOT = Path(__file__).resolve().parent.parent
CARTPOLE = ROOT / "experiments" / "cartpole_impala.toml"


# --------------------------------------------------------------------- configs built in Python


@pytest.mark.parametrize(
    ("call", "exc", "match"),
    [
        (lambda: rlpar.make_agent(42), TypeError, "agent name: expected a string .* got int 42"),
        (
            lambda: rlpar.make_agent("impala", "gamma=0.9"),
            TypeError,
            "agent params: expected a dict .* got str 'gamma=0.9'",
        ),
        (lambda: rlpar.RuntimeConfig(num_actors="2"), rlpar.ConfigError, "num_actors: .* '2'"),
        (lambda: rlpar.RuntimeConfig(num_actors=1.5), rlpar.ConfigError, "num_actors: .* 1.5"),
        (lambda: rlpar.RuntimeConfig(deterministic=1), rlpar.ConfigError, "deterministic:"),
        (lambda: rlpar.EnvConfig(id=3), rlpar.ConfigError, "id: expected a string, got 3"),
    ],
)
def test_configs_built_in_python_are_checked_like_toml(call, exc, match) -> None:
    with pytest.raises(exc, match=match):
        call()


def test_agent_config_dataclasses_check_types_when_built_directly() -> None:
    config_cls = rlpar.registered_agents()["impala"].config
    with pytest.raises(rlpar.ConfigError, match=r"gamma: expected a number, got '0\.9'"):
        config_cls(gamma="0.9")
    assert config_cls(gamma=1).gamma == 1.0 and isinstance(config_cls(gamma=1).gamma, float)


@pytest.mark.parametrize(
    ("override", "suggestion"),
    [("seed=1", "'runtime.seed'"), ("gamma=0.5", "'agent.gamma'"), ("logdir=x", "'log.logdir'")],
)
def test_a_section_key_at_the_top_level_names_its_section(override, suggestion) -> None:
    with pytest.raises(rlpar.ConfigError, match=f"did you mean {suggestion}"):
        load_experiment(CARTPOLE, [override])


# --------------------------------------------------------------------------------- envs


class _WrongShapeEnv(gym.Env):
    """Says [4] observations and returns [3]."""

    observation_space = gym.spaces.Box(-1, 1, (4,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(4, np.float32), {}

    def step(self, action):
        return np.zeros(3, np.float32), 0.0, False, False, {}


def test_an_observation_that_does_not_fit_its_space_is_named() -> None:
    gym.register("rlpar-test/WrongShape-v0", entry_point=_WrongShapeEnv)
    runtime = rlpar.RuntimeConfig(num_actors=1, envs_per_actor=2, total_env_steps=1000)
    runner = rlpar.Runner(
        rlpar.make_agent("impala"), rlpar.EnvConfig("rlpar-test/WrongShape-v0"), runtime
    )
    with pytest.raises(ValueError) as info:
        runner.run()
    text = str(info.value)
    assert "'rlpar-test/WrongShape-v0'" in text
    assert "shape (3,)" in text and "shape (4,)" in text


class _IntObsEnv(gym.Env):
    observation_space = gym.spaces.Box(0, 10, (3,), np.int64)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(3, np.int64), {}

    def step(self, action):
        return np.zeros(3, np.int64), 0.0, False, False, {}


def test_an_integer_observation_space_is_fed_as_float32() -> None:
    """Once refused ("unsupported observation dtype int64"); now cast (`rlpar.spaces`)."""
    gym.register("rlpar-test/IntObs-v0", entry_point=_IntObsEnv)
    envs = make_actor_envs(rlpar.EnvConfig("rlpar-test/IntObs-v0"), 2)
    try:
        assert envs.single_observation_space == gym.spaces.Box(0, 10, (3,), np.float32)
        obs, _ = envs.reset(seed=0)
        assert obs.dtype == np.float32 and obs.shape == (2, 3)
    finally:
        envs.close()
    runtime = rlpar.RuntimeConfig(num_actors=1, envs_per_actor=2, total_env_steps=200,
                                  checkpoint_interval_s=None)  # fmt: skip
    result = rlpar.Runner(TinyAgent(), rlpar.EnvConfig("rlpar-test/IntObs-v0"), runtime).run()
    assert result.env_steps >= 200


def test_an_unknown_env_id_points_to_env_setup() -> None:
    with pytest.raises(ValueError) as info:
        make_actor_envs(rlpar.EnvConfig("MiniGrid-Empty-5x5-v0"), 1)
    text = str(info.value)
    assert text.startswith("unknown environment id 'MiniGrid-Empty-5x5-v0'")
    assert "env.setup" in text and "docs/config.md" in text


class _ColumnActions(TinyAgent):
    """An agent whose act returns its actions as a column, [K, 1] instead of [K]."""

    def act(self, net, out, rng):
        return super().act(net, out, rng)[:, None]


def test_an_act_that_returns_a_column_is_named_with_the_shape_it_must_have() -> None:
    runtime = rlpar.RuntimeConfig(
        num_actors=1, envs_per_actor=16, unroll_length=4, total_env_steps=1000
    )
    runner = rlpar.Runner(_ColumnActions(), rlpar.EnvConfig("CartPole-v1"), runtime)
    with pytest.raises(ValueError) as info:
        runner.run()
    text = str(info.value)
    assert "agent _ColumnActions: act must return one action per env, int64 [K] = [16]" in text
    assert "got int64 [16, 1]" in text and "actions.reshape(16)" in text


@pytest.mark.parametrize(
    ("space", "actions", "match"),
    [
        (gym.spaces.Discrete(3), np.zeros(4, np.float32), r"int64 \[K\] = \[4\] .* got float32"),
        (gym.spaces.Discrete(3), [0, 1, 2, 0], r"got list \[0, 1, 2, 0\]"),
        (
            gym.spaces.Box(-1, 1, (2,), np.float32),
            np.zeros((4, 1), np.float32),
            r"float32 \[K, \*action_shape\] = \[4, 2\] .* got float32 \[4, 1\]$",
        ),
    ],
)
def test_actions_of_the_wrong_shape_or_kind_are_refused(space, actions, match) -> None:
    with pytest.raises(ValueError, match=match):
        ActionAdapter(space).checked(actions, 4, TinyAgent(), "act")
    good = np.zeros((4, *ActionAdapter(space).shape), ActionAdapter(space).dtype)
    assert ActionAdapter(space).checked(good, 4, TinyAgent(), "act") is good


# ------------------------------------------------------------------------------ checkpoints


def test_a_killed_writers_temp_files_are_removed_when_old(tmp_path: Path) -> None:
    stale = tmp_path / ".ckpt-000000000007.rlpar.0123456789abcdef.tmp"
    fresh = tmp_path / ".ckpt-000000000008.rlpar.fedcba9876543210.tmp"
    other = tmp_path / "notes.tmp"
    for path in (stale, fresh, other):
        path.write_bytes(b"x")
    old = time.time() - STALE_TEMP_S - 5
    os.utime(stale, (old, old))
    os.utime(other, (old, old))
    assert prune_checkpoints(tmp_path, keep=3) == [stale]
    assert not stale.exists() and fresh.exists() and other.exists()


def test_a_run_cleans_its_checkpoint_folder_of_stale_temp_files(tmp_path: Path) -> None:
    stale = tmp_path / ".ckpt-000000000001.rlpar.00000000000000aa.tmp"
    stale.write_bytes(b"partial")
    old = time.time() - STALE_TEMP_S - 5
    os.utime(stale, (old, old))
    runtime = rlpar.RuntimeConfig(num_actors=1, envs_per_actor=2, total_env_steps=200)
    rlpar.Runner(
        rlpar.make_agent("impala"), rlpar.EnvConfig(), runtime, checkpoint_dir=tmp_path
    ).run()
    assert not stale.exists()
    assert list(tmp_path.glob("ckpt-*.rlpar"))


# ------------------------------------------------------------------------- NaN gradients


class _State:
    def __init__(self) -> None:
        self.steps = 0
        self.extra: dict = {}


def test_a_nonfinite_gradient_skips_the_step_and_is_counted() -> None:
    grad = np.array([1.0, np.nan], np.float32)
    norm = rlpar.clip_grad_norm(grad, 1.0)
    assert math.isnan(norm) and np.isnan(grad[1])  # clip_grad_norm leaves it as it is
    state = _State()
    assert rlpar.skip_nonfinite_step(state, norm)
    assert not rlpar.skip_nonfinite_step(state, 0.5)
    assert state.extra["nonfinite_grad_steps"] == 1 and state.extra["nonfinite_in_a_row"] == 0


def test_too_many_nonfinite_steps_in_a_row_stop_with_the_step_named() -> None:
    state = _State()
    state.steps = 41
    for _ in range(9):
        assert rlpar.skip_nonfinite_step(state, math.inf)
    with pytest.raises(FloatingPointError, match="learner step 42: the gradient was not finite"):
        rlpar.skip_nonfinite_step(state, math.nan)


def test_the_built_in_learner_step_leaves_params_alone_on_a_nan_batch() -> None:
    agent = rlpar.make_agent("impala")
    env = gym.make_vec("CartPole-v1", num_envs=2)
    net = rlpar.Net(agent.net_spec(env.single_observation_space, env.single_action_space))
    env.close()
    state = agent.init_state(net, net.init_params(seed=0))
    t, n = 4, 2
    batch = rlpar.Batch(
        obs=np.zeros((t + 1, n, 4), np.float32),
        actions=np.zeros((t, n), np.int64),
        rewards=np.full((t, n), np.nan, np.float32),
        terminated=np.zeros((t, n), bool),
        truncated=np.zeros((t, n), bool),
        mask=np.ones((t, n), bool),
        behaviour=np.zeros((t, n, net.output_size), np.float32),
        versions=np.ones(1, np.int64),
        policy_lag=np.zeros(1, np.int64),
        learner_version=1,
    )
    before = state.params.copy()
    metrics = agent.learn(net, state, batch)
    np.testing.assert_array_equal(state.params, before)
    assert metrics["nonfinite_grad_steps"] == 1


# ------------------------------------------------------------------------------ the face


@dataclass(frozen=True)
class _EpConfig:
    x: int = 1


class _EpAgent:
    """Stands in for an agent class an installed package exposes."""

    Config = _EpConfig


def test_rlpar_agents_names_an_entry_point_source_once(monkeypatch) -> None:
    ep = metadata.EntryPoint(name="ep_agent", value=f"{__name__}:_EpAgent", group="rlpar.agents")
    real = metadata.entry_points
    monkeypatch.setattr(
        registry.metadata,
        "entry_points",
        lambda group=None: [ep] if group == "rlpar.agents" else real(group=group),
    )
    monkeypatch.setattr(registry, "_loaded", False)
    monkeypatch.setattr(registry, "_AGENTS", dict(registry._AGENTS))
    first = format_agents({"ep_agent": agent_reference()["ep_agent"]}).splitlines()[0]
    assert first.count("_EpAgent") == 1 and "entry point" in first, first


def test_a_checkout_without_the_compiled_core_says_what_to_run(tmp_path: Path) -> None:
    shutil.copytree(
        Path(rlpar.__file__).parent, tmp_path / "rlpar", ignore=shutil.ignore_patterns("*.so")
    )
    # -S: no site-packages, so the folder cannot reach an installed compiled core.
    proc = subprocess.run(
        [sys.executable, "-S", "-c", "import rlpar"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0
    assert "rlpar._native" in proc.stderr and "pip install -e '.[dev]'" in proc.stderr
    assert "circular import" not in proc.stderr.splitlines()[-1].split("(", 1)[0]


def test_the_net_api_page_states_the_slot_range_the_store_enforces() -> None:
    page = (ROOT / "docs" / "net-api.md").read_text()
    low, high = map(int, re.search(r"`num_slots` is (\d+) to (\d+)", page).groups())
    rlpar.SnapshotStore(4, num_slots=low)
    rlpar.SnapshotStore(4, num_slots=high)
    for bad in (low - 1, high + 1):
        with pytest.raises(ValueError, match="num_slots"):
            rlpar.SnapshotStore(4, num_slots=bad)


def test_eval_config_checks_field_types_when_built_in_python() -> None:
    with pytest.raises(rlpar.ConfigError, match="episodes: expected an integer, got '100'"):
        rlpar.EvalConfig(episodes="100")
