"""An actor thread: steps its K envs with one batched forward per step, writes rollouts; and
`LocalActors`, the actors of this process (the threads backend, as `RayActors` is Ray's).

The run's plan (`rlpar.runtime.plan`) gives each actor its loop; the actor keeps its buffers,
its generators, the episodes in progress (`Carry`), its stats and `Actor.run`, and fills each
rollout with the loop's unroller (`rlpar.runtime.unrollers`: fused, stepped, split in turn or
with side acts). The plan's ``native_loop`` replaces the whole of `Actor.run`'s loop with
native calls (`rlpar.runtime.handoff.run_native_actor_loop`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection
from typing import Any

import numpy as np
from gymnasium.vector import VectorEnv

from rlpar import _native
from rlpar.agent import Agent
from rlpar.config import EnvConfig, RuntimeConfig
from rlpar.data import Rollout
from rlpar.nn import Net
from rlpar.runtime.actor_carry import Carry
from rlpar.runtime.common import (
    ActorStats,
    EpisodeLog,
    EpisodeSink,
    FusedEnvs,
    HalvedEnvs,
    ItemQueue,
    queue_get,
    queue_put,
)
from rlpar.runtime.envs import (
    ActionAdapter,
    env_seeds,
    explain_env_error,
    make_actor_envs,
    storage_dtype,
)
from rlpar.runtime.gil_meter import ThreadMeter
from rlpar.runtime.handoff import HandOff, run_native_actor_loop
from rlpar.runtime.plan import choose_actor_loop, native_sampler
from rlpar.runtime.unrollers import (
    Fused,
    InTurn,
    PythonAct,
    SideActs,
    SideAuto,
    StepParts,
    Stepped,
    Unroller,
)
from rlpar.snapshot import SnapshotStore

__all__ = ["Actor", "LocalActors"]


class _RideAlong:
    """Deterministic mode: an unroll's finished episodes ride with the rollout (``ended``) and
    the learner logs them in batch order, so the log never depends on thread timing."""

    def __init__(self, r: Rollout) -> None:
        r.ended.clear()
        self.ended = r.ended

    def add_many(self, ended: list[tuple[float, int]]) -> None:
        self.ended.extend(ended)


class Actor:
    """Owns K envs, an action sampler and a few preallocated rollouts (see rlpar.agent)."""

    def __init__(
        self,
        index: int,
        *,
        envs: VectorEnv,
        agent: Agent,
        net: Net,
        store: SnapshotStore,
        unroll_length: int,
        num_buffers: int,
        seed: int,
        generation: int = 0,
        keep_resume_state: bool = False,
        loop: str | None = None,
    ) -> None:
        """``keep_resume_state``: after every unroll, copy what lets a resumed run continue
        this actor's episodes (`checkpoint_state`; the runner asks for it when it writes
        checkpoints). Only envs that can save their state (`ResumableEnvs`) give any.
        ``loop``: the run's plan for its actors (`rlpar.runtime.plan.ACTOR_LOOPS`); None: the
        plan's choice for these envs without the native whole loop (`choose_actor_loop`)."""
        self.index = index
        self.envs = envs
        self.agent = agent
        self.net = net
        self.store = store
        self.actions = ActionAdapter(envs.single_action_space)
        self.num_envs = envs.num_envs
        self.free: HandOff[Rollout] = HandOff()
        self.buffers = _allocate(index, envs, self.actions, net, unroll_length, num_buffers)
        for r in self.buffers:  # buffer i is ticket i of the free queue (the native loop)
            r.stamp = np.zeros(2, np.int64)  # version and seq, for the native hand-offs
            self.free.reserve(r)
            self.free.put(r)
        self.rng = np.random.default_rng(np.random.SeedSequence([seed, index, 1 << 20]))
        #: the loop this actor runs (`rlpar.runtime.plan.ACTOR_LOOPS`)
        self.path = loop or choose_actor_loop(envs, agent, net, "a lone actor").loop
        self.sampler = native_sampler(index, agent, net, seed)
        #: whether each unroll is one native call (and the step loop is None)
        self.fused = self.path in ("native_loop", "fused")
        self.loop = None if self.fused else _native.StepLoop(net, envs.num_envs, self.sampler)
        try:
            # one seed per env where the vector env takes them (gymnasium types it int)
            obs, _ = envs.reset(seed=env_seeds(envs, seed, index, generation))  # type: ignore[arg-type]
        except ValueError as e:
            raise explain_env_error(envs, e) from e
        # The episodes in progress and a recurrent net's state, carried on every path.
        self.carry = Carry(index, envs, net, obs, self.rng, self.sampler, keep_resume_state)
        self.stats = ActorStats()
        self.seq = 0
        self.unroller = self._unroller()

    def _unroller(self) -> Unroller:
        """The unroller of this actor's loop, over its envs, carry and stats."""
        if self.fused:
            if self.sampler is None or not isinstance(self.envs, FusedEnvs):
                raise ValueError(f"actor {self.index}: loop {self.path!r} needs native envs")
            return Fused(self.envs, self.net, self.store, self.sampler, self.carry, self.stats)
        assert self.loop is not None  # made for every loop but the fused ones
        act = (
            None
            if self.sampler is not None
            else PythonAct(self.agent, self.net, self.rng, self.actions)
        )
        parts = StepParts(self.loop, self.store, self.carry, self.stats, self.actions.to_env, act)
        if self.path == "stepped":
            return Stepped(self.envs, parts)
        if not isinstance(self.envs, HalvedEnvs):
            raise ValueError(f"actor {self.index}: loop {self.path!r} needs envs in halves")
        if self.path == "split":
            return InTurn(self.envs, parts)
        if self.path == "split_side":
            return SideAuto(SideActs(self.envs, parts), InTurn(self.envs, parts), self.stats)
        raise ValueError(f"actor {self.index}: no such loop {self.path!r}")

    # ------------------------------------------------------------------ checkpoints, resume

    def rng_state(self) -> dict:
        """The sampling generators' states as of the last finished unroll (what a checkpoint
        keeps). Copied by the actor thread itself: reading a generator that another thread is
        drawing from (the native sampler draws with the GIL released) would race."""
        return self.carry.checkpoint_state()[0]

    def checkpoint_state(self) -> tuple[dict, dict[str, np.ndarray] | None]:
        """(`rng_state`, the arrays that continue this actor's episodes), both copied by the
        actor thread at the end of the same unroll (`Carry.checkpoint_state`; the arrays are
        None unless ``keep_resume_state`` and the envs are `ResumableEnvs`)."""
        return self.carry.checkpoint_state()

    def load_resume_state(self, arrays: dict[str, np.ndarray]) -> None:
        """Continue the episodes that `checkpoint_state`'s arrays describe (`Carry.load`): the
        envs, the observations, the episode returns and lengths so far and the core state all
        come back. Call it before the actor runs; ValueError if they do not fit this actor."""
        self.carry.load(arrays)

    def set_rng_state(self, numpy_state: dict | None, sampler_state: list | None) -> None:
        """Restore what `rng_state` returned (None leaves that generator as it is)."""
        self.carry.set_rng_state(numpy_state, sampler_state)

    # ------------------------------------------------------------------------------ unrolls

    def run(
        self,
        stop: threading.Event,
        out_queue: ItemQueue[Rollout],
        episodes: EpisodeLog,
        wait_for_version: Callable[[int], bool] | None = None,
        rollouts_per_version: int = 1,
    ) -> None:
        """Unroll until ``stop`` is set. In deterministic mode ``wait_for_version(v)`` blocks
        until version ``v`` is published (False when stopping), and the actor makes exactly
        ``rollouts_per_version`` rollouts from each version. The plan's ``native_loop`` runs
        the whole loop natively (`run_native_actor_loop`; ``out_queue`` a `HandOff`)."""
        meter = ThreadMeter()
        try:
            if self.path == "native_loop":
                if wait_for_version is not None or not isinstance(out_queue, HandOff):
                    raise ValueError("the native actor loop needs a HandOff, no version waits")
                run_native_actor_loop(self, stop, out_queue, episodes, meter)
            else:
                self._run(stop, out_queue, episodes, wait_for_version, rollouts_per_version, meter)
        finally:
            self.stats.gil = meter.read()  # the whole loop, however it ended

    def _run(
        self,
        stop: threading.Event,
        out_queue: ItemQueue[Rollout],
        episodes: EpisodeLog,
        wait_for_version: Callable[[int], bool] | None,
        rollouts_per_version: int,
        meter: ThreadMeter,
    ) -> None:
        version = 1
        while not stop.is_set():
            if wait_for_version is not None and not wait_for_version(version):
                return
            for _ in range(rollouts_per_version):
                t0 = time.perf_counter()
                rollout = queue_get(self.free, stop)
                self.stats.queue_wait_s += time.perf_counter() - t0
                if rollout is None:
                    return
                try:
                    self.unroll(
                        rollout, episodes if wait_for_version is None else _RideAlong(rollout)
                    )
                except ValueError as e:
                    raise explain_env_error(self.envs, e) from e
                t0 = time.perf_counter()
                if not queue_put(out_queue, rollout, stop):
                    return
                self.stats.queue_wait_s += time.perf_counter() - t0
                if (gil := meter.poll()) is not None:
                    self.stats.gil = gil
            version += 1

    def unroll(self, r: Rollout, episodes: EpisodeSink) -> None:
        """Fill ``r`` with T steps, all acted with one pinned parameter version (the loop's
        unroller), and stamp it with this actor's index and sequence number."""
        self.unroller.unroll(r, episodes)
        r.actor = self.index
        r.seq = self.seq
        if r.stamp is not None:  # what a native reader of the rollout takes them from
            r.stamp[0], r.stamp[1] = r.version, r.seq
        self.seq += 1
        self.stats.rollouts += 1
        self.stats.env_steps += r.env_steps


class LocalActors:
    """The actors of this process, the threads backend's counterpart of `RayActors`:
    ``LocalActors(env, cfg)`` makes each actor's envs (an unknown id or a bad space fails
    here, before a net is built for their ``spaces``); `start` builds one `Actor` over each;
    `close` closes the envs."""

    lost_rollouts = 0  # rollouts lost with a dead actor process: none without processes

    def __init__(self, env: EnvConfig, cfg: RuntimeConfig) -> None:
        self.cfg = cfg
        self.envs: list[Any] = []
        try:
            for _ in range(cfg.num_actors):
                self.envs.append(make_actor_envs(env, cfg.envs_per_actor))
        except BaseException:
            self.close()
            raise
        first = self.envs[0]
        self.spaces = (first.single_observation_space, first.single_action_space)

    def start(
        self,
        agent: Agent,
        net: Net,
        store: SnapshotStore,
        generation: int,
        keep_resume_state: bool = False,
        loop: str | None = None,
    ) -> list[Actor]:
        """One `Actor` over each actor's envs (their threads are the caller's to start), each
        running ``loop`` (the run's plan, `rlpar.runtime.plan`; None: `Actor`'s default)."""
        cfg = self.cfg
        return [
            Actor(
                i,
                envs=envs,
                agent=agent,
                net=net,
                store=store,
                unroll_length=cfg.unroll_length,
                num_buffers=cfg.buffers_per_actor,
                seed=cfg.seed,
                generation=generation,
                keep_resume_state=keep_resume_state,
                loop=loop,
            )
            for i, envs in enumerate(self.envs)
        ]

    def close(self, stuck: Collection[int] = ()) -> None:
        """Close the envs (idempotent); those of the actors in ``stuck`` (indices: their
        threads did not stop) are left alone."""
        for i, envs in enumerate(self.envs):
            if envs is not None and i not in stuck:
                envs.close()
                self.envs[i] = None


def _allocate(
    index: int,
    envs: VectorEnv,
    actions: ActionAdapter,
    net: Net,
    unroll_length: int,
    num_buffers: int,
) -> list[Rollout]:
    """Actor ``index``'s ``num_buffers`` rollouts of ``unroll_length`` steps of ``envs``."""
    obs_space = envs.single_observation_space
    if obs_space.shape is None:
        raise ValueError(f"actor {index}: the observation space {obs_space} has no shape")
    return [
        Rollout.allocate(
            unroll_length,
            envs.num_envs,
            obs_space.shape,
            storage_dtype(obs_space, getattr(getattr(envs, "spec", None), "id", None)),
            actions.shape,
            actions.dtype,
            net.output_size,
            actor=index,
            state_size=net.state_size,
        )
        for _ in range(num_buffers)
    ]
