"""The conv entries of ``rlpar bench net``: pixel torsos against torch, GFLOP/s, learner threads.

Torsos on uint8 frames, each timed side by side with a torch twin that holds the same weights
(one thread each, the calls taking turns):

- ``nature``: 84x84x4 -> conv 32x8x8/4, 64x4x4/2, 64x3x3/1 -> Linear 512 -> 6 logits + value;
- ``minatar``: 10x10x4 -> conv 16x3x3/1 -> Linear 128 -> 6 logits + value;
- ``impala``: 84x84x4 -> the IMPALA ResNet (`rlpar.impala_cnn_spec`: channels 16-32-32, each
  section conv, 3x3 max-pool stride 2, two residual blocks) -> Linear 256 -> 6 logits + value;
- ``impala_minatar``: the same ResNet on 10x10x4.

``conv_train_ms`` times forward_train + backward from a fixed output gradient (no optimizer: the
layers alone). ``conv_gflops`` divides the Nature torso's arithmetic by the native times and sets
it beside the peak of a large single-threaded sgemm on this core (torch's when torch is there,
numpy's otherwise). ``conv_learner_threads`` runs IMPALA learner steps of the Nature torso on a
[T=20, N=32] batch of frames with ``runtime.learner_threads`` = 1 and 2 (`rlpar.ShardPool`): "2"
splits the torso's batch rows inside the net's calls (``learner_split = "rows"``, the default
for conv nets), "2_shards" splits the columns into shards.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import gymnasium as gym
import numpy as np

import rlpar
from rlpar.bench.timing import medians, sig, time_interleaved
from rlpar.bench.twins import check_twin, torch_input, torch_twin
from rlpar.bench.workloads import NATURE_NET, random_obs, synthetic_batch
from rlpar.nn import Head

__all__ = ["CONV_FORWARD_BATCHES", "CONV_TRAIN_BATCHES", "bench_conv", "conv_torsos"]

CONV_FORWARD_BATCHES = {"nature": (1, 32, 256), "impala": (1, 32)}
CONV_TRAIN_BATCHES = {
    "nature": (32, 256),
    "minatar": (256, 1024),
    "impala": (32,),
    "impala_minatar": (32, 256),
}
LEARNER_BATCH = (20, 32)  # [T, N] of the learner-step measurement
SGEMM_SIZE = 1536


def conv_torsos() -> dict[str, rlpar.Net]:
    """The benchmarked nets (6 logits + value heads)."""
    heads: list[Head] = [rlpar.Categorical(6), rlpar.Value()]
    return {
        "nature": rlpar.Net(rlpar.conv_spec((84, 84, 4), heads)),
        "minatar": rlpar.Net(rlpar.conv_spec((10, 10, 4), heads, convs=((16, 3, 1),), hidden=128)),
        "impala": rlpar.Net(rlpar.impala_cnn_spec((84, 84, 4), heads)),
        "impala_minatar": rlpar.Net(rlpar.impala_cnn_spec((10, 10, 4), heads)),
    }


def _first_layer_flops(net: rlpar.Net) -> float:
    """Multiply-adds x 2 of the first layer, whose input gradient backward skips."""
    h, w, c = net.input_shape
    layer = net.spec.layers[0]
    assert isinstance(layer, rlpar.Conv2d)
    oh = (h + 2 * layer.padding - layer.kernel) // layer.stride + 1
    ow = (w + 2 * layer.padding - layer.kernel) // layer.stride + 1
    return 2.0 * oh * ow * layer.kernel * layer.kernel * c * layer.out_channels


def _train_flops(net: rlpar.Net) -> float:
    """Per sample: the forward, the weight gradients (as many) and the input gradients (as
    many, less the first layer's)."""
    return 3.0 * net.flops_per_sample - _first_layer_flops(net)


def _pair(net: rlpar.Net, batch: int, torch: Any, train: bool) -> dict[str, Callable[[], object]]:
    """The native call and its torch twin at ``batch``, checked to agree first."""
    rng = np.random.default_rng(batch)
    params = net.init_params(seed=0)
    obs = random_obs(net, batch, rng)
    out = np.empty((batch, net.output_size), np.float32)
    dout = rng.standard_normal((batch, net.output_size)).astype(np.float32)
    grad = np.empty(net.num_params, np.float32)

    def native_forward() -> None:
        net.forward(params, obs, out)

    def native_train() -> None:
        _, tape = net.forward_train(params, obs, out=out)
        net.backward(tape, dout, grad=grad)
        tape.release()

    fns: dict[str, Callable[[], object]] = {"native": native_train if train else native_forward}
    if torch:
        model = torch_twin(net, params, torch)
        dout_t = torch.from_numpy(dout)

        def torch_forward() -> np.ndarray:
            with torch.no_grad():
                return model(torch_input(net, obs, torch)).numpy()

        def torch_train() -> None:
            model(torch_input(net, obs, torch)).backward(dout_t)
            model.zero_grad(set_to_none=False)

        check_twin("torch", torch_forward(), net.forward(params, obs))
        fns["torch"] = torch_train if train else torch_forward
    return fns


def _side_by_side(
    nets: dict[str, rlpar.Net],
    batches: Mapping[str, tuple[int, ...]],
    torch: Any,
    train: bool,
    chunk_s: float,
    repeats: int,
) -> dict[str, dict[str, dict[str, float]]]:
    """``{torso: {"native"|"torch": {batch: ms per call}}}``."""
    result: dict[str, dict[str, dict[str, float]]] = {}
    for name, sizes in batches.items():
        by_impl: dict[str, dict[str, float]] = {}
        for batch in sizes:
            fns = _pair(nets[name], batch, torch, train)
            for impl, seconds in time_interleaved(fns, chunk_s, repeats).items():
                by_impl.setdefault(impl, {})[str(batch)] = sig(seconds * 1e3)
        result[name] = by_impl
    return result


def _sgemm_peak_gflops(torch: Any, repeats: int) -> float:
    """GFLOP/s of a square float32 matrix product on one thread (the caller limits threads)."""
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((SGEMM_SIZE, SGEMM_SIZE)).astype(np.float32) for _ in range(2))
    if torch:
        ta, tb = torch.from_numpy(a), torch.from_numpy(b)

        def product() -> object:
            return torch.mm(ta, tb)
    else:

        def product() -> object:
            return a @ b

    seconds = time_interleaved({"sgemm": product}, 0.05, repeats)["sgemm"]
    return 2.0 * SGEMM_SIZE**3 / seconds / 1e9


def _learner_threads(repeats: int, min_steps: int) -> dict[str, float]:
    """Samples/s of IMPALA learner steps on the Nature torso with 1 thread and with 2 (rows
    and shards)."""
    t, n = LEARNER_BATCH
    rng = np.random.default_rng(0)
    agent = rlpar.make_agent("impala", {"optim": {"lr": 1e-4}, "net": NATURE_NET})
    space = gym.spaces.Box(0, 255, (84, 84, 4), np.uint8)
    net = rlpar.Net(agent.net_spec(space, gym.spaces.Discrete(6)))
    params = net.init_params(seed=0)
    obs = rng.integers(0, 256, (t + 1, n, *space.shape), dtype=np.uint8)
    batch = synthetic_batch(rng, net, params, obs, 6)
    pools = {"2": rlpar.ShardPool(2, split="rows"), "2_shards": rlpar.ShardPool(2, split="shards")}

    def rate(key: str) -> float:
        state = agent.init_state(net, params.copy())
        state.pool = pools.get(key)
        agent.learn(net, state, batch)  # workspaces grow to this shard size once
        t0 = time.perf_counter()
        for _ in range(min_steps):
            agent.learn(net, state, batch)
        return min_steps * batch.rewards.size / (time.perf_counter() - t0)

    try:
        med = medians({k: (lambda k=k: rate(k)) for k in ("1", "2", "2_shards")}, repeats)
    finally:
        for pool in pools.values():
            pool.close()
    return {str(k): sig(v) for k, v in med.items()}


def bench_conv(torch: Any, chunk_s: float, repeats: int, quick: bool) -> dict[str, Any]:
    """The conv entries of `rlpar.bench.net.bench_net` (torch and numpy already on one thread).

    Returns::

        {"conv_forward_ms": {"nature": {"native"|"torch": {"1"|"32"|"256": ms}},
                             "impala": {impl: {"1"|"32": ms}}},
         "conv_train_ms": {"nature": {impl: {"32"|"256": ms}},
                           "minatar": {impl: {"256"|"1024": ms}},
                           "impala": {impl: {"32": ms}},
                           "impala_minatar": {impl: {"32"|"256": ms}}},
         "conv_gflops": {"native": forward GFLOP/s, "native_train": ..., "sgemm_peak": ...},
         "conv_learner_threads": {"1"|"2"|"2_shards": samples/s}}

    GFLOP/s are the Nature torso's at batch 256. torch keys appear only when torch is importable.
    """
    nets = conv_torsos()
    forward = _side_by_side(nets, CONV_FORWARD_BATCHES, torch, False, chunk_s, repeats)
    train = _side_by_side(nets, CONV_TRAIN_BATCHES, torch, True, chunk_s, repeats)
    nature, big = nets["nature"], str(CONV_FORWARD_BATCHES["nature"][-1])
    gflops = {
        "native": sig(nature.flops_per_sample * int(big) / forward["nature"]["native"][big] / 1e6),
        "native_train": sig(_train_flops(nature) * int(big) / train["nature"]["native"][big] / 1e6),
        "sgemm_peak": sig(_sgemm_peak_gflops(torch, repeats)),
    }
    return {
        "conv_forward_ms": forward,
        "conv_train_ms": train,
        "conv_gflops": gflops,
        "conv_learner_threads": _learner_threads(1 if quick else 3, 1 if quick else 2),
    }


def conv_ratios(r: dict[str, Any]) -> dict[str, Any]:
    """torch time / native time per torso and batch (> 1: native is faster), and the learner's
    2-thread / 1-thread rate."""
    ratios: dict[str, Any] = {}
    for key in ("conv_forward_ms", "conv_train_ms"):
        ratios[f"{key[:-3]}_native_vs_torch"] = {
            net: {b: sig(t["torch"][b] / t["native"][b], 3) for b in t["native"]}
            for net, t in r[key].items()
            if "torch" in t
        }
    lt = r["conv_learner_threads"]
    ratios["conv_learner_threads_2v1"] = sig(lt["2"] / lt["1"], 3)
    return ratios


def format_conv(r: dict[str, Any]) -> list[str]:
    """Readable lines of the conv entries of a `bench_net` result."""
    lines = []
    for key, what in (("conv_forward_ms", "forward"), ("conv_train_ms", "forward_train+backward")):
        lines.append(f"conv {what}, ms per call (median)")
        for net, by_impl in r[key].items():
            batches = list(by_impl["native"])
            lines.append(f"  {net:<8} {'batch':>8}" + "".join(f"{b:>10}" for b in batches))
            for impl, times in by_impl.items():
                lines.append(
                    f"  {'':<8} {impl:>8}" + "".join(f"{times[b]:>10.4g}" for b in batches)
                )
    g = r["conv_gflops"]
    lines.append(
        f"conv GFLOP/s (nature, batch 256): forward {g['native']:.4g}, train "
        f"{g['native_train']:.4g}; sgemm peak {g['sgemm_peak']:.4g}"
    )
    lt = r["conv_learner_threads"]
    lines.append(
        f"conv learner step (IMPALA, nature, [T={LEARNER_BATCH[0]}, N={LEARNER_BATCH[1]}]), "
        f"samples/s: 1 thread {lt['1']:.4g}, 2 threads {lt['2']:.4g} (rows), "
        f"{lt['2_shards']:.4g} (shards)"
    )
    return lines
