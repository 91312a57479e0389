"""`rlpar bench runtime`: env steps/s of the whole actor/learner runtime.

gymnasium's CartPole-v1 (its vectorized version) with the IMPALA agent's mlp policy, 1 and 2
actor threads, with the learner idle (it takes rollouts and hands them back without training,
in the learner's native loop as the runtime runs a built-in agent; and, for one actor, taking
each batch in Python as for an agent whose ``learn`` is Python) and busy (real IMPALA learner
steps). Rates are measured after a warm-up, the configurations
alternate, and each value is the median of the repeats. ``learner_step``: the learner step's
own GIL-held time, fused into one native call and as separate calls (`rlpar.bench.learner`).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import gymnasium as gym
import numpy as np

from rlpar.agent import Agent, LearnerState
from rlpar.bench.learner import bench_learner_step
from rlpar.bench.timing import import_optional, medians
from rlpar.config import EnvConfig, RuntimeConfig
from rlpar.data import Batch
from rlpar.learner_step import NativeLearn
from rlpar.nn import Net, NetSpec
from rlpar.registry import make_agent
from rlpar.runtime import Runner
from rlpar.runtime.envs import make_actor_envs

__all__ = ["bench_runtime", "env_only_rate", "runtime_measure"]


class _IdleLearner(Agent):
    """The IMPALA agent with a learner step that does nothing (actors alone are measured): in
    the learner's native loop (`rlpar.NativeLearn` with no passes), or with ``python_take``
    each batch taken in Python and handed to this ``learn``."""

    def __init__(self, inner: Agent, python_take: bool = False) -> None:
        self.inner = inner
        self.python_take = python_take

    @property
    def native_sampling(self) -> bool:  # type: ignore[override]
        """As the wrapped agent's (set by its net_spec): native envs then take the fused path."""
        return self.inner.native_sampling

    def net_spec(self, obs_space: gym.Space, action_space: gym.Space) -> NetSpec:
        return self.inner.net_spec(obs_space, action_space)

    def init_state(self, net: Net, params: np.ndarray) -> LearnerState:
        return self.inner.init_state(net, params)

    def act(self, net: Net, out: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return self.inner.act(net, out, rng)

    def learn(self, net: Net, state: LearnerState, batch: Batch) -> dict[str, float]:
        return {}

    def native_learn(self, net: Net, state: LearnerState) -> NativeLearn | None:
        plan = None if self.python_take else self.inner.native_learn(net, state)
        return None if plan is None else NativeLearn(plan.loss, passes=0)


#: `bench_runtime`'s MinAtar case (where MinAtar is installed): Breakout with its minimal action
#: set, "sync", the MinAtar suite's conv torso and unroll
MINATAR = EnvConfig("MinAtar/Breakout-v1", setup="minatar.gym:register_envs")
MINATAR_SPLIT = dataclasses.replace(MINATAR, double_buffer=True)
MINATAR_NET: dict[str, Any] = {"conv": [[16, 3, 1]], "conv_hidden": 128}
MINATAR_UNROLL = 20


class _ImageEnv(gym.Env):
    """An 84 x 84 x 3 uint8 frame, or (``vector``) a Dict of that frame and a 16-float vector,
    that costs nothing to step (the same arrays every step, episodes of 200 steps): what the
    runtime does per observation of each kind, and nothing else."""

    def __init__(self, vector: bool = False) -> None:
        image = gym.spaces.Box(0, 255, (84, 84, 3), np.uint8)
        vec = gym.spaces.Box(-1.0, 1.0, (16,), np.float32)
        self.vector = vector
        self.observation_space = (
            gym.spaces.Dict({"image": image, "vector": vec}) if vector else image
        )
        self.action_space = gym.spaces.Discrete(4)
        rng = np.random.default_rng(0)
        self._image = rng.integers(0, 256, (84, 84, 3), dtype=np.uint8)
        self._vec = rng.uniform(-1.0, 1.0, 16).astype(np.float32)
        self._t = 0

    def _obs(self) -> Any:
        return {"image": self._image, "vector": self._vec} if self.vector else self._image

    def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[Any, dict]:
        super().reset(seed=seed)
        self._t = 0
        return self._obs(), {}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        self._t += 1
        return self._obs(), 0.0, False, self._t >= 200, {}


#: `bench_runtime`'s observation-kind case: one actor on a Box frame against a Dict of the
#: same frame and a vector (the frame through its own conv, `encoders = "per_leaf"`)
IMAGE_BOX, IMAGE_DICT = "rlpar-bench/Image-v0", "rlpar-bench/ImageDict-v0"
IMAGE_NET: dict[str, Any] = {
    "conv": [[16, 8, 4], [32, 4, 2]],
    "conv_hidden": 256,
    "hidden": [256],
    "activation": "relu",
    "encoders": "per_leaf",
}
IMAGE_ENVS = 8


def _register_image_envs() -> None:
    for env_id, vector in ((IMAGE_BOX, False), (IMAGE_DICT, True)):
        if env_id not in gym.registry:
            gym.register(
                env_id,
                lambda vector=vector, **kw: _ImageEnv(vector, **kw),
                disable_env_checker=True,  # the same arrays every step, on purpose
            )


_GIL_KEYS = ("actor_held", "actor_wait", "actor_native", "learner_held", "ceiling")


def _gil_shares(m: dict[str, float]) -> dict[str, float]:
    """The GIL shares of a `runtime_measure` result, rounded."""
    return {k: round(m[k], 3) for k in _GIL_KEYS}


def runtime_measure(
    num_actors: int,
    busy: bool,
    seconds: float,
    envs_per_actor: int,
    env_id: str | EnvConfig = "CartPole-v1",
    unroll_length: int = 16,
    learner_threads: int = 1,
    batch_rollouts: int = 1,
    python_take: bool = False,
    net: dict[str, Any] | None = None,
) -> dict[str, float]:
    """Env steps/s of one run ("rate", read from its progress reports after the first third),
    with the IMPALA learner (its ``net`` config; None: its default) training (``busy``) or
    idle (`_IdleLearner`; ``python_take``: it takes each batch in Python), with the run's GIL
    shares (`Progress.gil`): "actor_held", "actor_wait", "actor_native" (all actors together),
    "learner_held", and "ceiling" (actor threads the GIL could serve at these shares; 0 when
    unbounded); and the run's "wall_s", "rollouts" (all actors') and "learner_steps", to turn
    the shares into times, and "side_unrolls" (of the rollouts, those acted on the step loops'
    side threads: "sync" double buffering); "env_s" and "inference_s", the actors' time
    stepping envs and in their step loops' calls (`rlpar.runtime.common.ActorStats`)."""
    config: dict[str, Any] = {"optim": {"lr": 0.003}}
    if net is not None:
        config["net"] = net
    agent = make_agent("impala", config)
    if not busy:
        agent = _IdleLearner(agent, python_take)
    runtime = RuntimeConfig(
        num_actors=num_actors, envs_per_actor=envs_per_actor, unroll_length=unroll_length,
        batch_rollouts=batch_rollouts, total_env_steps=10**12, max_wall_s=seconds,
        checkpoint_interval_s=None, learner_threads=learner_threads,
    )  # fmt: skip
    samples: list[tuple[float, int]] = []
    env = env_id if isinstance(env_id, EnvConfig) else EnvConfig(env_id)
    runner = Runner(agent, env, runtime)
    result = runner.run(
        on_progress=lambda p: samples.append((p.wall_s, p.env_steps)), progress_interval_s=0.1
    )
    warm = [s for s in samples if s[0] >= seconds / 3]
    (t0, n0), (t1, n1) = warm[0], warm[-1]
    gil = result.gil
    return {
        "rate": (n1 - n0) / (t1 - t0),
        "actor_held": gil["actors"]["held"],
        "actor_wait": gil["actors"]["wait"],
        "actor_native": gil["actors"]["native"],
        "learner_held": gil["learner"]["held"],
        "ceiling": gil["actor_ceiling"] or 0.0,
        "wall_s": result.wall_s,
        "rollouts": float(sum(a.stats.rollouts for a in runner.actors)),
        "side_unrolls": float(sum(a.stats.side_unrolls for a in runner.actors)),
        "env_s": sum(a.stats.env_s for a in runner.actors),
        "inference_s": sum(a.stats.inference_s for a in runner.actors),
        "learner_steps": float(result.learner_steps),
    }


def env_only_rate(seconds: float, num_envs: int, env_id: str | EnvConfig = "CartPole-v1") -> float:
    """Env steps/s of one thread that only steps the runtime's vector env (`make_actor_envs`;
    ``"sync"`` for an id, random actions drawn beforehand): the most a Python env allows
    without processes."""
    env = env_id if isinstance(env_id, EnvConfig) else EnvConfig(env_id)
    envs = make_actor_envs(env, num_envs)
    try:
        envs.reset(seed=0)
        envs.action_space.seed(0)
        actions = [envs.action_space.sample() for _ in range(64)]
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            for a in actions:
                envs.step(a)
            n += len(actions)
        return n * num_envs / (time.perf_counter() - t0)
    finally:
        envs.close()


def bench_runtime(quick: bool = False) -> dict[str, Any]:
    """``{"env_steps_per_s": {"1": .., "2": ..}, "with_learner": {"1": .., "2": ..},
    "python_take_learner": {"1": ..} (the idle learner taking batches in Python),
    "minatar_breakout": one actor on MinAtar Breakout "sync" against its env-only rate, and
    the same with double buffering ("double_buffer"), where MinAtar is installed,
    "env_only_steps_per_s": one thread stepping the same vector env, "ratios": {...},
    "gil": {configuration: GIL shares and the predicted actor ceiling}, "learner_step":
    {agent: the learner step's GIL-held time, fused and separate}}``."""
    seconds, repeats = (0.6, 1) if quick else (3.0, 3)
    envs_per_actor = 16
    minatar = import_optional("minatar") is not None
    med = medians(_runtime_configs(seconds, envs_per_actor, minatar), repeats)
    out = _cartpole_report(med)
    if minatar:
        out["minatar_breakout"] = _minatar_report(med, envs_per_actor)
    out["dict_observation"] = _dict_report(med)
    out["learner_step"] = bench_learner_step(quick)
    out["setup"] = {
        "env": "CartPole-v1 (gymnasium vector env)",
        "envs_per_actor": envs_per_actor,
        "unroll_length": 16,
        "policy": "mlp 4-64-64 tanh, categorical + value",
        "seconds_per_measure": seconds,
        "repeats": repeats,
    }
    return out


def _runtime_configs(seconds: float, envs_per_actor: int, minatar: bool) -> dict[Any, Any]:
    """What `bench_runtime` measures side by side: {key: a function returning its measure}."""
    configs: dict[Any, Any] = {
        (actors, busy): (lambda a=actors, b=busy: runtime_measure(a, b, seconds, envs_per_actor))
        for actors in (1, 2)
        for busy in (False, True)
    }
    configs["python_take"] = lambda: runtime_measure(
        1, False, seconds, envs_per_actor, python_take=True
    )
    configs["env_only"] = lambda: env_only_rate(seconds / 2, envs_per_actor)
    _register_image_envs()
    for env_id in (IMAGE_BOX, IMAGE_DICT):
        configs[env_id] = lambda e=env_id: runtime_measure(
            1, False, seconds, IMAGE_ENVS, e, 16, net=IMAGE_NET
        )
    if minatar:
        for busy in (False, True):
            for key, env in (("minatar", MINATAR), ("minatar_double_buffer", MINATAR_SPLIT)):
                configs[key, busy] = lambda b=busy, e=env: runtime_measure(
                    1, b, seconds, envs_per_actor, e, MINATAR_UNROLL, net=MINATAR_NET
                )
        configs["minatar_env_only"] = lambda: env_only_rate(seconds / 2, envs_per_actor, MINATAR)
    return configs


def _cartpole_report(med: dict[Any, Any]) -> dict[str, Any]:
    """The CartPole part of `bench_runtime`'s result from the medians ``med``."""
    rate = {key: m["rate"] for key, m in med.items() if isinstance(m, dict)}
    out: dict[str, Any] = {
        "env_steps_per_s": {str(a): round(rate[(a, False)]) for a in (1, 2)},
        "with_learner": {str(a): round(rate[(a, True)]) for a in (1, 2)},
        "python_take_learner": {"1": round(rate["python_take"])},
        "env_only_steps_per_s": round(med["env_only"]),
    }
    out["ratios"] = {
        "two_actors_vs_one": round(rate[(2, False)] / rate[(1, False)], 3),
        "learner_cost": {str(a): round(1 - rate[(a, True)] / rate[(a, False)], 3) for a in (1, 2)},
        "one_actor_vs_env_only": round(rate[(1, False)] / med["env_only"], 3),
        "one_actor_python_take_vs_env_only": round(rate["python_take"] / med["env_only"], 3),
    }
    # GIL shares per configuration; the 1-actor rows predict the ceiling (no contention yet).
    out["gil"] = {
        f"{a}_actor{'s' if a > 1 else ''}{'_with_learner' if busy else ''}": _gil_shares(
            med[(a, busy)]
        )
        for a in (1, 2)
        for busy in (False, True)
    }
    out["gil"]["1_actor_python_take"] = _gil_shares(med["python_take"])
    return out


def _dict_report(med: dict[Any, Any]) -> dict[str, Any]:
    """One actor (learner idle) on the 84 x 84 x 3 frame as a Box against a Dict of the same
    frame and a 16-float vector: env steps/s, the ratio, and the actor's time a step."""
    box, dct = med[IMAGE_BOX], med[IMAGE_DICT]

    def per_step_us(m: dict[str, float]) -> dict[str, float]:
        steps = m["rollouts"] * 16
        return {k: round(m[f"{k}_s"] / steps * 1e6, 1) for k in ("env", "inference")}

    return {
        "env_steps_per_s": {
            "box_image": round(box["rate"]),
            "dict_image_vector": round(dct["rate"]),
        },
        "ratio_dict_vs_box": round(dct["rate"] / box["rate"], 3),
        "actor_us_per_step": {"box_image": per_step_us(box), "dict_image_vector": per_step_us(dct)},
        "setup": f"1 actor x {IMAGE_ENVS} envs sync, T = 16, learner idle; Box: uint8 frame "
        "(84, 84, 3) fed as it is; Dict: that frame + a (16,) float vector, encoded to float32 "
        "(rlpar.spaces.FlatObservation), the frame through its own conv (encoders = per_leaf); "
        "conv 16x8x8/4, 32x4x4/2, then 256",
    }


def _minatar_report(med: dict[Any, Any], envs_per_actor: int) -> dict[str, Any]:
    """The MinAtar Breakout part of `bench_runtime`'s result: "sync" and double buffering
    against the env-only rate."""
    only = med["minatar_env_only"]
    sync = {busy: med["minatar", busy] for busy in (False, True)}
    split = {busy: med["minatar_double_buffer", busy] for busy in (False, True)}

    def per_step_us(m: dict[str, float]) -> dict[str, float]:
        """The actor's time a step of its K envs: stepping them, and in the loop's calls."""
        steps = m["rollouts"] * MINATAR_UNROLL
        return {k: round(m[f"{k}_s"] / steps * 1e6, 1) for k in ("env", "inference")}

    def gil(by_busy: dict[bool, Any]) -> dict[str, Any]:
        return {
            f"1_actor{'_with_learner' if busy else ''}": _gil_shares(m)
            for busy, m in by_busy.items()
        }

    report: dict[str, Any] = {
        "env_steps_per_s": {"1": round(sync[False]["rate"])},
        "with_learner": {"1": round(sync[True]["rate"])},
        "env_only_steps_per_s": round(only),
        "ratios": {
            "one_actor_vs_env_only": round(sync[False]["rate"] / only, 3),
            "one_actor_with_learner_vs_env_only": round(sync[True]["rate"] / only, 3),
        },
        "gil": gil(sync),
        "actor_us_per_step": per_step_us(sync[False]),
        "env_only_us_per_step": round(envs_per_actor / only * 1e6, 1),
        "setup": f"{MINATAR.id} sync x{envs_per_actor}, T = {MINATAR_UNROLL}, conv 16x3x3 "
        "-> 128, categorical + value",
    }
    report["double_buffer"] = {
        "env_steps_per_s": {"1": round(split[False]["rate"])},
        "with_learner": {"1": round(split[True]["rate"])},
        "ratios": {
            "one_actor_vs_env_only": round(split[False]["rate"] / only, 3),
            "one_actor_with_learner_vs_env_only": round(split[True]["rate"] / only, 3),
            "vs_sync": round(split[False]["rate"] / sync[False]["rate"], 3),
            "with_learner_vs_sync": round(split[True]["rate"] / sync[True]["rate"], 3),
        },
        "actor_us_per_step": per_step_us(split[False]),
        "side_unroll_share": {
            "1": round(split[False]["side_unrolls"] / split[False]["rollouts"], 3),
            "1_with_learner": round(split[True]["side_unrolls"] / split[True]["rollouts"], 3),
        },
        "gil": gil(split),
    }
    return report
