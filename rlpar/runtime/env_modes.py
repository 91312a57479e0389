"""How an actor's K envs are stepped (`EnvConfig.vectorization`), and double buffering.

- "sync": gymnasium's `make_vec` in the actor thread (the env's own vector env, else
  `SyncVectorEnv`). Python envs hold the GIL while they step, so actor threads cannot overlap.
- "async": `GroupedAsyncEnvs`: gymnasium's `AsyncVectorEnv` (shared-memory observations) over
  W worker processes, each stepping K / W envs in turn; the actor thread waits on the pipes with
  the GIL released.
- "ale": `AleEnvs`: ale-py's `AtariVectorEnv` (games stepped on C++ threads, GIL released in
  send/recv) with the standard Atari preprocessing.
- "envpool": `EnvPoolEnvs`: EnvPool's send/recv (C++ threads, GIL released).

Each of them can `send` actions and `recv` the results separately; `SplitEnvs` holds two halves
of an actor's envs so that the actor runs inference on one half while the other steps
(`EnvConfig.double_buffer`, Sample Factory's ``worker_num_splits=2``). A "sync" half
(`SyncHalf`) steps in the actor's own thread; the forward of the other half then runs on the
actor's step-loop side thread (`rlpar._native.StepLoop.step_async`). Every mode keeps
gymnasium's NEXT_STEP autoreset (the step after an episode's end is a reset step: reward 0,
action ignored) and takes one seed per env in `reset`.
"""

from __future__ import annotations

import logging
import pickle
import re
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, cast

import gymnasium as gym
import numpy as np
from gymnasium.vector import AsyncVectorEnv, SyncVectorEnv, VectorEnv

from rlpar.config import EnvConfig
from rlpar.runtime.env_setup import run_setup
from rlpar.spaces import encoded

__all__ = [
    "AleEnvs",
    "EnvPoolEnvs",
    "GroupedAsyncEnvs",
    "SplitEnvs",
    "StepResult",
    "SyncHalf",
    "gil_bound_warning",
    "per_env_seeds",
    "takes_env_seeds",
]

log = logging.getLogger("rlpar")

#: (obs [K, *obs_shape], reward float64 [K], terminated bool [K], truncated bool [K])
StepResult = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def per_env_seeds(seed: Any, num_envs: int) -> list[int] | None:
    """The seeds of ``num_envs`` envs from what gymnasium's vector ``reset`` accepts: None
    (unseeded), one int ``s`` (env i gets ``s + i``, gymnasium's convention) or one int per env.
    Every env mode's ``reset`` reads its ``seed`` through this."""
    if seed is None:
        return None
    if isinstance(seed, (int, np.integer)) and not isinstance(seed, bool):
        return [int(seed) + i for i in range(num_envs)]
    if isinstance(seed, (list, tuple, np.ndarray)):
        seeds = list(seed)
        if len(seeds) == num_envs and all(
            isinstance(s, (int, np.integer)) and not isinstance(s, bool) for s in seeds
        ):
            return [int(s) for s in seeds]
    raise ValueError(
        f"reset seed: expected None, an int or a list of {num_envs} ints (one per env), "
        f"got {seed!r}"
    )


def takes_env_seeds(envs: VectorEnv) -> bool:
    """Whether ``envs.reset`` takes one seed per env (else one seed for all of them)."""
    return isinstance(
        envs, (SyncVectorEnv, AsyncVectorEnv, GroupedAsyncEnvs, AleEnvs, EnvPoolEnvs, SplitEnvs)
    )


#: Actor time (env stepping + inference, all actors) measured before `gil_bound_warning` judges.
GIL_CHECK_AFTER_S = 2.0
#: The share of that time spent stepping envs above which the actors are called GIL-bound.
GIL_BOUND_ENV_SHARE = 0.5


def gil_bound_warning(
    env: EnvConfig, python_loop_actors: int, env_s: float, inference_s: float
) -> str | None:
    """The warning for a run whose actor threads take turns on the GIL, else None (also None
    until the actors have measured `GIL_CHECK_AFTER_S` seconds between them).

    GIL-bound: more than one actor thread steps its envs in the thread (``"sync"``, and not
    the fused native unroll: ``python_loop_actors`` counts those), and stepping is more than
    `GIL_BOUND_ENV_SHARE` of their time (``env_s``, ``inference_s``: sums over those actors).
    """
    busy = env_s + inference_s
    if env.vectorization != "sync" or python_loop_actors < 2 or busy < GIL_CHECK_AFTER_S:
        return None
    share = env_s / busy
    if share <= GIL_BOUND_ENV_SHARE:
        return None
    return (
        f"{python_loop_actors} actor threads step {env.id!r} in the thread "
        f'(env.vectorization = "sync"); env steps are {share:.0%} of their time, and a Python '
        "env holds the GIL while it steps, so the threads take turns instead of running in "
        'parallel. Try env.vectorization = "async" (worker processes) where cores outnumber '
        "actors, or one actor with more envs (runtime.envs_per_actor); for a native rlpar "
        "env, an agent with native sampling runs whole unrolls without the GIL. See "
        "docs/runtime.md, Env modes."
    )


class _SendRecv(VectorEnv):
    """A vector env whose step is `send` then `recv`; the info dict is always empty (rlpar's
    actors read none), so no per-step info is built or shipped."""

    def send(self, actions: np.ndarray) -> None:
        raise NotImplementedError

    def recv(self) -> StepResult:
        raise NotImplementedError

    def step(self, actions: np.ndarray) -> tuple[Any, ...]:
        self.send(actions)
        return (*self.recv(), {})


# ---------------------------------------------------------------------------------- async


class _EnvGroup(gym.Env):
    """k envs in one worker process, stepped one after another, seen by `AsyncVectorEnv` as
    one env. Its observation is a dict {"obs" [k, ...], "reward" [k], "terminated" [k],
    "truncated" [k]}, so everything comes back through shared memory (nothing is pickled per
    step). It autoresets each env itself (NEXT_STEP, like `SyncVectorEnv`) and never ends."""

    def __init__(
        self,
        spec: gym.envs.registration.EnvSpec,
        kwargs: dict,
        k: int,
        first: int,
        drop_keys: Sequence[str] = (),
    ) -> None:
        self.envs = [encoded(gym.make(spec, **kwargs), drop_keys, spec.id) for _ in range(k)]
        self.first = first  # index of this group's first env among the actor's K
        space = self.envs[0].observation_space
        if not isinstance(space, gym.spaces.Box):  # `encoded` makes every space one
            raise ValueError(f"unsupported observation space {space}: expected a Box")
        self.single_action_space = self.envs[0].action_space
        self.observation_space = gym.spaces.Dict(
            {
                "obs": gym.spaces.Box(
                    np.broadcast_to(space.low, (k, *space.shape)),
                    np.broadcast_to(space.high, (k, *space.shape)),
                    dtype=space.dtype,
                ),
                "reward": gym.spaces.Box(-np.inf, np.inf, (k,), np.float64),
                "terminated": gym.spaces.MultiBinary(k),
                "truncated": gym.spaces.MultiBinary(k),
            }
        )
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, k)
        self.autoreset = np.zeros(k, bool)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        seeds = (options or {}).get("seeds")
        k = len(self.envs)
        mine = seeds[self.first : self.first + k] if seeds is not None else [None] * k
        obs = [env.reset(seed=s)[0] for env, s in zip(self.envs, mine, strict=True)]
        self.autoreset[:] = False
        zeros = np.zeros(k, np.int8)
        return {
            "obs": np.stack(obs),
            "reward": np.zeros(k),
            "terminated": zeros,
            "truncated": zeros,
        }, {}

    def step(self, action: Sequence[Any]) -> tuple[dict, float, bool, bool, dict]:
        k = len(self.envs)
        obs: list[Any] = [None] * k
        reward = np.zeros(k)
        terminated, truncated = np.zeros(k, np.int8), np.zeros(k, np.int8)
        for j, env in enumerate(self.envs):
            if self.autoreset[j]:
                obs[j], _ = env.reset()
            else:
                obs[j], reward[j], terminated[j], truncated[j], _ = env.step(action[j])
        self.autoreset[:] = (terminated | truncated) != 0
        out = {"obs": np.stack(obs), "reward": reward, "terminated": terminated}
        return {**out, "truncated": truncated}, 0.0, False, False, {}

    def close(self) -> None:
        for env in self.envs:
            env.close()


def _make_group(
    spec: gym.envs.registration.EnvSpec,
    kwargs: dict,
    k: int,
    first: int,
    setup: str | None,
    drop_keys: Sequence[str] = (),
) -> _EnvGroup:
    if spec.id not in gym.registry:  # a fresh worker process: run what registers the env
        run_setup(setup)
    return _EnvGroup(spec, kwargs, k, first, drop_keys)


class GroupedAsyncEnvs(_SendRecv):
    """ "async": K envs in W worker processes (gymnasium's `AsyncVectorEnv`, "spawn" context,
    shared-memory observations); worker w steps envs [w * K / W, (w + 1) * K / W)."""

    def __init__(self, cfg: EnvConfig, num_envs: int, workers: int) -> None:
        if workers < 1 or num_envs % workers:
            raise ValueError(
                f"env.workers_per_actor: expected a divisor of the envs per actor ({num_envs}), "
                f"got {workers}"
            )
        k = num_envs // workers
        spec = gym.spec(cfg.id)
        # constructor errors surface here, in this process
        probe = encoded(gym.make(spec, **cfg.kwargs), cfg.drop_keys, cfg.id)
        self.single_observation_space = probe.observation_space
        self.single_action_space = probe.action_space
        probe.close()
        fns = [
            partial(_make_group, spec, dict(cfg.kwargs), k, w * k, cfg.setup, cfg.drop_keys)
            for w in range(workers)
        ]
        _check_picklable(fns[0], cfg.id)
        # "spawn": a fork of this multi-threaded process could copy a lock held by another thread
        self.async_envs = AsyncVectorEnv(fns, shared_memory=True, copy=False, context="spawn")
        self.num_envs = num_envs
        self.observation_space = gym.vector.utils.batch_space(
            self.single_observation_space, num_envs
        )
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, num_envs)
        self.metadata = {"autoreset_mode": gym.vector.AutoresetMode.NEXT_STEP}
        self.workers = workers
        self.env_id = cfg.id
        self.dead = False

    def reset(self, *, seed: Any = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        seeds = per_env_seeds(seed, self.num_envs)
        try:
            out, _ = self.async_envs.reset(options={"seeds": seeds})
        except (EOFError, ConnectionError) as e:
            raise RuntimeError(self._died()) from e
        return self._flat(out["obs"]), {}

    def send(self, actions: np.ndarray) -> None:
        actions = np.asarray(actions)
        try:
            self.async_envs.step_async(actions.reshape(self.workers, -1, *actions.shape[1:]))
        except (EOFError, ConnectionError) as e:
            raise RuntimeError(self._died()) from e

    def recv(self) -> StepResult:
        try:
            out, *_ = self.async_envs.step_wait()
        except (EOFError, ConnectionError) as e:
            raise RuntimeError(self._died()) from e
        flags = (out["terminated"].reshape(-1) != 0, out["truncated"].reshape(-1) != 0)
        return self._flat(out["obs"]), out["reward"].reshape(-1), *flags

    def _died(self) -> str:
        self.dead = True
        codes = [p.exitcode for p in self.async_envs.processes]
        return (
            f'env.vectorization = "async": a worker process of {self.env_id!r} died while '
            f'stepping (exit codes {codes}); run the env with vectorization = "sync" to see '
            "its own error, or check the machine's memory (a killed worker exits with -9); "
            "a script that starts the run when imported must do so under "
            '`if __name__ == "__main__":`, since spawned workers import the main module'
        )

    def _flat(self, obs: np.ndarray) -> np.ndarray:
        return obs.reshape(self.num_envs, *obs.shape[2:])

    def close_extras(self, **kwargs: Any) -> None:
        # After a worker died mid-step, gymnasium's close (even with terminate=True) first
        # reads the pending step's answers from every pipe, and the dead one's read fails: stop
        # the workers here instead. Closing is no place to raise an env's error again either
        # (a pending step can end in one, or in the broken pipe of a worker that died unseen).
        if not self.dead:
            try:
                self.async_envs.close(**kwargs)
                return
            except Exception:
                log.debug("closing %s: a worker failed; terminating the workers", self.env_id)
        envs = self.async_envs
        for process in envs.processes:
            if process.is_alive():
                process.terminate()
        for process in envs.processes:
            process.join()
        for pipe in envs.parent_pipes:
            if pipe is not None:
                pipe.close()
        envs.closed = True


def _check_picklable(fn: Callable, env_id: str) -> None:
    try:
        pickle.dumps(fn)
    except Exception as e:
        raise ValueError(
            f'env.vectorization = "async" starts worker processes, which get the env\'s spec '
            f"and env.kwargs pickled, but those of {env_id!r} cannot be pickled ({e}); register "
            'the env in an importable module named by env.setup, or use vectorization = "sync"'
        ) from e


# ------------------------------------------------------------------------------------ ale


#: rlpar's standard Atari preprocessing (Machado et al. 2018 and the IMPALA paper): 84x84
#: grayscale, frame skip 4 with max-pooling, 4 stacked frames, up to 30 no-op starts, sticky
#: actions 0.25, no episodic life, a reset step that presses FIRE where the game needs it.
ALE_DEFAULTS: dict[str, Any] = {
    "img_height": 84,
    "img_width": 84,
    "grayscale": True,
    "frameskip": 4,
    "stack_num": 4,
    "noop_max": 30,
    "repeat_action_probability": 0.25,
    "episodic_life": False,
    "reward_clipping": False,
    "use_fire_reset": True,
}


def ale_game(env_id: str) -> str:
    """ale-py's game name for a gymnasium Atari id: "ALE/Pong-v5" -> "pong",
    "ALE/MontezumaRevenge-v5" -> "montezuma_revenge"."""
    m = re.fullmatch(r"(?:ALE/)?([A-Za-z0-9]+?)(?:NoFrameskip)?(?:-v\d+)?", env_id)
    name = m.group(1) if m else env_id
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower()


class AleEnvs(_SendRecv):
    """ "ale": ale-py's `AtariVectorEnv` (ale-py >= 0.12): K games stepped on C++ threads, the
    GIL released in send/recv. Observations are turned to channels-last uint8 [K, 84, 84, 4]
    (rlpar's conv layout). ``kwargs`` override `ALE_DEFAULTS` (any `AtariVectorEnv` keyword,
    e.g. ``num_threads``)."""

    def __init__(self, env_id: str, num_envs: int, kwargs: dict[str, Any]) -> None:
        vector_env = _import_extra("ale_py.vector_env", "ale", "atari", "ale-py>=0.12")
        import ale_py.roms

        game = ale_game(env_id)
        known = ale_py.roms.get_all_rom_ids()
        if game not in known:
            close = __import__("difflib").get_close_matches(game, known, n=3)
            hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
            raise ValueError(
                f'env.id {env_id!r} with env.vectorization = "ale": ale-py has no game {game!r} '
                f'(ids look like "ALE/Pong-v5"){hint}'
            )
        self.env = vector_env.AtariVectorEnv(game, num_envs, **{**ALE_DEFAULTS, **kwargs})
        self.num_envs = num_envs
        chw = self.env.single_observation_space
        self.single_observation_space = gym.spaces.Box(0, 255, _hwc(chw.shape), np.uint8)
        self.single_action_space = self.env.single_action_space
        self.observation_space = gym.vector.utils.batch_space(
            self.single_observation_space, num_envs
        )
        self.action_space = self.env.action_space
        self.metadata = {"autoreset_mode": gym.vector.AutoresetMode.NEXT_STEP}

    def reset(self, *, seed: Any = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        # ale-py takes an int array, one C int per env: an int seed s seeds env i with s + i
        # (gymnasium's convention); rlpar's 32-bit unsigned seeds are folded into C int range.
        each = per_env_seeds(seed, self.num_envs)
        seeds = None if each is None else np.asarray(each, np.int64) % (1 << 31)
        obs, _ = self.env.reset(seed=seeds)
        return _channels_last(obs), {}

    def send(self, actions: np.ndarray) -> None:
        self.env.send(actions)

    def recv(self) -> StepResult:
        obs, reward, terminated, truncated, info = self.env.recv()
        ids = info.get("env_id")
        if ids is not None and not np.array_equal(ids, np.arange(self.num_envs)):
            # ale-py returns the envs in order when all are sent at once (measured), but its
            # results carry their env ids; never pair one env's step with another's column.
            order = np.argsort(ids)
            obs, reward, terminated, truncated = (
                obs[order],
                reward[order],
                terminated[order],
                truncated[order],
            )
        return _channels_last(obs), reward, terminated, truncated

    def close_extras(self, **kwargs: Any) -> None:
        self.env.close()


def _hwc(shape: tuple[int, ...]) -> tuple[int, ...]:
    return (*shape[1:], shape[0])


def _channels_last(obs: np.ndarray) -> np.ndarray:
    """uint8 [K, C, H, W] -> [K, H, W, C] (a copy: the engines reuse their buffers)."""
    return np.ascontiguousarray(obs.transpose(0, 2, 3, 1))


def _import_extra(module: str, mode: str, extra: str, package: str) -> Any:
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ValueError(
            f'env.vectorization = "{mode}" needs {package} ({e}); install it with '
            f'pip install "rlpar[{extra}]", or choose another env.vectorization'
        ) from e


# -------------------------------------------------------------------------------- envpool


class EnvPoolEnvs(_SendRecv):
    """ "envpool": EnvPool's pool of K envs (C++ threads, GIL released in send/recv). EnvPool
    seeds env i with seed + i when the pool is made, so `reset` makes the pool (with the first
    env's seed). Atari observations are turned channels-last like "ale"'s."""

    def __init__(self, env_id: str, num_envs: int, kwargs: dict[str, Any]) -> None:
        self.envpool = _import_extra("envpool", "envpool", "envpool", "envpool")
        task = env_id.removeprefix("ALE/")
        if task not in self.envpool.list_all_envs():
            close = __import__("difflib").get_close_matches(task, self.envpool.list_all_envs())
            hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
            raise ValueError(f"env.id {env_id!r}: EnvPool has no task {task!r}{hint}")
        self.task, self.kwargs, self.num_envs = task, dict(kwargs), num_envs
        self.pool = self._make(seed=0)
        space = self.pool.observation_space
        self.images = len(space.shape) == 3
        shape = _hwc(space.shape) if self.images else space.shape
        self.single_observation_space = gym.spaces.Box(
            np.broadcast_to(space.low.reshape(-1)[0], shape) if self.images else space.low,
            np.broadcast_to(space.high.reshape(-1)[0], shape) if self.images else space.high,
            dtype=space.dtype,
        )
        self.single_action_space = self.pool.action_space
        self.observation_space = gym.vector.utils.batch_space(
            self.single_observation_space, num_envs
        )
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, num_envs)
        self.metadata = {"autoreset_mode": gym.vector.AutoresetMode.NEXT_STEP}

    def _make(self, seed: int) -> Any:
        return self.envpool.make(
            self.task, env_type="gymnasium", num_envs=self.num_envs, seed=seed, **self.kwargs
        )

    def reset(self, *, seed: Any = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        seeds = per_env_seeds(seed, self.num_envs)
        if seeds is not None:
            self.pool.close()
            self.pool = self._make(seed=seeds[0] % (1 << 31))
        obs, info = self.pool.reset()
        return self._obs(obs, info["env_id"]), {}

    def send(self, actions: np.ndarray) -> None:
        self.pool.send(actions, np.arange(self.num_envs, dtype=np.int32))

    def recv(self) -> StepResult:
        obs, reward, terminated, truncated, info = self.pool.recv()
        ids = info["env_id"]
        if np.array_equal(ids, np.arange(self.num_envs)):
            return self._obs(obs, ids), reward, terminated, truncated
        order = np.argsort(ids)
        return self._obs(obs, ids), reward[order], terminated[order], truncated[order]

    def _obs(self, obs: np.ndarray, ids: np.ndarray) -> np.ndarray:
        if not np.array_equal(ids, np.arange(self.num_envs)):
            obs = obs[np.argsort(ids)]
        return _channels_last(obs) if self.images else obs

    def close_extras(self, **kwargs: Any) -> None:
        self.pool.close()


# ------------------------------------------------------------------------ double buffering


class SyncHalf(_SendRecv):
    """Half of a "sync" actor's envs, for double buffering (`SplitEnvs`): `send` keeps the
    actions and `recv` steps ``envs`` with them in the calling thread, holding the GIL as
    "sync" does (the actor steps ``envs`` directly and overlaps the other half's forward,
    `rlpar.runtime.unrollers.SideActs`)."""

    def __init__(self, envs: VectorEnv) -> None:
        self.envs = envs
        self.num_envs = envs.num_envs
        self.single_observation_space = envs.single_observation_space
        self.single_action_space = envs.single_action_space
        self.observation_space = envs.observation_space
        self.action_space = envs.action_space
        self.metadata = envs.metadata
        self._actions: np.ndarray | None = None

    def reset(self, *, seed: Any = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        """One seed per env (`per_env_seeds`); an env vectorized natively, which draws all its
        envs from one generator, takes the first."""
        seeds = per_env_seeds(seed, self.num_envs)
        given: Any = seeds if seeds is None or takes_env_seeds(self.envs) else seeds[0]
        obs, _ = self.envs.reset(seed=given)  # gymnasium types it int; its Sync/Async take a list
        return obs, {}

    def send(self, actions: np.ndarray) -> None:
        self._actions = actions

    def recv(self) -> StepResult:
        if self._actions is None:
            raise RuntimeError("SyncHalf.recv: no actions were sent")
        actions, self._actions = self._actions, None
        obs, reward, terminated, truncated, _ = self.envs.step(actions)
        return obs, reward, terminated, truncated

    def close_extras(self, **kwargs: Any) -> None:
        self.envs.close()


class SplitEnvs(VectorEnv):
    """An actor's K envs as two halves of one mode (``halves[h]`` steps columns
    ``cols[h]``), for double-buffered sampling: the actor infers on one half while the other
    steps. `step` (both halves at once) makes it an ordinary vector env elsewhere."""

    def __init__(self, make_half: Callable[[int], _SendRecv], num_envs: int) -> None:
        if num_envs < 2 or num_envs % 2:
            raise ValueError(
                f"env.double_buffer: expected an even number of envs per actor, got {num_envs}"
            )
        half = num_envs // 2
        self.halves = [make_half(half)]
        try:
            self.halves.append(make_half(half))
        except BaseException:
            self.halves[0].close()
            raise
        self.cols = [slice(0, half), slice(half, num_envs)]
        first = self.halves[0]
        self.num_envs = num_envs
        self.single_observation_space = first.single_observation_space
        self.single_action_space = first.single_action_space
        self.observation_space = gym.vector.utils.batch_space(
            self.single_observation_space, num_envs
        )
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, num_envs)
        self.metadata = {"autoreset_mode": gym.vector.AutoresetMode.NEXT_STEP}

    def reset(self, *, seed: Any = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        seeds = per_env_seeds(seed, self.num_envs)
        obs = [
            h.reset(seed=None if seeds is None else seeds[c])[0]  # type: ignore[arg-type]
            for h, c in zip(self.halves, self.cols, strict=True)
        ]
        return np.concatenate(obs), {}

    def step(self, actions: np.ndarray) -> tuple[Any, ...]:
        for h, c in zip(self.halves, self.cols, strict=True):
            h.send(actions[c])
        parts = [h.recv() for h in self.halves]
        return (*(np.concatenate(x) for x in zip(*parts, strict=True)), {})

    def sync_halves(self) -> list[VectorEnv] | None:
        """Each half's vector envs where every half is a `SyncHalf` (it steps in the caller's
        thread, so the actor may step it directly), else None."""
        if all(isinstance(h, SyncHalf) for h in self.halves):
            return [cast(SyncHalf, h).envs for h in self.halves]
        return None

    def close_extras(self, **kwargs: Any) -> None:
        for h in self.halves:
            h.close()
