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

The package: `connect` (connecting to a cluster or a local instance, for every user of Ray in
rlpar), `driver` (`RayActors`, `RemoteActor`), `process` (`ActorProcess`) and `protocol` (the
typed request and reply between them). Ray is imported only here, and only when a Runner is
built with backend "ray" (or another command asks for Ray).
"""

from rlpar.runtime.ray.connect import LOOPBACK_ENV, connect_ray, init_local_ray
from rlpar.runtime.ray.driver import RayActors, RemoteActor
from rlpar.runtime.ray.process import ActorProcess

__all__ = [
    "LOOPBACK_ENV",
    "ActorProcess",
    "RayActors",
    "RemoteActor",
    "connect_ray",
    "init_local_ray",
]
