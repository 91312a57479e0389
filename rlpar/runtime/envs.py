"""Environments for actors: one gymnasium vector env per actor, seeded per (seed, actor, env)."""

from __future__ import annotations

import importlib

import gymnasium as gym
import numpy as np
from gymnasium.vector import AsyncVectorEnv, AutoresetMode, SyncVectorEnv, VectorEnv

from rlpar._checks import did_you_mean
from rlpar.config import EnvConfig

__all__ = ["ActionAdapter", "env_seeds", "explain_env_error", "make_actor_envs"]


def env_seeds(envs: VectorEnv, seed: int, actor: int, generation: int = 0) -> int | list[int]:
    """Seeds for ``envs.reset``: one per env from (seed, actor, env index, generation) for
    gymnasium's Sync/Async vector envs; one per actor for natively vectorized envs (such as
    gymnasium's CartPole vector env), which draw all their envs from one generator.
    ``generation`` counts resumes, so a resumed run does not replay its first episodes."""

    def draw(*key: int) -> int:
        return int(np.random.SeedSequence([seed, actor, *key, generation]).generate_state(1)[0])

    if isinstance(envs, (SyncVectorEnv, AsyncVectorEnv)):
        return [draw(k) for k in range(envs.num_envs)]
    return draw(1 << 30)


def run_setup(setup: str | None) -> None:
    """Import "module" or call "module:function" (what `EnvConfig.setup` names)."""
    if not setup:
        return
    module_name, _, function = setup.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"env.setup: cannot import {module_name!r} ({e})") from e
    if function:
        fn = getattr(module, function, None)
        if not callable(fn):
            raise ValueError(f"env.setup: {module_name!r} has no function {function!r}")
        fn()


def make_actor_envs(cfg: EnvConfig, num_envs: int) -> VectorEnv:
    """A vector env of ``num_envs`` copies of ``cfg.id`` (the env's own vectorized version when
    it has one, else synchronous), with gymnasium's default NEXT_STEP autoreset."""
    if cfg.id not in gym.registry:
        run_setup(cfg.setup)
    if cfg.id.startswith("rlpar/") and cfg.id not in gym.registry:
        run_setup("rlpar.envs")  # the native envs register themselves on import
    if cfg.id not in gym.registry:
        raise ValueError(f"unknown environment id {cfg.id!r}{did_you_mean(cfg.id, gym.registry)}")
    envs = gym.make_vec(cfg.id, num_envs=num_envs, **cfg.kwargs)
    mode = envs.metadata.get("autoreset_mode", AutoresetMode.NEXT_STEP)
    if mode != AutoresetMode.NEXT_STEP:
        envs.close()
        raise ValueError(
            f"environment {cfg.id!r} autoresets in mode {mode}; rlpar expects NEXT_STEP "
            "(gymnasium's default), where the step after an episode's end is the reset step"
        )
    return envs


def storage_dtype(space: gym.Space) -> np.dtype:
    """How observations are stored and fed to the net: float32 for real-valued boxes, uint8 for
    byte and boolean frames (MinAtar's channels are bool)."""
    if not isinstance(space, gym.spaces.Box):
        raise ValueError(f"unsupported observation space {space}: expected a Box")
    if np.issubdtype(space.dtype, np.floating):
        return np.dtype(np.float32)
    if space.dtype in (np.uint8, np.bool_):
        return np.dtype(np.uint8)
    raise ValueError(f"unsupported observation dtype {space.dtype}: expected float, uint8 or bool")


class ActionAdapter:
    """Checks the action space once, and turns sampled actions into what the env accepts.

    Discrete: int64 [K]. Box (1-D): float32 [K, A], clipped to the bounds only here, on the way
    to the env (the rollout keeps the unclipped sample its log-probability belongs to).
    """

    def __init__(self, space: gym.Space) -> None:
        self.space = space
        if isinstance(space, gym.spaces.Discrete):
            self.shape: tuple[int, ...] = ()
            self.dtype = np.dtype(np.int64)
            self.low = self.high = None
        elif isinstance(space, gym.spaces.Box) and len(space.shape) == 1:
            self.shape = tuple(space.shape)
            self.dtype = np.dtype(np.float32)
            self.low = space.low.astype(np.float32)
            self.high = space.high.astype(np.float32)
        else:
            raise ValueError(f"unsupported action space {space}: expected Discrete or a 1-D Box")

    def to_env(self, actions: np.ndarray) -> np.ndarray:
        if self.low is None:
            return actions
        return np.clip(actions, self.low, self.high)


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
        if got.shape != space.shape or not np.can_cast(got.dtype, space.dtype, "same_kind"):
            spec = getattr(envs, "spec", None)
            name = repr(spec.id) if spec is not None else type(envs).__name__
            return ValueError(
                f"environment {name}: env {i} returned an observation of shape {got.shape} "
                f"and dtype {got.dtype}, but its observation space is {space} (shape "
                f"{space.shape}, dtype {space.dtype}): fix the env or its observation_space"
            )
    return error
