"""The runner: builds a run's pieces, starts the actor and learner threads, supervises, stops.

Control flow, top to bottom in `Runner.run`: start threads (actors, learner, and with an
`EvalConfig` whose ``interval_env_steps`` is set, the evaluator) -> the main thread waits and
checks (errors, signals, the stop rules: step budget, target return, wall clock; the progress
callback) -> stop flag -> bounded joins -> the first thread error, if any, re-raised (after a
final checkpoint, unless the learner failed) -> final checkpoint -> final evaluation.

Each piece is built with what it needs and none calls back into the Runner. How the run
executes is chosen once, before any thread starts (`rlpar.runtime.plan.plan_run`: the actors'
loop and the learner's, each with its reason); each piece gets its part as an argument, and
`RunResult.plan` records it.

- `rlpar.runtime.actor.LocalActors` (or `rlpar.runtime.ray.RayActors`): the actors
  and their envs;
- `rlpar.runtime.stop_rules`: when the run stops (each rule, the thread that applies it, the
  order);
- `rlpar.runtime.evaluator`: the evaluator thread, and the target checks' and final
  evaluations;
- `rlpar.runtime.checkpointing`: writing checkpoints, and what a resume puts back;
- `rlpar.runtime.counters`: env steps and episodes, continued across resumes;
- `rlpar.runtime.reports`: `Progress`, `RunResult` and the GIL report;
- `rlpar.runtime.threads`: the guarded threads, their bounded joins, SIGINT/SIGTERM.

Between two steps the learner thread runs an explicit list of hooks (`Runner._rules_and_hooks`
gives them and their order): its stop rules, the target check, the interval checkpoint.

With an `EvalConfig` whose ``check_target`` is true, a window mean at the target return only
asks the learner to evaluate its current parameters between two steps; the run stops when that
evaluation reaches the target too (the learner takes no further step, so the final parameters
are the evaluated ones).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from rlpar.agent import Agent, LearnerState
from rlpar.checkpoint import Checkpoint
from rlpar.config import EnvConfig, EvalConfig, RuntimeConfig, check_env_layout, to_dict
from rlpar.nn import Net
from rlpar.parallel import ShardPool
from rlpar.runtime.actor import LocalActors
from rlpar.runtime.checkpointing import (
    Checkpointer,
    PeriodicCheckpoint,
    learner_rng,
    open_resume,
    restore_actors,
    restore_learner,
    space_layout,
)
from rlpar.runtime.common import ActorHandle, ActorState, RecentLog
from rlpar.runtime.counters import RunCounters
from rlpar.runtime.evaluator import EvalPoint, build_evaluators
from rlpar.runtime.handoff import HandOff
from rlpar.runtime.learner import Learner, LearnerHook, LearnerStats, NativeInbox, VersionClock
from rlpar.runtime.plan import ExecutionPlan, plan_run
from rlpar.runtime.reports import GilBoundCheck, Progress, RunResult, gil_shares, measure_progress
from rlpar.runtime.stop_rules import Rule, StopVerdict, TargetCheck, stop_rules
from rlpar.runtime.threads import RunThreads, SignalStop, note_thread_error, supervise
from rlpar.snapshot import SnapshotStore

if TYPE_CHECKING:
    from rlpar.data import Rollout
    from rlpar.runtime.ray import RayActors

__all__ = ["EvalPoint", "Progress", "RunResult", "Runner", "TargetCheck"]

log = logging.getLogger("rlpar")

#: Evaluation points and target checks a Runner keeps in memory (the newest).
KEEP_POINTS = 100


class Runner:
    """One actor-learner run. Build it (errors in the config, env or agent surface here), then
    call `run` once. ``checkpoint_dir``: where checkpoints go (None: none are written);
    ``resume``: a checkpoint file to continue from, or a run directory (its newest checkpoint;
    `resumed_from` names the file); ``evaluation``: how the policy is evaluated
    during training, to confirm the target return and at the end (None: never).

    After `run`, `params` holds the final parameters (those of the final checkpoint)."""

    def __init__(
        self,
        agent: Agent,
        env: EnvConfig,
        runtime: RuntimeConfig,
        checkpoint_dir: str | Path | None = None,
        resume: str | Path | None = None,
        config: dict[str, Any] | None = None,
        keep_checkpoints: int = 3,
        evaluation: EvalConfig | None = None,
    ) -> None:
        _check_types(agent=agent, env=env, runtime=runtime)
        check_env_layout(env, runtime)
        _check_evaluation(evaluation)
        self.agent, self.env_cfg, self.cfg = agent, env, runtime
        self.eval_cfg = evaluation
        # The newest points only: a run of any length keeps its memory flat (the monitor writes
        # each point to TensorBoard as it comes).
        self.evaluations: RecentLog[EvalPoint] = RecentLog(KEEP_POINTS)  # by the evaluator
        self.target_checks: RecentLog[TargetCheck] = RecentLog(KEEP_POINTS)  # by the learner
        self.config = (
            config if config is not None else {"env": to_dict(env), "runtime": to_dict(runtime)}
        )
        self.checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir is not None else None
        self.keep_checkpoints = keep_checkpoints
        self.stop = threading.Event()
        self._threads = RunThreads(self.stop)
        self.backend: LocalActors | RayActors | None = None  # the actors' envs or processes
        self.ray: RayActors | None = None  # the backend when it is "ray"
        self.actors: list[ActorHandle] = []
        self.resumed_from, resumed = open_resume(resume)
        self._generation = int(resumed.counters.get("generation", 0)) + 1 if resumed else 0
        try:
            self._build_net_and_actors(resumed)
        except BaseException:
            self.close()
            raise
        if resumed is not None:
            restore_actors(self.actors, resumed)
        self._build_pieces(resumed.counters if resumed else {})
        self._ran = False

    def _build_net_and_actors(self, resumed: Checkpoint | None) -> None:
        """Envs (or Ray actor processes) -> spaces -> net -> learner state (restored on resume)
        -> snapshot store with the first version -> the plan -> actors."""
        cfg = self.cfg
        self.agent.check_runtime(cfg)
        backend = self.backend = _start_backend(self.env_cfg, cfg)
        self.ray = None if isinstance(backend, LocalActors) else backend
        self.net = Net(self.agent.net_spec(*backend.spaces))
        self.spaces = space_layout(backend.spaces)
        self.state = _learner_state(
            self.agent, self.net, cfg.seed, resumed, self.resumed_from, self.spaces
        )
        periodic = self.eval_cfg is not None and self.eval_cfg.interval_env_steps is not None
        pins = cfg.num_actors + (1 if periodic else 0)
        self.store = _first_store(self.state, self.net.num_params, pins)
        local = backend if isinstance(backend, LocalActors) else None
        self.plan = plan_run(
            cfg, self.agent, self.net, self.state, local.envs if local is not None else None
        )
        log.info("execution plan: %s", self.plan.describe())
        keep = self.checkpoint_dir is not None  # the actors' episodes go into checkpoints
        agent, net, store, generation = self.agent, self.net, self.store, self._generation
        if local is not None:
            self.actors.extend(
                local.start(agent, net, store, generation, keep, loop=self.plan.actor.loop)
            )
        else:  # each actor process chooses its unroller (`RayActors`)
            self.actors.extend(backend.start(agent, net, store, generation, keep))

    def _build_pieces(self, resumed_counters: dict[str, Any]) -> None:
        """The counters, the queue and the learner, and the pieces that read them: the stop
        verdict, checkpoints, evaluations, the GIL check."""
        cfg = self.cfg
        # Deterministic mode counts the env steps the learner consumed (its stats).
        learned = LearnerStats() if cfg.deterministic else None
        self.counters = RunCounters(resumed_counters, self.actors, learned)
        self.episodes = self.counters.episodes
        self.queue: HandOff[Rollout] = HandOff(maxsize=cfg.num_actors * cfg.buffers_per_actor)
        self._verdict = StopVerdict(self.stop)
        # A native take registers every actor buffer in the queue before any thread starts.
        inbox = (
            None
            if self.plan.learner.loop == "python"
            else NativeInbox(self.queue, self.actors, release_gil=True)
        )
        self.learner = _learner(
            cfg, self.agent, self.net, self.state, self.store, self.counters, self.plan, inbox
        )
        self.clock = self.learner.clock
        self._checkpoints = Checkpointer(
            self.checkpoint_dir, self.keep_checkpoints, state=self.state, net=self.net,
            actors=self.actors, counters=self.counters, config=self.config,
            generation=self._generation,
            actor_states=self._consumed_actor_states if cfg.deterministic else None,
            spaces=self.spaces,
        )  # fmt: skip
        self._evaluator, self._periodic = build_evaluators(
            self.agent, self.net, self.env_cfg, self.eval_cfg, seed=cfg.seed,
            generation=self._generation, store=self.store, env_steps=self.counters.env_steps,
            points=self.evaluations,
        )  # fmt: skip
        self._gil_check = GilBoundCheck(self.env_cfg, self.actors)

    def _consumed_actor_states(self) -> list[ActorState]:
        """Deterministic mode: the actors as the learner's last step left them (read on the
        learner thread, or once it has stopped)."""
        states = self.learner.actor_states
        assert states is not None  # a deterministic learner keeps them
        return states

    @property
    def params(self) -> np.ndarray:
        """A copy of the learner's parameters, float32 [num_params]: after `run`, the run's
        final parameters (those of its final checkpoint and final evaluation)."""
        return self.state.params.copy()

    # ------------------------------------------------------------------------------ counters

    def env_steps(self) -> int:
        """Env steps so far, across all actors (and before a resume). In deterministic mode, the
        steps the learner consumed: an unroll in flight when the run stops is not counted."""
        return self.counters.env_steps()

    def progress(self, wall_s: float) -> Progress:
        """The run as it is ``wall_s`` seconds after its start (`Progress`)."""
        return measure_progress(
            wall_s, counters=self.counters, learner=self.learner, actors=self.actors,
            return_window=self.cfg.return_window, queue_depth=self.queue.qsize(),
            lost_rollouts=self.ray.lost_rollouts if self.ray is not None else 0,
        )  # fmt: skip

    def gil_report(self) -> dict[str, Any]:
        """`Progress.gil`: each thread's GIL shares since it started, and the actor ceiling."""
        return gil_shares(self.actors, self.learner.stats)

    # ------------------------------------------------------------------------------- the run

    def run(
        self,
        on_progress: Callable[[Progress], None] | None = None,
        progress_interval_s: float = 2.0,
    ) -> RunResult:
        """Run until a stop condition; re-raise a thread's exception in this thread.

        Works from any thread; only on the main thread does it handle SIGINT/SIGTERM (a final
        checkpoint, then ``stopped_by`` names the signal). ``on_progress`` is called on the
        calling thread every ``progress_interval_s`` seconds and once at the end.
        """
        if self._ran:
            raise RuntimeError("a Runner runs once; build a new one (resume=checkpoint) to go on")
        self._ran = True
        self._start = time.perf_counter()
        self._checkpoints.prune()  # what an earlier run, killed mid-write, left
        rules, hooks = self._rules_and_hooks()
        with SignalStop(self.stop) as signals:
            try:
                self._start_threads(hooks)
                stopped_by = supervise(
                    self._threads, signals, rules, lambda: self._verdict.reason,
                    start=self._start,
                    on_progress=(lambda s: on_progress(self.progress(s))) if on_progress else None,
                    interval_s=progress_interval_s, every_wake=self._gil_check,
                )  # fmt: skip
            finally:
                self.stop.set()
                stuck = self._threads.join(self.cfg.join_timeout_s)
                if self.state.pool is not None:
                    stuck += self.state.pool.close(self.cfg.join_timeout_s)
                    self.state.pool = None
        wall = time.perf_counter() - self._start
        learner_alive = "rlpar-learner" in self._threads.alive()
        if self._threads.errors:
            self._raise_first_error(learner_alive)
        final = None if learner_alive else self._checkpoints.save()
        if on_progress is not None:
            on_progress(self.progress(wall))
        self.close()
        result = self._result(wall, stopped_by, final, stuck)
        if not learner_alive and self._evaluator is not None:
            # after the threads stopped: nothing else reads or writes the parameters now
            result.evaluation = self._evaluator.final(self.state.params)
        return result

    def _rules_and_hooks(self) -> tuple[list[Rule], list[LearnerHook]]:
        """(the main thread's stop rules, the learner's hooks), each in the order it runs them:
        after every step the learner runs its stop rules and the target check (`stop_rules`),
        then the interval checkpoint, which is skipped once the run is stopping (the final
        checkpoint, of the same parameters, follows the joins)."""
        cfg = self.cfg
        main, learner = stop_rules(
            cfg, verdict=self._verdict, episodes=self.episodes, env_steps=self.counters.env_steps,
            state=self.state, evaluator=self._evaluator, checks=self.target_checks,
            start=self._start,
        )  # fmt: skip
        if cfg.checkpoint_interval_s is not None:
            interval = cfg.checkpoint_interval_s
            learner.append(PeriodicCheckpoint(self._checkpoints, interval, self._start))
        return main, learner

    def _raise_first_error(self, learner_alive: bool) -> None:
        name, exc = self._threads.errors[0]
        # The learner's state is whole unless the learner itself failed (or is stuck).
        saved = self._checkpoints.save() if name != "learner" and not learner_alive else None
        self.close()
        raise note_thread_error(exc, name, saved)

    def _result(
        self, wall: float, stopped_by: str, final: Path | None, stuck: list[str]
    ) -> RunResult:
        mean_return, time_to_target = self._verdict.outcome(
            stopped_by, self.episodes, self.cfg.return_window, self._start
        )
        return RunResult(
            mean_return=mean_return, env_steps=self.env_steps(), learner_steps=self.state.steps,
            episodes=self.counters.episode_count(), wall_s=wall, time_to_target_s=time_to_target,
            stopped_by=stopped_by, checkpoint=str(final) if final else None, stuck_threads=stuck,
            target_checks=[dataclasses.asdict(c) for c in self.target_checks],
            gil=self.gil_report(), plan=self.plan.to_dict(),
        )  # fmt: skip

    def close(self) -> None:
        """Close the envs (idempotent); envs of a stuck actor are left alone."""
        if self.backend is not None:
            alive = self._threads.alive()
            self.backend.close({a.index for a in self.actors if _thread_name(a) in alive})

    # ----------------------------------------------------------------------------- threads

    def _start_threads(self, hooks: list[LearnerHook]) -> None:
        """The actor threads, the learner thread (running ``hooks`` after each step) and, with
        ``interval_env_steps``, the evaluator thread; each stops and fails like the others."""
        cfg, threads = self.cfg, self._threads
        if cfg.learner_threads > 1:  # the learner step's helpers, for this run only
            self.state.pool = ShardPool(cfg.learner_threads, split=cfg.learner_split)
        # Deterministic mode: each actor makes B / num_actors rollouts from each version.
        wait = self.clock.waiter(self.state.steps + 1, self.stop) if cfg.deterministic else None
        per_version = cfg.batch_rollouts // cfg.num_actors if cfg.deterministic else 1
        for actor in self.actors:
            body = _bind(actor.run, self.stop, self.queue, self.episodes, wait, per_version)
            name = f"actor-{actor.index} (env {self.env_cfg.id})"
            threads.add(name, _thread_name(actor), body)
        threads.add(
            "learner", "rlpar-learner", _bind(self.learner.run, self.stop, self.queue, hooks)
        )
        if self._periodic is not None:  # evaluates pinned snapshots
            threads.add("evaluator", "rlpar-evaluator", _bind(self._periodic.run, self.stop))
        threads.start()


def _check_types(**given: Any) -> None:
    """Name an argument of the wrong type (the usual slip: a name where an object belongs)."""
    expected = {"agent": Agent, "env": EnvConfig, "runtime": RuntimeConfig}
    for name, value in given.items():
        cls = expected[name]
        if not isinstance(value, cls):
            raise TypeError(
                f"Runner {name} must be an rlpar.{cls.__name__}, got {type(value).__name__}"
                + (" (build one with rlpar.make_agent(name))" if cls is Agent else "")
            )


def _check_evaluation(evaluation: Any) -> None:
    if evaluation is not None and not isinstance(evaluation, EvalConfig):
        raise TypeError(
            f"Runner evaluation must be an rlpar.EvalConfig or None, "
            f"got {type(evaluation).__name__}"
        )


def _start_backend(env: EnvConfig, cfg: RuntimeConfig) -> LocalActors | RayActors:
    """The actors' envs: in this process, or in Ray actor processes (backend "ray")."""
    if cfg.backend != "ray":
        return LocalActors(env, cfg)
    from rlpar.runtime.ray import RayActors  # Ray is an optional dependency

    return RayActors(env, cfg)


def _learner_state(
    agent: Agent,
    net: Net,
    seed: int,
    resumed: Checkpoint | None,
    resumed_from: Path | None,
    spaces: dict[str, str],
) -> LearnerState:
    """The learner's state: fresh parameters and optimizer from ``seed``, or on resume those of
    ``resumed`` (the checkpoint file ``resumed_from``, checked against the run's ``spaces``)."""
    state = agent.init_state(net, net.init_params(seed=seed))
    state.rng = learner_rng(seed)
    if resumed is not None and resumed_from is not None:
        restore_learner(state, net, resumed, resumed_from, spaces)
    return state


def _first_store(state: LearnerState, num_params: int, pins: int) -> SnapshotStore:
    """The run's snapshot store of ``num_params`` floats (the net's: parameters of another size
    are refused when published), holding ``state``'s parameters as the first version. ``pins``:
    the readers that pin a snapshot, at most one each at a time (each actor, the evaluator);
    +2 slots so no publish is ever skipped, +1 for the monitor's histograms."""
    store = SnapshotStore(num_params, num_slots=min(255, pins + 3))
    store.publish(state.params, version=state.steps + 1)
    return store


def _bind(fn: Callable[..., None], *args: Any) -> Callable[[], None]:
    return lambda: fn(*args)


def _learner(
    cfg: RuntimeConfig,
    agent: Agent,
    net: Net,
    state: LearnerState,
    store: SnapshotStore,
    counters: RunCounters,
    plan: ExecutionPlan,
    inbox: NativeInbox | None,
) -> Learner:
    """The learner of a run configured by ``cfg``, over ``counters.actors``, running the loop
    of ``plan`` (with ``inbox``, its native take). Deterministic mode: no rollout dropped for
    its policy lag, the episodes that ride with the rollouts logged in batch order, and the
    learner's stats are ``counters.learned``."""
    return Learner(
        agent=agent,
        net=net,
        state=state,
        store=store,
        actors=counters.actors,
        batch_rollouts=cfg.batch_rollouts,
        max_policy_lag=0 if cfg.deterministic else cfg.max_policy_lag,
        deterministic=cfg.deterministic,
        clock=VersionClock(state.steps + 1),
        episodes=counters.episodes if cfg.deterministic else None,
        stats=counters.learned,
        loop=plan.learner.loop,
        inbox=inbox,
    )


def _thread_name(actor: ActorHandle) -> str:
    return f"rlpar-actor-{actor.index}"
