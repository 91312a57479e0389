"""When a run stops: the stop rules, the thread that applies each, and their order.

Each rule is a callable that, when it fires, decides the run's `StopVerdict` (the first
decision wins; it sets the stop event):

- ``total_env_steps``: the env-step budget (`EnvStepBudget`). In deterministic mode a fixed
  number of learner steps instead, ceil(total_env_steps / (B T K)) (`LearnerStepBudget`), not
  a race between the actors and the main thread.
- ``target_return``: the mean return of the last ``return_window`` episodes reaches
  ``target_return`` (`WindowTarget`). With `rlpar.EvalConfig.check_target` the window only asks
  the learner to evaluate its current parameters between two steps (`CheckTarget`); the run
  stops when that evaluation reaches the target too (the learner takes no further step, so the
  final parameters are the evaluated ones).
- ``max_wall_s``: the wall clock (`WallClock`).

`stop_rules` says where each runs. The main thread applies its rules, in the order above, at
every tick of its supervising loop (after thread errors and signals, which come first). In
deterministic mode the target and the budget are learner hooks instead, run between two steps:
finished episodes ride with their rollouts and the learner logs them, so the episode log only
changes in learner steps, and a run that stops at its target stops at the same step every time.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from rlpar.agent import LearnerState
from rlpar.config import RuntimeConfig
from rlpar.runtime.common import EpisodeLog, RecentLog
from rlpar.runtime.evaluator import PolicyEvaluator

__all__ = [
    "CheckTarget",
    "EnvStepBudget",
    "LearnerStepBudget",
    "ReturnWindow",
    "Rule",
    "StopVerdict",
    "TargetCheck",
    "WallClock",
    "WindowTarget",
    "stop_rules",
]

log = logging.getLogger("rlpar")

#: A stop rule: applied by its thread (main or learner), it may decide the `StopVerdict`.
Rule = Callable[[], None]


@dataclass
class TargetCheck:
    """One `EvalConfig.check_target` evaluation on the learner thread."""

    env_steps: int
    learner_steps: int
    window_mean: float
    """The window mean that asked for the check."""
    eval_mean: float
    passed: bool


class StopVerdict:
    """Why a run stops, decided once by the first rule that fires, on any thread: ``reason``
    (`RunResult.stopped_by`), ``at`` (`time.perf_counter` then) and ``window_mean`` (for
    ``target_return``: the mean of the window that met the target). Deciding sets ``stop``."""

    def __init__(self, stop: threading.Event) -> None:
        self.stop = stop
        self._lock = threading.Lock()
        self.reason: str | None = None
        self.at = 0.0
        self.window_mean: float | None = None

    def decide(self, reason: str, window_mean: float | None = None) -> None:
        with self._lock:
            if self.reason is None:
                self.at, self.window_mean = time.perf_counter(), window_mean
                self.reason = reason  # last: whoever sees a reason sees the rest
        self.stop.set()

    def outcome(
        self, stopped_by: str, episodes: EpisodeLog, window: int, start: float
    ) -> tuple[float | None, float | None]:
        """(the mean return a run reports, its time to target in seconds since ``start``):
        stopped by ``target_return``, the window that met the target and when; otherwise the
        mean of the last ``window`` episodes (None before the first) and None."""
        if stopped_by == "target_return":
            return self.window_mean, self.at - start
        recent = episodes.recent(window)
        return (float(np.mean([e[0] for e in recent])) if recent else None), None


class ReturnWindow:
    """The mean return of the last ``size`` episodes of ``episodes``, against ``target``."""

    def __init__(self, episodes: EpisodeLog, target: float, size: int) -> None:
        self.episodes, self.target, self.size = episodes, target, size
        self._next_at = 0  # episodes the log must hold before the next look

    def at_target(self) -> float | None:
        """The window mean once the last ``size`` episodes average at least ``target`` (and,
        after a failed check, the window is new), else None."""
        if self.episodes.count < self._next_at:
            return None
        recent = self.episodes.recent(self.size)
        if len(recent) < self.size:
            return None
        mean = float(np.mean([e[0] for e in recent]))
        return mean if mean >= self.target else None

    def renew(self) -> None:
        """After a failed check: the next look waits for ``size`` new episodes."""
        self._next_at = self.episodes.count + self.size


class WindowTarget:
    """``target_return``: decide once the window is at the target; with a ``check``
    (`EvalConfig.check_target`), ask it for an evaluation instead."""

    def __init__(
        self, window: ReturnWindow, verdict: StopVerdict, check: CheckTarget | None
    ) -> None:
        self.window, self.verdict, self.check = window, verdict, check

    def __call__(self) -> None:
        mean = self.window.at_target()
        if mean is None:
            return
        if self.check is not None:
            self.check.request()
        else:
            self.verdict.decide("target_return", mean)


class CheckTarget:
    """A learner hook (`EvalConfig.check_target`): once `request`ed, evaluate the learner's
    current parameters (``state.params``, quiet between two steps); if they reach
    ``threshold``, decide ``target_return`` (the learner takes no further step). Otherwise the
    window must fill with new episodes before the next check. Every check goes to ``checks``."""

    def __init__(
        self,
        *,
        window: ReturnWindow,
        verdict: StopVerdict,
        evaluator: PolicyEvaluator,
        state: LearnerState,
        env_steps: Callable[[], int],
        checks: RecentLog[TargetCheck],
        threshold: float,
        stop: threading.Event,
    ) -> None:
        self.window, self.verdict, self.evaluator = window, verdict, evaluator
        self.state, self.env_steps, self.checks = state, env_steps, checks
        self.threshold, self.stop = threshold, stop
        self._requested = threading.Event()  # main thread -> learner: check the target

    def request(self) -> None:
        self._requested.set()

    def __call__(self) -> None:
        if not self._requested.is_set():
            return
        self._requested.clear()
        window_mean = self.window.at_target()  # again: the window may have moved since
        if window_mean is None:
            return
        e = self.evaluator.target_check(self.state.params, self.checks.count, self.stop)
        if e is None:  # stopping anyway
            return
        passed = e.mean_return >= self.threshold
        steps = self.env_steps()
        self.checks.append(TargetCheck(steps, self.state.steps, window_mean, e.mean_return, passed))
        log.info(
            "target check at %d env steps: window mean %.2f, evaluated %s %.2f over %d "
            "episodes -> %s",
            steps,
            window_mean,
            e.policy,
            e.mean_return,
            e.episodes,
            "stop" if passed else "go on",
        )
        if passed:
            self.verdict.decide("target_return", window_mean)
        else:
            self.window.renew()


class EnvStepBudget:
    """``total_env_steps``: decide once ``env_steps()`` reaches ``total``."""

    def __init__(self, env_steps: Callable[[], int], total: int, verdict: StopVerdict) -> None:
        self.env_steps, self.total, self.verdict = env_steps, total, verdict

    def __call__(self) -> None:
        if self.env_steps() >= self.total:
            self.verdict.decide("total_env_steps")


class LearnerStepBudget:
    """``total_env_steps`` in deterministic mode (a learner hook): decide once the learner has
    taken ``steps`` steps (``state.steps``, resumed ones included)."""

    def __init__(self, state: LearnerState, steps: int, verdict: StopVerdict) -> None:
        self.state, self.steps, self.verdict = state, steps, verdict

    def __call__(self) -> None:
        if self.state.steps >= self.steps:
            self.verdict.decide("total_env_steps")


class WallClock:
    """``max_wall_s``: decide ``max_wall_s`` seconds after ``start`` (`time.perf_counter`)."""

    def __init__(self, start: float, max_wall_s: float, verdict: StopVerdict) -> None:
        self.start, self.max_wall_s, self.verdict = start, max_wall_s, verdict

    def __call__(self) -> None:
        if time.perf_counter() - self.start >= self.max_wall_s:
            self.verdict.decide("max_wall_s")


def stop_rules(
    cfg: RuntimeConfig,
    *,
    verdict: StopVerdict,
    episodes: EpisodeLog,
    env_steps: Callable[[], int],
    state: LearnerState,
    evaluator: PolicyEvaluator | None,
    checks: RecentLog[TargetCheck],
    start: float,
) -> tuple[list[Rule], list[Rule]]:
    """(the main thread's rules, the learner's), each in the order it applies them, for a run
    configured by ``cfg`` that started at ``start``. ``evaluator``: the run's evaluations
    (None without an `EvalConfig`); with ``check_target``, the learner's rules end with a
    `CheckTarget`, after the others: a check that the window asked for in deterministic mode
    evaluates the parameters of that very step."""
    target: list[Rule] = []
    checking: list[Rule] = []
    if cfg.target_return is not None:
        window = ReturnWindow(episodes, cfg.target_return, cfg.return_window)
        check = None
        if evaluator is not None and evaluator.cfg.check_target:
            given = evaluator.cfg.check_return
            check = CheckTarget(
                window=window,
                verdict=verdict,
                evaluator=evaluator,
                state=state,
                env_steps=env_steps,
                checks=checks,
                threshold=cfg.target_return if given is None else given,
                stop=verdict.stop,
            )
            checking.append(check)
        target.append(WindowTarget(window, verdict, check))
    wall: list[Rule] = []
    if cfg.max_wall_s is not None:
        wall.append(WallClock(start, cfg.max_wall_s, verdict))
    if cfg.deterministic:
        per_step = cfg.batch_rollouts * cfg.env_steps_per_rollout
        budget = LearnerStepBudget(state, -(-cfg.total_env_steps // per_step), verdict)
        return wall, [*target, budget, *checking]
    return [EnvStepBudget(env_steps, cfg.total_env_steps, verdict), *target, *wall], checking
