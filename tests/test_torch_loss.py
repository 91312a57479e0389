"""rlpar.TorchLoss: a loss written with PyTorch's autodiff gives the gradient a hand-derived
numpy loss gives (examples/custom_agent_torch.py against examples/custom_agent.py), hands the
net's output to torch and the gradient back without copies, splits over the learner's threads,
trains beside actor threads, and says clearly what is wrong with a bad loss."""

from __future__ import annotations

import importlib
import importlib.util
import subprocess
import sys
import threading
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

import rlpar
from rlpar import registry

torch = pytest.importorskip("torch")

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.fixture(scope="module")
def examples():
    """(the numpy REINFORCE module, the torch one), loaded as the files they are."""
    sys.path.insert(0, str(EXAMPLES))
    try:
        loaded = []
        for name in ("custom_agent", "custom_agent_torch"):
            spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module  # dataclasses (and the torch file's import) look it up
            spec.loader.exec_module(module)
            loaded.append(module)
        yield loaded
    finally:
        sys.path.remove(str(EXAMPLES))
        for name in ("custom_agent", "custom_agent_torch"):
            sys.modules.pop(name, None)


def cartpole_batch(t: int, n: int, seed: int) -> rlpar.Batch:
    """A batch [T, N] with every kind of step: terminations, truncations, masked autoresets."""
    rng = np.random.default_rng(seed)
    terminated = rng.random((t, n)) < 0.15
    truncated = ~terminated & (rng.random((t, n)) < 0.1)
    mask = np.ones((t, n), bool)
    mask[1:] = ~(terminated[:-1] | truncated[:-1])  # the step after an episode's end: autoreset
    return rlpar.Batch(
        obs=rng.normal(size=(t + 1, n, 4)).astype(np.float32),
        actions=rng.integers(0, 2, (t, n)),
        rewards=rng.normal(size=(t, n)).astype(np.float32),
        terminated=terminated,
        truncated=truncated,
        mask=mask,
        behaviour=np.zeros((t, n, 3), np.float32),
        versions=np.ones(1, np.int64),
        policy_lag=np.zeros(1, np.int64),
        learner_version=1,
    )


def agents_and_net(examples):
    numpy_module, torch_module = examples
    config = numpy_module.ReinforceConfig(gamma=0.9, baseline_cost=0.7)
    numpy_agent = numpy_module.Reinforce(config)
    torch_agent = torch_module.TorchReinforce(config)
    space = gym.spaces.Box(-1, 1, (4,), np.float32)
    net = rlpar.Net(numpy_agent.net_spec(space, gym.spaces.Discrete(2)))
    return numpy_agent, torch_agent, net


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_torch_loss_gives_the_numpy_loss_gradient(examples, seed: int) -> None:
    numpy_agent, torch_agent, net = agents_and_net(examples)
    params = net.init_params(seed=seed)
    batch = cartpole_batch(12, 6, seed)
    out = net.forward(params, batch.obs.reshape(-1, 4)).reshape(13, 6, -1)
    want, want_metrics = numpy_agent.loss(net, out, batch)
    got, metrics = torch_agent.loss(net, out, batch)
    assert got.dtype == np.float32 and got.shape == out.shape
    scale = np.abs(want).max()
    np.testing.assert_allclose(got.reshape(want.shape), want, rtol=1e-5, atol=1e-6 * scale)
    assert np.all(got[-1] == 0)  # the bootstrap row T has no loss
    assert metrics["mean_return_estimate"] == pytest.approx(
        want_metrics["mean_return_estimate"], rel=1e-5
    )
    assert np.isfinite(metrics["loss"])  # its value, added to the loss's own metrics
    # through the native backward: the parameter gradients agree too
    g_numpy, _ = rlpar.loss_gradient(net, params, batch, numpy_agent.loss)
    g_torch, _ = rlpar.loss_gradient(net, params, batch, torch_agent.loss)
    np.testing.assert_allclose(g_torch, g_numpy, rtol=1e-4, atol=1e-6 * np.abs(g_numpy).max())


def test_out_goes_to_torch_and_its_gradient_comes_back_without_a_copy(examples) -> None:
    _, _, net = agents_and_net(examples)
    params = net.init_params(seed=0)
    batch = cartpole_batch(5, 4, 3)
    out = net.forward(params, batch.obs.reshape(-1, 4)).reshape(6, 4, -1)
    seen = {}

    def loss(o, b):
        seen["out"], seen["rewards"] = o.data_ptr(), b.rewards.data_ptr()
        seen["grad"] = o  # its .grad stays None: autograd.grad returns the gradient
        return (o * o).sum() / 2

    dout, _ = rlpar.TorchLoss(loss)(net, out, batch)
    assert seen["out"] == out.ctypes.data
    assert seen["rewards"] == batch.rewards.ctypes.data
    np.testing.assert_array_equal(dout, out)  # d(sum(o^2)/2)/do = o


def test_heads_name_the_output_columns(examples) -> None:
    _, _, net = agents_and_net(examples)
    batch = cartpole_batch(3, 2, 0)
    out = np.arange(4 * 2 * 3, dtype=np.float32).reshape(4, 2, 3)
    heads = rlpar.TorchBatch(batch, net, torch).heads(torch.from_numpy(out))
    assert set(heads) == {"logits", "value"}
    np.testing.assert_array_equal(heads["logits"].numpy(), out[..., :2])
    np.testing.assert_array_equal(heads["value"].numpy(), out[..., 2])


def test_on_shards_the_gradient_is_the_whole_batch_s(examples) -> None:
    """learner_threads = 2 on an MLP cuts the batch into column shards, each with its own torch
    call on its own thread; the weighted shards add up to the one-thread gradient."""
    _, torch_agent, net = agents_and_net(examples)
    params = net.init_params(seed=1)
    batch = cartpole_batch(10, 8, 5)
    whole, _ = rlpar.loss_gradient(net, params, batch, torch_agent.loss)
    pool = rlpar.ShardPool(2, split="shards")
    try:
        assert rlpar.learner_split(net, pool, batch) == "shards"
        sharded, _ = rlpar.loss_gradient(net, params, batch, torch_agent.loss, pool)
    finally:
        pool.close(5.0)
    np.testing.assert_allclose(sharded, whole, rtol=1e-4, atol=1e-6 * np.abs(whole).max())


def test_it_trains_on_learner_threads_beside_actor_threads(examples, monkeypatch) -> None:
    monkeypatch.setattr(registry, "_AGENTS", dict(registry.registered_agents()))
    rlpar.register_agent("torch-reinforce", examples[1].TorchReinforce)
    runtime = rlpar.RuntimeConfig(
        num_actors=2, envs_per_actor=8, unroll_length=16, batch_rollouts=2, learner_threads=2,
        total_env_steps=6_000, seed=0, checkpoint_interval_s=None, max_wall_s=120,
    )  # fmt: skip
    runner = rlpar.Runner(
        rlpar.make_agent("torch-reinforce"), rlpar.EnvConfig("CartPole-v1"), runtime
    )
    before = runner.params
    result = runner.run()
    assert result.stopped_by == "total_env_steps" and result.learner_steps > 0
    assert np.all(np.isfinite(runner.params)) and not np.array_equal(runner.params, before)
    assert not [t for t in threading.enumerate() if t.name.startswith("rlpar-")]


@pytest.mark.parametrize(
    ("fn", "error", "match"),
    [
        (lambda o, b: o.sum(-1), ValueError, r"expected a scalar loss tensor, got shape \[6, 4\]"),
        (lambda o, b: 1.0, ValueError, "expected a scalar loss tensor, got <class 'float'>"),
        (lambda o, b: (o.sum(), [1.0]), TypeError, "metrics a mapping, got list"),
        (lambda o, b: b.rewards.sum(), ValueError, "the loss does not depend on out"),
        (lambda o, b: b.values.sum(), AttributeError, "TorchBatch has no field 'values'"),
    ],
)
def test_a_bad_loss_gets_a_clear_error(examples, fn, error, match) -> None:
    _, _, net = agents_and_net(examples)
    batch = cartpole_batch(5, 4, 0)
    out = np.zeros((6, 4, net.output_size), np.float32)
    with pytest.raises(error, match=match):
        rlpar.TorchLoss(fn)(net, out, batch)
    with pytest.raises(TypeError, match="expected a function"):
        rlpar.TorchLoss(3)  # type: ignore[arg-type]


def test_without_torch_the_error_says_what_to_install(examples, monkeypatch) -> None:
    _, _, net = agents_and_net(examples)
    real = importlib.import_module

    def no_torch(name, *args):
        if name == "torch":
            raise ModuleNotFoundError("No module named 'torch'")
        return real(name, *args)

    monkeypatch.setattr(importlib, "import_module", no_torch)
    with pytest.raises(ImportError, match=r'pip install "rlpar\[torch\]"'):
        rlpar.TorchLoss(lambda o, b: o.sum())(net, np.zeros((6, 4, 3), np.float32),
                                              cartpole_batch(5, 4, 0))  # fmt: skip


def test_importing_rlpar_does_not_import_torch() -> None:
    code = "import sys, rlpar; assert 'torch' not in sys.modules, 'torch was imported'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd="/")


def test_the_example_runs_as_a_script() -> None:
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / "custom_agent_torch.py")],
        capture_output=True, text=True, timeout=300, cwd="/",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("window mean return ")
