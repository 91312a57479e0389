"""The Ray backend (``runtime.backend = "ray"``): actor threads in Ray actor processes, the
learner in this (the driver) process.

::

    driver process (Runner: learner thread, main thread)     Ray actor process p (one per
                                                             `ray_actor_threads` actors)
    learner thread: agent.learn -> store.publish(version v)  net = Net(spec)  (one, shared)
                                                             store = SnapshotStore (its own)
    RemoteActor thread a (one per actor, in place of Actor): actor threads j: Actor.run, as
      params = ray.put(store[v]): once per version, at          with threads: K envs, one
        most every PARAMS_INTERVAL_S                            pinned version per unroll
      keeps `buffers_per_actor` requests in flight:
        next_rollouts.remote(j, v, params if new) ─────────►  publish params if newer; start
                                                              thread j on its first request
      ray.get(oldest) -> Rollouts -> learner queue ◀────────  reply: every rollout thread j has
        (one driver-side slot per rollout: back-pressure)      finished (numpy arrays), the
                                                              process's new episodes

The learner, the queue, policy lag, checkpoints and monitoring are the threads backend's,
unchanged: a `RemoteActor` looks like an `Actor` to them (``index``, ``free``, ``stats``,
``rng``, ``run``, ``checkpoint_state``): with checkpoints on, each reply carries the actor's
`Actor.checkpoint_state` (its generators and, on native envs, its episodes in progress), and a
resumed run's processes load the checkpoint's when their actor threads first start. Memory is
bounded per actor: ``PROCESS_BUFFERS * buffers_per_actor``
rollouts in its process, ``buffers_per_actor`` replies in flight and as many rollouts at the
driver.

Faults: Ray restarts a dead actor process (``max_restarts=-1``) and the run goes on. The
requests that were in flight to it fail; each is counted in `RemoteActor.lost_rollouts` (it
stood for at least one rollout, made or in the making, that never reached the learner) and the
death is logged. The next requests start the threads of the new process with the latest
parameters, the actors' RNG states as last delivered and newly seeded envs. An actor whose
process fails `CRASH_LOOP_REQUESTS` times `buffers_per_actor` requests in a row, or is not
back within `RESTART_TIMEOUT_S`, stops the run with an error.

Ray is imported only here, and only when a Runner is built with backend "ray".
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import queue
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Collection, Iterator
from pathlib import Path
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
    ActorStats,
    EpisodeLog,
    ItemQueue,
    queue_get,
    queue_put,
)
from rlpar.runtime.env_setup import add_import_folders, import_folders, run_setup
from rlpar.runtime.envs import make_actor_envs, storage_dtype
from rlpar.runtime.plan import choose_actor_loop
from rlpar.snapshot import SnapshotStore

__all__ = ["RayActors", "RemoteActor", "connect_ray", "init_local_ray"]

log = logging.getLogger("rlpar")

READY_TIMEOUT_S = 120.0
"""How long to wait for the actor processes to start (workers import rlpar, build envs)."""
RESTART_TIMEOUT_S = 120.0
"""After a process died: how long its actors wait for a rollout from the new one."""
PROCESS_BUFFERS = 2
"""An actor thread in a Ray actor process has this many times `buffers_per_actor` rollouts: a
reply carries every rollout the thread has finished, so Ray's cost per call is shared."""
PARAMS_INTERVAL_S = 0.01
"""At most one ``ray.put`` of the parameters per this many seconds (and per version): each
put and each first read of it costs the object store (measured here on cartpole_impala: a put
per learner step cost about 35 % of the throughput, one per 10 ms about 6 %, for a few more
versions of policy lag)."""
CRASH_LOOP_REQUESTS = 4
"""Give up on an actor after this many times `buffers_per_actor` failed requests in a row."""
LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}
"""Set (unless already set) before importing Ray for a local instance, or a cluster on
loopback: every Ray process then listens on 127.0.0.1 only (Ray's single-machine mode; without
it Ray also maps a 127.0.0.1 address to this machine's network address), and sends no usage
statistics."""


def _on_loopback(address: str | None) -> bool:
    """A local instance (None), or a cluster at a loopback address."""
    if address is None:
        return True
    host = address.rpartition(":")[0].strip("[]")
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _import_ray(local: bool) -> Any:
    if local and "ray" not in sys.modules:
        for key, value in LOOPBACK_ENV.items():
            os.environ.setdefault(key, value)
    try:
        import ray
    except ImportError as e:
        raise ImportError('runtime.backend = "ray" needs Ray: pip install "rlpar[ray]"') from e
    return ray


# ----------------------------------------------------------------------------- driver side


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
        self.ray = _import_ray(local=_on_loopback(cfg.ray_address))
        self._owns_connection = _connect(
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
            _check_cpus(ray, self.num_processes, cfg.ray_actor_threads)
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
            if reply.get("need_params"):  # a new process, asked before we knew the old died
                self._sent_version = 0
            elif not self._deliver(reply, stop, out_queue, episodes):
                return

    def _request(self) -> Any:
        version, ref = self.params.latest()
        if version > self._sent_version:
            self._sent_version = version
        else:
            ref = None  # the process has these already: a request without arguments is cheap
        return self.process.next_rollouts.remote(
            self.thread,
            version,
            ref,
            self.rng.bit_generator.state,
            self.deaths,
            self._saved[0]["sampler"],
            self._resume,
        )

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
        reply: dict[str, Any],
        stop: threading.Event,
        out_queue: ItemQueue[Rollout],
        episodes: EpisodeLog,
    ) -> bool:
        if stop.is_set():  # the run has ended: its result counts nothing more
            return False
        self._saved = reply["saved"]  # the process actor's generators (and episodes), one unroll
        self.rng.bit_generator.state = self._saved[0]["numpy"]
        if self._resume is not None:
            self._resume = None
            self.resumed = bool(reply.get("resumed"))
            if reply.get("resume_refused"):
                log.warning(
                    "resume: %s; actor %d starts new episodes", reply["resume_refused"], self.index
                )
        self._count_times(reply)
        episodes.add_many(reply["episodes"])
        arrays = {name: _canonical(a) for name, a in reply["arrays"].items()}
        for i, (version, seq) in enumerate(zip(reply["versions"], reply["seqs"], strict=True)):
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

    def _count_times(self, reply: dict[str, Any]) -> None:
        """Stage times are the actor thread's, sent as running totals of its process."""
        pid: int = reply["pid"]
        env_s, inference_s, wait_s = (float(x) for x in reply["times"])
        seen = self._seen if self._seen[0] == pid else (pid, 0.0, 0.0, 0.0)
        s = self.stats
        s.env_s += env_s - seen[1]
        s.inference_s += inference_s - seen[2]
        s.queue_wait_s += wait_s - seen[3]
        self._seen = (pid, env_s, inference_s, wait_s)
        self.pid = pid


def connect_ray(
    address: str | None, num_cpus: int | None = None, what: str = "runtime.ray_address"
) -> tuple[Any, bool]:
    """Import Ray and connect as ``runtime.ray_address = address`` would (None: a local
    instance of ``num_cpus`` CPUs, default all, on 127.0.0.1 only), for other users of Ray
    such as ``rlpar sweep``; errors name the address as ``what``. Returns (the ``ray``
    module, whether this call made the connection: then ``ray.shutdown()`` is the caller's
    to call; a connection the process already had is left alone)."""
    ray = _import_ray(local=_on_loopback(address))
    return ray, _connect(ray, address, num_cpus or os.cpu_count() or 1, 100 << 20, what)


def _connect(
    ray: Any,
    address: str | None,
    num_cpus: int,
    object_store_bytes: int,
    what: str = "runtime.ray_address",
) -> bool:
    """Connect to Ray at ``address`` (None: a local instance); True when this call made the
    connection (and `RayActors.close` should end it)."""
    if ray.is_initialized():
        log.info("ray backend: using the Ray connection this process already has")
        return False
    if address is None:
        init_local_ray(num_cpus, object_store_bytes)
        return True
    if address != "auto":
        _probe(address, what=what)
    if _on_loopback(address) and not _loopback_mode():
        raise ConnectionError(
            f"{what} = {address!r} is a loopback address, but Ray was "
            "imported without RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 and would look for the "
            "cluster at this machine's network address: set it before importing ray"
        )
    try:
        with _clean_working_dir() as runtime_env:
            ray.init(address=address, logging_level=logging.WARNING, runtime_env=runtime_env)
    except ConnectionError as e:
        raise ConnectionError(
            f"{what} = {address!r}: {e} (a cluster started by `ray start` "
            "uses token authentication when ~/.ray/auth_token exists: then set "
            "RAY_AUTH_MODE=token here too; or leave ray_address unset for a local Ray instance)"
        ) from None
    return True


@contextlib.contextmanager
def _clean_working_dir() -> Iterator[dict[str, Any] | None]:
    """Ray puts the driver's working directory (and its script's) first on every worker's
    import path. When that directory holds rlpar's source tree (e.g. the driver runs from a
    checkout), the workers would import it instead of the installed package and fail; then
    start them in an empty working directory instead (a Ray ``runtime_env``). The workers also
    get the folders of the user's modules (`_user_module_folders`)."""
    folders = _user_module_folders()
    installed = Path(__file__).resolve().parents[1]  # this module is rlpar/runtime/ray_backend.py
    dirs = {Path.cwd(), Path(sys.argv[0]).resolve().parent if sys.argv and sys.argv[0] else None}
    if not any(d and (d / "rlpar").is_dir() and (d / "rlpar").resolve() != installed for d in dirs):
        yield folders or None
        return
    log.info(
        "ray backend: the workers start in an empty working_dir, because the working directory "
        "holds rlpar's source tree (which Ray would import there instead of the installed one)"
    )
    with tempfile.TemporaryDirectory(prefix="rlpar-ray-") as empty:
        yield {"working_dir": empty, **folders}


def _user_module_folders() -> dict[str, Any]:
    """A ``runtime_env`` entry that adds the folders rlpar searches for the user's modules
    (`rlpar.runtime.env_setup.import_folders`: an experiment file's ``plugin_path``) to each
    worker's import path when it starts, so that it unpickles a plug-in agent and runs
    ``env.setup`` as the driver does. They are this machine's folders: on a cluster of several
    machines, install the modules on every node."""
    folders = import_folders()
    if not folders:
        return {}

    def add_folders() -> None:  # a local function: Ray pickles it by value
        add_import_folders(folders)

    return {"worker_process_setup_hook": add_folders}


def init_local_ray(num_cpus: int, object_store_bytes: int = 100 << 20) -> Any:
    """Start a Ray instance on this machine, as backend "ray" does when ``ray_address`` is
    None: on 127.0.0.1 only, no dashboard, no usage statistics. Returns the ``ray`` module
    (``ray.shutdown()`` ends the instance); a Runner built meanwhile uses this instance."""
    ray = _import_ray(local=True)
    if not _loopback_mode():
        log.warning(
            "ray backend: the local Ray instance listens on every interface, not only on "
            "127.0.0.1: Ray was imported without RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 (set it "
            "before importing ray, or let rlpar import it)"
        )
    with _clean_working_dir() as runtime_env:
        ray.init(
            address="local",
            num_cpus=num_cpus,
            include_dashboard=False,
            object_store_memory=object_store_bytes,
            logging_level=logging.WARNING,
            runtime_env=runtime_env,
        )
    return ray


def _loopback_mode() -> bool:
    return os.environ.get("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER") == "0"


def _probe(address: str, timeout_s: float = 3.0, what: str = "runtime.ray_address") -> None:
    """Fail fast, with the address in the message, where ``ray.init`` would retry for minutes:
    nothing listens there, or what does is not a gRPC (HTTP/2) server like Ray's GCS."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    where = f"{what} = {address!r}"
    hint = "(start a cluster with `ray start --head`; `ray status` prints its address)"
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s) as sock:
            sock.settimeout(timeout_s)
            # HTTP/2 client preface and an empty SETTINGS frame; a server answers with SETTINGS.
            sock.sendall(
                b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
            )
            head = sock.recv(9)
    except OSError as e:
        raise ConnectionError(f"{where}: no Ray cluster answers there ({e}) {hint}") from None
    if len(head) < 9 or head[3] != 0x04:
        raise ConnectionError(f"{where}: what answers there is not a Ray cluster {hint}")


def _check_cpus(ray: Any, processes: int, threads: int) -> None:
    """Each actor process reserves one CPU per actor thread, all on one node."""
    cpus = [n["Resources"].get("CPU", 0) for n in ray.nodes() if n["Alive"]]
    if max(cpus, default=0) < threads:
        raise ValueError(
            f"runtime.ray_actor_threads: an actor process reserves one CPU per actor thread "
            f"({threads}) on one node, and the largest node of the Ray cluster has "
            f"{max(cpus, default=0):g}"
        )
    if sum(int(c // threads) for c in cpus) < processes:
        raise ValueError(
            f"runtime.num_actors: {processes} actor processes of {threads} thread(s) need "
            f"{processes * threads} CPUs (one per actor thread) and the Ray cluster's nodes "
            f"have {', '.join(f'{c:g}' for c in cpus)}: add nodes, or lower num_actors"
        )


def _canonical(a: np.ndarray) -> np.ndarray:
    """``a`` with numpy's own dtype object (a view). An unpickled array's dtype is equal to,
    not the same object as, ``np.dtype(np.float32)``, and the native bindings test identity."""
    return a.view(np.dtype(a.dtype.str))


def _original(e: Exception) -> BaseException:
    """The exception raised in the actor process (its type, with the remote traceback in the
    message), or Ray's error when there is none."""
    try:
        return e.as_instanceof_cause()  # type: ignore[attr-defined]  # a RayTaskError's
    except Exception:
        return e


# ------------------------------------------------------------------------ actor process side


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
        self,
        thread: int,
        version: int,
        params: np.ndarray | None,
        rng_state: dict,
        restarts: int,
        sampler_state: list | None = None,
        resume: dict[str, np.ndarray] | None = None,
    ) -> dict[str, Any]:
        """Publish ``params`` (version ``version``) if newer; start actor thread ``thread`` on
        its first request; wait for its next rollout and hand over every one it has finished:
        ``arrays`` (the Rollout arrays stacked, [n, ...]), ``versions`` and ``seqs`` ([n]),
        ``saved`` (`Actor.checkpoint_state`: the generators, and with ``keep_resume_state`` the
        episodes in progress), the process's new ``episodes``, ``pid`` and the thread's stage
        ``times``. A thread's
        first start restores ``sampler_state`` and loads ``resume`` (the episodes of a
        checkpoint): its first replies say ``resumed`` (or why not, ``resume_refused``).
        ``{"need_params": True}`` when the process has no parameters yet."""
        with self.lock:
            if params is not None and version > self.version:
                self.store.publish(_canonical(params), version=version)
                self.version = version
            if thread not in self.actors:
                if self.version == 0:
                    return {"need_params": True}
                self._start(thread, rng_state, restarts, sampler_state, resume)
        actor, q = self.actors[thread], self.queues[thread]
        rollouts = [self._first(thread, q)]
        while True:
            try:
                rollouts.append(q.get_nowait())
            except queue.Empty:
                break
        reply: dict[str, Any] = {
            "arrays": {n: np.stack([getattr(r, n) for r in rollouts]) for n in ARRAY_FIELDS},
            "versions": [r.version for r in rollouts],
            "seqs": [r.seq for r in rollouts],
        }
        for r in rollouts:
            actor.free.put(r)
        s = actor.stats
        saved = actor.checkpoint_state()  # the generators and episodes of one finished unroll
        resumed = self.resumed.get(thread, False)
        reply |= {
            "saved": saved,
            "resumed": resumed is True,
            "resume_refused": resumed if isinstance(resumed, str) else None,
            "episodes": self.episodes.drain(),
            "pid": os.getpid(),
            "times": (s.env_s, s.inference_s, s.queue_wait_s),
        }
        return reply

    def _first(self, thread: int, q: queue.Queue[Rollout]) -> Rollout:
        while True:
            if thread in self.errors:
                raise self.errors[thread]
            try:
                return q.get(timeout=POLL_S)
            except queue.Empty:
                continue

    def _start(
        self,
        thread: int,
        rng_state: dict,
        restarts: int,
        sampler_state: list | None,
        resume: dict[str, np.ndarray] | None,
    ) -> None:
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
        actor.set_rng_state(rng_state, sampler_state)
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
