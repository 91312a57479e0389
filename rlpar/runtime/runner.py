"""The runner: builds the net, starts the actor and learner threads, supervises, stops, resumes.

Control flow, top to bottom in `Runner.run`: start threads (actors, learner, and with an
`EvalConfig` whose ``interval_env_steps`` is set, the evaluator) -> the main thread waits and
checks (errors, step budget, target return, wall clock, signals, progress callback) -> stop
flag -> bounded joins -> final checkpoint -> final evaluation -> re-raise the first thread
error, if any.

With an `EvalConfig` whose ``check_target`` is true, a window mean at the target return only
asks the learner to evaluate its current parameters between two steps; the run stops when that
evaluation reaches the target too (the learner takes no further step, so the final parameters
are the evaluated ones).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import queue
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from rlpar.agent import Agent, LearnerState
from rlpar.checkpoint import (
    Checkpoint,
    check_signature,
    checkpoint_path,
    find_checkpoint,
    load_checkpoint,
    net_signature,
    prune_checkpoints,
    save_checkpoint,
)
from rlpar.config import EnvConfig, EvalConfig, RuntimeConfig, check_env_layout, to_dict
from rlpar.nn import Net
from rlpar.parallel import ShardPool
from rlpar.runtime.actor import Actor
from rlpar.runtime.common import POLL_S, ActorHandle, EpisodeLog, RecentLog
from rlpar.runtime.env_modes import GIL_CHECK_AFTER_S, gil_bound_warning
from rlpar.runtime.envs import make_actor_envs
from rlpar.runtime.evaluation import Evaluation, eval_seed, evaluate_policy
from rlpar.runtime.gil_meter import GilTimes, actor_ceiling
from rlpar.runtime.learner import Learner, VersionClock
from rlpar.snapshot import SnapshotStore

if TYPE_CHECKING:
    from rlpar.runtime.ray_backend import RayActors

__all__ = ["EvalPoint", "Progress", "RunResult", "Runner", "TargetCheck"]

log = logging.getLogger("rlpar")

# Evaluation seeds: (purpose, index) keys, so a check's episodes do not depend on how many
# periodic evaluations ran before it (deterministic runs stay reproducible).
_PERIODIC, _CHECK, _FINAL = 0, 1, 2
#: Evaluation points and target checks a Runner keeps in memory (the newest).
KEEP_POINTS = 1000


@dataclass
class EvalPoint:
    """One evaluation during training (the evaluator thread), one per evaluated policy."""

    env_steps: int
    """Env steps when the snapshot was pinned (the x-axis of the eval curves)."""
    version: int
    """The parameter version evaluated."""
    results: list[Evaluation]


@dataclass
class TargetCheck:
    """One `EvalConfig.check_target` evaluation on the learner thread."""

    env_steps: int
    learner_steps: int
    window_mean: float
    """The window mean that asked for the check."""
    eval_mean: float
    passed: bool


@dataclass
class Progress:
    """A consistent-enough view of a running run, taken by the main thread."""

    wall_s: float
    env_steps: int
    learner_steps: int
    version: int
    episodes: int
    mean_return: float | None
    min_return: float | None
    max_return: float | None
    mean_length: float | None
    env_steps_per_s: float
    learner_steps_per_s: float
    samples_per_s: float
    policy_lag_mean: float
    policy_lag_max: int
    dropped_rollouts: int
    skipped_publishes: int
    lost_rollouts: int
    queue_depth: int
    stage_fractions: dict[str, float]
    metrics: dict[str, float]
    gil: dict[str, Any] = field(default_factory=dict)
    """The GIL meter (`rlpar.runtime.gil_meter`) since the threads started: {"actor_<i>",
    "actors" (all local actors together), "learner": {"held", "wait", "native": shares of
    that thread's wall time}, "actor_ceiling": actor threads the GIL could serve at these
    shares (Amdahl over the held share; null when no actor holds it)}. Ray actors are not
    metered (they run in processes of their own)."""


@dataclass
class RunResult:
    """What `Runner.run` returns (also the summary the CLI prints as JSON)."""

    mean_return: float | None
    env_steps: int
    learner_steps: int
    episodes: int
    wall_s: float
    time_to_target_s: float | None
    stopped_by: str
    checkpoint: str | None
    stuck_threads: list[str] = field(default_factory=list)
    evaluation: list[dict[str, Any]] | None = None
    """The final evaluation, one entry per `EvalConfig.policies` (policy, episodes, mean_return,
    std_return, min_return, max_return, mean_length, seed), of the final parameters; None
    without an `EvalConfig` with episodes > 0 (or when the learner did not stop)."""
    target_checks: list[dict[str, Any]] = field(default_factory=list)
    """The `EvalConfig.check_target` evaluations: env_steps, learner_steps, window_mean,
    eval_mean, passed."""
    gil: dict[str, Any] = field(default_factory=dict)
    """The GIL meter over the whole run, as in `Progress.gil`."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


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
        if evaluation is not None and not isinstance(evaluation, EvalConfig):
            raise TypeError(
                f"Runner evaluation must be an rlpar.EvalConfig or None, "
                f"got {type(evaluation).__name__}"
            )
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
        self._threads: list[threading.Thread] = []
        self._envs: list[Any] = []
        self.ray: RayActors | None = None  # backend "ray": its actor processes

        # A run or checkpoints directory resumes from its newest checkpoint.
        self.resumed_from = find_checkpoint(resume) if resume is not None else None
        resume = self.resumed_from
        resumed = load_checkpoint(resume) if resume is not None else None
        if resume is not None:
            log.info("resuming from %s", resume)
        self._generation = int(resumed.counters.get("generation", 0)) + 1 if resumed else 0
        try:
            self._build_net_and_actors(resumed, resume)
        except BaseException:
            self.close()
            raise
        if resumed is not None:
            self._restore_rng_states(resumed)
        counters = resumed.counters if resumed else {}
        self._base_env_steps = int(counters.get("env_steps", 0))
        self._base_episodes = int(counters.get("episodes", 0))
        self._build_learner()
        # Set once the target is met: (seconds since start, the window's mean return then).
        self._target_hit: tuple[float, float] | None = None
        self._check_requested = threading.Event()  # main thread -> learner: check the target
        self._next_check_at = 0  # episodes the log must hold before the next target check
        self._errors: list[tuple[str, BaseException]] = []
        self._ran = False

    def _build_net_and_actors(self, resumed: Checkpoint | None, resume: Any) -> None:
        """Envs (or Ray actor processes) -> spaces -> net -> learner state (restored on resume)
        -> snapshot store with the first version -> actors."""
        cfg, agent = self.cfg, self.agent
        if cfg.backend == "ray":
            from rlpar.runtime.ray_backend import RayActors  # Ray is an optional dependency

            self.ray = RayActors(self.env_cfg, cfg)
            spaces = self.ray.spaces
        else:
            for _ in range(cfg.num_actors):
                self._envs.append(make_actor_envs(self.env_cfg, cfg.envs_per_actor))
            spaces = (self._envs[0].single_observation_space, self._envs[0].single_action_space)
        self.net = Net(agent.net_spec(*spaces))
        self.state: LearnerState = agent.init_state(self.net, self.net.init_params(seed=cfg.seed))
        if resumed is not None:
            self._restore(resumed, resume)
        # Each actor (and the evaluator) pins at most one snapshot at a time; +2 so no publish is
        # ever skipped, +1 for the monitor's histograms.
        pins = cfg.num_actors + (1 if self._periodic_eval else 0)
        self.store = SnapshotStore(self.net.num_params, num_slots=min(255, pins + 3))
        self.store.publish(self.state.params, version=self.state.steps + 1)
        self.actors: list[ActorHandle] = []
        if self.ray is not None:
            self.actors.extend(
                self.ray.start(
                    agent,
                    self.net,
                    self.store,
                    self._generation,
                    keep_resume_state=self.checkpoint_dir is not None,
                )
            )
            return
        self.actors.extend(
            Actor(
                i,
                envs=envs,
                agent=agent,
                net=self.net,
                store=self.store,
                unroll_length=cfg.unroll_length,
                num_buffers=cfg.buffers_per_actor,
                seed=cfg.seed,
                generation=self._generation,
                keep_resume_state=self.checkpoint_dir is not None,
            )
            for i, envs in enumerate(self._envs)
        )

    def _restore_rng_states(self, resumed: Checkpoint) -> None:
        numpy_states = resumed.rng_states.get("actors", [])
        samplers = resumed.rng_states.get("samplers", [])
        for i, actor in enumerate(self.actors):
            actor.set_rng_state(
                numpy_states[i] if i < len(numpy_states) else None,
                samplers[i] if i < len(samplers) else None,
            )
            # The episodes in progress, where the checkpoint has them (envs that save their
            # state); a state that does not fit this run (other envs or K) is skipped, loudly.
            prefix = f"actors/{i}/"
            arrays = {
                k.removeprefix(prefix): v for k, v in resumed.arrays.items() if k.startswith(prefix)
            }
            if arrays:
                try:
                    actor.load_resume_state(arrays)
                except ValueError as e:
                    log.warning("resume: %s; actor %d starts new episodes", e, i)

    def _build_learner(self) -> None:
        cfg = self.cfg
        self.episodes = EpisodeLog(env_steps=self.env_steps)
        self.queue: queue.Queue = queue.Queue(maxsize=cfg.num_actors * cfg.buffers_per_actor)
        self.stop = threading.Event()
        self.clock = VersionClock(self.state.steps + 1)
        self._budget_spent = threading.Event()
        self.learner = Learner(
            agent=self.agent,
            net=self.net,
            state=self.state,
            store=self.store,
            actors=self.actors,
            batch_rollouts=cfg.batch_rollouts,
            max_policy_lag=0 if cfg.deterministic else cfg.max_policy_lag,
            deterministic=cfg.deterministic,
            clock=self.clock,
            after_step=self._after_learner_step,
            episodes=self.episodes if cfg.deterministic else None,
        )

    @property
    def _periodic_eval(self) -> bool:
        return self.eval_cfg is not None and self.eval_cfg.interval_env_steps is not None

    @property
    def _verify_target(self) -> bool:
        return self.eval_cfg is not None and self.eval_cfg.check_target

    @property
    def params(self) -> np.ndarray:
        """A copy of the learner's parameters, float32 [num_params]: after `run`, the run's
        final parameters (those of its final checkpoint and final evaluation)."""
        return self.state.params.copy()

    # ------------------------------------------------------------------------------ counters

    def env_steps(self) -> int:
        """Env steps so far, across all actors (and before a resume). In deterministic mode, the
        steps the learner consumed: an unroll in flight when the run stops is not counted."""
        if self.cfg.deterministic:
            return self._base_env_steps + self.learner.stats.samples
        return self._base_env_steps + sum(a.stats.env_steps for a in self.actors)

    def progress(self, wall_s: float) -> Progress:
        recent = self.episodes.recent(self.cfg.return_window)
        rets = [e[0] for e in recent]
        ls = self.learner.stats
        acts = [a.stats for a in self.actors]
        env_s = sum(a.env_s for a in acts)
        inf_s = sum(a.inference_s for a in acts)
        wait_s = sum(a.queue_wait_s for a in acts) + ls.queue_wait_s
        total = env_s + inf_s + wait_s + ls.learn_s + ls.publish_s
        stages = {
            "env_step": env_s,
            "inference": inf_s,
            "queue_wait": wait_s,
            "learn": ls.learn_s,
            "publish": ls.publish_s,
        }
        run_steps = sum(a.env_steps for a in acts)
        rate = 1.0 / wall_s if wall_s > 0 else 0.0
        return Progress(
            wall_s=wall_s,
            env_steps=self.env_steps(),
            learner_steps=self.state.steps,
            version=self.learner.version,
            episodes=self._base_episodes + self.episodes.count,
            mean_return=float(np.mean(rets)) if rets else None,
            min_return=float(np.min(rets)) if rets else None,
            max_return=float(np.max(rets)) if rets else None,
            mean_length=float(np.mean([e[1] for e in recent])) if recent else None,
            env_steps_per_s=run_steps * rate,
            learner_steps_per_s=ls.steps * rate,
            samples_per_s=ls.samples * rate,
            policy_lag_mean=ls.lag_mean,
            policy_lag_max=ls.lag_max,
            dropped_rollouts=ls.dropped_rollouts,
            skipped_publishes=ls.skipped_publishes,
            lost_rollouts=self.ray.lost_rollouts if self.ray is not None else 0,
            queue_depth=self.queue.qsize(),
            stage_fractions={k: (v / total if total > 0 else 0.0) for k, v in stages.items()},
            metrics=dict(ls.metrics),
            gil=self.gil_report(),
        )

    def gil_report(self) -> dict[str, Any]:
        """`Progress.gil`: each thread's GIL shares since it started, and the actor ceiling."""
        local = [a for a in self.actors if isinstance(a, Actor)]
        report: dict[str, Any] = {f"actor_{a.index}": a.stats.gil.shares() for a in local}
        total = sum((a.stats.gil for a in local), GilTimes())
        learner = self.learner.stats.gil.shares()
        report["actors"] = total.shares()
        report["learner"] = learner
        ceiling = actor_ceiling(report["actors"]["held"], learner["held"]) if local else None
        report["actor_ceiling"] = ceiling if ceiling is None or math.isfinite(ceiling) else None
        return report

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
        self._start = self._last_checkpoint = time.perf_counter()
        if self.checkpoint_dir is not None:  # what an earlier run, killed mid-write, left
            prune_checkpoints(self.checkpoint_dir, keep=self.keep_checkpoints)
        restore_signals = self._install_signal_handlers()
        try:
            self._start_threads()
            stopped_by, time_to_target = self._supervise(on_progress, progress_interval_s)
        finally:
            self.stop.set()
            stuck = self._join_threads()
            if self.state.pool is not None:
                stuck += self.state.pool.close(self.cfg.join_timeout_s)
                self.state.pool = None
            restore_signals()
        wall = time.perf_counter() - self._start
        learner_alive = any(t.name == "rlpar-learner" and t.is_alive() for t in self._threads)
        if self._errors:
            self._raise_first_error(learner_alive)
        final = None if learner_alive else self._save_checkpoint()
        if on_progress is not None:
            on_progress(self.progress(wall))
        self.close()
        result = self._result(wall, stopped_by, time_to_target, final, stuck)
        if not learner_alive:
            result.evaluation = self._final_evaluation()
        return result

    def _supervise(
        self, on_progress: Callable[[Progress], None] | None, interval_s: float
    ) -> tuple[str, float | None]:
        """The main thread's loop: wait, check every stop condition, report progress.
        Returns (``stopped_by``, seconds to the target return or None)."""
        cfg, start = self.cfg, self._start
        next_progress = start + interval_s
        while True:
            self.stop.wait(0.02)
            now = time.perf_counter()
            if self._errors:
                return "error", None
            if self._signal is not None:
                return self._signal, None
            if self._target_hit is not None:  # found by the learner (deterministic, or checked)
                return "target_return", self._target_hit[0]
            if self._budget_spent.is_set():
                return "total_env_steps", None
            if self.stop.is_set():
                return "stop", None
            if not cfg.deterministic and self.env_steps() >= cfg.total_env_steps:
                return "total_env_steps", None
            if not cfg.deterministic and self._check_target(now):
                return "target_return", now - start
            if cfg.max_wall_s is not None and now - start >= cfg.max_wall_s:
                return "max_wall_s", None
            if on_progress is not None and now >= next_progress:
                on_progress(self.progress(now - start))
                next_progress = now + interval_s
            self._check_gil_bound()

    _gil_checked = False

    def _check_gil_bound(self) -> None:
        """Warn once when the actor threads take turns on the GIL (`gil_bound_warning`)."""
        if self._gil_checked:
            return
        looping = [a for a in self.actors if isinstance(a, Actor) and a.sampler is None]
        env_s = sum(a.stats.env_s for a in looping)
        inference_s = sum(a.stats.inference_s for a in looping)
        if len(looping) < 2 or self.env_cfg.vectorization != "sync":
            self._gil_checked = True  # nothing to find in this run
            return
        if env_s + inference_s < GIL_CHECK_AFTER_S:
            return  # not measured long enough yet
        self._gil_checked = True
        warning = gil_bound_warning(self.env_cfg, len(looping), env_s, inference_s)
        if warning is not None:
            log.warning(warning)

    def _raise_first_error(self, learner_alive: bool) -> None:
        name, exc = self._errors[0]
        # The learner's state is whole unless the learner itself failed (or is stuck).
        saved = None
        if name != "learner" and not learner_alive:
            saved = self._save_checkpoint()
        self.close()
        note = f"(raised in rlpar thread {name!r}; the run was stopped"
        note += f", its final checkpoint is {saved})" if saved is not None else ")"
        if saved is not None:
            log.error("rlpar thread %r failed; the final checkpoint is %s", name, saved)
        if hasattr(exc, "add_note"):
            exc.add_note(note)
        raise exc

    def _result(
        self,
        wall: float,
        stopped_by: str,
        time_to_target: float | None,
        final: Path | None,
        stuck: list[str],
    ) -> RunResult:
        recent = self.episodes.recent(self.cfg.return_window)
        mean_return = float(np.mean([e[0] for e in recent])) if recent else None
        if stopped_by == "target_return" and self._target_hit is not None:
            mean_return = self._target_hit[1]  # the window that met the target, not a later one
        return RunResult(
            mean_return=mean_return,
            env_steps=self.env_steps(),
            learner_steps=self.state.steps,
            episodes=self._base_episodes + self.episodes.count,
            wall_s=wall,
            time_to_target_s=time_to_target,
            stopped_by=stopped_by,
            checkpoint=str(final) if final else None,
            stuck_threads=stuck,
            target_checks=[dataclasses.asdict(c) for c in self.target_checks],
            gil=self.gil_report(),
        )

    def _final_evaluation(self) -> list[dict[str, Any]] | None:
        """Each of `EvalConfig.policies` played with the final parameters (after the threads
        stopped: nothing else reads or writes them now)."""
        ecfg = self.eval_cfg
        if ecfg is None or ecfg.episodes == 0:
            return None
        out = []
        for i, policy in enumerate(ecfg.policies):
            e = evaluate_policy(
                self.agent,
                self.net,
                self.state.params,
                self.env_cfg,
                episodes=ecfg.episodes,
                greedy=policy == "greedy",
                seed=eval_seed(self.cfg.seed, _FINAL, self._generation, i),
                max_envs=ecfg.max_envs,
            )
            assert e is not None  # no stop event: it plays every episode
            out.append(e.to_dict(episodes=False))
        return out

    def close(self) -> None:
        """Close the envs (idempotent); envs of a stuck actor are left alone."""
        stuck = {t.name for t in self._threads if t.is_alive()} if self._threads else set()
        for i, envs in enumerate(self._envs):
            if envs is not None and f"rlpar-actor-{i}" not in stuck:
                envs.close()
                self._envs[i] = None
        if self.ray is not None:
            self.ray.close()

    # ----------------------------------------------------------------------------- threads

    def _guard(self, name: str, body: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                body()
            except BaseException as exc:  # every failure stops the run and reaches the main thread
                self._errors.append((name, exc))
                self.stop.set()

        return run

    def _start_threads(self) -> None:
        cfg = self.cfg
        if cfg.learner_threads > 1:  # the learner step's helpers, for this run only
            self.state.pool = ShardPool(cfg.learner_threads, split=cfg.learner_split)
        per_version = cfg.batch_rollouts // cfg.num_actors if cfg.deterministic else 1
        first = self.state.steps + 1
        for actor in self.actors:
            if cfg.deterministic:

                def wait_for(v: int, first: int = first) -> bool:
                    return self.clock.wait_for(first + v - 1, self.stop)

                wait: Callable[[int], bool] | None = wait_for
            else:
                wait = None
            body = _bind(actor.run, self.stop, self.queue, self.episodes, wait, per_version)
            self._threads.append(
                threading.Thread(
                    target=self._guard(f"actor-{actor.index} (env {self.env_cfg.id})", body),
                    name=f"rlpar-actor-{actor.index}",
                    daemon=True,
                )
            )
        learner = _bind(self.learner.run, self.stop, self.queue)
        self._threads.append(
            threading.Thread(
                target=self._guard("learner", learner), name="rlpar-learner", daemon=True
            )
        )
        if self._periodic_eval:  # evaluates pinned snapshots; stops and fails like the others
            self._threads.append(
                threading.Thread(
                    target=self._guard("evaluator", self._evaluate_periodically),
                    name="rlpar-evaluator",
                    daemon=True,
                )
            )
        for t in self._threads:
            t.start()

    def _join_threads(self) -> list[str]:
        deadline = time.perf_counter() + self.cfg.join_timeout_s
        stuck = []
        for t in self._threads:
            t.join(max(0.0, deadline - time.perf_counter()))
            if t.is_alive():
                stuck.append(t.name)
        if stuck:
            log.error(
                "%s did not stop within %.1f s (stuck in an env step or the learner?); "
                "left running as daemon threads",
                ", ".join(stuck),
                self.cfg.join_timeout_s,
            )
        return stuck

    def _evaluate_periodically(self) -> None:
        """The evaluator thread: every ``interval_env_steps`` env steps, pin the newest
        snapshot and evaluate it (``interval_episodes`` episodes per policy)."""
        ecfg = self.eval_cfg
        assert ecfg is not None and ecfg.interval_env_steps is not None
        every = ecfg.interval_env_steps
        next_at = self.env_steps()  # the first point: the policy the run starts with
        index = 0
        while not self.stop.is_set():
            steps = self.env_steps()
            if steps < next_at:
                self.stop.wait(POLL_S)
                continue
            results = []
            with self.store.pin() as snap:  # one version for every episode of this point
                version = snap.version
                for i, policy in enumerate(ecfg.policies):
                    e = evaluate_policy(
                        self.agent,
                        self.net,
                        snap,
                        self.env_cfg,
                        episodes=ecfg.interval_episodes,
                        greedy=policy == "greedy",
                        seed=eval_seed(self.cfg.seed, _PERIODIC, self._generation, index, i),
                        max_envs=ecfg.max_envs,
                        stop=self.stop,
                    )
                    if e is None:  # stopping
                        return
                    results.append(e)
            self.evaluations.append(EvalPoint(steps, version, results))
            index += 1
            next_at = (steps // every + 1) * every

    def _window_at_target(self) -> float | None:
        """The window mean once the last ``return_window`` episodes average at least
        ``target_return`` (and, after a failed check, the window is new), else None."""
        target = self.cfg.target_return
        if target is None or self.episodes.count < self._next_check_at:
            return None
        recent = self.episodes.recent(self.cfg.return_window)
        if len(recent) < self.cfg.return_window:
            return None
        mean = float(np.mean([e[0] for e in recent]))
        return mean if mean >= target else None

    def _check_target(self, now: float) -> bool:
        """True (and ``_target_hit`` set) once the window mean reaches ``target_return``; with
        ``check_target``, that only asks the learner for an evaluation (see `_check_on_learner`)
        and returns False."""
        mean = self._window_at_target()
        if mean is None:
            return False
        if self._verify_target:
            self._check_requested.set()
            return False
        self._target_hit = (now - self._start, mean)
        return True

    def _check_on_learner(self) -> None:
        """On the learner thread, between steps: evaluate the current parameters; if they reach
        the target, stop (the learner takes no further step). Otherwise wait for a new window."""
        window_mean = self._window_at_target()  # again: the window may have moved since
        if window_mean is None:
            return
        ecfg, target = self.eval_cfg, self.cfg.target_return
        assert ecfg is not None and target is not None
        e = evaluate_policy(
            self.agent,
            self.net,
            self.state.params,
            self.env_cfg,
            episodes=ecfg.episodes,
            greedy=ecfg.policies[0] == "greedy",
            seed=eval_seed(self.cfg.seed, _CHECK, self._generation, self.target_checks.count),
            max_envs=ecfg.max_envs,
            stop=self.stop,
        )
        if e is None:  # stopping anyway
            return
        passed = e.mean_return >= (target if ecfg.check_return is None else ecfg.check_return)
        self.target_checks.append(
            TargetCheck(self.env_steps(), self.state.steps, window_mean, e.mean_return, passed)
        )
        log.info(
            "target check at %d env steps: window mean %.2f, evaluated %s %.2f over %d "
            "episodes -> %s",
            self.env_steps(),
            window_mean,
            e.policy,
            e.mean_return,
            e.episodes,
            "stop" if passed else "go on",
        )
        if passed:
            self._target_hit = (time.perf_counter() - self._start, window_mean)
            self.stop.set()
        else:
            self._next_check_at = self.episodes.count + self.cfg.return_window

    # --------------------------------------------------------------------------- signals

    _signal: str | None = None

    def _install_signal_handlers(self) -> Callable[[], None]:
        if threading.current_thread() is not threading.main_thread():
            return lambda: None
        previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}

        def handler(signum: int, _frame: Any) -> None:
            self._signal = signal.Signals(signum).name
            self.stop.set()

        for s in previous:
            signal.signal(s, handler)

        def restore() -> None:
            for s, h in previous.items():
                signal.signal(s, h)

        return restore

    # ------------------------------------------------------------------------ checkpoints

    def _after_learner_step(self) -> None:
        """On the learner thread, between steps: the only place the state is quiet."""
        cfg = self.cfg
        if cfg.deterministic:
            # A fixed number of learner steps, not a race between actors and the main thread;
            # the episode log only changes in learner steps, so the target check is exact too.
            if self._check_target(time.perf_counter()):
                self.stop.set()
            per_step = cfg.batch_rollouts * cfg.env_steps_per_rollout
            if self.state.steps >= -(-cfg.total_env_steps // per_step):
                self._budget_spent.set()
                self.stop.set()
        if self._check_requested.is_set():  # eval.check_target: the window asked for a check
            self._check_requested.clear()
            self._check_on_learner()
            if self.stop.is_set():
                return
        interval = self.cfg.checkpoint_interval_s
        if interval is not None and time.perf_counter() - self._last_checkpoint >= interval:
            self._save_checkpoint()
            self._last_checkpoint = time.perf_counter()

    def _snapshot_state(self) -> Checkpoint:
        # Each actor's generators and episodes as of one of its finished unrolls (one read each).
        saved = [a.checkpoint_state() for a in self.actors]
        return Checkpoint(
            params=self.state.params.copy(),
            optimizer=self.state.optimizer.state_dict(),
            counters={
                "env_steps": self.env_steps(),
                "learner_steps": self.state.steps,
                "version": self.state.steps + 1,
                "episodes": self._base_episodes + self.episodes.count,
                "generation": self._generation,
            },
            rng_states={
                "actors": [rng["numpy"] for rng, _ in saved],
                "samplers": [rng["sampler"] for rng, _ in saved],
            },
            config=self.config,
            net_signature=net_signature(self.net),
            extra={"agent": dict(self.state.extra)},
            arrays={
                f"actors/{i}/{name}": array
                for i, (_, arrays) in enumerate(saved)
                for name, array in (arrays or {}).items()
            },
        )

    def _save_checkpoint(self) -> Path | None:
        if self.checkpoint_dir is None:
            return None
        self.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        path = save_checkpoint(
            checkpoint_path(self.checkpoint_dir, self.state.steps), self._snapshot_state()
        )
        prune_checkpoints(self.checkpoint_dir, keep=self.keep_checkpoints)
        return path

    def _restore(self, ckpt: Checkpoint, path: str | Path) -> None:
        check_signature(ckpt, net_signature(self.net), path)
        self.state.params[...] = ckpt.params
        self.state.optimizer.load_state_dict(ckpt.optimizer)
        self.state.steps = int(ckpt.counters["learner_steps"])
        self.state.extra = dict(ckpt.extra.get("agent", {}))


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


def _bind(fn: Callable[..., None], *args: Any) -> Callable[[], None]:
    return lambda: fn(*args)
