"""examples/ppo_kl_torch.py: PPO with an adaptive KL penalty, its loss in PyTorch.

The loss's value and its gradient w.r.t. the net's output (what `rlpar.TorchLoss` hands the
native backward) against a float64 numpy twin written step by step from the paper's formula,
the gradient against central finite differences of that twin; GAE against a hand-worked case;
the KL rule; and `rlpar train` on the shipped config, which names the file as a plug-in."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from test_torch_loss import cartpole_batch

import rlpar
from rlpar import registry

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "ppo_kl_torch.py"
CONFIG = ROOT / "experiments" / "cartpole_ppo_kl_torch.toml"


@pytest.fixture(scope="module")
def ppo():
    """The example, loaded as the file it is (and registering its agent), then unloaded; an
    earlier load (a test that read the shipped config imports it as a plug-in) is put back."""
    before = sys.modules.pop("ppo_kl_torch", None), registry._AGENTS.pop("ppo-kl-torch", None)
    spec = importlib.util.spec_from_file_location("ppo_kl_torch", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules["ppo_kl_torch"] = module  # the dataclass looks its module up
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop("ppo_kl_torch", None)
        registry._AGENTS.pop("ppo-kl-torch", None)
        if before[0] is not None:
            sys.modules["ppo_kl_torch"] = before[0]
        if before[1] is not None:
            registry._AGENTS["ppo-kl-torch"] = before[1]


def random_batch(t: int, n: int, seed: int) -> rlpar.Batch:
    """test_torch_loss's batch [T, N] (terminations, truncations, masked autoresets) for a
    3-action task, with behaviour logits that differ from any net's."""
    rng = np.random.default_rng(seed + 100)
    return dataclasses.replace(
        cartpole_batch(t, n, seed),
        actions=rng.integers(0, 3, (t, n)),
        behaviour=rng.normal(size=(t, n, 4)).astype(np.float32),
    )


def reference_objective(out, adv_values, batch, config, beta) -> float:
    """The loss in float64, one step at a time: out [T + 1, N, 4] (3 logits, value);
    ``adv_values`` [T + 1, N], the values the advantages come from (held fixed, as the torch
    loss detaches them)."""
    T, N = batch.rewards.shape
    adv = np.zeros((T, N))
    for n in range(N):  # GAE, written per column from its definition
        acc = 0.0
        for t in reversed(range(T)):
            if not batch.mask[t, n]:
                acc = 0.0
                continue
            nxt = 0.0 if batch.terminated[t, n] else adv_values[t + 1, n]
            delta = batch.rewards[t, n] + config.gamma * nxt - adv_values[t, n]
            cont = 0.0 if (batch.terminated[t, n] or batch.truncated[t, n]) else acc
            acc = delta + config.gamma * config.gae_lambda * cont
            adv[t, n] = acc
    returns = adv + adv_values[:T]
    valid = [(t, n) for t in range(T) for n in range(N) if batch.mask[t, n]]
    mean = sum(adv[s] for s in valid) / len(valid)
    std = math.sqrt(sum((adv[s] - mean) ** 2 for s in valid) / len(valid))
    total = 0.0
    for t, n in valid:
        logits, old = out[t, n, :3], batch.behaviour[t, n, :3].astype(np.float64)
        logp = logits - np.log(np.exp(logits).sum())
        logp_old = old - np.log(np.exp(old).sum())
        a = batch.actions[t, n]
        ratio = math.exp(logp[a] - logp_old[a])
        kl = float((np.exp(logp_old) * (logp_old - logp)).sum())
        entropy = -float((np.exp(logp) * logp).sum())
        a_hat = (adv[t, n] - mean) / (std + 1e-8)
        total += (
            -ratio * a_hat
            + beta * kl
            + 0.5 * config.value_cost * (out[t, n, 3] - returns[t, n]) ** 2
            - config.entropy_cost * entropy
        )
    return total / len(valid)


@pytest.mark.parametrize("seed", [0, 1])
def test_the_loss_and_its_gradient_match_the_paper_formula(ppo, seed: int) -> None:
    config = ppo.PpoKlConfig(entropy_cost=0.03, value_cost=0.7, gae_lambda=0.9)
    agent = ppo.PpoKl(config)
    net = rlpar.Net(agent.net_spec(gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(3)))
    batch = random_batch(6, 5, seed)
    rng = np.random.default_rng(seed + 10)
    out = rng.normal(size=(7, 5, 4)).astype(np.float32)
    beta = 0.37
    loss = rlpar.TorchLoss(lambda o, b: agent.objective(o, b, beta=beta))
    dout, metrics = loss(net, out, batch)
    dout = np.asarray(dout).reshape(7, 5, 4)
    out64 = out.astype(np.float64)
    expected = reference_objective(out64, out64[..., 3], batch, config, beta)
    assert metrics["loss"] == pytest.approx(expected, rel=1e-5)
    assert np.all(dout[6] == 0)  # the bootstrap row only feeds the (detached) advantages
    eps = 1e-6
    for idx in [(0, 0, 0), (1, 2, 1), (3, 4, 2), (2, 1, 3), (5, 3, 3), (4, 0, 1)]:
        plus, minus = out64.copy(), out64.copy()
        plus[idx] += eps
        minus[idx] -= eps
        numeric = (
            reference_objective(plus, out64[..., 3], batch, config, beta)
            - reference_objective(minus, out64[..., 3], batch, config, beta)
        ) / (2 * eps)
        assert dout[idx] == pytest.approx(numeric, rel=1e-3, abs=1e-6), idx


def test_gae_by_hand(ppo) -> None:
    # One column, 4 steps, r = 1 each: step 1 truncates (the value of its final observation,
    # row 2, follows), step 2 is the autoreset after it (masked), step 3 terminates.
    rewards = np.ones((4, 1))
    values = np.array([[0.5], [2.0], [9.0], [1.0], [7.0]])
    terminated = np.array([[False], [False], [False], [True]])
    truncated = np.array([[False], [True], [False], [False]])
    mask = np.array([[True], [True], [False], [True]])
    adv = ppo.gae(rewards, values, terminated, truncated, mask, gamma=0.5, lam=0.5)
    d3 = 1.0 - 1.0  # terminated: nothing follows V(x3) = 1
    d1 = 1.0 + 0.5 * 9.0 - 2.0  # truncated: V of the final obs (row 2) follows
    d0 = 1.0 + 0.5 * 2.0 - 0.5
    np.testing.assert_allclose(adv[:, 0], [d0 + 0.25 * d1, d1, 0.0, d3])


def test_the_kl_coefficient_follows_the_paper_rule(ppo) -> None:
    assert ppo.adapted_kl_coef(1.0, 0.001, 0.01) == 0.5
    assert ppo.adapted_kl_coef(1.0, 0.02, 0.01) == 2.0
    assert ppo.adapted_kl_coef(1.0, 0.012, 0.01) == 1.0
    assert ppo.adapted_kl_coef(1e-4, 0.0, 0.01) == 1e-4  # floored


def test_bad_config_names_the_key(ppo) -> None:
    with pytest.raises(rlpar.ConfigError, match="kl_target: expected a number > 0, got -1"):
        ppo.PpoKlConfig(kl_target=-1.0)
    with pytest.raises(rlpar.ConfigError, match="minibatches: expected an integer >= 1"):
        ppo.PpoKlConfig(minibatches=0)


def test_trains_from_the_shipped_config_and_checkpoints_its_kl_coefficient(tmp_path) -> None:
    """`rlpar train` imports the file as the config's plug-in; the KL coefficient moves from
    its initial 1.0 and the checkpoint holds it."""
    proc = subprocess.run(
        [sys.executable, "-m", "rlpar", "train", str(CONFIG),
         "--json", "--quiet", "--logdir", str(tmp_path), "--set", "runtime.total_env_steps=6000",
         "--set", "eval.episodes=2", "--set", "eval.interval_env_steps=none"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.splitlines()[-1])
    from rlpar.checkpoint import load_checkpoint

    assert report["learner_steps"] >= 4
    kl_coef = load_checkpoint(report["checkpoint"]).extra["agent"]["kl_coef"]
    assert kl_coef != 1.0 and math.log2(kl_coef) == round(math.log2(kl_coef))  # halved/doubled
