"""An actor thread: steps its K envs with one batched forward per step, writes rollouts."""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable

import numpy as np
from gymnasium.vector import VectorEnv

from rlpar import _native
from rlpar.agent import Agent
from rlpar.data import Rollout
from rlpar.nn import Net
from rlpar.runtime.common import (
    ActorStats,
    EpisodeLog,
    EpisodeSink,
    FusedEnvs,
    queue_get,
    queue_put,
)
from rlpar.runtime.envs import ActionAdapter, env_seeds, explain_env_error, storage_dtype
from rlpar.runtime.recurrent import CoreState
from rlpar.snapshot import SnapshotStore

__all__ = ["Actor"]

log = logging.getLogger("rlpar")


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
    ) -> None:
        self.index = index
        self.envs = envs
        self.agent = agent
        self.net = net
        self.store = store
        self.actions = ActionAdapter(envs.single_action_space)
        obs_space = envs.single_observation_space
        self.num_envs = envs.num_envs
        self.free: queue.Queue[Rollout] = queue.Queue()
        for _ in range(num_buffers):
            self.free.put(
                Rollout.allocate(
                    unroll_length,
                    self.num_envs,
                    obs_space.shape,
                    storage_dtype(obs_space),
                    self.actions.shape,
                    self.actions.dtype,
                    net.output_size,
                    actor=index,
                    state_size=net.state_size,
                )
            )
        self.rng = np.random.default_rng(np.random.SeedSequence([seed, index, 1 << 20]))
        # The fused path: native envs and an agent that samples the categorical softmax.
        self.sampler = None
        if agent.native_sampling and isinstance(envs, FusedEnvs):
            try:
                envs.check_fused(net)
            except ValueError as e:
                log.info("actor %d: Python path (%s)", index, e)
            else:
                key = np.random.SeedSequence([seed, index, 1 << 21]).generate_state(1)[0]
                self.sampler = _native.CategoricalSampler(int(key))
        try:
            obs, _ = envs.reset(seed=env_seeds(envs, seed, index, generation))
        except ValueError as e:
            raise explain_env_error(envs, e) from e
        self.obs = obs
        self.prev_done = np.zeros(self.num_envs, bool)
        self.ep_return = np.zeros(self.num_envs, np.float64)
        self.ep_length = np.zeros(self.num_envs, np.int64)
        self.stats = ActorStats()
        # A recurrent net's state (None for a feed-forward net): the Python path carries it.
        self.core = CoreState(net, self.num_envs) if net.recurrent else None
        self.seq = 0
        self._rng_state = self._read_rng_state()

    def rng_state(self) -> dict:
        """The sampling generators' states as of the last finished unroll (what a checkpoint
        keeps). Copied by the actor thread itself: reading a generator that another thread is
        drawing from (the native sampler draws with the GIL released) would race."""
        return self._rng_state

    def set_rng_state(self, numpy_state: dict | None, sampler_state: list | None) -> None:
        """Restore what `rng_state` returned (None leaves that generator as it is)."""
        if numpy_state is not None:
            self.rng.bit_generator.state = numpy_state
        if sampler_state is not None and self.sampler is not None:
            self.sampler.state = tuple(sampler_state)
        self._rng_state = self._read_rng_state()

    def _read_rng_state(self) -> dict:
        sampler = list(self.sampler.state) if self.sampler is not None else None
        return {"numpy": self.rng.bit_generator.state, "sampler": sampler}

    def run(
        self,
        stop: threading.Event,
        out_queue: queue.Queue[Rollout],
        episodes: EpisodeLog,
        wait_for_version: Callable[[int], bool] | None = None,
        rollouts_per_version: int = 1,
    ) -> None:
        """Unroll until ``stop`` is set. In deterministic mode ``wait_for_version(v)`` blocks
        until version ``v`` is published (False when stopping), and the actor makes exactly
        ``rollouts_per_version`` rollouts from each version."""
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
            version += 1

    def unroll(self, r: Rollout, episodes: EpisodeSink) -> None:
        """Fill ``r`` with T steps, all acted with one pinned parameter version."""
        if self.sampler is not None:
            self._unroll_fused(r, episodes)
        else:
            self._unroll_python(r, episodes)
        r.actor = self.index
        r.seq = self.seq
        self.seq += 1
        self.stats.rollouts += 1
        self.stats.env_steps += r.env_steps
        self._rng_state = self._read_rng_state()

    def _unroll_fused(self, r: Rollout, episodes: EpisodeSink) -> None:
        """The whole unroll in one native call (its time counts as env stepping)."""
        t0 = time.perf_counter()
        with self.store.pin() as snap:
            r.version, ends = self.envs.fused_unroll(
                self.net, snap, self.sampler, r, self.ep_return, self.ep_length
            )
        episodes.add_many(ends)
        self.prev_done = r.terminated[-1] | r.truncated[-1]
        self.obs = r.obs[-1].copy()
        self.stats.env_s += time.perf_counter() - t0

    def _unroll_python(self, r: Rollout, episodes: EpisodeSink) -> None:
        net, agent, envs, rng, stats = self.net, self.agent, self.envs, self.rng, self.stats
        clock = time.perf_counter
        core = self.core
        if core is not None:
            core.begin_unroll(r)
        with self.store.pin() as snap:
            r.version = snap.version
            for t in range(r.rewards.shape[0]):
                t0 = clock()
                r.obs[t] = self.obs
                out = r.behaviour[t]
                if core is None:
                    net.forward(snap, r.obs[t], out)  # positional: keywords cost ~0.4 us
                else:
                    core.forward(snap, r.obs[t], out)
                a = agent.act(net, out, rng)
                r.actions[t] = a
                t1 = clock()
                obs, reward, terminated, truncated, _ = envs.step(self.actions.to_env(a))
                t2 = clock()
                r.rewards[t] = reward
                r.terminated[t] = terminated
                r.truncated[t] = truncated
                np.logical_not(self.prev_done, out=r.mask[t])
                if core is not None:
                    core.after_step(r.mask[t])
                self._track_episodes(r.mask[t], reward, terminated | truncated, episodes)
                self.obs = obs
                stats.inference_s += t1 - t0
                stats.env_s += t2 - t1
            r.obs[-1] = self.obs

    def _track_episodes(
        self,
        valid: np.ndarray,
        reward: np.ndarray,
        done: np.ndarray,
        episodes: EpisodeSink,
    ) -> None:
        self.ep_return += np.where(valid, reward, 0.0)
        self.ep_length += valid
        self.prev_done = done
        if done.any():
            k = np.flatnonzero(done)
            rets, lens = self.ep_return[k].tolist(), self.ep_length[k].tolist()
            episodes.add_many(list(zip(rets, lens, strict=True)))
            self.ep_return[done] = 0.0
            self.ep_length[done] = 0
