"""Gymnasium faces of rlpar's native envs (C++, ``native/include/rlpar/envs.h``).

- ``NativeVectorEnv``: K envs of one game stepped in one native call (a
  ``gymnasium.vector.VectorEnv`` with NEXT_STEP autoreset, like ``gymnasium.make_vec`` gives).
- ``NativeEnv``: one env (a batch of 1) as a plain ``gymnasium.Env``, for ``gymnasium.make``
  and ``gymnasium.utils.env_checker.check_env``. Its time limit comes from gymnasium's
  ``TimeLimit`` wrapper (``max_episode_steps`` of the registration), so the native one is off.

Games: ``CartPole-v1`` and ``Acrobot-v1`` (gymnasium's dynamics, bit for bit from the same
state), ``Catch-v0`` (uint8 frames [10, 10, 1]). Per subclass below, one per game.

Seeding: ``reset(seed=s)`` seeds env ``i`` with ``s + i`` (gymnasium's convention for vector
envs), ``reset(seed=[s_0, ..., s_{K-1}])`` seeds env ``i`` with ``s_i``; ``reset()`` continues
each env's generator (the first ``reset()`` of an unseeded env draws seeds from the OS). Each env
owns a xoshiro256** generator seeded through splitmix64, so its trajectory depends only on its
own seed and actions. ``NativeEnv.reset(seed=s)`` gives the same episodes as env 0 of a vector
env reset with ``seed=s``.

Rendering: ``render_mode="rgb_array"`` (the only mode) makes ``render()`` return the current
state as uint8 [H, W, 3] (a vector env: a tuple of K frames). CartPole and Acrobot are drawn by
gymnasium's own classic-control renderer (pygame, ``pip install "rlpar[video]"``) from the
native state, so a frame is the one gymnasium's env draws in the same state; Catch is its
10 x 10 board scaled up, drawn in numpy.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from rlpar import _native

__all__ = [
    "AcrobotEnv",
    "AcrobotVectorEnv",
    "CartPoleEnv",
    "CartPoleVectorEnv",
    "CatchEnv",
    "CatchVectorEnv",
    "CategoricalSampler",
    "NativeEnv",
    "NativeVectorEnv",
]

#: Draws actions from categorical logits with its own generator (the fused unroll's sampler):
#: ``CategoricalSampler(seed).sample(logits float32 [K, n]) -> int64 [K]``; ``.state`` is a
#: 4-int tuple to save and restore. See ``native/include/rlpar/unroll.h`` for the algorithm.
CategoricalSampler = _native.CategoricalSampler

_SEED_LIMIT = 2**64


def _spaces(native: _native.VecEnv) -> tuple[spaces.Box, spaces.Discrete]:
    shape = tuple(native.obs_shape)
    obs: spaces.Box
    if native.obs_dtype == np.uint8:
        obs = spaces.Box(0, 255, shape, np.uint8)
    else:
        low = native.obs_low.astype(np.float32).reshape(shape)
        high = native.obs_high.astype(np.float32).reshape(shape)
        obs = spaces.Box(low, high, dtype=np.float32)
    return obs, spaces.Discrete(native.num_actions)


def _check_seed(seed: Any, what: str) -> int:
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"{what} must be an int, got {type(seed).__name__} {seed!r}")
    if not 0 <= int(seed) < _SEED_LIMIT:
        raise ValueError(f"{what} must be in [0, 2**64), got {seed}")
    return int(seed)


class _Renderer:
    """Frames uint8 [H, W, 3] of one game's state (float64 [state_size], as ``save_state``'s
    ``game`` row holds it). CartPole and Acrobot hand the state to a gymnasium env of the same
    game made for rendering only (its state layout is the native one); Catch scales its board."""

    CLASSIC_CONTROL = ("CartPole-v1", "Acrobot-v1")  # gymnasium's ids of the same games
    CATCH_CELL = 16  # pixels per board cell
    CATCH_COLORS: ClassVar[dict[str, tuple[int, int, int]]] = {
        "board": (20, 20, 30), "ball": (250, 200, 40), "paddle": (60, 160, 250),
    }  # fmt: skip

    def __init__(self, native: _native.VecEnv) -> None:
        self.game, self.shape = native.name, tuple(native.obs_shape)
        self._env: Any = None
        game = self.game
        if game not in self.CLASSIC_CONTROL and game != "Catch-v0":
            raise ValueError(f"native env {game!r} has no rgb_array render")

    def __call__(self, state: np.ndarray) -> np.ndarray:
        if self.game == "Catch-v0":
            return self._catch(state)
        if self._env is None:
            # Off-screen: pygame needs no display for rgb_array.
            import os

            os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
            self._env = gym.make(self.game, render_mode="rgb_array").unwrapped
        self._env.state = np.array(state, np.float64)
        return np.asarray(self._env.render())

    def _catch(self, state: np.ndarray) -> np.ndarray:
        ball_row, ball_col, paddle_col = (int(v) for v in state[:3])
        (rows, cols), cell = self.shape[:2], self.CATCH_CELL
        board = np.empty((rows, cols, 3), np.uint8)
        board[:] = self.CATCH_COLORS["board"]
        board[rows - 1, paddle_col] = self.CATCH_COLORS["paddle"]
        board[ball_row, ball_col] = self.CATCH_COLORS["ball"]
        return np.repeat(np.repeat(board, cell, axis=0), cell, axis=1)

    def close(self) -> None:
        if self._env is not None:
            self._env.close()
            self._env = None


def _check_render_mode(render_mode: str | None) -> None:
    if render_mode not in (None, "rgb_array"):
        raise ValueError(
            f'native envs render only render_mode="rgb_array", got render_mode={render_mode!r}'
        )


def _check_options(options: dict[str, Any] | None) -> None:
    if options:
        raise ValueError(
            f"native envs take no reset options, got {sorted(options)} (they always reset "
            "from their documented initial-state distribution)"
        )


class NativeVectorEnv(VectorEnv):
    """``num_envs`` copies of one native game (``game``), stepped in one call that releases the
    GIL when the batch is large enough (see the C++ header).

    ``step(actions)``: integer actions [K] -> (obs [K, *obs_shape] float32 or uint8, rewards
    float32 [K], terminated bool [K], truncated bool [K], {}), new arrays every call. Bad actions
    raise before any env moves: TypeError for a non-integer dtype, ValueError for a wrong shape
    or an out-of-range value. ``native`` is the underlying ``rlpar._native.VecEnv``.
    """

    metadata: dict[str, Any] = {  # noqa: RUF012  (gymnasium reads it from the class)
        "autoreset_mode": AutoresetMode.NEXT_STEP,
        "render_modes": ["rgb_array"],
    }
    game: ClassVar[str] = ""

    def __init__(
        self,
        num_envs: int = 1,
        max_episode_steps: int | None = None,
        render_mode: str | None = None,
        game: str | None = None,
    ) -> None:
        _check_render_mode(render_mode)
        self.native = _native.VecEnv(game or self.game, num_envs, max_episode_steps)
        self.num_envs = num_envs
        self.render_mode = render_mode
        self._renderer = _Renderer(self.native) if render_mode else None
        self.single_observation_space, self.single_action_space = _spaces(self.native)
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)
        self._seeded = False

    def reset(
        self,
        *,
        seed: int | Sequence[int] | None = None,
        options: dict[str, Any] | None = None,
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """``seed``: None (continue each env's stream), an int ``s`` (env i gets ``s + i``) or
        one int per env. Returns (obs [K, *obs_shape], {})."""
        _check_options(options)
        k = self.num_envs
        if seed is None:
            seeds = None if self._seeded else np.random.SeedSequence().generate_state(k, np.uint64)
        elif isinstance(seed, (int, np.integer)) and not isinstance(seed, (bool, np.bool_)):
            base = _check_seed(seed, "seed")
            super().reset(seed=base)
            seeds = np.array([(base + i) % _SEED_LIMIT for i in range(k)], np.uint64)
        elif isinstance(seed, (Sequence, np.ndarray)):
            if len(seed) != k:
                raise ValueError(f"seed must hold one int per env ({k}), got {len(seed)}")
            seeds = np.array([_check_seed(s, f"seed[{i}]") for i, s in enumerate(seed)], np.uint64)
        else:
            raise TypeError(
                f"seed must be None, an int or a list of {k} ints, got {type(seed).__name__}"
            )
        self._seeded = True
        return self.native.reset(seeds), {}

    def step(
        self, actions: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        obs, rewards, terminated, truncated = self.native.step(actions)
        return obs, rewards, terminated, truncated, {}

    def render(self) -> tuple[np.ndarray, ...] | None:
        """With ``render_mode="rgb_array"``: each env's current state as uint8 [H, W, 3] (K
        frames); None otherwise."""
        if self._renderer is None:
            return None
        return tuple(self._renderer(row) for row in self.native.save_state()["game"])

    def close_extras(self, **kwargs: Any) -> None:
        if self._renderer is not None:
            self._renderer.close()

    def save_state(self) -> dict[str, np.ndarray]:
        """Every env's state, new arrays (what a checkpoint keeps to resume the episodes in
        progress): ``game`` float64 [K, state_size], ``rng`` uint64 [K, 4] (each env's
        generator), ``elapsed`` int64 [K] (steps since its reset), ``needs_reset`` bool [K]."""
        return self.native.save_state()

    def load_state(self, state: dict[str, np.ndarray]) -> np.ndarray:
        """Put every env back in what `save_state` returned; return the observation each env
        returned last (obs [K, *obs_shape]). Every array and env is checked first (KeyError,
        TypeError or ValueError naming it); a refused state changes nothing."""
        if not isinstance(state, dict):
            raise TypeError(
                f"state must be the dict save_state returned, got {type(state).__name__}"
            )
        self.native.load_state(state)
        self._seeded = True
        return self.native.observe()

    def check_fused(self, net: Any) -> None:
        """Raise ValueError (saying why) unless `fused_unroll` can run ``net`` on these envs:
        the net needs exactly one Categorical head with one logit per action, and inputs of
        the envs' observation dtype and size (feed-forward or recurrent)."""
        _native.check_fused_unroll(self.native, net)

    def fused_unroll(
        self,
        net: Any,
        params: Any,
        sampler: _native.CategoricalSampler,
        rollout: Any,
        ep_return: np.ndarray,
        ep_length: np.ndarray,
        core: Any = None,
        release_gil: bool | None = None,
    ) -> tuple[int, list[tuple[float, int]]]:
        """Fill ``rollout`` (an ``rlpar.Rollout`` of T steps over these K envs) with one
        whole unroll in one native call: per step a batched ``net.forward`` with ``params``,
        actions drawn by ``sampler`` from the net's Categorical logits, and the env step.

        ``params``: a pinned ``rlpar.Snapshot`` (whose version is returned) or a flat float32
        array (version 0). ``ep_return`` float64 [K] and ``ep_length`` int64 [K] carry the
        episodes in progress across calls, updated in place. Returns (version, [(return, length)]
        of the episodes that ended, in order). Only ``rollout``'s arrays are written: set its
        ``version``, ``actor`` and ``seq`` yourself.

        A recurrent net needs ``core``, the actor's carried state
        (`rlpar.runtime.recurrent.CoreState`: ``state`` float32 [K, state_size] and ``starts``
        bool [K], both updated in place); the state fed into step 0 goes to
        ``rollout.core_state`` [K, state_size], as on the Python path.
        """
        state = starts = core_state = None
        if core is not None:
            state, starts, core_state = core.state, core.starts, rollout.core_state
        return _native.fused_unroll(
            self.native,
            net,
            params,
            sampler,
            rollout.obs,
            rollout.actions,
            rollout.rewards,
            rollout.terminated,
            rollout.truncated,
            rollout.mask,
            rollout.behaviour,
            ep_return,
            ep_length,
            state=state,
            starts=starts,
            core_state=core_state,
            release_gil=release_gil,
        )

    def fused_loop(
        self,
        net: Any,
        store: Any,
        sampler: _native.CategoricalSampler,
        free: Any,
        out: Any,
        buffers: Sequence[Any],
        out_tickets: Sequence[int],
        carry: Any,
        seq: int = 0,
    ) -> _native.FusedActorLoop:
        """An actor's whole loop over these envs as one native object
        (`rlpar._native.FusedActorLoop`): its ``run(budget_s)`` takes buffer indices from the
        `rlpar._native.TicketQueue` ``free``, fills ``buffers[i]`` with a `fused_unroll` on the
        latest snapshot of ``store``, writes the buffer's ``stamp`` (version, seq) and queues
        ``out_tickets[i]`` on ``out``, without the GIL, until its time budget is spent.
        ``carry``: the actor's `rlpar.runtime.actor_carry.Carry` (``ep_return``,
        ``ep_length``, ``prev_done``, ``obs`` and a recurrent ``core``, all used in place)."""
        core = carry.core
        return _native.FusedActorLoop(
            self.native,
            net,
            store,
            sampler,
            free,
            out,
            list(buffers),
            list(out_tickets),
            carry.ep_return,
            carry.ep_length,
            carry.prev_done,
            carry.obs,
            state=None if core is None else core.state,
            starts=None if core is None else core.starts,
            seq=seq,
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.native.name}, num_envs={self.num_envs})"


class NativeEnv(gym.Env):
    """One native env as a ``gymnasium.Env``: ``step(action: int)`` -> (obs, float reward,
    terminated, truncated=False, {}). Stepping on after an episode's end without ``reset`` is
    the native autoreset step (reward 0, the new episode's first observation)."""

    metadata: dict[str, Any] = {"render_modes": ["rgb_array"]}  # noqa: RUF012  (read from the class)
    game: ClassVar[str] = ""

    def __init__(self, render_mode: str | None = None, game: str | None = None) -> None:
        _check_render_mode(render_mode)
        self.native = _native.VecEnv(game or self.game, 1, max_episode_steps=0)
        self.render_mode = render_mode
        self._renderer = _Renderer(self.native) if render_mode else None
        self.observation_space, self.action_space = _spaces(self.native)
        self._seeded = False

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        _check_options(options)
        super().reset(seed=seed)
        if seed is not None:
            seeds = np.array([_check_seed(seed, "seed")], np.uint64)
        elif not self._seeded:
            seeds = self.np_random.integers(0, 2**63, size=1).astype(np.uint64)
        else:
            seeds = None
        self._seeded = True
        return self.native.reset(seeds)[0], {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        a = np.asarray(action)
        if a.shape != ():
            raise ValueError(f"action must be a single integer, got shape {a.shape}")
        obs, rewards, terminated, truncated = self.native.step(a.reshape(1))
        return obs[0], float(rewards[0]), bool(terminated[0]), bool(truncated[0]), {}

    def render(self) -> np.ndarray | None:
        """With ``render_mode="rgb_array"``: the current state as uint8 [H, W, 3]; None
        otherwise."""
        if self._renderer is None:
            return None
        return self._renderer(self.native.save_state()["game"][0])

    def close(self) -> None:
        if self._renderer is not None:
            self._renderer.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.native.name})"


class CartPoleVectorEnv(NativeVectorEnv):
    metadata = {**NativeVectorEnv.metadata, "render_fps": 50}  # noqa: RUF012
    game = "CartPole-v1"


class AcrobotVectorEnv(NativeVectorEnv):
    metadata = {**NativeVectorEnv.metadata, "render_fps": 15}  # noqa: RUF012
    game = "Acrobot-v1"


class CatchVectorEnv(NativeVectorEnv):
    metadata = {**NativeVectorEnv.metadata, "render_fps": 10}  # noqa: RUF012
    game = "Catch-v0"


class CartPoleEnv(NativeEnv):
    metadata = {**NativeEnv.metadata, "render_fps": 50}  # noqa: RUF012
    game = "CartPole-v1"


class AcrobotEnv(NativeEnv):
    metadata = {**NativeEnv.metadata, "render_fps": 15}  # noqa: RUF012
    game = "Acrobot-v1"


class CatchEnv(NativeEnv):
    metadata = {**NativeEnv.metadata, "render_fps": 10}  # noqa: RUF012
    game = "Catch-v0"
