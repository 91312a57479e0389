"""`rlpar bench envs`: env steps/s of native envs against gymnasium (and EnvPool when installed).

Two measurements on K = 64 CartPoles:

- ``env_only``: stepping the vector env with random actions (drawn beforehand, so the
  generator is not timed): rlpar's ``rlpar/CartPole-v1`` vector env, gymnasium's own vectorized
  ``CartPole-v1``, and EnvPool's when ``import envpool`` works (never a dependency).
- ``actor_loop``: 1 and 2 Python threads, each an actor with its own 64 envs, an mlp policy
  (4-64-64-(2+1)) on a pinned snapshot, categorical sampling and preallocated rollouts of 20
  steps, reporting env steps/s of all threads together. ``python_env``: rlpar's actor step
  loop (`rlpar.runtime.actor.Actor.unroll`: one native call between two env steps) on
  gymnasium's CartPole; ``native_env``: the same loop on rlpar's native CartPole;
  ``native_fused``: the fused native unroll (``NativeVectorEnv.fused_unroll``: one call per
  rollout, GIL released).

Configurations take turns, repeat after repeat, and every value is the median of the repeats.
"""

from __future__ import annotations

import importlib
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

import rlpar
from rlpar import _native
from rlpar.bench.timing import import_optional, loop_rate_gil, medians, sig
from rlpar.bench.workloads import PolicyAgent
from rlpar.data import Rollout
from rlpar.runtime.actor import Actor
from rlpar.runtime.common import EpisodeLog

__all__ = ["bench_envs"]

NUM_ENVS = 64
UNROLL = 20
THREADS = (1, 2)
ACTION_POOL = 512  # pre-drawn action batches, cycled through


@dataclass(frozen=True)
class Budget:
    env_s: float  # one timed chunk of env-only stepping
    loop_s: float  # one actor-loop run (after its warm-up)
    warmup_s: float
    repeats: int


FULL = Budget(env_s=0.3, loop_s=0.6, warmup_s=0.15, repeats=5)
QUICK = Budget(env_s=0.02, loop_s=0.05, warmup_s=0.02, repeats=1)


# ---------------------------------------------------------------------------------------------
# env only


class _Stepper:
    """A vector env and a pool of random action batches; ``run(seconds)`` returns steps/s."""

    def __init__(self, make: Callable[[], Any], n_actions: int = 2) -> None:
        self.env = make()  # made and reset
        rng = np.random.default_rng(0)
        self.actions = [rng.integers(n_actions, size=NUM_ENVS) for _ in range(ACTION_POOL)]
        self.i = 0

    def run(self, seconds: float) -> float:
        step, actions = self.env.step, self.actions
        calls, t0 = 0, time.perf_counter()
        deadline = t0 + seconds
        while True:
            for _ in range(32):
                step(actions[self.i])
                self.i = (self.i + 1) % ACTION_POOL
            calls += 32
            now = time.perf_counter()
            if now >= deadline:
                return calls * NUM_ENVS / (now - t0)


def _env_only(budget: Budget) -> dict[str, float]:
    rlpar_envs = importlib.import_module("rlpar.envs")  # installed from envs/

    rlpar_envs.register_envs()  # rlpar/CartPole-v1 (importing rlpar.envs does it too)

    def made(env: Any, **reset: Any) -> Any:
        env.reset(**reset)
        return env

    makers: dict[str, Callable[[], Any]] = {
        "rlpar": lambda: made(gym.make_vec("rlpar/CartPole-v1", num_envs=NUM_ENVS), seed=0),
        "gymnasium": lambda: made(
            gym.make_vec("CartPole-v1", num_envs=NUM_ENVS, vectorization_mode="vector_entry_point"),
            seed=0,
        ),
    }
    envpool = import_optional("envpool")
    if envpool is not None:
        # EnvPool takes its seed at creation (reset(seed=...) is ignored with a warning).
        makers["envpool"] = lambda: made(
            envpool.make("CartPole-v1", env_type="gymnasium", num_envs=NUM_ENVS, seed=0)
        )
    steppers = {name: _Stepper(make) for name, make in makers.items()}
    configs = {name: (lambda s=s: s.run(budget.env_s)) for name, s in steppers.items()}
    return {name: sig(rate) for name, rate in medians(configs, budget.repeats).items()}


# ---------------------------------------------------------------------------------------------
# actor loop


class _Worker:
    """One actor thread's loop of one kind; ``steps`` grows after every rollout."""

    def __init__(self, kind: str, index: int, net: rlpar.Net, store: rlpar.SnapshotStore) -> None:
        env_id = "CartPole-v1" if kind == "python_env" else "rlpar/CartPole-v1"
        self.envs = gym.make_vec(env_id, num_envs=NUM_ENVS)
        if kind == "native_env":
            # A plain wrapper hides fused_unroll: the actor takes its step loop.
            self.envs = gym.vector.VectorWrapper(self.envs)
        self.kind, self.net, self.store = kind, net, store
        self.steps = 0
        if kind == "native_fused":
            self.envs.reset(seed=index)
            space = self.envs.single_observation_space
            assert space.shape is not None and space.dtype is not None
            self.rollout = Rollout.allocate(
                UNROLL, NUM_ENVS, space.shape, space.dtype, (), np.dtype(np.int64), net.output_size
            )
            self.sampler = _native.CategoricalSampler(index)
            self.ep_return = np.zeros(NUM_ENVS)
            self.ep_length = np.zeros(NUM_ENVS, np.int64)
        else:
            self.actor = Actor(
                index, envs=self.envs, agent=PolicyAgent(), net=net, store=store,
                unroll_length=UNROLL, num_buffers=1, seed=0,
            )  # fmt: skip
            self.log = EpisodeLog()

    def loop(self, stop: threading.Event) -> None:
        while not stop.is_set():
            if self.kind == "native_fused":
                with self.store.pin() as snap:
                    self.envs.fused_unroll(  # type: ignore[attr-defined]  # native envs
                        self.net, snap, self.sampler, self.rollout, self.ep_return, self.ep_length
                    )
            else:
                r = self.actor.free.get()
                self.actor.unroll(r, self.log)
                self.actor.free.put(r)
            self.steps += UNROLL * NUM_ENVS


def actor_loop_workers(
    kinds: Sequence[str], threads: Sequence[int]
) -> dict[tuple[str, int], list[_Worker]]:
    """For each kind and thread count N, N workers sharing one net and one snapshot store."""
    rlpar_envs = importlib.import_module("rlpar.envs")  # installed from envs/

    rlpar_envs.register_envs()  # rlpar/CartPole-v1 (importing rlpar.envs does it too)

    agent = PolicyAgent()
    probe = gym.make_vec("rlpar/CartPole-v1", num_envs=1)
    net = rlpar.Net(agent.net_spec(probe.single_observation_space, probe.single_action_space))
    store = rlpar.SnapshotStore(net.num_params)
    store.publish(net.init_params(seed=0))
    return {
        (kind, n): [_Worker(kind, i, net, store) for i in range(n)]
        for kind in kinds
        for n in threads
    }


def actor_loop_measures(
    kinds: Sequence[str], threads: Sequence[int], budget: Budget, repeats: int
) -> dict[str, dict[str, dict[str, float]]]:
    """``{kind: {threads: {"rate", "held", "wait", "native", "ceiling"}}}``: env steps/s and
    the threads' GIL shares (`rlpar.bench.timing.loop_rate_gil`), medians of ``repeats``."""
    workers = actor_loop_workers(kinds, threads)
    configs = {
        key: (lambda ws=ws: loop_rate_gil(ws, budget.warmup_s, budget.loop_s))
        for key, ws in workers.items()
    }
    try:
        med = medians(configs, repeats)
    finally:
        for ws in workers.values():
            for w in ws:
                w.envs.close()
    return {
        kind: {
            str(n): {k: sig(v, 4 if k == "rate" else 3) for k, v in med[kind, n].items()}
            for n in threads
        }
        for kind in kinds
    }


def _actor_loop(budget: Budget) -> tuple[dict[str, Any], dict[str, Any]]:
    """(rates {kind: {threads: env steps/s}}, GIL shares {kind: {threads: {...}}})."""
    kinds = ("python_env", "native_env", "native_fused")
    measured = actor_loop_measures(kinds, THREADS, budget, budget.repeats)
    rates = {kind: {n: m["rate"] for n, m in by_n.items()} for kind, by_n in measured.items()}
    gil = {
        kind: {n: {k: v for k, v in m.items() if k != "rate"} for n, m in by_n.items()}
        for kind, by_n in measured.items()
    }
    return rates, gil


def bench_envs(quick: bool = False) -> dict[str, Any]:
    """``{"env_only": {"rlpar", "gymnasium"[, "envpool"]: steps/s}, "actor_loop": {"python_env"
    | "native_env" | "native_fused": {"1", "2": env steps/s over all threads}},
    "actor_loop_gil": {kind: {"1", "2": {"held", "wait", "native": the threads' GIL shares,
    "ceiling": threads the GIL could serve at that held share (0: unbounded)}}}, "real_envs":
    {env: {mode: {"1", "2": ...}}}}`` (see `rlpar.bench.real_envs`), medians."""
    from rlpar.bench.real_envs import bench_real_envs

    budget = QUICK if quick else FULL
    rates, gil = _actor_loop(budget)
    return {
        "env_only": _env_only(budget),
        "actor_loop": rates,
        "actor_loop_gil": gil,
        "num_envs": NUM_ENVS,
        "unroll_length": UNROLL,
        "real_envs": bench_real_envs(quick),
    }


if __name__ == "__main__":
    import json

    print(json.dumps(bench_envs(), indent=2))
