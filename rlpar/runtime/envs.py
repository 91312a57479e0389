"""Environments for actors: one gymnasium vector env per actor, seeded per (seed, actor, env)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, cast

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv

from rlpar._checks import did_you_mean
from rlpar.config import EnvConfig
from rlpar.runtime.env_modes import (
    AleEnvs,
    EnvPoolEnvs,
    GroupedAsyncEnvs,
    SplitEnvs,
    SyncHalf,
    takes_env_seeds,
)
from rlpar.runtime.env_setup import run_setup
from rlpar.runtime.observations import check_observations, storage_dtype

__all__ = ["ActionAdapter", "env_seeds", "explain_env_error", "make_actor_envs", "storage_dtype"]


def env_seeds(envs: VectorEnv, seed: int, actor: int, generation: int = 0) -> int | list[int]:
    """Seeds for ``envs.reset``: one per env from (seed, actor, env index, generation) for
    gymnasium's Sync/Async vector envs; one per actor for natively vectorized envs (such as
    gymnasium's CartPole vector env), which draw all their envs from one generator.
    ``generation`` counts resumes, so a resumed run does not replay its first episodes."""

    def draw(*key: int) -> int:
        return int(np.random.SeedSequence([seed, actor, *key, generation]).generate_state(1)[0])

    if takes_env_seeds(envs):
        return [draw(k) for k in range(envs.num_envs)]
    return draw(1 << 30)


def make_actor_envs(cfg: EnvConfig, num_envs: int) -> VectorEnv:
    """A vector env of ``num_envs`` copies of ``cfg.id``, stepped as ``cfg.vectorization``
    says (see `rlpar.runtime.env_modes`), with gymnasium's default NEXT_STEP autoreset.
    "sync": the env's own vectorized version when it has one, else `SyncVectorEnv`."""
    if cfg.vectorization in ("ale", "envpool"):
        return _engine_envs(cfg, num_envs)
    _register(cfg)
    encoder = check_observations(cfg)  # the observation contract: runtime/observations.py
    if cfg.vectorization == "async":
        workers = cfg.workers_per_actor or _default_workers(num_envs)
        if not cfg.double_buffer:
            return GroupedAsyncEnvs(cfg, num_envs, workers)
        if workers % 2:
            raise ValueError(
                "env.workers_per_actor: expected an even number with env.double_buffer (each "
                f"half of an actor's envs gets half of the workers), got {workers}"
            )
        return SplitEnvs(lambda n: GroupedAsyncEnvs(cfg, n, workers // 2), num_envs)
    if cfg.double_buffer:
        return SplitEnvs(lambda n: SyncHalf(_sync_envs(cfg, n, encoder)), num_envs)
    return _sync_envs(cfg, num_envs, encoder)


def _engine_envs(cfg: EnvConfig, num_envs: int) -> VectorEnv:
    """ "ale" and "envpool": the env ids are theirs, not gymnasium's registry's."""
    make: Callable[[int], VectorEnv]
    if cfg.vectorization == "ale":
        make = lambda n: AleEnvs(cfg.id, n, cfg.kwargs)  # noqa: E731
    else:
        make = lambda n: EnvPoolEnvs(cfg.id, n, cfg.kwargs)  # noqa: E731
    return SplitEnvs(make, num_envs) if cfg.double_buffer else make(num_envs)


def _default_workers(num_envs: int) -> int:
    """The most workers up to the core count that divide ``num_envs`` evenly."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(w for w in range(1, min(cores or 1, num_envs) + 1) if num_envs % w == 0)


def _register(cfg: EnvConfig) -> None:
    if cfg.id not in gym.registry:
        run_setup(cfg.setup)
    if cfg.id.startswith("rlpar/") and cfg.id not in gym.registry:
        run_setup("rlpar.envs")  # the native envs register themselves on import
    if cfg.id not in gym.registry:
        raise ValueError(
            f"unknown environment id {cfg.id!r}{did_you_mean(cfg.id, gym.registry)}; "
            + _how_to_register(cfg)
        )


def _how_to_register(cfg: EnvConfig) -> str:
    """What makes an id known: the package that registers it, imported by ``env.setup``."""
    if cfg.setup:
        return (
            f"env.setup = {cfg.setup!r} ran and did not register it: check the id and what "
            "that hook registers"
        )
    return (
        "an env of a package that registers its ids on import needs that import first: name "
        'the module in env.setup (the experiment key: [env] setup = "module" or '
        '"module:function"; --set env.setup=module; e.g. "minigrid" for MiniGrid ids), see '
        "docs/config.md"
    )


def _sync_envs(
    cfg: EnvConfig, num_envs: int, encoder: Callable[[gym.Env], gym.Env] | None
) -> VectorEnv:
    """gymnasium's `make_vec`; with an ``encoder`` (`rlpar.spaces`), a `SyncVectorEnv` of
    encoded envs (an env's own vector version would skip the encoding)."""
    if encoder is None:
        envs = gym.make_vec(cfg.id, num_envs=num_envs, **cfg.kwargs)
    else:
        wrap = cast(Callable[[gym.Env], gym.Wrapper], encoder)  # a FlatObservation
        envs = gym.make_vec(cfg.id, num_envs, "sync", wrappers=[wrap], **cfg.kwargs)
    return _check_autoreset(envs, cfg.id)


def _check_autoreset(envs: VectorEnv, env_id: str) -> VectorEnv:
    mode = envs.metadata.get("autoreset_mode", AutoresetMode.NEXT_STEP)
    if mode != AutoresetMode.NEXT_STEP:
        envs.close()
        raise ValueError(
            f"environment {env_id!r} autoresets in mode {mode}; rlpar expects NEXT_STEP "
            "(gymnasium's default), where the step after an episode's end is the reset step"
        )
    return envs


class ActionAdapter:
    """Checks the action space once, and turns sampled actions into what the env accepts.

    Discrete: int64 [K]. MultiDiscrete (1-D nvec) and MultiBinary (1-D): int64 [K, D], each
    dimension's choice counted from 0 (a MultiDiscrete's ``start`` is added, and a MultiBinary's
    bits cast to int8, on the way to the env). Box of any shape: float32 [K, A] with A the
    number of its elements, reshaped to the Box's shape and clipped to its bounds only on the
    way to the env (the rollout keeps the unclipped sample its log-probability belongs to).
    """

    def __init__(self, space: gym.Space) -> None:
        self.space = space
        self.low = self.high = None
        self.start: np.ndarray | None = None
        self.env_shape: tuple[int, ...] | None = None  # a Box's own shape, when not 1-D
        self.dtype: np.dtype = np.dtype(np.int64)
        if isinstance(space, gym.spaces.Discrete):
            self.shape: tuple[int, ...] = ()
        elif isinstance(space, gym.spaces.MultiDiscrete) and len(space.nvec.shape) == 1:
            self.shape = (len(space.nvec),)
            if np.any(space.start != 0):
                self.start = space.start.astype(np.int64)
        elif isinstance(space, gym.spaces.MultiBinary) and len(space.shape) == 1:
            self.shape = (int(space.shape[0]),)
        elif (
            isinstance(space, gym.spaces.Box)
            and np.issubdtype(space.dtype, np.floating)
            and int(np.prod(space.shape)) >= 1
        ):
            size = int(np.prod(space.shape))
            self.shape = (size,)
            self.dtype = np.dtype(np.float32)
            self.low = space.low.astype(np.float32).reshape(size)
            self.high = space.high.astype(np.float32).reshape(size)
            if len(space.shape) != 1:
                self.env_shape = tuple(int(d) for d in space.shape)
        else:
            raise ValueError(
                f"unsupported action space {space}: expected Discrete, MultiDiscrete or "
                "MultiBinary (one dimension of choices), or a float Box (any shape); a Tuple or "
                "Dict of actions, an integer Box or a MultiDiscrete of more than one dimension "
                "has no policy head yet"
            )

    def checked(self, actions: Any, num_envs: int, agent: object, method: str) -> np.ndarray:
        """``actions``, what ``agent``'s ``method`` ("act" or "greedy") returned for
        ``num_envs`` envs, if they are one action per env: int64 [K] (any integer dtype) for a
        Discrete space, int64 [K, D] for a MultiDiscrete or MultiBinary, float32 [K, A] (any
        float dtype) for a Box. Else ValueError naming
        the agent, what was expected and what came. A shape and dtype compare: no copy."""
        expected = (num_envs, *self.shape)
        kinds = "iu" if self.low is None else "f"
        dtype = getattr(actions, "dtype", None)
        if (
            isinstance(actions, np.ndarray)
            and actions.shape == expected
            and dtype is not None
            and dtype.kind in kinds
        ):
            return actions
        if isinstance(actions, np.ndarray):
            got = f"{actions.dtype} {list(actions.shape)}"
        else:
            got = f"{type(actions).__name__} {_short(actions)}"
        hint = ""
        if isinstance(actions, np.ndarray) and actions.size == int(np.prod(expected)):
            hint = f"; e.g. return actions.reshape({', '.join(map(str, expected))})"
        what = "K" if not self.shape else "K, *action_shape"
        raise ValueError(
            f"agent {type(agent).__name__}: {method} must return one action per env, "
            f"{self.dtype} [{what}] = {list(expected)} for the action space {self.space}, "
            f"got {got}{hint}"
        )

    def to_env(self, actions: np.ndarray) -> np.ndarray:
        """``actions`` [K, *shape] as the env takes them (see the class)."""
        if self.low is not None:
            clipped = np.clip(actions, self.low, self.high)
            return clipped if self.env_shape is None else clipped.reshape(-1, *self.env_shape)
        if self.start is not None:
            return actions + self.start
        if isinstance(self.space, gym.spaces.MultiBinary):
            return actions.astype(np.int8)
        return actions


def _short(value: object, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def explain_env_error(envs: VectorEnv, error: BaseException) -> BaseException:
    """A clearer error for ``error``, raised by stepping or resetting ``envs``, when one of
    its envs returned an observation that does not fit its observation space (gymnasium
    only says "Output array is the wrong shape"); else ``error`` itself."""
    env_obs = getattr(envs, "_env_obs", None)  # SyncVectorEnv keeps each env's last obs
    space = envs.single_observation_space
    if not isinstance(error, ValueError) or not isinstance(env_obs, list):
        return error
    for i, obs in enumerate(env_obs):
        got = np.asarray(obs)
        fits_dtype = space.dtype is None or np.can_cast(got.dtype, space.dtype, "same_kind")
        if got.shape != space.shape or not fits_dtype:
            spec = getattr(envs, "spec", None)
            name = repr(spec.id) if spec is not None else type(envs).__name__
            return ValueError(
                f"environment {name}: env {i} returned an observation of shape {got.shape} "
                f"and dtype {got.dtype}, but its observation space is {space} (shape "
                f"{space.shape}, dtype {space.dtype}): fix the env or its observation_space"
            )
    return error
