"""`rlpar bench envs` key "real_envs": the whole actor loop on GIL-bound real envs, per
`EnvConfig.vectorization` (MinAtar Breakout and Atari Pong, each where it is installed).

Each actor thread owns K = 16 envs and runs `rlpar.runtime.actor.Actor.unroll` (env steps, the
batched conv-policy forward on a pinned snapshot, sampling, rollout writing) with the learner
idle; env steps/s of all threads together, 1 and 2 threads. Modes:

- MinAtar Breakout (Python/numpy, conv 16x3x3 -> 128): "sync", "async" (worker processes,
  `workers_per_actor` = cores) and "async_double_buffer".
- Pong (Nature-DQN torso, 84x84x4): "ale" (ale-py's C++ vector env), "ale_double_buffer",
  "envpool", and "gymnasium_async" (gymnasium's own Atari env and preprocessing wrappers in
  "async" worker processes).

The configurations of one env take turns, repeat after repeat; every value is a median.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import gymnasium as gym
import numpy as np

import rlpar
from rlpar.bench.timing import import_optional, loop_rate, medians, sig
from rlpar.bench.workloads import PolicyAgent
from rlpar.config import EnvConfig
from rlpar.nn import Head
from rlpar.runtime.actor import Actor
from rlpar.runtime.common import EpisodeLog
from rlpar.runtime.envs import make_actor_envs

__all__ = ["REAL_FULL", "REAL_QUICK", "bench_real_envs", "make_preprocessed_pong"]

NUM_ENVS = 16
UNROLL = 20
THREADS = (1, 2)


@dataclass(frozen=True)
class Budget:
    loop_s: float  # one actor-loop run (after its warm-up)
    warmup_s: float
    repeats: int


REAL_FULL = Budget(loop_s=1.5, warmup_s=0.5, repeats=3)
REAL_QUICK = Budget(loop_s=0.05, warmup_s=0.02, repeats=1)


@dataclass(frozen=True)
class _Case:
    env: EnvConfig
    convs: tuple[tuple[int, int, int], ...]
    hidden: int


def make_preprocessed_pong() -> gym.Env:
    """Pong with gymnasium's own Atari wrappers and rlpar's standard preprocessing (as "ale"
    does natively): 84x84 grayscale, frame skip 4, 30 no-ops, 4 stacked frames, channels last."""
    import ale_py

    gym.register_envs(ale_py)
    env = gym.make("ALE/Pong-v5", frameskip=1, repeat_action_probability=0.25)
    env = gym.wrappers.AtariPreprocessing(env, noop_max=30, frame_skip=4, screen_size=84)
    env = gym.wrappers.FrameStackObservation(env, 4)
    hwc = gym.spaces.Box(0, 255, (84, 84, 4), np.uint8)
    return gym.wrappers.TransformObservation(env, lambda o: np.moveaxis(o, 0, -1), hwc)


def _cases() -> dict[str, dict[str, _Case]]:
    """Per env, per mode: what to run (only envs whose packages are installed)."""
    cases: dict[str, dict[str, _Case]] = {}
    nature = ((32, 8, 4), (64, 4, 2), (64, 3, 1))
    if import_optional("minatar") is not None:
        breakout: dict[str, Any] = {
            "id": "MinAtar/Breakout-v1",
            "setup": "minatar.gym:register_envs",
        }
        cases["minatar_breakout"] = {
            name: _Case(EnvConfig(**breakout, **kw), ((16, 3, 1),), 128)
            for name, kw in dict[str, dict[str, Any]](
                {
                    "sync": {},
                    "async": {"vectorization": "async"},
                    "async_double_buffer": {"vectorization": "async", "double_buffer": True},
                }
            ).items()
        }
    pong: dict[str, _Case] = {}
    if import_optional("ale_py.vector_env") is not None:
        pong["ale"] = _Case(EnvConfig("ALE/Pong-v5", vectorization="ale"), nature, 512)
        pong["ale_double_buffer"] = _Case(
            EnvConfig("ALE/Pong-v5", vectorization="ale", double_buffer=True), nature, 512
        )
    if import_optional("ale_py") is not None and import_optional("cv2") is not None:
        # gymnasium's AtariPreprocessing resizes with OpenCV
        if "rlpar-bench/Pong-v5" not in gym.registry:
            gym.register("rlpar-bench/Pong-v5", "rlpar.bench.real_envs:make_preprocessed_pong")
        pong["gymnasium_async"] = _Case(
            EnvConfig("rlpar-bench/Pong-v5", vectorization="async"), nature, 512
        )
    if import_optional("envpool") is not None:
        pong["envpool"] = _Case(EnvConfig("ALE/Pong-v5", vectorization="envpool"), nature, 512)
    if pong:
        cases["pong"] = pong
    return cases


class _ConvPolicy(PolicyAgent):
    """The bench's acting-only policy on a conv torso over uint8 frames [H, W, C]."""

    def __init__(self, convs: tuple[tuple[int, int, int], ...], hidden: int) -> None:
        self.convs, self.hidden = convs, hidden

    def net_spec(self, obs_space: gym.Space, action_space: gym.Space) -> rlpar.NetSpec:
        assert isinstance(action_space, gym.spaces.Discrete)
        assert isinstance(obs_space, gym.spaces.Box) and len(obs_space.shape) == 3
        heads: list[Head] = [rlpar.Categorical(int(action_space.n)), rlpar.Value()]
        h, w, c = obs_space.shape
        spec = rlpar.conv_spec((h, w, c), heads, self.convs, self.hidden)
        scale = 1 / 255 if float(np.max(obs_space.high)) > 1 else 1.0
        return rlpar.NetSpec(spec.input_shape, spec.layers, spec.heads, "uint8", scale)


class _RealWorker:
    """One actor thread's loop; ``steps`` grows after every rollout."""

    def __init__(self, case: _Case, index: int, net: rlpar.Net, store: Any) -> None:
        self.envs = make_actor_envs(case.env, NUM_ENVS)
        self.actor = Actor(
            index, envs=self.envs, agent=_ConvPolicy(case.convs, case.hidden), net=net,
            store=store, unroll_length=UNROLL, num_buffers=1, seed=0,
        )  # fmt: skip
        self.log = EpisodeLog()
        self.steps = 0

    def loop(self, stop: threading.Event) -> None:
        while not stop.is_set():
            r = self.actor.free.get()
            self.actor.unroll(r, self.log)
            self.actor.free.put(r)
            self.steps += UNROLL * NUM_ENVS


def _measure_env(cases: dict[str, _Case], budget: Budget) -> dict[str, dict[str, float]]:
    """All modes of one env, 1 and 2 threads, taking turns; closes every env it made."""
    workers: dict[tuple[str, int], list[_RealWorker]] = {}
    try:
        for mode, case in cases.items():
            probe = make_actor_envs(case.env, 2)
            spaces = (probe.single_observation_space, probe.single_action_space)
            probe.close()
            net = rlpar.Net(_ConvPolicy(case.convs, case.hidden).net_spec(*spaces))
            store = rlpar.SnapshotStore(net.num_params)
            store.publish(net.init_params(seed=0))
            for n in THREADS:
                workers[mode, n] = []
                for i in range(n):
                    workers[mode, n].append(_RealWorker(case, i, net, store))
        configs: dict[Any, Callable[[], float]] = {
            key: partial(loop_rate, ws, budget.warmup_s, budget.loop_s)
            for key, ws in workers.items()
        }
        med = medians(configs, budget.repeats)
    finally:
        for ws in workers.values():
            for w in ws:
                w.envs.close()
    return {mode: {str(n): sig(med[mode, n]) for n in THREADS} for mode in cases}


def bench_real_envs(quick: bool = False) -> dict[str, dict[str, dict[str, float]]]:
    """``{"minatar_breakout": {mode: {"1", "2": env steps/s}}, "pong": {...}}`` for the envs
    whose packages are installed (an env or a mode whose package is missing is left out)."""
    budget = REAL_QUICK if quick else REAL_FULL
    return {name: _measure_env(cases, budget) for name, cases in _cases().items()}
