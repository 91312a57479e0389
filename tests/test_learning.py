"""CI learning check, step-based: the CartPole experiments, in deterministic mode with a fixed
seed, reach a mean return of 150 within a fixed env-step budget (reproducible on any machine,
whatever its speed)."""

from __future__ import annotations

from pathlib import Path

import pytest

import rlpar
from rlpar.app.experiment import load_experiment

EXPERIMENTS = Path(__file__).resolve().parent.parent / "experiments"
BUDGET = 300_000
# On-policy (one actor, lag 0) V-trace targets are n-step returns, so both configs take the same
# path here; the test still pins each experiment file. APPO (several epochs on each batch) takes
# its own.


@pytest.mark.parametrize("name", ["cartpole_impala", "cartpole_a3c", "cartpole_appo"])
def test_cartpole_learns_within_a_fixed_step_budget(name: str) -> None:
    exp = load_experiment(
        EXPERIMENTS / f"{name}.toml",
        [
            "runtime.num_actors=1",
            "runtime.deterministic=true",
            "runtime.seed=0",
            f"runtime.total_env_steps={BUDGET}",
            "runtime.target_return=150.0",
        ],
    )
    result = rlpar.Runner(exp.make_agent(), exp.env, exp.runtime).run()
    assert result.mean_return is not None and result.mean_return >= 150, result
    per_step = exp.runtime.env_steps_per_rollout * exp.runtime.batch_rollouts
    assert result.env_steps <= BUDGET + 2 * per_step
