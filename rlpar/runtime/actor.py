"""An actor thread: steps its K envs with one batched forward per step, writes rollouts; and
`LocalActors`, the actors of this process (the threads backend, as `RayActors` is Ray's).

One unroll path per kind of env: native envs run the whole unroll in one GIL-free call
(`_unroll_fused`), and outside deterministic mode the whole loop over rollouts too
(`_run_native`: many unrolls and their hand-offs per call); a vector env steps from a Python
loop that makes one native call between two env steps (`_unroll_stepped`, `_native.StepLoop`:
the step written into the rollout, the episodes carried, the forward and the native sampling);
split envs (`SplitEnvs`, double buffering) step one half while the actor infers on the other
(`_unroll_double_buffered`, the same loop over column ranges); "sync" halves step in the actor
thread while the other half's forward runs on the step loop's side thread (`_unroll_side_acts`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection
from typing import Any, cast

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
from rlpar.runtime.handoff import HandOff
from rlpar.runtime.plan import choose_actor_loop, native_sampler
from rlpar.snapshot import SnapshotStore

__all__ = ["Actor", "LocalActors"]

log = logging.getLogger("rlpar")

#: How long one native call of the actor loop over native envs runs (`Actor._run_native`):
#: between two, the actor looks at the stop flag and logs the episodes that ended. The Python
#: between two calls (~60 us) is 0.6 % of it.
NATIVE_LOOP_S = 0.01


#: "sync" double buffering (`Actor._unroll_side_acts`) pays only where a core is free for the
#: step loop's side thread: beside a busy learner on 2 cores the side thread takes the learner's
#: core time, and the actor then waits longer for its free buffers. So such an actor times
#: blocks of `SIDE_PROBE_UNROLLS` unrolls both ways (the acts on the side thread, or the halves'
#: acts in turn in its own thread: the same rollouts either way), from the start of a block to
#: the start of the next (the hand-offs and the waits for free buffers included), in the order
#: side, in turn, in turn, side; then runs the next `SIDE_KEEP_UNROLLS` unrolls the way that
#: took less time, and measures again.
SIDE_PROBE_UNROLLS = 8
SIDE_KEEP_UNROLLS = 256
_SIDE_PROBE_ORDER = (True, False, False, True)


class _SideChoice:
    """Whether an actor's next unroll runs its acts on the side thread (see
    `SIDE_PROBE_UNROLLS`)."""

    def __init__(self) -> None:
        self.keep = 0  # unrolls left to run the chosen way
        self.side = True
        self.phase = 0  # the probe's block
        self.count = 0  # unrolls begun in it
        self.start: float | None = None  # when it began
        self.spent = {True: 0.0, False: 0.0}

    def next(self, now: float) -> bool:
        """The way of the unroll that begins at ``now`` (seconds, `time.perf_counter`)."""
        if self.keep:
            self.keep -= 1
            return self.side
        if self.start is not None and self.count == SIDE_PROBE_UNROLLS:
            self.spent[_SIDE_PROBE_ORDER[self.phase]] += now - self.start
            self.phase, self.count, self.start = self.phase + 1, 0, None
            if self.phase == len(_SIDE_PROBE_ORDER):
                self.side = self.spent[True] <= self.spent[False]
                self.phase, self.spent = 0, {True: 0.0, False: 0.0}
                self.keep = SIDE_KEEP_UNROLLS - 1
                return self.side
        if self.start is None:
            self.start = now
        self.count += 1
        return _SIDE_PROBE_ORDER[self.phase]


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
        for r in self.buffers:  # buffer i is ticket i of the free queue (`_run_native`)
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
        #: "sync" double buffering that can act on the step loop's side thread: which way the
        #: next unroll goes (else None)
        self.side_choice = _SideChoice() if self.path == "split_side" else None
        try:
            # one seed per env where the vector env takes them (gymnasium types it int)
            obs, _ = envs.reset(seed=env_seeds(envs, seed, index, generation))  # type: ignore[arg-type]
        except ValueError as e:
            raise explain_env_error(envs, e) from e
        # The episodes in progress and a recurrent net's state, carried on every path.
        self.carry = Carry(index, envs, net, obs, self.rng, self.sampler, keep_resume_state)
        self.stats = ActorStats()
        self.seq = 0
        self._all = slice(0, self.num_envs)

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
        ``rollouts_per_version`` rollouts from each version."""
        meter = ThreadMeter()
        try:
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
        if self.path == "native_loop":
            if wait_for_version is not None or not isinstance(out_queue, HandOff):
                raise ValueError("the native actor loop needs a HandOff, no version waits")
            self._run_native(stop, out_queue, episodes, meter)
            return
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

    def _run_native(
        self,
        stop: threading.Event,
        out: HandOff[Rollout],
        episodes: EpisodeSink,
        meter: ThreadMeter,
    ) -> None:
        """The loop of `_run` in native calls (`rlpar._native.FusedActorLoop.run`) of up to
        `NATIVE_LOOP_S` each, without the GIL: take a free buffer, pin the latest snapshot, fused
        unroll, stamp the rollout's version and seq (the learner reads them, `Rollout.read_stamp`),
        queue it. Between two calls, with the GIL: the episodes that ended, the stats, the
        checkpoint copy, the stop flag. Not in deterministic mode (it waits for versions)."""
        c = self.carry
        c.obs = np.array(c.obs)  # written in place by the loop from now on
        c.prev_done = np.array(c.prev_done, bool)
        loop = self.envs.fused_loop(  # type: ignore[attr-defined]  # the plan checked it
            self.net,
            self.store,
            self.sampler,
            self.free.tickets,
            out.tickets,
            self.buffers,
            [out.reserve(r) for r in self.buffers],
            c,
            seq=self.seq,
        )
        steps = self.buffers[0].env_steps
        stats, clock = self.stats, time.perf_counter
        while not stop.is_set():
            t0 = clock()
            try:
                n, ends, wait_s = loop.run(NATIVE_LOOP_S)
            except ValueError as e:
                raise explain_env_error(self.envs, e) from e
            finally:
                self.seq = loop.seq
            if n:
                episodes.add_many(ends)
                c.unroll_done(None)
                stats.rollouts += n
                stats.env_steps += n * steps
            stats.env_s += clock() - t0 - wait_s
            stats.queue_wait_s += wait_s
            if (gil := meter.poll()) is not None:
                stats.gil = gil

    def unroll(self, r: Rollout, episodes: EpisodeSink) -> None:
        """Fill ``r`` with T steps, all acted with one pinned parameter version."""
        if self.fused:
            self._unroll_fused(r, episodes)
        elif self.side_choice is not None:
            if self.side_choice.next(time.perf_counter()):
                self._unroll_side_acts(r, episodes)
                self.stats.side_unrolls += 1
            else:
                self._unroll_double_buffered(r, episodes)
        elif self.path == "split":
            self._unroll_double_buffered(r, episodes)
        else:
            self._unroll_stepped(r, episodes)
        r.actor = self.index
        r.seq = self.seq
        if r.stamp is not None:  # what a native reader of the rollout takes them from
            r.stamp[0], r.stamp[1] = r.version, r.seq
        self.seq += 1
        self.stats.rollouts += 1
        self.stats.env_steps += r.env_steps

    def _unroll_fused(self, r: Rollout, episodes: EpisodeSink) -> None:
        """The whole unroll in one native call (its time counts as env stepping); the native
        loop carries the episodes as `_record` does."""
        t0 = time.perf_counter()
        envs, c = cast(FusedEnvs, self.envs), self.carry  # checked when the sampler was made
        with self.store.pin() as snap:
            r.version, ends = envs.fused_unroll(
                self.net, snap, self.sampler, r, c.ep_return, c.ep_length, c.core
            )
        episodes.add_many(ends)
        c.prev_done = r.terminated[-1] | r.truncated[-1]
        c.unroll_done(r)
        self.stats.env_s += time.perf_counter() - t0

    def _unroll_stepped(self, r: Rollout, episodes: EpisodeSink) -> None:
        """Envs that step in Python: between two env steps, one native call
        (`_native.StepLoop.step`) writes the step into ``r``, carries the episodes, runs the
        forward and (native sampling) draws the next actions; only the env's step and this one
        call hold the GIL. An agent that samples in Python acts after each call."""
        loop, envs, to_env = self.loop, self.envs, self.actions.to_env
        assert loop is not None  # made in __init__ for every actor that does not fuse
        act = None if self.sampler is not None else self._act
        clock = time.perf_counter
        steps = r.rewards.shape[0]
        t0 = clock()
        act_s = 0.0
        with self.store.pin() as snap:
            r.version = self.carry.begin(loop, snap, r)
            try:
                loop.act(0, self.carry.obs)
                if act is not None:
                    act_s += act(r, 0, self._all)
                for t in range(1, steps):
                    obs, reward, terminated, truncated, _ = envs.step(to_env(r.actions[t - 1]))
                    loop.step(t, obs, reward, terminated, truncated)
                    if act is not None:
                        act_s += act(r, t, self._all)
                obs, reward, terminated, truncated, _ = envs.step(to_env(r.actions[-1]))
                loop.record(steps - 1, obs, reward, terminated, truncated)
            finally:
                ends, native_s = loop.end()
        self.carry.unroll_done(r, obs)
        episodes.add_many(ends)
        self.stats.inference_s += native_s + act_s
        self.stats.env_s += clock() - t0 - native_s - act_s

    def _unroll_double_buffered(self, r: Rollout, episodes: EpisodeSink) -> None:
        """`_unroll_stepped` over two halves of the envs (`SplitEnvs`): each half's inference
        runs while the other half steps. Same rollout, same random draws in the same order:
        half 0's then half 1's columns at every step, as one [K] draw would take them."""
        loop, to_env = self.loop, self.actions.to_env
        assert loop is not None
        act = None if self.sampler is not None else self._act
        assert isinstance(self.envs, HalvedEnvs)
        halves = [
            (cols, cols.start, cols.stop, half)
            for cols, half in zip(self.envs.cols, self.envs.halves, strict=True)
        ]
        clock = time.perf_counter
        steps = r.rewards.shape[0]
        env_s = act_s = 0.0
        obs0 = self.carry.obs
        with self.store.pin() as snap:
            r.version = self.carry.begin(loop, snap, r)
            try:
                for t in range(steps):
                    for cols, begin, end, half in halves:
                        if t == 0:
                            loop.act(0, obs0[cols], begin, end)
                        else:
                            t0 = clock()
                            obs, reward, terminated, truncated = half.recv()
                            env_s += clock() - t0
                            loop.step(t, obs, reward, terminated, truncated, begin, end)
                        if act is not None:
                            act_s += act(r, t, cols)
                        half.send(to_env(r.actions[t, cols]))
                for _, begin, end, half in halves:
                    t0 = clock()
                    obs, reward, terminated, truncated = half.recv()
                    env_s += clock() - t0
                    loop.record(steps - 1, obs, reward, terminated, truncated, begin, end)
            finally:
                ends, native_s = loop.end()
        episodes.add_many(ends)
        self.carry.unroll_done(r)
        self.stats.inference_s += native_s + act_s
        self.stats.env_s += env_s

    def _unroll_side_acts(self, r: Rollout, episodes: EpisodeSink) -> None:
        """Double buffering for envs that step in this thread (`SyncHalf`): each half steps
        while the other half's forward and draw run on the step loop's side thread
        (`_native.StepLoop.step_async`, without the GIL). Every loop call first waits for the
        act in flight, so acts run in `_unroll_double_buffered`'s order: the same rollout."""
        loop, to_env = self.loop, self.actions.to_env
        assert loop is not None and isinstance(self.envs, HalvedEnvs)
        sync = self.envs.sync_halves()
        assert sync is not None  # the plan's "split_side"
        halves = [
            (cols, cols.start, cols.stop, half)
            for cols, half in zip(self.envs.cols, sync, strict=True)
        ]
        clock = time.perf_counter
        steps = r.rewards.shape[0]
        env_s = 0.0
        obs0 = self.carry.obs
        with self.store.pin() as snap:
            r.version = self.carry.begin(loop, snap, r)
            try:
                (first, b0, e0, _), (second, b1, e1, _) = halves
                loop.act(0, obs0[first], b0, e0)
                loop.act_async(0, obs0[second], b1, e1)
                for t in range(steps):
                    for cols, begin, end, envs in halves:
                        # this half's actions[t]: the loop call before waited for its act
                        actions = to_env(r.actions[t, cols])
                        t0 = clock()
                        obs, reward, terminated, truncated, _ = envs.step(actions)
                        env_s += clock() - t0
                        if t + 1 < steps:
                            loop.step_async(t + 1, obs, reward, terminated, truncated, begin, end)
                        else:
                            loop.record(t, obs, reward, terminated, truncated, begin, end)
            finally:
                ends, native_s = loop.end()
        episodes.add_many(ends)
        self.carry.unroll_done(r)
        self.stats.inference_s += native_s
        self.stats.env_s += env_s

    def _act(self, r: Rollout, t: int, cols: slice) -> float:
        """An agent that samples in Python: its `act` on step ``t``'s outputs of the envs
        ``cols``, written to ``r.actions``. Returns the seconds it took."""
        t0 = time.perf_counter()
        actions = self.agent.act(self.net, r.behaviour[t, cols], self.rng)
        r.actions[t, cols] = self.actions.checked(
            actions, cols.stop - cols.start, self.agent, "act"
        )
        return time.perf_counter() - t0


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
