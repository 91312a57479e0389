"""`rlpar bench scaling`: how rlpar's threaded paths scale with the number of threads.

For each thread count N (default 1, 2, 4, 8, 16), side by side in one process:

- ``net_forward``: forwards/s of N Python threads sharing one `rlpar.Net` (GIL released): the
  mlp ``mlp_spec(4, [Categorical(2), Value()])`` at batches 32 and 256, and the Nature-DQN conv
  net on uint8 ``[84, 84, 4]`` frames at batch 8.
- ``snapshot_pins``: pin + unpin per second of N native reader threads while one thread keeps
  publishing (`rlpar._native.bench_snapshot_readers`), with the writer's publishes/s.
- ``actor_loop``: env steps/s of N actor threads, each with its own 64 CartPoles and the
  shared mlp policy: ``python_env`` (gymnasium envs, rlpar's Python actor loop) and
  ``native_fused`` (rlpar's native CartPole, one GIL-free native call per 20-step unroll).
- ``learner_step``: samples/s of IMPALA learner steps with ``runtime.learner_threads`` = N
  (`rlpar.ShardPool`), each case twice: ``_rows`` (the torso's batch rows split inside the
  net's native calls, ``learner_split = "rows"``) and ``_shards`` (the batch's columns split
  into N shards): the mlp on a [20, 256] batch, the agents' default conv torso on a [4, 32]
  batch of 84x84 frames, and the Nature torso on a [20, 32] batch.
- ``runtime``: the whole actor/learner runtime on ``rlpar/CartPole-v1`` with N actors (64
  envs each, fused unrolls) and the IMPALA agent, the learner idle (actors and queues alone)
  and busy (real learner steps on one thread, which then set the pace), the idle learner
  again with 256 envs per actor (``learner_idle_k256``: 4x fewer rollouts, so 4x fewer GIL
  hand-offs and queue operations per env step); and
  ``learner_threads``: 2 actors feeding batches of 2 rollouts ([20, 128]) to a learner with
  ``runtime.learner_threads`` = N (here N counts learner threads, not actors).

Every configuration runs once per round, rounds repeat, and values are medians; ``speedup``
divides each by its 1-thread value (or the smallest N asked for). ``cpus`` is the number of cores
this process may run on: thread counts above it only oversubscribe them.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

import rlpar
from rlpar import _native
from rlpar.bench.envs import NUM_ENVS, UNROLL, actor_loop_measures
from rlpar.bench.envs import Budget as LoopBudget
from rlpar.bench.net import forwards_per_second
from rlpar.bench.runtime import runtime_measure
from rlpar.bench.timing import medians, sig
from rlpar.bench.workloads import NATURE_NET, synthetic_batch
from rlpar.parallel import ShardPool
from rlpar.registry import make_agent

__all__ = ["DEFAULT_THREADS", "bench_scaling", "format_scaling", "parse_threads"]

DEFAULT_THREADS = (1, 2, 4, 8, 16)
SECTIONS = ("net_forward", "snapshot_pins", "actor_loop", "learner_step", "runtime")
MAX_THREADS = 256
MLP_BATCHES = (32, 256)
CONV_BATCH = 8
SNAPSHOT_FLOATS = 262_144  # 1 MB of parameters
LEARNER_MLP_BATCH = (20, 256)  # [T, N] of the learner-step cases
LEARNER_CONV_BATCH = (4, 32)
LEARNER_NATURE_BATCH = (20, 32)


@dataclass(frozen=True)
class Budget:
    seconds: float  # one timed run of a configuration
    repeats: int  # rounds; the median is reported
    runtime_s: float  # one whole-runtime run (rates are read after its first third)
    runtime_repeats: int


FULL = Budget(seconds=0.4, repeats=3, runtime_s=2.4, runtime_repeats=2)
QUICK = Budget(seconds=0.03, repeats=1, runtime_s=0.6, runtime_repeats=1)


def parse_threads(text: str) -> tuple[int, ...]:
    """``"1,2,4"`` -> ``(1, 2, 4)``: distinct positive counts, at most `MAX_THREADS`, sorted."""
    try:
        counts = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        raise ValueError(
            f"expected thread counts as comma-separated integers (e.g. 1,2,4), got {text!r}"
        ) from None
    if not counts or counts[0] < 1 or counts[-1] > MAX_THREADS:
        raise ValueError(
            f"expected thread counts between 1 and {MAX_THREADS} (e.g. 1,2,4), got {text!r}"
        )
    return tuple(counts)


def _net_forward(threads: Sequence[int], budget: Budget) -> dict[str, dict[str, float]]:
    rng = np.random.default_rng(0)
    mlp = rlpar.Net(rlpar.mlp_spec(4, [rlpar.Categorical(2), rlpar.Value()]))
    conv = rlpar.Net(rlpar.conv_spec((84, 84, 4), [rlpar.Categorical(6), rlpar.Value()]))
    cases: dict[str, tuple[rlpar.Net, np.ndarray]] = {
        f"mlp_b{b}": (mlp, rng.standard_normal((b, 4)).astype(np.float32)) for b in MLP_BATCHES
    }
    frames = rng.integers(0, 256, (CONV_BATCH, 84, 84, 4), dtype=np.uint8)
    cases[f"conv_b{CONV_BATCH}"] = (conv, frames)
    params = {name: net.init_params(seed=0) for name, (net, _) in cases.items()}
    configs = {
        (name, n): (
            lambda name=name, net=net, obs=obs, n=n: forwards_per_second(
                net, params[name], obs, n, True, budget.seconds
            )
        )
        for name, (net, obs) in cases.items()
        for n in threads
    }
    med = medians(configs, budget.repeats)
    return {name: {str(n): sig(med[name, n]) for n in threads} for name in cases}


def _snapshot_pins(threads: Sequence[int], budget: Budget) -> dict[str, dict[str, float]]:
    configs = {
        n: (lambda n=n: _native.bench_snapshot_readers(SNAPSHOT_FLOATS, n, budget.seconds))
        for n in threads
    }
    med = medians(configs, budget.repeats)
    return {
        key: {str(n): sig(med[n][key]) for n in threads}
        for key in ("pins_per_s", "publishes_per_s")
    }


def _actor_loop(
    threads: Sequence[int], budget: Budget
) -> tuple[dict[str, dict[str, float]], dict[str, float]]:
    """(env steps/s {kind: {N: ..}}, the ceiling the GIL meter predicts at the smallest N)."""
    loop_budget = LoopBudget(
        env_s=budget.seconds, loop_s=budget.seconds, warmup_s=budget.seconds / 3, repeats=1
    )
    kinds = ("python_env", "native_fused")
    measured = actor_loop_measures(kinds, threads, loop_budget, budget.repeats)
    rates = {kind: {n: m["rate"] for n, m in by_n.items()} for kind, by_n in measured.items()}
    first = str(min(threads))
    return rates, {kind: measured[kind][first]["ceiling"] for kind in kinds}


def _learner_step(threads: Sequence[int], budget: Budget) -> dict[str, dict[str, float]]:
    """Samples/s of IMPALA learner steps on N threads (`ShardPool`), rows and shards."""
    rng = np.random.default_rng(0)
    frames = gym.spaces.Box(0, 255, (84, 84, 4), np.uint8)
    cases = {}
    for name, space, n_actions, (t, n), net_cfg in (
        ("mlp_T20_N256", gym.spaces.Box(-1.0, 1.0, (4,), np.float32), 2, LEARNER_MLP_BATCH, {}),
        ("conv_T4_N32", frames, 6, LEARNER_CONV_BATCH, {}),
        ("nature_T20_N32", frames, 6, LEARNER_NATURE_BATCH, NATURE_NET),
    ):
        agent = make_agent("impala", {"optim": {"lr": 1e-4}, "net": net_cfg})
        net = rlpar.Net(agent.net_spec(space, gym.spaces.Discrete(n_actions)))
        params = net.init_params(seed=0)
        if space.dtype == np.uint8:
            obs = rng.integers(0, 256, (t + 1, n, *space.shape), dtype=np.uint8)
        else:
            obs = rng.standard_normal((t + 1, n, *space.shape)).astype(np.float32)
        cases[name] = (agent, net, params, synthetic_batch(rng, net, params, obs, n_actions))
    splits = ("rows", "shards")
    pools = {(k, s): ShardPool(k, split=s) for k in threads if k > 1 for s in splits}

    def rate(name: str, k: int, split: str) -> float:
        agent, net, params, batch = cases[name]
        state = agent.init_state(net, params.copy())
        state.pool = pools.get((k, split))
        agent.learn(net, state, batch)
        steps, t0 = 0, time.perf_counter()
        while steps < 2 or time.perf_counter() - t0 < budget.seconds:
            agent.learn(net, state, batch)
            steps += 1
        return steps * batch.rewards.size / (time.perf_counter() - t0)

    try:
        configs = {
            (f"{name}_{s}", k): (lambda name=name, k=k, s=s: rate(name, k, s))
            for name in cases
            for s in splits
            for k in threads
        }
        for measure in configs.values():  # an untimed round: every thread's workspace grows
            measure()  # to its shard size once (hundreds of MB for the conv net)
        med = medians(configs, budget.repeats)
    finally:
        for pool in pools.values():
            pool.close()
    return {
        f"{name}_{s}": {str(k): sig(med[f"{name}_{s}", k]) for k in threads}
        for name in cases
        for s in splits
    }


RUNTIME_MODES = ("learner_idle", "learner_idle_k256", "learner_busy", "learner_threads")
POOLED_ACTORS = 2


def _runtime(
    threads: Sequence[int], budget: Budget
) -> tuple[dict[str, dict[str, float]], dict[str, float]]:
    """(env steps/s {mode: {N: ..}}, the actor ceiling the GIL meter predicts at the smallest
    N, for the modes whose thread count is the actors')."""

    def measure(mode: str, n: int) -> dict[str, float]:
        if mode == "learner_threads":  # a learner-bound run: 2 actors, batches of 2 rollouts
            return runtime_measure(
                POOLED_ACTORS,
                True,
                budget.runtime_s,
                NUM_ENVS,
                "rlpar/CartPole-v1",
                unroll_length=UNROLL,
                learner_threads=n,
                batch_rollouts=2,
            )
        envs = 4 * NUM_ENVS if mode == "learner_idle_k256" else NUM_ENVS
        return runtime_measure(
            n,
            mode == "learner_busy",
            budget.runtime_s,
            envs,
            "rlpar/CartPole-v1",
            unroll_length=UNROLL,
        )

    configs = {
        (mode, n): (lambda mode=mode, n=n: measure(mode, n))
        for mode in RUNTIME_MODES
        for n in threads
    }  # fmt: skip
    med = medians(configs, budget.runtime_repeats)
    rates = {mode: {str(n): sig(med[mode, n]["rate"]) for n in threads} for mode in RUNTIME_MODES}
    first = min(threads)
    ceilings = {
        mode: sig(med[mode, first]["ceiling"], 3)
        for mode in RUNTIME_MODES
        if mode != "learner_threads"
    }
    return rates, ceilings


def _speedups(table: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    out = {}
    for name, by_n in table.items():
        base = by_n[min(by_n, key=int)]
        out[name] = {n: round(v / base, 2) if base > 0 else 0.0 for n, v in by_n.items()}
    return out


def bench_scaling(threads: Sequence[int] = DEFAULT_THREADS, quick: bool = False) -> dict[str, Any]:
    """Throughput of N threads on rlpar's threaded paths, for each N in ``threads``.

    Returns ``{"threads": [..], "cpus": int,
    "net_forward": {case: {N: forwards/s}},
    "snapshot_pins": {"pins_per_s"|"publishes_per_s": {N: per s}},
    "actor_loop": {"python_env"|"native_fused": {N: env steps/s}},
    "learner_step": {"mlp_T20_N256"|"conv_T4_N32"|"nature_T20_N32" + "_rows"|"_shards":
    {N: samples/s}},
    "runtime": {"learner_idle"|"learner_idle_k256"|"learner_busy"|"learner_threads": {N: env
    steps/s}},
    "speedup": {section: {case: {N: value / value at the smallest N}}},
    "predicted_ceiling": {"actor_loop"|"runtime": {case: threads}}, "setup": {...}}``;
    every value a median of repeats.
    """
    threads = tuple(sorted(set(threads)))
    if not threads or threads[0] < 1 or threads[-1] > MAX_THREADS:
        raise ValueError(f"expected thread counts between 1 and {MAX_THREADS}, got {threads}")
    budget = QUICK if quick else FULL
    result: dict[str, Any] = {
        "threads": list(threads),
        "cpus": len(os.sched_getaffinity(0))
        if hasattr(os, "sched_getaffinity")
        else os.cpu_count(),
        "net_forward": _net_forward(threads, budget),
        "snapshot_pins": _snapshot_pins(threads, budget),
    }
    result["actor_loop"], loop_ceiling = _actor_loop(threads, budget)
    result["learner_step"] = _learner_step(threads, budget)
    result["runtime"], runtime_ceiling = _runtime(threads, budget)
    # Thread counts past which the GIL meter, read at the smallest count, says a path stops
    # scaling (Amdahl over its GIL-held share; 0: unbounded), beside the measured scaling.
    result["predicted_ceiling"] = {"actor_loop": loop_ceiling, "runtime": runtime_ceiling}
    result["speedup"] = {section: _speedups(result[section]) for section in SECTIONS}
    result["setup"] = {
        "mlp": "4-64-64 tanh, categorical(2) + value",
        "conv": "Nature-DQN torso on uint8 [84, 84, 4], categorical(6) + value",
        "envs_per_actor": NUM_ENVS,
        "unroll_length": UNROLL,
        "snapshot_floats": SNAPSHOT_FLOATS,
        "seconds_per_measure": budget.seconds,
        "repeats": budget.repeats,
        "learner_batches": {"mlp": LEARNER_MLP_BATCH, "conv": LEARNER_CONV_BATCH},
        "runtime_seconds": budget.runtime_s,
        "runtime_repeats": budget.runtime_repeats,
        "gil_release_threshold_flops": rlpar.gil_release_threshold(),
    }
    return result


def format_scaling(r: dict[str, Any]) -> str:
    """One table per section: a row per case, a column per thread count (value, then ×speedup)."""
    ns = [str(n) for n in r["threads"]]
    lines = [f"thread scaling on {r['cpus']} cpus (values per second; ×: over {ns[0]} thread)"]
    for section in SECTIONS:
        lines.append(f"{section:<22}" + "".join(f"{'N=' + n:>18}" for n in ns))
        for case, by_n in r[section].items():
            sp = r["speedup"][section][case]
            cells = "".join(f"{by_n[n]:>11.3g} ×{sp[n]:<5.3g}" for n in ns)
            lines.append(f"  {case:<20}{cells}")
    lines.append(f"predicted ceiling (GIL meter at N={ns[0]}; threads, 0: unbounded)")
    for section, by_case in r.get("predicted_ceiling", {}).items():
        cells = ", ".join(f"{case} {value:.3g}" for case, value in by_case.items())
        lines.append(f"  {section:<20}{cells}")
    return "\n".join(lines)


if __name__ == "__main__":
    import json

    print(json.dumps(bench_scaling(), indent=2))
