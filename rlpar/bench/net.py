"""Benchmarks behind ``rlpar bench``: each returns a JSON-ready dict of medians.

The machine may be small and noisy, so configurations that are compared are timed side by side in
one process, taking turns chunk by chunk, and every figure is the median over repeats.

- `bench_net`: forward latency of the native net against a numpy twin and a torch twin that read
  the same weights, thread scaling with the GIL released or held, one training step against torch.
- `bench_snapshot`: pin/unpin and publish costs of the snapshot store (a native loop).
- `bench_gil_threshold`: from which batch size releasing the GIL pays off, to set
  `rlpar.set_gil_release_threshold` from data.

torch is optional: its entries appear only when ``import torch`` works. It runs on one thread
(``torch_threads``), like every native call.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

import rlpar
from rlpar import _native
from rlpar.bench.conv import bench_conv, conv_ratios, format_conv
from rlpar.bench.lstm import bench_lstm, lstm_ratios
from rlpar.bench.timing import (
    BackgroundLoad,
    import_optional,
    medians,
    sig,
    single_threaded,
    time_interleaved,
)
from rlpar.bench.twins import check_twin, numpy_forward, torch_input, torch_twin
from rlpar.bench.workloads import random_obs

__all__ = [
    "bench_gil_threshold",
    "bench_net",
    "bench_snapshot",
    "format_gil_threshold",
    "format_net",
    "format_snapshot",
]

MLP_BATCHES = (1, 32, 256)
# Conv batch 256 is left out: ~4.8 Gflop per forward, too slow to repeat on a 2-core machine.
CONV_BATCHES = (1, 32)
THREAD_BATCHES = (32, 256)
GIL_BATCHES = (1, 2, 4, 8, 16, 32, 64)
TRAIN_BATCH = 512


@dataclass(frozen=True)
class Budget:
    """How long to measure: ``--quick`` only checks that everything runs."""

    chunk_s: float  # one timed chunk of calls
    repeats: int  # chunks per configuration; the median is reported
    thread_s: float  # one thread-throughput run
    thread_repeats: int


# Thread runs last 0.2 s: 2-thread runs of 0.05 s varied twice as much here (0.9x-1.9x).
FULL = Budget(chunk_s=0.02, repeats=9, thread_s=0.2, thread_repeats=7)
QUICK = Budget(chunk_s=0.001, repeats=2, thread_s=0.01, thread_repeats=1)


def _budget(quick: bool) -> Budget:
    return QUICK if quick else FULL


def forwards_per_second(
    net: rlpar.Net,
    params: np.ndarray,
    obs: np.ndarray,
    threads: int,
    release: bool,
    duration: float,
) -> float:
    """Total forwards/s of ``threads`` Python threads calling ``net.forward`` in a loop.

    Each thread writes into its own output buffer; all read the same ``obs`` and ``params``.
    """
    counts = [0] * threads
    stop = [False]
    start = threading.Barrier(threads + 1)

    def loop(k: int) -> None:
        forward, out, n = net.forward, np.empty((len(obs), net.output_size), np.float32), 0
        start.wait()
        while True:  # at least one call: a loaded machine may not run a thread in `duration`
            forward(params, obs, out, release)  # positional: less time holding the GIL
            n += 1
            if stop[0]:
                break
        counts[k] = n

    workers = [threading.Thread(target=loop, args=(k,)) for k in range(threads)]
    for w in workers:
        w.start()
    start.wait()
    t0 = time.perf_counter()
    time.sleep(duration)
    stop[0] = True
    for w in workers:
        w.join()
    return sum(counts) / (time.perf_counter() - t0)


def _thread_scaling(
    net: rlpar.Net, params: np.ndarray, batches: tuple[int, ...], budget: Budget
) -> dict[str, dict[str, dict[str, float]]]:
    """``{"released"|"held": {batch: {threads: forwards/s}}}`` for 1 and 2 threads.

    Every configuration runs once per round, rounds repeat, and the median is reported.
    """
    rng = np.random.default_rng(0)
    obs = {b: rng.standard_normal((b, *net.input_shape)).astype(np.float32) for b in batches}
    modes = {"released": True, "held": False}
    configs = {
        (mode, b, threads): (
            lambda b=b, r=release, t=threads: forwards_per_second(
                net, params, obs[b], t, r, budget.thread_s
            )
        )
        for b in batches
        for mode, release in modes.items()
        for threads in (1, 2)
    }
    med = medians(configs, budget.thread_repeats)
    return {
        mode: {str(b): {str(t): sig(med[mode, b, t]) for t in (1, 2)} for b in batches}
        for mode in modes
    }


# ------------------------------------------------------------------------------------ bench_net


def _forward_us(net: rlpar.Net, batches: tuple[int, ...], budget: Budget, torch) -> dict:
    """``{"native"|"numpy"|"torch": {batch: µs per forward}}``; the three take turns per batch."""
    params = net.init_params(seed=0)
    to_numpy = numpy_forward(net, params)
    model = torch_twin(net, params, torch) if torch else None
    rng = np.random.default_rng(0)
    result: dict[str, dict[str, float]] = {"native": {}, "numpy": {}}
    if torch:
        result["torch"] = {}
    for batch in batches:
        obs = random_obs(net, batch, rng)
        out = np.empty((batch, net.output_size), np.float32)
        fns: dict[str, Callable[[], Any]] = {
            # positional: keyword arguments cost ~0.4 us in pybind11 (docs/net-api.md)
            "native": partial(net.forward, params, obs, out),
            "numpy": partial(to_numpy, obs),
        }
        want = net.forward(params, obs)
        check_twin("numpy", fns["numpy"](), want)
        if torch:
            fns["torch"] = partial(_torch_forward, net, model, obs, torch)
            check_twin("torch", fns["torch"](), want)
        for name, seconds in time_interleaved(fns, budget.chunk_s, budget.repeats).items():
            result[name][str(batch)] = sig(seconds * 1e6)
    return result


def _torch_forward(net: rlpar.Net, model, obs: np.ndarray, torch) -> np.ndarray:
    with torch.no_grad():
        return model(torch_input(net, obs, torch)).numpy()


def _train_step_ms(net: rlpar.Net, budget: Budget, torch) -> dict[str, float]:
    """One training step at batch `TRAIN_BATCH`: forward, backward from a fixed ``dout``, gradient
    clipping (max norm 40) and an RMSProp update, native against torch."""
    lr, alpha, eps, max_norm = 1e-5, 0.99, 1e-5, 40.0
    rng = np.random.default_rng(0)
    obs = random_obs(net, TRAIN_BATCH, rng)
    dout = rng.standard_normal((TRAIN_BATCH, net.output_size)).astype(np.float32)
    params = net.init_params(seed=0)
    out = np.empty((TRAIN_BATCH, net.output_size), np.float32)
    grad = np.empty(net.num_params, np.float32)
    opt = rlpar.RMSProp(net.num_params, lr=lr, alpha=alpha, eps=eps)

    def native_step() -> None:
        _, tape = net.forward_train(params, obs, out=out)
        net.backward(tape, dout, grad=grad)
        tape.release()
        rlpar.clip_grad_norm(grad, max_norm)
        opt.step(params, grad)

    fns: dict[str, Callable[[], object]] = {"native": native_step}
    if torch:
        model = torch_twin(net, params, torch)
        torch_opt = torch.optim.RMSprop(model.parameters(), lr=lr, alpha=alpha, eps=eps)
        dout_t = torch.from_numpy(dout)

        def torch_step() -> None:
            model(torch_input(net, obs, torch)).backward(dout_t)
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
            torch_opt.step()
            torch_opt.zero_grad()

        fns["torch"] = torch_step
    return {
        name: sig(s * 1e3)
        for name, s in time_interleaved(fns, budget.chunk_s, budget.repeats).items()
    }


def bench_net(quick: bool = False) -> dict:
    """Native net against numpy and torch twins (same weights), threads, and a training step.

    Returns::

        {"forward_us": {"mlp"|"conv": {"native"|"numpy"|"torch": {batch: µs}}},
         "threads_fps": {"released"|"held": {batch: {threads: forwards/s}}},
         "train_step_ms": {"native": ms, "torch": ms},
         "lstm_train_ms": {"native": ms, "torch": ms}, "lstm_step_us": {"native": µs, ...},
         "conv_forward_ms", "conv_train_ms", "conv_gflops", "conv_learner_threads": see
         `rlpar.bench.conv.bench_conv`,
         "gil_release_threshold_flops": float, "torch_threads": 1, "numpy_blas_threads": 1,
         "ratios": {...}, "background_load_cores": float,
         "kernels": "avx512" | "avx2" | "" (the conv and Linear kernels that ran: AVX-512,
         AVX2 + FMA for conv, or Eigen alone; see RLPAR_MAX_ISA), "amx": bool,
         "cpu_info": `rlpar.cpu_info()` (CPU model and flags, the build's -march, ...)}

    ``mlp`` is ``mlp_spec(4, [Categorical(2), Value()])`` (batches 1, 32, 256), ``conv`` the
    Nature-DQN torso on uint8 frames ``[84, 84, 4]`` (batches 1, 32). Thread scaling and the
    training step use the mlp; the LSTM figures are `rlpar.bench.lstm`'s. torch keys are
    present only when torch is importable, ``numpy_blas_threads`` only when threadpoolctl is.
    ``background_load_cores``: see `BackgroundLoad`.
    """
    budget = _budget(quick)
    torch = import_optional("torch")
    with BackgroundLoad() as load, single_threaded(torch) as limited:
        mlp = rlpar.Net(rlpar.mlp_spec(4, [rlpar.Categorical(2), rlpar.Value()]))
        conv = rlpar.Net(rlpar.conv_spec((84, 84, 4), [rlpar.Categorical(6), rlpar.Value()]))
        result: dict = {
            "forward_us": {
                "mlp": _forward_us(mlp, MLP_BATCHES, budget, torch),
                "conv": _forward_us(conv, CONV_BATCHES, budget, torch),
            },
            "threads_fps": _thread_scaling(mlp, mlp.init_params(seed=0), THREAD_BATCHES, budget),
            "train_step_ms": _train_step_ms(mlp, budget, torch),
            **bench_lstm(budget.chunk_s, budget.repeats, torch),
            "gil_release_threshold_flops": rlpar.gil_release_threshold(),
            **bench_conv(torch, budget.chunk_s, budget.repeats, quick),
            **limited,
        }
    result["ratios"] = {**_net_ratios(result), **conv_ratios(result)}
    result["background_load_cores"] = load.cores
    result["kernels"] = _native.simd_kernels()
    result["amx"] = rlpar.amx_available()
    result["cpu_info"] = rlpar.cpu_info()
    return result


def _net_ratios(r: dict) -> dict:
    """Speed-up factors (> 1: native is faster, or 2 threads beat one)."""
    fwd = r["forward_us"]
    ratios: dict = {
        "native_vs_numpy_b1": {
            net: sig(f["numpy"]["1"] / f["native"]["1"], 3) for net, f in fwd.items()
        },
    }
    if "torch" in fwd["mlp"]:
        ratios["native_vs_torch_b1"] = {
            net: sig(f["torch"]["1"] / f["native"]["1"], 3) for net, f in fwd.items()
        }
    for mode in ("released", "held"):
        ratios[f"threads_2v1_{mode}"] = {
            b: sig(fps["2"] / fps["1"], 3) for b, fps in r["threads_fps"][mode].items()
        }
    step = r["train_step_ms"]
    if "torch" in step:
        ratios["train_step_native_vs_torch"] = sig(step["torch"] / step["native"], 3)
    ratios.update(lstm_ratios(r))
    return ratios


def format_net(r: dict) -> str:
    """A readable table of a `bench_net` result."""
    kernels = {"avx512": "AVX-512 (conv, Linear)", "avx2": "AVX2 + FMA (conv)", "": "Eigen only"}
    cap = r.get("cpu_info", {}).get("max_isa")
    lines = [f"kernels: {kernels.get(r.get('kernels', ''), r.get('kernels'))}"
             f"{', AMX' if r.get('amx') else ''}{f' (RLPAR_MAX_ISA={cap})' if cap else ''}",
             "forward, µs per call (median)"]  # fmt: skip
    for net, by_impl in r["forward_us"].items():
        batches = list(by_impl["native"])
        lines.append(f"  {net:<5} {'batch':>8}" + "".join(f"{b:>10}" for b in batches))
        for impl, times in by_impl.items():
            lines.append(f"  {'':<5} {impl:>8}" + "".join(f"{times[b]:>10.4g}" for b in batches))
    lines.append("threads: mlp forwards/s (1 thread, 2 threads, 2/1)")
    for mode, by_batch in r["threads_fps"].items():
        for b, fps in by_batch.items():
            ratio = fps["2"] / fps["1"]
            lines.append(
                f"  {mode:<8} batch {b:>4}  {fps['1']:>10.0f} {fps['2']:>10.0f}  x{ratio:.2f}"
            )
    steps = ", ".join(f"{impl} {ms:.4g}" for impl, ms in r["train_step_ms"].items())
    lines.append(f"train step, mlp batch {TRAIN_BATCH}, ms: {steps}")
    lstm = ", ".join(f"{impl} {ms:.4g}" for impl, ms in r["lstm_train_ms"].items())
    lines.append(f"LSTM 256->256 forward+BPTT [T=20, B=256], ms: {lstm}")
    step = ", ".join(f"{impl} {us:.4g}" for impl, us in r["lstm_step_us"].items())
    lines.append(f"LSTM actor step, batch 16, µs: {step}")
    lines += format_conv(r)
    lines.append(f"GIL release threshold: {r['gil_release_threshold_flops']:.0f} flops")
    lines.append("speed-ups: " + _flat(r["ratios"]))
    lines.append(_load_line(r["background_load_cores"]))
    return "\n".join(lines)


def _load_line(cores: float | None) -> str:
    if cores is None:
        return "other processes' load: unknown"
    return f"other processes kept {cores:.2g} cores busy meanwhile (~0 for a clean run)"


def _flat(d: dict, prefix: str = "") -> str:
    parts = []
    for k, v in d.items():
        if isinstance(v, dict):
            parts.append(_flat(v, f"{prefix}{k}."))
        else:
            parts.append(f"{prefix}{k}={v:.3g}")
    return ", ".join(parts)


# ---------------------------------------------------------------------------------- snapshot


def bench_snapshot(quick: bool = False) -> dict:
    """Snapshot store costs, timed by the native loop (`rlpar._native.bench_snapshot`).

    Returns ``pin_unpin_ns`` (one pin + unpin while another thread publishes), ``publish_us_per_mb``
    and ``memcpy_us_per_mb`` (the plain-copy baseline over as many buffers as the store has slots),
    ``publish_vs_memcpy``, the size used (``n_floats``, ``mbytes``), and ``python_pin_release_ns``:
    ``store.pin()`` + ``Snapshot.release()`` from Python, what an actor pays once per unroll;
    ``background_load_cores``: see `BackgroundLoad`.
    """
    n_floats, iters, repeats = (16384, 200, 3) if quick else (262144, 5000, 7)
    with BackgroundLoad() as load:
        r = dict(_native.bench_snapshot(n_floats, iters, repeats))
    r["publish_vs_memcpy"] = r["publish_us_per_mb"] / r["memcpy_us_per_mb"]
    r["n_floats"] = n_floats
    r["mbytes"] = n_floats * 4 / 1e6
    r["python_pin_release_ns"] = _python_pin_release_s(n_floats, _budget(quick)) * 1e9
    r = {k: sig(v) if isinstance(v, float) else v for k, v in r.items()}
    r["background_load_cores"] = load.cores
    return r


def _python_pin_release_s(n_floats: int, budget: Budget) -> float:
    store = _native.SnapshotStore(n_floats)
    store.publish(np.zeros(n_floats, np.float32))

    def pin_release() -> None:
        store.pin().release()

    return time_interleaved({"pin": pin_release}, budget.chunk_s, budget.repeats)["pin"]


def format_snapshot(r: dict) -> str:
    """A readable table of a `bench_snapshot` result."""
    return "\n".join([
        f"snapshot store, {r['n_floats']} floats ({r['mbytes']:.3g} MB)",
        f"  pin + unpin (native, while publishing) {r['pin_unpin_ns']:>10.3g} ns",
        f"  pin + release from Python              {r['python_pin_release_ns']:>10.3g} ns",
        f"  publish                                {r['publish_us_per_mb']:>10.3g} µs/MB",
        f"  memcpy                                 {r['memcpy_us_per_mb']:>10.3g} µs/MB",
        f"  publish / memcpy                       {r['publish_vs_memcpy']:>10.3g}",
        _load_line(r["background_load_cores"]),
    ])  # fmt: skip


# ------------------------------------------------------------------------------ GIL threshold


def bench_gil_threshold(quick: bool = False) -> dict:
    """Where releasing the GIL starts to pay, for the mlp at small batches.

    For each batch: its flops (``flops_per_sample * batch``), forwards/s with 1 and 2 threads with
    the GIL released and held, and the 2-thread/1-thread ratios. ``crossover_batch`` is the
    smallest batch whose released 2-thread throughput beats held (``null`` if none does);
    ``crossover_flops`` its flops. ``threshold_flops`` is the threshold in effect now;
    ``background_load_cores``: see `BackgroundLoad`.
    """
    budget = _budget(quick)
    net = rlpar.Net(rlpar.mlp_spec(4, [rlpar.Categorical(2), rlpar.Value()]))
    with BackgroundLoad() as load:
        fps = _thread_scaling(net, net.init_params(seed=0), GIL_BATCHES, budget)
    batches = {}
    crossover = None
    for b in GIL_BATCHES:
        rel, held = fps["released"][str(b)], fps["held"][str(b)]
        batches[str(b)] = {
            "flops": net.flops_per_sample * b,
            "fps": {"released": rel, "held": held},
            "ratio_2v1": {
                "released": sig(rel["2"] / rel["1"], 3),
                "held": sig(held["2"] / held["1"], 3),
            },
        }
        if crossover is None and rel["2"] > held["2"]:
            crossover = b
    return {
        "net": "mlp 4-64-64-(2+1)",
        "batches": batches,
        "crossover_batch": crossover,
        "crossover_flops": net.flops_per_sample * crossover if crossover else None,
        "threshold_flops": rlpar.gil_release_threshold(),
        "background_load_cores": load.cores,
    }


def format_gil_threshold(r: dict) -> str:
    """A readable table of a `bench_gil_threshold` result."""
    lines = [
        f"GIL release, {r['net']}: forwards/s with 1 and 2 threads",
        f"  {'batch':>5} {'flops':>8} {'rel 1':>9} {'rel 2':>9} {'held 1':>9} {'held 2':>9}"
        f" {'rel 2/1':>8} {'held 2/1':>8}",
    ]
    for b, row in r["batches"].items():
        rel, held = row["fps"]["released"], row["fps"]["held"]
        lines.append(
            f"  {b:>5} {row['flops']:>8.0f} {rel['1']:>9.0f} {rel['2']:>9.0f} {held['1']:>9.0f}"
            f" {held['2']:>9.0f} {row['ratio_2v1']['released']:>8.2f}"
            f" {row['ratio_2v1']['held']:>8.2f}"
        )
    if r["crossover_batch"] is None:
        lines.append(f"released never beats held up to batch {GIL_BATCHES[-1]}")
    else:
        lines.append(
            f"released beats held from batch {r['crossover_batch']} "
            f"({r['crossover_flops']:.0f} flops)"
        )
    lines.append(f"threshold now {r['threshold_flops']:.0f} flops")
    lines.append(_load_line(r["background_load_cores"]))
    return "\n".join(lines)
