"""Every gymnasium observation space, as what the net is fed: a float32 or uint8 ``Box``.

A ``Box`` of one dimension (a vector) or three (an image, (H, W, C)) of a float dtype, uint8 or
bool goes to the net as it is (`rlpar.runtime.observations`). Every other space is encoded, one
env at a time, by `FlatObservation` into one float32 vector:

==============================  =================================================================
space                           encoded as
==============================  =================================================================
``Box`` of another shape        flattened, e.g. (3, 5) -> (15,); a scalar () -> (1,)
``Box`` of an integer dtype     cast to float32 (a vector or an image keeps its shape)
``Discrete(n)``                 one-hot, n values
``MultiDiscrete(nvec)``         one-hot per dimension, side by side: sum(nvec) values
``MultiBinary(n)``              its n bits as 0.0 / 1.0
``Dict``, ``Tuple``             their leaves encoded as above (an image leaf flattened, its values
                                as they are: MiniGrid's view holds small object codes, not
                                pixels), side by side in the space's order (a Dict's keys
                                sorted), nested too
==============================  =================================================================

A ``Text`` leaf (MiniGrid's ``mission``) cannot be fed: name its key in ``env.drop_keys`` to
leave it out (the error says so). ``Graph``, ``Sequence`` and ``OneOf`` spaces have no fixed
size and are refused. The encoding is gymnasium's own (`gymnasium.spaces.flatten`), cast to
float32; it runs in the env's process (each env of a vector env, or each "async" worker), so
the rollout holds the encoded vector.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

__all__ = [
    "EncodedBox",
    "FlatObservation",
    "Leaf",
    "categorical_dims",
    "encoded",
    "encoder_for",
    "fed_as_is",
]

_LEAVES = (gym.spaces.Box, gym.spaces.Discrete, gym.spaces.MultiDiscrete, gym.spaces.MultiBinary)


def categorical_dims(space: gym.Space) -> tuple[int, ...] | None:
    """The choices of each dimension of a discrete action space, or None for another space:
    ``Discrete(n)`` -> (n,); ``MultiDiscrete(nvec)`` (1-D) -> nvec; ``MultiBinary(n)`` -> n
    twos (each bit a choice of two). A policy over it is one Categorical per dimension, over
    sum(dims) logits side by side (`rlpar.NativeLoss.for_net`'s ``action_dims``)."""
    if isinstance(space, gym.spaces.Discrete):
        return (int(space.n),)
    if isinstance(space, gym.spaces.MultiDiscrete) and len(space.nvec.shape) == 1:
        return tuple(int(n) for n in space.nvec)
    if isinstance(space, gym.spaces.MultiBinary) and len(space.shape) == 1:
        return (2,) * int(space.shape[0])
    return None


def fed_as_is(space: gym.Space) -> bool:
    """Whether ``space`` goes to the net unencoded: a float, uint8 or bool ``Box`` of one or
    three dimensions."""
    if not isinstance(space, gym.spaces.Box) or len(space.shape) not in (1, 3):
        return False
    return np.issubdtype(space.dtype, np.floating) or space.dtype in (np.uint8, np.bool_)


def encoder_for(
    space: gym.Space, drop_keys: Sequence[str] = (), env_id: str | None = None
) -> Callable[[gym.Env], gym.Env] | None:
    """The wrapper that makes one env of ``space`` feedable (`FlatObservation`), or None when
    ``space`` is fed as it is. Raises ValueError, naming the env and the space, for a space that
    cannot be encoded, and for ``drop_keys`` that name no key of a Dict space."""
    _kept_space(space, drop_keys, env_id)  # the checks, before any env is made
    if fed_as_is(space) and not drop_keys:
        return None
    return lambda env: FlatObservation(env, drop_keys, env_id)


def encoded(env: gym.Env, drop_keys: Sequence[str] = (), env_id: str | None = None) -> gym.Env:
    """``env`` as the net is fed it: wrapped in `FlatObservation` when its space needs it."""
    wrap = encoder_for(env.observation_space, drop_keys, env_id)
    if wrap is None:
        return env
    try:
        return wrap(env)
    except BaseException:
        env.close()
        raise


def _kept_space(space: gym.Space, drop_keys: Sequence[str], env_id: str | None) -> gym.Space:
    """``space`` without the Dict keys ``drop_keys``, each leaf checked."""
    where = f"env {env_id!r}: " if env_id else ""
    if drop_keys:
        if not isinstance(space, gym.spaces.Dict):
            raise ValueError(
                f"{where}env.drop_keys {list(drop_keys)}: expected a Dict observation space "
                f"to drop keys from, got {space}"
            )
        unknown = [k for k in drop_keys if k not in space.spaces]
        if unknown:
            raise ValueError(
                f"{where}env.drop_keys: {unknown} are not keys of the observation space; its "
                f"keys: {sorted(space.spaces)}"
            )
        space = gym.spaces.Dict({k: s for k, s in space.spaces.items() if k not in drop_keys})
    _check_leaves(space, space, "", where)
    return space


def _check_leaves(space: gym.Space, top: gym.Space, path: str, where: str) -> None:
    if isinstance(space, gym.spaces.Dict):
        for key, sub in space.spaces.items():
            _check_leaves(sub, top, f"{path}[{key!r}]", where)
        return
    if isinstance(space, gym.spaces.Tuple):
        for i, sub in enumerate(space.spaces):
            _check_leaves(sub, top, f"{path}[{i}]", where)
        return
    leaf = f"the observation space's leaf {path} " if path else "the observation space "
    if isinstance(space, _LEAVES):
        pass
    elif path and isinstance(top, gym.spaces.Dict):
        key = _key(path)
        raise ValueError(
            f"{where}{leaf}is {space}: it cannot be fed to the net (text, or no fixed size); "
            f"name its key in env.drop_keys to leave it out (--set 'env.drop_keys=[\"{key}\"]')"
        )
    elif isinstance(space, gym.spaces.Text):
        raise ValueError(f"{where}{leaf}is {space}: text cannot be fed to the net; wrap the env "
                         "to drop or encode it")  # fmt: skip
    else:
        raise ValueError(
            f"{where}{leaf}is {space}: expected Box, Discrete, MultiDiscrete, MultiBinary, or a "
            "Dict or Tuple of those (a space without a fixed size cannot be fed to the net)"
        )
    if isinstance(space, gym.spaces.Box) and not (
        np.issubdtype(space.dtype, np.floating)
        or np.issubdtype(space.dtype, np.integer)
        or space.dtype == np.bool_
    ):
        raise ValueError(f"{where}{leaf}is {space}: expected a numeric or bool dtype")


def _key(path: str) -> str:
    """The first Dict key of a leaf's path ``['mission']...``."""
    return path[2 : path.index("']")] if path.startswith("['") else path


def _leaf_paths(space: gym.Space, keys: tuple = ()) -> list[tuple[tuple, gym.Space]]:
    """Every leaf of a Dict/Tuple ``space``: (the keys and indices that reach it, the leaf)."""
    if isinstance(space, gym.spaces.Dict):
        return [p for k, sub in space.spaces.items() for p in _leaf_paths(sub, (*keys, k))]
    if isinstance(space, gym.spaces.Tuple):
        return [p for i, sub in enumerate(space.spaces) for p in _leaf_paths(sub, (*keys, i))]
    return [(keys, space)]


def _path_name(keys: tuple) -> str:
    return "obs" + "".join(f'["{k}"]' if isinstance(k, str) else f"[{k}]" for k in keys)


def _leaf_problem(space: gym.Space, value: Any) -> str | None:
    """What is wrong with ``value`` as a value of the leaf ``space`` (None: nothing): the
    shape, the dtype's kind, a Discrete value out of range."""
    if isinstance(space, gym.spaces.Discrete):
        if np.ndim(value) != 0 or np.asarray(value).dtype.kind not in "iub":
            return f"an integer, got {_described(value)}"
        if not space.start <= int(value) < space.start + space.n:
            return f"an integer in [{space.start}, {space.start + space.n}), got {int(value)}"
        return None
    shape = space.shape or ()
    if np.shape(value) != shape:
        return f"shape {tuple(shape)}, got {_described(value)}"
    kind = np.asarray(value).dtype.kind
    if kind not in "iubf":
        return f"numbers of shape {tuple(shape)}, got {_described(value)}"
    return None


def _described(value: Any) -> str:
    if isinstance(value, np.ndarray):
        return f"{value.dtype} array of shape {value.shape}"
    return f"{type(value).__name__} {value!r}"[:80]


@dataclass(frozen=True)
class Leaf:
    """One leaf of a Dict/Tuple observation in the encoded vector: its ``path``
    (``obs["image"]``, ``obs[1]``), its ``space``, and the ``size`` columns from ``offset`` that
    hold its encoding (an image leaf (H, W, C) flattened in that order, so its columns viewed as
    ``space.shape`` are the image)."""

    path: str
    space: gym.Space
    offset: int
    size: int

    @property
    def image(self) -> bool:
        """An (H, W, C) Box leaf: one a conv branch can read (`rlpar.Branch`)."""
        return isinstance(self.space, gym.spaces.Box) and len(self.space.shape) == 3


class EncodedBox(gym.spaces.Box):
    """The float32 vector `FlatObservation` makes of a Dict or Tuple observation: a ``Box``
    like any other, which also knows where each leaf lies (``leaves``), so that an agent can
    give each leaf an encoder of its own (`rlpar.Concat`; the built-in agents' ``[agent.net]
    encoders = "per_leaf"``)."""

    def __init__(self, low: np.ndarray, high: np.ndarray, leaves: Sequence[Leaf]) -> None:
        super().__init__(low, high, dtype=np.float32)
        self.leaves = tuple(leaves)


def _leaves(space: gym.Space) -> list[Leaf]:
    """The `Leaf` of each of ``space``'s leaves, in the order `gymnasium.spaces.flatten` lays
    them side by side."""
    out, offset = [], 0
    for keys, leaf in _leaf_paths(space):
        size = int(gym.spaces.flatdim(leaf))
        out.append(Leaf(_path_name(keys), leaf, offset, size))
        offset += size
    return out


class FlatObservation(gym.ObservationWrapper):
    """One env's observations as the net is fed them (the module docstring's table): a Box of
    one or three dimensions cast to float32 keeps its shape, everything else becomes one
    float32 vector; Dict keys in ``drop_keys`` are left out first."""

    def __init__(
        self, env: gym.Env, drop_keys: Sequence[str] = (), env_id: str | None = None
    ) -> None:
        super().__init__(env)
        self.drop_keys = tuple(drop_keys)
        self.source = self.env.observation_space
        self.kept = _kept_space(self.source, self.drop_keys, env_id)
        kept = self.kept
        if isinstance(kept, gym.spaces.Box) and len(kept.shape) in (1, 3):
            self.shape: tuple[int, ...] | None = tuple(kept.shape)  # keeps its shape: a cast
            low, high = kept.low, kept.high
        else:
            self.shape = None
            flat = gym.spaces.flatten_space(kept)
            assert isinstance(flat, gym.spaces.Box)  # every leaf checked has a flat Box
            low, high = flat.low, flat.high
        low, high = low.astype(np.float32), high.astype(np.float32)
        if self.shape is None and isinstance(kept, (gym.spaces.Dict, gym.spaces.Tuple)):
            self.observation_space = EncodedBox(low, high, _leaves(kept))
        else:
            self.observation_space = gym.spaces.Box(low, high, dtype=np.float32)
        self.leaves = _leaf_paths(kept)
        self.env_id = env_id

    def observation(self, observation: Any) -> np.ndarray:
        if self.drop_keys:
            observation = {k: v for k, v in observation.items() if k not in self.drop_keys}
        self.check(observation)
        if self.shape is not None:
            return np.asarray(observation, np.float32)
        return np.asarray(gym.spaces.flatten(self.kept, observation), np.float32)

    def check(self, observation: Any) -> None:
        """ValueError naming the leaf's path (``obs["image"]``, ``obs[1]``), what its space
        expects and what came, when ``observation`` does not fit the env's declared space (a
        missing key, another shape or dtype in one leaf, a Discrete value out of range); before
        anything is encoded, so nothing reaches a rollout from it."""
        for keys, space in self.leaves:
            value = observation
            for depth, key in enumerate(keys):
                try:
                    value = value[key]
                except (KeyError, IndexError, TypeError):
                    raise self._error(keys[: depth + 1], space, "is missing") from None
            problem = _leaf_problem(space, value)
            if problem is not None:
                raise self._error(keys, space, f"should be {problem}")

    def _error(self, keys: tuple, space: gym.Space, what: str) -> ValueError:
        env = f"env {self.env_id!r}: " if self.env_id else ""
        leaf = f"{_path_name(keys)} " if keys else "the observation "
        return ValueError(f"{env}{leaf}{what}: its space is {space}")
