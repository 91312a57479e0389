"""CI memory check, step-based (deterministic mode, fixed seed): on rlpar/MemoryChain-v0 the
LSTM agent reaches a mean return of 0.8 within a fixed env-step budget, while the same agent
without memory stays near chance (0) with the same budget. Plus the env's own contract."""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from rlpar.envs import MemoryChainEnv

import rlpar
from rlpar.app.experiment import load_experiment

EXPERIMENTS = Path(__file__).resolve().parent.parent / "experiments"
BUDGET = 60_000


def run(name: str, *overrides: str) -> rlpar.RunResult:
    exp = load_experiment(
        EXPERIMENTS / f"{name}.toml",
        [
            "runtime.num_actors=1",
            "runtime.deterministic=true",
            "runtime.seed=0",
            f"runtime.total_env_steps={BUDGET}",
            "runtime.target_return=0.8",
            "runtime.return_window=100",
            *overrides,
        ],
    )
    return rlpar.Runner(exp.make_agent(), exp.env, exp.runtime, evaluation=exp.eval).run()


def evaluated(result: rlpar.RunResult) -> float:
    assert result.evaluation is not None
    return float(result.evaluation[0]["mean_return"])


@pytest.mark.parametrize(
    "matmul",
    [
        "float32",
        pytest.param(
            "bf16x3",
            marks=pytest.mark.skipif(not rlpar.amx_available(), reason="no AMX-BF16 tiles"),
        ),
    ],
)
def test_the_lstm_agent_remembers_within_a_fixed_step_budget(matmul: str) -> None:
    result = run("memory_lstm_impala", f"agent.net.lstm_matmul={matmul}")
    assert result.mean_return is not None and result.mean_return >= 0.8, result
    # The trained policy, played greedily with its state carried across steps (and reset at
    # each episode start) on fresh seeds, names the cue too.
    assert evaluated(result) >= 0.8, result


def test_the_feed_forward_agent_stays_at_chance() -> None:
    result = run("memory_ff_impala")
    assert result.env_steps >= BUDGET
    assert result.mean_return is not None and abs(result.mean_return) < 0.4, result
    assert abs(evaluated(result)) < 0.4, result


def test_memory_chain_contract() -> None:
    env = MemoryChainEnv(delay=3, num_cues=3)
    check_env(env, skip_render_check=True)
    for seed in range(6):
        obs, _ = env.reset(seed=seed)
        cue = int(np.argmax(obs[:3]))
        assert obs[:3].sum() == 1 and obs[-1] == 0
        for _ in range(4):  # first step + delay: nothing to win, no cue shown
            obs, reward, terminated, _, _ = env.step(0)
            assert reward == 0 and not terminated and obs[:3].sum() == 0
        assert obs[-1] == 1  # the query, identical whatever the cue
        _, reward, terminated, _, _ = env.step(cue if seed % 2 else (cue + 1) % 3)
        assert terminated and reward == (1.0 if seed % 2 else -1.0)
    assert gym.make("rlpar/MemoryChain-v0").spec.reward_threshold == 0.9


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"delay": -1}, "delay: expected an integer >= 0, got -1"),
     ({"num_cues": 1}, "num_cues: expected an integer >= 2, got 1")],
)  # fmt: skip
def test_memory_chain_arguments_are_checked(kwargs, match) -> None:
    with pytest.raises(ValueError, match=match):
        MemoryChainEnv(**kwargs)
