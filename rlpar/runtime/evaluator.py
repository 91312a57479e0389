"""How a run evaluates its policy (`rlpar.EvalConfig`): periodically while it trains (the
evaluator thread), to confirm the target return (`rlpar.runtime.stop_rules.CheckTarget`, on the
learner thread) and once at the end (the final parameters).

Every evaluation plays on envs of its own (`evaluate_policy`) with a seed named by (purpose,
generation, index): a check's episodes do not depend on how many periodic evaluations ran
before it, so deterministic runs stay reproducible, and a resumed run (the next generation)
plays fresh episodes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlpar.agent import Agent
from rlpar.config import EnvConfig, EvalConfig
from rlpar.nn import Net
from rlpar.runtime.common import POLL_S, RecentLog
from rlpar.runtime.evaluation import Evaluation, eval_seed, evaluate_policy
from rlpar.snapshot import Snapshot, SnapshotStore

__all__ = ["EvalPoint", "PeriodicEvaluator", "PolicyEvaluator"]

# The purposes in evaluation seeds.
_PERIODIC, _CHECK, _FINAL = 0, 1, 2


@dataclass
class EvalPoint:
    """One evaluation during training (the evaluator thread), one per evaluated policy."""

    env_steps: int
    """Env steps when the snapshot was pinned (the x-axis of the eval curves)."""
    version: int
    """The parameter version evaluated."""
    results: list[Evaluation]


class PolicyEvaluator:
    """Plays the run's policy as ``eval_cfg`` says, with seeds from the run's ``seed`` and
    ``generation``. It only reads ``agent``, ``net`` and the parameters it is given, so it may
    run on any thread."""

    def __init__(
        self,
        agent: Agent,
        net: Net,
        env: EnvConfig,
        eval_cfg: EvalConfig,
        seed: int,
        generation: int,
    ) -> None:
        self.agent, self.net, self.env, self.cfg = agent, net, env, eval_cfg
        self.seed, self.generation = seed, generation

    def final(self, params: np.ndarray) -> list[dict[str, Any]] | None:
        """Each of `EvalConfig.policies` played ``episodes`` episodes with ``params`` float32
        [num_params] (`RunResult.evaluation`); None with ``episodes = 0``."""
        if self.cfg.episodes == 0:
            return None
        out = []
        for i, policy in enumerate(self.cfg.policies):
            e = self._play(params, self.cfg.episodes, policy, (_FINAL, self.generation, i))
            assert e is not None  # no stop event: it plays every episode
            out.append(e.to_dict(episodes=False))
        return out

    def target_check(
        self, params: np.ndarray, index: int, stop: threading.Event
    ) -> Evaluation | None:
        """The ``index``-th target check: ``episodes`` episodes of the first policy; None when
        ``stop`` is set first."""
        key = (_CHECK, self.generation, index)
        return self._play(params, self.cfg.episodes, self.cfg.policies[0], key, stop)

    def point(self, snap: Snapshot, index: int, stop: threading.Event) -> list[Evaluation] | None:
        """The ``index``-th periodic evaluation: ``interval_episodes`` episodes of each policy,
        all with the pinned ``snap``; None when ``stop`` is set first."""
        results = []
        for i, policy in enumerate(self.cfg.policies):
            key = (_PERIODIC, self.generation, index, i)
            e = self._play(snap, self.cfg.interval_episodes, policy, key, stop)
            if e is None:
                return None
            results.append(e)
        return results

    def _play(
        self,
        params: np.ndarray | Snapshot,
        episodes: int,
        policy: str,
        key: tuple[int, ...],
        stop: threading.Event | None = None,
    ) -> Evaluation | None:
        return evaluate_policy(
            self.agent,
            self.net,
            params,
            self.env,
            episodes=episodes,
            greedy=policy == "greedy",
            seed=eval_seed(self.seed, *key),
            max_envs=self.cfg.max_envs,
            stop=stop,
            max_episode_steps=self.cfg.max_episode_steps,
        )


class PeriodicEvaluator:
    """The evaluator thread: every ``interval_env_steps`` env steps (``env_steps()``, the
    run's count), pin the newest snapshot of ``store`` and evaluate it
    (`PolicyEvaluator.point`), appending an `EvalPoint` to ``points``. The learner never waits
    for it."""

    def __init__(
        self,
        evaluator: PolicyEvaluator,
        store: SnapshotStore,
        env_steps: Callable[[], int],
        points: RecentLog[EvalPoint],
    ) -> None:
        if evaluator.cfg.interval_env_steps is None:
            raise ValueError("PeriodicEvaluator: the EvalConfig has no interval_env_steps")
        self.evaluator, self.store, self.env_steps = evaluator, store, env_steps
        self.every, self.points = evaluator.cfg.interval_env_steps, points

    def run(self, stop: threading.Event) -> None:
        """Evaluate until ``stop`` is set; the first point is the policy the run starts with."""
        next_at = self.env_steps()
        index = 0
        while not stop.is_set():
            steps = self.env_steps()
            if steps < next_at:
                stop.wait(POLL_S)
                continue
            with self.store.pin() as snap:  # one version for every episode of this point
                version = snap.version
                results = self.evaluator.point(snap, index, stop)
            if results is None:  # stopping
                return
            self.points.append(EvalPoint(steps, version, results))
            index += 1
            next_at = (steps // self.every + 1) * self.every


def build_evaluators(
    agent: Agent,
    net: Net,
    env: EnvConfig,
    cfg: EvalConfig | None,
    *,
    seed: int,
    generation: int,
    store: SnapshotStore,
    env_steps: Callable[[], int],
    points: RecentLog[EvalPoint],
) -> tuple[PolicyEvaluator | None, PeriodicEvaluator | None]:
    """A run's evaluators for ``cfg``: the `PolicyEvaluator` (target checks, the final
    evaluation; None without ``cfg``) and, when ``cfg.interval_env_steps`` is set, the
    evaluator thread's `PeriodicEvaluator` over ``store``, appending to ``points``."""
    if cfg is None:
        return None, None
    evaluator = PolicyEvaluator(agent, net, env, cfg, seed, generation)
    if cfg.interval_env_steps is None:
        return evaluator, None
    return evaluator, PeriodicEvaluator(evaluator, store, env_steps, points)
