"""The driver side of backend "ray": `RayActors` starts the actor processes, and one
`RemoteActor` per actor stands in for an `Actor` beside the learner, asking its process for
rollouts (`rlpar.runtime.ray.protocol`)."""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Collection
from typing import Any

import gymnasium as gym
import numpy as np

from rlpar.agent import Agent
from rlpar.config import EnvConfig, RuntimeConfig
from rlpar.data import Rollout
from rlpar.nn import Net
from rlpar.runtime.common import (
    POLL_S,
    ActorStats,
    EpisodeLog,
    ItemQueue,
    queue_get,
    queue_put,
)
from rlpar.runtime.envs import make_actor_envs, storage_dtype
from rlpar.runtime.ray.connect import check_cpus, connect, import_ray, on_loopback
from rlpar.runtime.ray.process import ActorProcess
from rlpar.runtime.ray.protocol import NeedParams, RolloutReply, RolloutRequest, canonical
from rlpar.snapshot import SnapshotStore

__all__ = [
    "CRASH_LOOP_REQUESTS",
    "PARAMS_INTERVAL_S",
    "READY_TIMEOUT_S",
    "RESTART_TIMEOUT_S",
    "RayActors",
    "RemoteActor",
]

log = logging.getLogger("rlpar")


READY_TIMEOUT_S = 120.0
"""How long to wait for the actor processes to start (workers import rlpar, build envs)."""
RESTART_TIMEOUT_S = 120.0
"""After a process died: how long its actors wait for a rollout from the new one."""


PARAMS_INTERVAL_S = 0.01
"""At most one ``ray.put`` of the parameters per this many seconds (and per version): each
put and each first read of it costs the object store (measured here on cartpole_impala: a put
per learner step cost about 35 % of the throughput, one per 10 ms about 6 %, for a few more
versions of policy lag)."""
CRASH_LOOP_REQUESTS = 4
"""Give up on an actor after this many times `buffers_per_actor` failed requests in a row."""


class RayActors:
    """The Ray actor processes of one run, from the driver's side.

    ``RayActors(env, cfg)`` connects to Ray (or starts a local instance) and reads the env's
    spaces from one local env; ``start`` launches the processes and returns one `RemoteActor`
    per actor; ``close`` kills them and disconnects. ``lost_rollouts``, ``restarts`` and
    ``pids`` are for monitoring and tests.
    """

    def __init__(self, env: EnvConfig, cfg: RuntimeConfig) -> None:
        self.env_cfg, self.cfg = env, cfg
        self.handles: list[Any] = []
        self.actors: list[RemoteActor] = []
        self.nodes: list[str] = []  # the Ray node id of each process, as first started
        self._closed = False
        probe = make_actor_envs(env, 1)  # unknown ids and bad spaces fail here, as with threads
        self.spaces = (probe.single_observation_space, probe.single_action_space)
        probe.close()
        self.ray = import_ray(local=on_loopback(cfg.ray_address))
        self._owns_connection = connect(
            self.ray, cfg.ray_address, max(os.cpu_count() or 1, cfg.num_actors),
            self._object_store_bytes(),
        )  # fmt: skip

    @property
    def num_processes(self) -> int:
        return self.cfg.num_actors // self.cfg.ray_actor_threads

    def start(
        self,
        agent: Agent,
        net: Net,
        store: SnapshotStore,
        generation: int,
        keep_resume_state: bool = False,
    ) -> list[RemoteActor]:
        """Start the actor processes (their actor threads start with the first requests).
        ``keep_resume_state``: their actors send what continues their episodes with each reply
        (`Actor.checkpoint_state`; envs that can save their state only)."""
        ray, cfg = self.ray, self.cfg
        try:
            check_cpus(ray, self.num_processes, cfg.ray_actor_threads)
            remote = ray.remote(ActorProcess).options(
                num_cpus=cfg.ray_actor_threads,
                max_restarts=-1,
                max_task_retries=0,
                max_concurrency=cfg.ray_actor_threads * cfg.buffers_per_actor + 2,
                scheduling_strategy="SPREAD",
            )
            spec = gym.spec(self.env_cfg.id)
            params = _ParamsBroadcast(ray, store)
            threads = cfg.ray_actor_threads
            for p in range(self.num_processes):
                indices = list(range(p * threads, (p + 1) * threads))
                handle = remote.remote(
                    agent, self.env_cfg, spec, cfg, indices, generation, keep_resume_state
                )
                self.handles.append(handle)
                self.actors += [
                    RemoteActor(index, j, handle, params, cfg) for j, index in enumerate(indices)
                ]
            self._wait_ready()
        except BaseException:
            self.close()
            raise
        return self.actors

    @property
    def lost_rollouts(self) -> int:
        """Requests in flight to actor processes when they died (see the module docstring)."""
        return sum(a.lost_rollouts for a in self.actors)

    @property
    def restarts(self) -> int:
        """Deaths of actor processes that had replied (Ray restarts each one)."""
        per_process: dict[int, int] = {}
        for a in self.actors:
            p = a.index // self.cfg.ray_actor_threads
            per_process[p] = max(per_process.get(p, 0), a.deaths)
        return sum(per_process.values())

    def pids(self) -> list[int]:
        """The latest known PID of each actor process."""
        threads = self.cfg.ray_actor_threads
        return [self.actors[p * threads].pid for p in range(self.num_processes)]

    def close(self, stuck: Collection[int] = ()) -> None:
        """Kill the actor processes and disconnect (idempotent). Call after the actor threads
        (`RemoteActor.run`) have stopped. ``stuck``: as `LocalActors.close` takes it; a stuck
        thread waits on a process that is killed all the same."""
        if self._closed:
            return
        self._closed = True
        if self.actors and (self.lost_rollouts or self.restarts):
            log.warning(
                "ray backend: %d actor process restart(s), %d rollout(s) lost",
                self.restarts,
                self.lost_rollouts,
            )
        for handle in self.handles:
            try:
                self.ray.kill(handle, no_restart=True)
            except Exception as e:  # already gone, or Ray is shutting down: nothing to free
                log.debug("ray.kill: %s", e)
        if self._owns_connection:
            self.ray.shutdown()

    def _object_store_bytes(self) -> int:
        """For a local instance: room for every rollout in flight and a few parameter
        versions, four times over; at least 100 MiB."""
        obs_space, action_space = self.spaces
        t, k = self.cfg.unroll_length, self.cfg.envs_per_actor
        obs = (t + 1) * k * int(np.prod(obs_space.shape or ())) * storage_dtype(obs_space).itemsize
        rollout = obs + t * k * (64 + 8 * int(np.prod(action_space.shape or (1,))))
        in_flight = self.cfg.num_actors * self.cfg.buffers_per_actor
        return max(100 << 20, 4 * in_flight * rollout)

    def _wait_ready(self) -> None:
        ray = self.ray
        refs = [h.ready.remote() for h in self.handles]
        try:
            infos = ray.get(refs, timeout=READY_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            raise RuntimeError(
                f"ray backend: the {len(refs)} actor processes did not start within "
                f"{READY_TIMEOUT_S:.0f} s (is the cluster busy? ray status shows it)"
            ) from None
        except ray.exceptions.RayError as e:
            raise _original(e) from None
        threads = self.cfg.ray_actor_threads
        for p, info in enumerate(infos):
            for a in self.actors[p * threads : (p + 1) * threads]:
                a.pid = info["pid"]
            self.nodes.append(info["node"])
            log.info(
                "ray backend: actor process %d: pid %d on node %s (%s)",
                p,
                info["pid"],
                info["node"][:8],
                info["ip"],
            )


class _ParamsBroadcast:
    """The latest published parameters in the object store: one ``ray.put`` per version,
    made by the first request that wants it (versions nobody asks for are never put)."""

    def __init__(self, ray: Any, store: SnapshotStore) -> None:
        self.ray, self.store = ray, store
        self.lock = threading.Lock()
        self.version = -1
        self.ref: Any = None
        self.put_at = -PARAMS_INTERVAL_S

    def latest(self) -> tuple[int, Any]:
        with self.lock:
            now = time.monotonic()
            if now - self.put_at >= PARAMS_INTERVAL_S:
                with self.store.pin() as snap:
                    if snap.version != self.version:
                        self.ref = self.ray.put(snap.params)  # flat float32 [num_params]
                        self.version, self.put_at = snap.version, now
            return self.version, self.ref


class RemoteActor:
    """Stands in for an `Actor` on the driver: its ``run`` keeps requests for rollouts in flight
    to actor thread ``thread`` of a Ray actor process, and feeds the replies to the learner."""

    def __init__(
        self,
        index: int,
        thread: int,
        process: Any,
        params: _ParamsBroadcast,
        cfg: RuntimeConfig,
    ) -> None:
        self.index, self.thread, self.process, self.params = index, thread, process, params
        self.in_flight = cfg.buffers_per_actor
        self.free: queue.Queue[Rollout | None] = queue.Queue()
        for _ in range(cfg.buffers_per_actor):  # slots: the learner hands each rollout back
            self.free.put(None)
        self.stats = ActorStats()
        # The same stream the actor thread draws from; updated from every reply (checkpoints).
        self.rng = np.random.default_rng(np.random.SeedSequence([cfg.seed, index, 1 << 20]))
        self.pid = 0
        self.lost_rollouts = 0
        self.deaths = 0
        self._sent_version = 0  # the newest parameters sent to the process (0: none yet)
        self._dead_pid = 0
        self._seen: tuple[int, float, float, float] = (0, 0.0, 0.0, 0.0)
        # The process's `Actor.checkpoint_state` as of its last reply: (rng, arrays or None).
        self._saved: tuple[dict, dict[str, np.ndarray] | None] = (self._rng_dict(None), None)
        self._resume: dict[str, np.ndarray] | None = None  # sent until the first reply
        self.resumed = False  # the process's actor continued the checkpoint's episodes

    def _rng_dict(self, sampler: list | None) -> dict:
        return {"numpy": self.rng.bit_generator.state, "sampler": sampler}

    def rng_state(self) -> dict:
        """The generators' states the process reported last (the driver's copy)."""
        return self._saved[0]

    def set_rng_state(self, numpy_state: dict | None, sampler_state: list | None) -> None:
        """Restore the state the next (re)started process thread samples from."""
        if numpy_state is not None:
            self.rng.bit_generator.state = numpy_state
        sampler = sampler_state if sampler_state is not None else self._saved[0]["sampler"]
        self._saved = (self._rng_dict(sampler), self._saved[1])

    def checkpoint_state(self) -> tuple[dict, dict[str, np.ndarray] | None]:
        """What the process's actor reported with its last reply (one reference): its
        generators and, when it keeps them, the arrays that continue its episodes."""
        return self._saved

    def load_resume_state(self, arrays: dict[str, np.ndarray]) -> None:
        """Send ``arrays`` with the requests until the first reply: the process's actor
        loads them when it starts (`Actor.load_resume_state`; one that does not fit is
        skipped there, with a warning here). A process restarted later starts new episodes."""
        self._resume = arrays

    def run(
        self,
        stop: threading.Event,
        out_queue: ItemQueue[Rollout],
        episodes: EpisodeLog,
        wait_for_version: Callable[[int], bool] | None = None,
        rollouts_per_version: int = 1,
    ) -> None:
        """Until ``stop``: keep ``in_flight`` requests out, deliver each reply as it arrives."""
        if wait_for_version is not None:  # RuntimeConfig refuses this combination
            raise ValueError('deterministic mode needs runtime.backend = "threads"')
        ray = self.params.ray
        pending: dict[Any, int] = {}  # request -> deaths seen when it was sent, oldest first
        failed_in_a_row, died_at = 0, None
        while not stop.is_set():
            while len(pending) < self.in_flight:
                pending[self._request()] = self.deaths
            # The process serves this actor's requests in order: take the oldest reply as soon
            # as it arrives (one call per reply; ray.wait + ray.get would be two).
            ref = next(iter(pending))
            try:
                reply = ray.get(ref, timeout=POLL_S)
            except ray.exceptions.GetTimeoutError:
                if died_at is not None and time.monotonic() - died_at > RESTART_TIMEOUT_S:
                    raise RuntimeError(
                        f"actor-{self.index}: its Ray actor process died and was not back "
                        f"within {RESTART_TIMEOUT_S:.0f} s"
                    ) from None
                continue
            except ray.exceptions.RayActorError as e:  # the process died, or is restarting
                failed_in_a_row += 1
                if failed_in_a_row > CRASH_LOOP_REQUESTS * self.in_flight:
                    raise RuntimeError(
                        f"actor-{self.index}: its Ray actor process keeps dying "
                        f"({failed_in_a_row} requests failed in a row): {e}"
                    ) from None
                self._failed(pending.pop(ref), e)
                died_at = died_at or time.monotonic()
                continue
            except ray.exceptions.RayTaskError as e:  # an env, agent.act or actor error
                raise _original(e) from None
            del pending[ref]
            failed_in_a_row, died_at = 0, None
            if isinstance(reply, NeedParams):  # a new process, asked before we knew the old died
                self._sent_version = 0
            elif not self._deliver(reply, stop, out_queue, episodes):
                return

    def _request(self) -> Any:
        version, ref = self.params.latest()
        if version > self._sent_version:
            self._sent_version = version
        else:
            ref = None  # the process has these already: a request without arguments is cheap
        request = RolloutRequest(
            thread=self.thread,
            version=version,
            rng_state=dict(self.rng.bit_generator.state),
            restarts=self.deaths,
            sampler_state=self._saved[0]["sampler"],
            resume=self._resume,
        )
        return self.process.next_rollouts.remote(request, ref)

    def _failed(self, sent_at: int, e: Exception) -> None:
        """A request failed: the process died with it, or was being restarted when it came.
        ``sent_at``: the deaths seen when it was sent."""
        self._sent_version = 0  # a new process has no parameters yet
        if self.pid != self._dead_pid:  # the process that last replied has died
            self._dead_pid = self.pid
            self.deaths += 1
            log.warning(
                "actor-%d: its Ray actor process (pid %d) died (%s); Ray restarts it and the "
                "run goes on",
                self.index,
                self.pid,
                type(e).__name__,
            )
        if sent_at < self.deaths:  # it was in flight to the process that died
            self.lost_rollouts += 1

    def _deliver(
        self,
        reply: RolloutReply,
        stop: threading.Event,
        out_queue: ItemQueue[Rollout],
        episodes: EpisodeLog,
    ) -> bool:
        if stop.is_set():  # the run has ended: its result counts nothing more
            return False
        self._saved = reply.saved  # the process actor's generators (and episodes), one unroll
        self.rng.bit_generator.state = self._saved[0]["numpy"]
        if self._resume is not None:
            self._resume = None
            self.resumed = reply.resumed
            if reply.resume_refused:
                log.warning(
                    "resume: %s; actor %d starts new episodes", reply.resume_refused, self.index
                )
        self._count_times(reply)
        episodes.add_many(reply.episodes)
        arrays = {name: canonical(a) for name, a in reply.arrays.items()}
        for i, (version, seq) in enumerate(zip(reply.versions, reply.seqs, strict=True)):
            queue_get(self.free, stop)  # a slot (the learner hands them back): back-pressure
            if stop.is_set():
                return False
            rollout = Rollout(
                **{name: a[i] for name, a in arrays.items()},
                version=version,
                actor=self.index,
                seq=seq,
            )
            self.stats.env_steps += rollout.env_steps
            self.stats.rollouts += 1
            if not queue_put(out_queue, rollout, stop):
                return False
        return True

    def _count_times(self, reply: RolloutReply) -> None:
        """Stage times are the actor thread's, sent as running totals of its process."""
        pid = reply.pid
        env_s, inference_s, wait_s = reply.times
        seen = self._seen if self._seen[0] == pid else (pid, 0.0, 0.0, 0.0)
        s = self.stats
        s.env_s += env_s - seen[1]
        s.inference_s += inference_s - seen[2]
        s.queue_wait_s += wait_s - seen[3]
        self._seen = (pid, env_s, inference_s, wait_s)
        self.pid = pid


def _original(e: Exception) -> BaseException:
    """The exception raised in the actor process (its type, with the remote traceback in the
    message), or Ray's error when there is none."""
    try:
        return e.as_instanceof_cause()  # type: ignore[attr-defined]  # a RayTaskError's
    except Exception:
        return e
