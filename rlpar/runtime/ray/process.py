"""The process side of backend "ray": an `ActorProcess` runs ordinary actor threads in a Ray
actor process and answers each `RolloutRequest` with a `RolloutReply`."""

from __future__ import annotations

import logging
import os
import queue
import threading
from typing import Any

import gymnasium as gym
import numpy as np

from rlpar.agent import Agent
from rlpar.config import EnvConfig, RuntimeConfig
from rlpar.data import ARRAY_FIELDS, Rollout
from rlpar.nn import Net
from rlpar.runtime.actor import Actor
from rlpar.runtime.common import (
    POLL_S,
    EpisodeLog,
)
from rlpar.runtime.env_setup import run_setup
from rlpar.runtime.envs import make_actor_envs
from rlpar.runtime.plan import choose_actor_loop
from rlpar.runtime.ray.protocol import NeedParams, RolloutReply, RolloutRequest, canonical
from rlpar.snapshot import SnapshotStore

__all__ = ["PROCESS_BUFFERS", "ActorProcess"]

log = logging.getLogger("rlpar")


PROCESS_BUFFERS = 2
"""An actor thread in a Ray actor process has this many times `buffers_per_actor` rollouts: a
reply carries every rollout the thread has finished, so Ray's cost per call is shared."""


class _EpisodeInbox(EpisodeLog):
    """The process's finished episodes, sent to the driver with the next reply."""

    def add_many(self, ended: list[tuple[float, int]]) -> None:
        with self.lock:
            self.episodes.extend([(ret, length, 0) for ret, length in ended])

    def drain(self) -> list[tuple[float, int]]:
        with self.lock:
            out = [(ret, length) for ret, length, _ in self.episodes]
            self.episodes.clear()
        return out


class ActorProcess:
    """A Ray actor process: ``len(indices)`` ordinary actor threads (`Actor.run`, K envs each)
    sharing one `Net` and one local `SnapshotStore`. Wrapped by ``ray.remote`` in
    `RayActors.start`; Ray restarts it by calling ``__init__`` again with the same arguments."""

    def __init__(
        self,
        agent: Agent,
        env_cfg: EnvConfig,
        env_spec: gym.envs.registration.EnvSpec,
        cfg: RuntimeConfig,
        indices: list[int],
        generation: int,
        keep_resume_state: bool = False,
    ) -> None:
        if env_cfg.id not in gym.registry:
            run_setup(env_cfg.setup)
        if env_cfg.id not in gym.registry:  # registered at run time in the driver
            gym.registry[env_cfg.id] = env_spec
        self.agent, self.cfg, self.indices, self.generation = agent, cfg, indices, generation
        self.keep_resume_state = keep_resume_state
        self.resumed: dict[int, bool | str] = {}  # thread -> loaded, or why it was refused
        self.envs = [make_actor_envs(env_cfg, cfg.envs_per_actor) for _ in indices]
        first = self.envs[0]
        self.net = Net(agent.net_spec(first.single_observation_space, first.single_action_space))
        self.store = SnapshotStore(self.net.num_params, num_slots=min(255, len(indices) + 3))
        self.version = 0
        self.lock = threading.Lock()  # one writer for the store; one start per thread
        self.stop = threading.Event()
        self.episodes = _EpisodeInbox()
        self.actors: dict[int, Actor] = {}
        self.queues: dict[int, queue.Queue[Rollout]] = {}
        self.errors: dict[int, BaseException] = {}

    def ready(self) -> dict[str, Any]:
        import ray

        node = ray.get_runtime_context().get_node_id()
        return {"pid": os.getpid(), "node": node, "ip": ray.util.get_node_ip_address()}

    def next_rollouts(
        self, request: RolloutRequest, params: np.ndarray | None
    ) -> RolloutReply | NeedParams:
        """Publish ``params`` (version ``request.version``) if newer; start actor thread
        ``request.thread`` on its first request (restoring the request's generators and
        loading its ``resume`` episodes); wait for its next rollout and hand over every one it
        has finished (`RolloutReply`). `NeedParams` when the process has no parameters yet."""
        thread = request.thread
        with self.lock:
            if params is not None and request.version > self.version:
                self.store.publish(canonical(params), version=request.version)
                self.version = request.version
            if thread not in self.actors:
                if self.version == 0:
                    return NeedParams()
                self._start(request)
        actor, q = self.actors[thread], self.queues[thread]
        rollouts = [self._first(thread, q)]
        while True:
            try:
                rollouts.append(q.get_nowait())
            except queue.Empty:
                break
        arrays = {n: np.stack([getattr(r, n) for r in rollouts]) for n in ARRAY_FIELDS}
        versions, seqs = [r.version for r in rollouts], [r.seq for r in rollouts]
        for r in rollouts:
            actor.free.put(r)
        s = actor.stats
        resumed = self.resumed.get(thread, False)
        return RolloutReply(
            arrays=arrays,
            versions=versions,
            seqs=seqs,
            saved=actor.checkpoint_state(),  # the generators and episodes of one unroll
            resumed=resumed is True,
            resume_refused=resumed if isinstance(resumed, str) else None,
            episodes=self.episodes.drain(),
            pid=os.getpid(),
            times=(s.env_s, s.inference_s, s.queue_wait_s),
        )

    def _first(self, thread: int, q: queue.Queue[Rollout]) -> Rollout:
        while True:
            if thread in self.errors:
                raise self.errors[thread]
            try:
                return q.get(timeout=POLL_S)
            except queue.Empty:
                continue

    def _start(self, request: RolloutRequest) -> None:
        thread, restarts, resume = request.thread, request.restarts, request.resume
        cfg, index = self.cfg, self.indices[thread]
        # A restarted process must not replay the episodes of the first: new env seeds.
        generation = self.generation + (restarts << 32)
        actor = Actor(
            index,
            envs=self.envs[thread],
            agent=self.agent,
            net=self.net,
            store=self.store,
            unroll_length=cfg.unroll_length,
            num_buffers=PROCESS_BUFFERS * cfg.buffers_per_actor,
            seed=cfg.seed,
            generation=generation,
            keep_resume_state=self.keep_resume_state,
            loop=choose_actor_loop(
                self.envs[thread], self.agent, self.net, "rollouts cross processes"
            ).loop,
        )
        actor.set_rng_state(request.rng_state, request.sampler_state)
        if resume is not None and restarts == 0:  # a restarted process starts new episodes
            try:
                actor.load_resume_state(resume)
                self.resumed[thread] = True
            except ValueError as e:
                self.resumed[thread] = str(e)
        self.actors[thread] = actor
        self.queues[thread] = queue.Queue()

        def body() -> None:
            try:
                actor.run(self.stop, self.queues[thread], self.episodes)
            except BaseException as e:  # reaches the driver with the next request
                self.errors[thread] = e

        threading.Thread(target=body, name=f"rlpar-actor-{index}", daemon=True).start()
