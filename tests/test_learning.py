"""CI learning check, step-based: the CartPole experiments, in deterministic mode with a fixed
seed, reach a mean return of 150 within a fixed env-step budget (reproducible on any machine,
whatever its speed)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

import rlpar
from rlpar.config import EnvConfig, RuntimeConfig, from_dict

EXPERIMENTS = Path(__file__).resolve().parent.parent / "experiments"
BUDGET = 300_000


@pytest.mark.parametrize("name", ["cartpole_impala", "cartpole_a3c"])
def test_cartpole_learns_within_a_fixed_step_budget(name: str) -> None:
    data = tomllib.loads((EXPERIMENTS / f"{name}.toml").read_text())
    agent_table = dict(data["agent"])
    agent = rlpar.make_agent(agent_table.pop("name"), agent_table)
    runtime = from_dict(
        RuntimeConfig,
        {**data["runtime"], "num_actors": 1, "deterministic": True, "seed": 0,
         "total_env_steps": BUDGET, "target_return": 150.0},
    )  # fmt: skip
    result = rlpar.Runner(agent, from_dict(EnvConfig, data["env"]), runtime).run()
    assert result.mean_return is not None and result.mean_return >= 150, result
    assert result.env_steps <= BUDGET + runtime.env_steps_per_rollout * runtime.batch_rollouts * 2
