"""What a GIL hand-off costs here, and which calls should release the GIL. Side by side in one
process, taking turns, medians of the rounds:

    python experiments/gil_handoff.py [ROUNDS]

1. The floor no runtime can go below: two Python threads that each only step their own
   gymnasium CartPole vector env (64 envs, random actions; and MinAtar Breakout's "sync" vector
   env of 16 where MinAtar is installed), and two that only draw from their
   own numpy Generator (numpy releases the GIL for every draw, so a waiting thread takes it:
   one hand-off per draw), against one thread.
2. rlpar's actor step loop (`rlpar bench envs`'s ``python_env`` and ``native_env``, 64
   CartPoles a thread, mlp 4-64-64) and MinAtar Breakout "sync" (16 envs, conv policy) at 1
   and 2 threads for several GIL release thresholds (`rlpar.set_gil_release_threshold`, flops
   a call must do to release the GIL): env steps/s and the ratio 2 / 1.
"""

from __future__ import annotations

import statistics
import sys
import threading
import time
from collections.abc import Callable

import gymnasium as gym
import numpy as np

import rlpar
from rlpar.bench.envs import actor_loop_workers
from rlpar.bench.timing import import_optional, loop_rate_gil
from rlpar.bench.workloads import PolicyAgent
from rlpar.config import EnvConfig
from rlpar.runtime.actor import Actor
from rlpar.runtime.common import EpisodeLog
from rlpar.runtime.envs import make_actor_envs

THRESHOLDS = [70e3, 1e6, 4e6, 16e6, 1e30]  # 70e3: the default; 1e30: never release


def threads_rate(make_work: Callable[[int], Callable[[], int]], n: int, seconds: float) -> float:
    """Units of work per second of ``n`` threads, each running its own ``make_work(i)()``
    (which returns the units it did) until ``seconds`` have passed."""
    done = [0] * n
    works = [make_work(i) for i in range(n)]

    def run(i: int) -> None:
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            done[i] += works[i]()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(done) / (time.perf_counter() - t0)


def floor_workloads() -> dict[str, Callable[[int], Callable[[], int]]]:
    envsets = [gym.make_vec("CartPole-v1", num_envs=64) for _ in range(2)]
    for e in envsets:
        e.reset(seed=0)
    actions = np.random.default_rng(0).integers(0, 2, (64, 64))
    gens = [np.random.default_rng(i) for i in range(2)]

    def env_steps(i: int) -> Callable[[], int]:
        def work() -> int:
            for a in actions[:8]:
                envsets[i].step(a)
            return 8 * 64

        return work

    def draws(i: int) -> Callable[[], int]:
        def work() -> int:
            for _ in range(64):
                gens[i].uniform(-0.05, 0.05, size=4)
            return 64

        return work

    floors: dict[str, Callable[[int], Callable[[], int]]] = {
        "gymnasium CartPole x64 env steps": env_steps,
        "numpy Generator draws": draws,
    }
    if import_optional("minatar") is not None:
        env = EnvConfig("MinAtar/Breakout-v1", setup="minatar.gym:register_envs")
        breakouts = [make_actor_envs(env, 16) for _ in range(2)]
        for e in breakouts:
            e.reset(seed=0)
        moves = np.random.default_rng(0).integers(0, 3, (8, 16))

        def minatar_steps(i: int) -> Callable[[], int]:
            def work() -> int:
                for a in moves:
                    breakouts[i].step(a)
                return 8 * 16

            return work

        floors["MinAtar Breakout x16 env steps"] = minatar_steps
    return floors


class ConvPolicy(PolicyAgent):
    """The MinAtar suite's torso (16 3x3 convs, 128 hidden) acting on uint8 frames."""

    def net_spec(self, obs_space: gym.Space, action_space: gym.Space) -> rlpar.NetSpec:
        assert isinstance(action_space, gym.spaces.Discrete) and obs_space.shape is not None
        heads: list[rlpar.Categorical | rlpar.Value] = [
            rlpar.Categorical(int(action_space.n)),
            rlpar.Value(),
        ]
        h, w, c = obs_space.shape
        spec = rlpar.conv_spec((h, w, c), heads, ((16, 3, 1),), 128)
        return rlpar.NetSpec(spec.input_shape, spec.layers, spec.heads, "uint8", 1.0)


class MinAtarWorker:
    """One actor thread on 16 MinAtar Breakout envs ("sync"); ``steps`` grows per rollout."""

    def __init__(self, index: int, net: rlpar.Net, store: rlpar.SnapshotStore) -> None:
        env = EnvConfig("MinAtar/Breakout-v1", setup="minatar.gym:register_envs")
        self.envs = make_actor_envs(env, 16)
        self.actor = Actor(index, envs=self.envs, agent=ConvPolicy(), net=net, store=store,
                           unroll_length=20, num_buffers=1, seed=0)  # fmt: skip
        self.log, self.steps = EpisodeLog(), 0

    def loop(self, stop: threading.Event) -> None:
        while not stop.is_set():
            r = self.actor.free.get()
            self.actor.unroll(r, self.log)
            self.actor.free.put(r)
            self.steps += r.env_steps


def minatar_workers() -> dict[int, list[MinAtarWorker]]:
    if import_optional("minatar") is None:
        return {}
    probe = make_actor_envs(EnvConfig("MinAtar/Breakout-v1", setup="minatar.gym:register_envs"), 1)
    net = rlpar.Net(ConvPolicy().net_spec(probe.single_observation_space,
                                          probe.single_action_space))  # fmt: skip
    probe.close()
    store = rlpar.SnapshotStore(net.num_params)
    store.publish(net.init_params(seed=0))
    return {n: [MinAtarWorker(i, net, store) for i in range(n)] for n in (1, 2)}


def main(rounds: int) -> None:
    print(f"CPU: {cpu_name()}; switch interval {sys.getswitchinterval() * 1e3:.0f} ms")
    floors = floor_workloads()
    floor_runs: dict[tuple[str, int], list[float]] = {}
    for _ in range(rounds):
        for name, make in floors.items():
            for n in (1, 2):
                floor_runs.setdefault((name, n), []).append(threads_rate(make, n, 1.0))
    for name in floors:
        one, two = (statistics.median(floor_runs[name, n]) for n in (1, 2))
        print(f"floor: {name}: 1 thread {one:,.0f}/s, 2 threads {two:,.0f}/s (x{two / one:.2f})")

    workers: dict[tuple[str, int], list] = dict(actor_loop_workers(("python_env", "native_env"),
                                                                   (1, 2)))  # fmt: skip
    for n, ws in minatar_workers().items():
        workers["minatar_sync", n] = ws
    default = rlpar.gil_release_threshold()
    runs: dict[tuple[float, str, int], list[float]] = {}
    try:
        for _ in range(rounds):
            for threshold in THRESHOLDS:
                rlpar.set_gil_release_threshold(threshold)
                for (kind, n), ws in workers.items():
                    rate = loop_rate_gil(ws, 0.2, 1.0)["rate"]
                    runs.setdefault((threshold, kind, n), []).append(rate)
    finally:
        rlpar.set_gil_release_threshold(default)
        for ws in workers.values():
            for w in ws:
                w.envs.close()
    kinds = sorted({kind for kind, _ in workers})
    for threshold in THRESHOLDS:
        label = "never" if threshold >= 1e29 else f"{threshold:,.0f} flops"
        cells = []
        for kind in kinds:
            one, two = (statistics.median(runs[threshold, kind, n]) for n in (1, 2))
            cells.append(f"{kind} {one:,.0f} / {two:,.0f} (x{two / one:.2f})")
        print(f"release above {label}: " + "; ".join(cells))


def cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 3)
