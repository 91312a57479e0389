"""The actor's unrollers, one per loop of the run's plan (`rlpar.runtime.plan`): each fills a
rollout with T steps acted with one pinned parameter version, carrying the episodes in the
actor's `Carry`, in one method, ``unroll(r, episodes)``.

- `Fused`: rlpar's native envs: the whole unroll in one GIL-free native call.
- `Stepped`: a vector env stepped from Python, one native call (`_native.StepLoop`) between two
  env steps: the step written into the rollout, the episodes carried, the forward and (native
  sampling) the draw.
- `InTurn`: double buffering (`HalvedEnvs`): the same over column ranges, each half's forward
  while the other half steps.
- `SideActs`: "sync" halves that step in the actor thread while the other half's forward runs
  on the step loop's side thread.
- `SideAuto`: `SideActs` or `InTurn`, whichever `SideProbe` measured faster.

The three step-loop unrollers share their skeleton (`StepParts.run`: pin, ``carry.begin``, the
steps, ``loop.end``, the episodes, ``carry.unroll_done``, the stats); each writes only its
steps. The actor's whole loop in native calls is `rlpar.runtime.handoff.run_native_actor_loop`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from gymnasium.vector import VectorEnv

from rlpar import _native
from rlpar.agent import Agent
from rlpar.data import Rollout
from rlpar.nn import Net
from rlpar.runtime.actor_carry import Carry
from rlpar.runtime.common import ActorStats, EpisodeSink, FusedEnvs, HalvedEnvs
from rlpar.runtime.envs import ActionAdapter
from rlpar.snapshot import SnapshotStore

__all__ = [
    "SIDE_KEEP_UNROLLS",
    "SIDE_PROBE_UNROLLS",
    "Fused",
    "InTurn",
    "PythonAct",
    "SideActs",
    "SideAuto",
    "SideProbe",
    "StepParts",
    "StepTimes",
    "Stepped",
    "Unroller",
]

#: "sync" double buffering (`SideActs`) pays only where a core is free for the step loop's
#: side thread: beside a busy learner on 2 cores the side thread takes the learner's core
#: time, and the actor then waits longer for its free buffers. So such an actor times blocks
#: of `SIDE_PROBE_UNROLLS` unrolls both ways (the acts on the side thread, or the halves' acts
#: in turn in its own thread: the same rollouts either way), from the start of a block to the
#: start of the next (the hand-offs and the waits for free buffers included), in the order
#: side, in turn, in turn, side; then runs the next `SIDE_KEEP_UNROLLS` unrolls the way that
#: took less time, and measures again.
SIDE_PROBE_UNROLLS = 8
SIDE_KEEP_UNROLLS = 256
_SIDE_PROBE_ORDER = (True, False, False, True)


class Unroller(Protocol):
    """One way to fill a rollout."""

    def unroll(self, r: Rollout, episodes: EpisodeSink) -> None:
        """Fill ``r`` (T steps of K envs) acted with one pinned version (``r.version``); the
        episodes that ended go to ``episodes``."""


class Fused:
    """The whole unroll in one native call (its time counts as env stepping); the native loop
    carries the episodes as the step loop does."""

    def __init__(
        self,
        envs: FusedEnvs,
        net: Net,
        store: SnapshotStore,
        sampler: _native.CategoricalSampler,
        carry: Carry,
        stats: ActorStats,
    ) -> None:
        self.envs, self.net, self.store, self.sampler = envs, net, store, sampler
        self.carry, self.stats = carry, stats

    def unroll(self, r: Rollout, episodes: EpisodeSink) -> None:
        """`Unroller.unroll`."""
        t0 = time.perf_counter()
        c = self.carry
        with self.store.pin() as snap:
            r.version, ends = self.envs.fused_unroll(
                self.net, snap, self.sampler, r, c.ep_return, c.ep_length, c.core
            )
        episodes.add_many(ends)
        c.prev_done = r.terminated[-1] | r.truncated[-1]
        c.unroll_done(r)
        self.stats.env_s += time.perf_counter() - t0


class PythonAct:
    """An agent that samples in Python: its `act` on step ``t``'s outputs of the envs ``cols``,
    written to ``r.actions`` [T, K] or [T, K, A]; a call returns the seconds it took."""

    def __init__(self, agent: Agent, net: Net, rng: np.random.Generator, actions: ActionAdapter):
        self.agent, self.net, self.rng, self.actions = agent, net, rng, actions

    def __call__(self, r: Rollout, t: int, cols: slice) -> float:
        t0 = time.perf_counter()
        actions = self.agent.act(self.net, r.behaviour[t, cols], self.rng)
        r.actions[t, cols] = self.actions.checked(
            actions, cols.stop - cols.start, self.agent, "act"
        )
        return time.perf_counter() - t0


@dataclass
class StepTimes:
    """What an unroll's steps report to `StepParts.run`: seconds spent stepping envs (None: the
    rest of the unroll's wall time, after the native calls and the acts), seconds in the Python
    acts, and the next observations [K, *obs_shape] (None: the rollout's last)."""

    env_s: float | None
    act_s: float
    obs: np.ndarray | None = None


#: An unroll's steps: given the loop bound to the rollout, write all T steps into it.
Steps = Callable[[_native.StepLoop, Rollout], StepTimes]


@dataclass(frozen=True)
class StepParts:
    """What the step-loop unrollers share: the loop, the snapshot store, the carry, the stats,
    the actions' conversion for the envs, and ``act`` (`PythonAct`; None with native
    sampling)."""

    loop: _native.StepLoop
    store: SnapshotStore
    carry: Carry
    stats: ActorStats
    to_env: Callable[[np.ndarray], np.ndarray]
    act: PythonAct | None

    def run(self, r: Rollout, episodes: EpisodeSink, steps: Steps) -> None:
        """The skeleton of a step-loop unroll: pin the latest snapshot, bind the loop to ``r``
        and the episodes (`Carry.begin`), ``steps``, end the loop (even when a step raised),
        then the episodes that ended, the carry's next observations and checkpoint copy, and
        the inference and env-stepping times."""
        loop, clock = self.loop, time.perf_counter
        t0 = clock()
        with self.store.pin() as snap:
            r.version = self.carry.begin(loop, snap, r)
            try:
                times = steps(loop, r)
            finally:
                ends, native_s = loop.end()
        self.carry.unroll_done(r, times.obs)
        episodes.add_many(ends)
        self.stats.inference_s += native_s + times.act_s
        if times.env_s is None:
            self.stats.env_s += clock() - t0 - native_s - times.act_s
        else:
            self.stats.env_s += times.env_s


class Stepped:
    """Envs that step in Python: between two env steps, one native call
    (`_native.StepLoop.step`) writes the step into ``r``, carries the episodes, runs the
    forward and (native sampling) draws the next actions; only the env's step and this one call
    hold the GIL. An agent that samples in Python acts after each call."""

    def __init__(self, envs: VectorEnv, parts: StepParts) -> None:
        self.envs, self.parts = envs, parts
        self.all = slice(0, envs.num_envs)

    def unroll(self, r: Rollout, episodes: EpisodeSink) -> None:
        """`Unroller.unroll`."""
        self.parts.run(r, episodes, self._steps)

    def _steps(self, loop: _native.StepLoop, r: Rollout) -> StepTimes:
        step, to_env, act, cols = self.envs.step, self.parts.to_env, self.parts.act, self.all
        steps = r.rewards.shape[0]
        act_s = 0.0
        loop.act(0, self.parts.carry.obs)
        if act is not None:
            act_s += act(r, 0, cols)
        for t in range(1, steps):
            obs, reward, terminated, truncated, _ = step(to_env(r.actions[t - 1]))
            loop.step(t, obs, reward, terminated, truncated)
            if act is not None:
                act_s += act(r, t, cols)
        obs, reward, terminated, truncated, _ = step(to_env(r.actions[-1]))
        loop.record(steps - 1, obs, reward, terminated, truncated)
        return StepTimes(None, act_s, obs)


class InTurn:
    """`Stepped` over two halves of the envs (`HalvedEnvs`): each half's inference runs while
    the other half steps. Same rollout, same random draws in the same order: half 0's then
    half 1's columns at every step, as one [K] draw would take them."""

    def __init__(self, envs: HalvedEnvs, parts: StepParts) -> None:
        self.halves = [
            (cols, cols.start, cols.stop, half)
            for cols, half in zip(envs.cols, envs.halves, strict=True)
        ]
        self.parts = parts

    def unroll(self, r: Rollout, episodes: EpisodeSink) -> None:
        """`Unroller.unroll`."""
        self.parts.run(r, episodes, self._steps)

    def _steps(self, loop: _native.StepLoop, r: Rollout) -> StepTimes:
        to_env, act, halves = self.parts.to_env, self.parts.act, self.halves
        clock = time.perf_counter
        steps = r.rewards.shape[0]
        env_s = act_s = 0.0
        obs0 = self.parts.carry.obs
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
        return StepTimes(env_s, act_s)


class SideActs:
    """Double buffering for envs that step in the actor thread ("sync" halves,
    `HalvedEnvs.sync_halves`): each half steps while the other half's forward and draw run on
    the step loop's side thread (`_native.StepLoop.step_async`, without the GIL). Every loop
    call first waits for the act in flight, so acts run in `InTurn`'s order: the same
    rollout. Needs native sampling and a net without Python layers (``loop.can_act_async``)."""

    def __init__(self, envs: HalvedEnvs, parts: StepParts) -> None:
        sync = envs.sync_halves()
        if sync is None or not parts.loop.can_act_async:
            raise ValueError("SideActs: needs sync halves and a loop that can act async")
        self.halves = [
            (cols, cols.start, cols.stop, half) for cols, half in zip(envs.cols, sync, strict=True)
        ]
        self.parts = parts

    def unroll(self, r: Rollout, episodes: EpisodeSink) -> None:
        """`Unroller.unroll`."""
        self.parts.run(r, episodes, self._steps)

    def _steps(self, loop: _native.StepLoop, r: Rollout) -> StepTimes:
        to_env, halves = self.parts.to_env, self.halves
        clock = time.perf_counter
        steps = r.rewards.shape[0]
        env_s = 0.0
        obs0 = self.parts.carry.obs
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
        return StepTimes(env_s, 0.0)


class SideProbe:
    """Whether the next unroll runs its acts on the side thread (see `SIDE_PROBE_UNROLLS`)."""

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


class SideAuto:
    """`SideActs` or `InTurn` (the same rollouts), unroll by unroll as `SideProbe` says; counts
    the side thread's unrolls in ``stats.side_unrolls``."""

    def __init__(self, side: SideActs, in_turn: InTurn, stats: ActorStats) -> None:
        self.side, self.in_turn, self.stats = side, in_turn, stats
        self.probe = SideProbe()

    def unroll(self, r: Rollout, episodes: EpisodeSink) -> None:
        """`Unroller.unroll`."""
        if self.probe.next(time.perf_counter()):
            self.side.unroll(r, episodes)
            self.stats.side_unrolls += 1
        else:
            self.in_turn.unroll(r, episodes)
