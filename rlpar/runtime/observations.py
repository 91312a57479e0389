"""The observation contract: what an env's observations may be, and what rlpar makes of them.

Every other gymnasium space is first encoded, one env at a time, into a float32 ``Box``
(`rlpar.spaces`: one-hot for Discrete leaves, Dict and Tuple leaves side by side). A ``Box``
rlpar stores observations of (in rollouts, ``obs [T + 1, K, *shape]``) is fed to the net as:

====================================  ================  ==================================
observation space dtype               stored and fed    an observation of another dtype
====================================  ================  ==================================
float16/32/64                         float32           bool or any integer or float dtype:
                                                        cast, with one warning
uint8, or bool (MinAtar's channels)   uint8             bool or any integer dtype: cast,
                                                        with one warning; a float is an error
====================================  ================  ==================================

An observation's shape must be the space's (``Box.shape``); anything else is an error naming
both shapes when an actor first stores one. The dtype check runs once per env id and kwargs in
a process, on a probe env's ``reset()`` and first ``step()``, when an actor's envs are made
(`check_observations`). The casting itself is
done by gymnasium's vector envs, which write every observation into an array of the space's
dtype: the warning says that it happens, so an env that returns float64 for a float32 space
trains as it would with float32, and an env whose frames are floats in a uint8 space fails
instead of training on truncated pixels.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np

from rlpar.config import EnvConfig
from rlpar.spaces import encoder_for

__all__ = ["check_observation", "check_observations", "storage_dtype"]

log = logging.getLogger("rlpar")

_CHECKED: dict[str, Callable[[gym.Env], gym.Env] | None] = {}


def check_observations(cfg: EnvConfig) -> Callable[[gym.Env], gym.Env] | None:
    """Check the observations of one env of ``cfg`` (a registered gymnasium id) against its
    space, once per id, kwargs and ``drop_keys`` in this process (see the module docstring):
    ValueError for one rlpar cannot use, one warning for one it casts. Returns the wrapper
    that encodes each env's observations (`rlpar.spaces.encoder_for`), None for a space fed as
    it is."""
    key = json.dumps([cfg.id, cfg.kwargs, cfg.drop_keys], sort_keys=True, default=repr)
    if key in _CHECKED:
        return _CHECKED[key]
    try:
        env = gym.make(cfg.id, disable_env_checker=True, **cfg.kwargs)
    except gym.error.DependencyNotInstalled as e:
        # e.g. LunarLander without Box2D: one line naming the env and what to install
        raise ValueError(f"env {cfg.id!r} needs a package that is not installed: {e}") from None
    try:
        encoder = encoder_for(env.observation_space, cfg.drop_keys, cfg.id)
        if encoder is not None:
            env = encoder(env)
        space = env.observation_space
        storage_dtype(space, cfg.id)
        first = check_observation(cfg.id, space, env.reset(seed=0)[0], "reset()")
        then = check_observation(cfg.id, space, env.step(env.action_space.sample())[0], "step()")
    finally:
        env.close()
    _CHECKED[key] = encoder
    if first or then:
        log.warning("%s", first or then)
    return encoder


def storage_dtype(space: gym.Space, env_id: str | None = None) -> np.dtype:
    """How observations of ``space`` are stored and fed to the net: float32 for real-valued
    boxes, uint8 for byte and boolean frames (MinAtar's channels are bool). ValueError naming
    the env ``env_id`` (where known) and the space for any other."""
    env = f"env {env_id!r}: " if env_id else ""
    if not isinstance(space, gym.spaces.Box):
        raise ValueError(f"{env}unsupported observation space {space}: expected a Box")
    if np.issubdtype(space.dtype, np.floating):
        return np.dtype(np.float32)
    if space.dtype in (np.uint8, np.bool_):
        return np.dtype(np.uint8)
    raise ValueError(
        f"{env}unsupported observation dtype {space.dtype} of its observation space {space}: "
        "expected a float dtype (fed as float32), uint8 or bool (fed as uint8). Declare the "
        "space with one of them (e.g. Box(low, high, shape, np.float32)) and return "
        "observations of that dtype"
    )


def check_observation(env_id: str, space: gym.Space, obs: Any, where: str) -> str | None:
    """Raise ValueError for an observation ``obs`` (what ``where`` returned) whose dtype rlpar
    cannot feed as ``space`` says; the warning to give when its dtype differs but casts, else
    None (a shape that differs is left to the actor's check)."""
    if not isinstance(space, gym.spaces.Box):
        return None  # make_actor_envs' callers name an unsupported space themselves
    got = np.asarray(obs)
    if got.shape != space.shape or got.dtype == space.dtype:
        return None  # a wrong shape: the actor's error names both shapes
    floats = np.issubdtype(space.dtype, np.floating)
    kind = got.dtype.kind  # b bool, i/u integers, f floats
    if kind not in ("biuf" if floats else "biu"):
        expected = "a real number dtype" if floats else "uint8 (or another integer dtype, or bool)"
        raise ValueError(
            f"env {env_id!r}: {where} returned {got.dtype} observations for its "
            f"{space.dtype} observation space {space}: expected {expected}. Return "
            f"np.asarray(obs, np.{space.dtype}), or declare the space with the dtype you return"
        )
    stored = "float32" if floats else "uint8"
    return (
        f"env {env_id!r}: {where} returned {got.dtype} observations for its {space.dtype} "
        f"observation space; rlpar casts them to {stored} (return np.asarray(obs, "
        f"np.{space.dtype}) to silence this)"
    )
