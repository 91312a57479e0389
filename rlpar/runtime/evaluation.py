"""Evaluate a policy: play whole episodes with one parameter vector, on envs of their own.

::

    result = evaluate_policy(agent, net, params, EnvConfig("CartPole-v1"), episodes=100)
    result.mean_return, result.std_return

Used by ``rlpar eval`` (a checkpoint's parameters), by the runner's evaluator thread (a pinned
snapshot during training) and for the final evaluation of a run. Each of K envs plays a fixed
quota of episodes (N split evenly, decided up front), so short episodes are not favoured the
way "the first N to finish" would favour them.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from rlpar.agent import Agent
from rlpar.config import ConfigError, EnvConfig, EvalConfig
from rlpar.nn import Net
from rlpar.runtime.envs import ActionAdapter, make_actor_envs
from rlpar.snapshot import Snapshot, SnapshotStore

__all__ = [
    "DEFAULT_MAX_EPISODE_STEPS",
    "Evaluation",
    "EvaluationError",
    "eval_seed",
    "evaluate_policy",
    "evaluation_env",
    "policy_actions",
]

log = logging.getLogger("rlpar")

#: Steps after which an evaluation cuts an episode unless told otherwise (`EvalConfig`'s).
DEFAULT_MAX_EPISODE_STEPS: int | None = EvalConfig.max_episode_steps

# Mixed into evaluation seeds so evaluation envs never replay the training envs' episodes.
_EVAL_STREAM = 0x5EED_E7A1


@dataclass
class Evaluation:
    """Returns and lengths of the episodes one policy played."""

    policy: str
    """"greedy" or "sampled" (what was played: an agent without a greedy policy samples)."""
    episodes: int
    mean_return: float
    std_return: float
    min_return: float
    max_return: float
    mean_length: float
    returns: list[float]
    lengths: list[int]
    truncated: int
    """Episodes cut at the evaluation's step cap (``max_episode_steps``): counted, with the
    return they had reached."""
    seed: int
    """The seed the evaluation envs were reset with."""

    def to_dict(self, episodes: bool = True) -> dict[str, Any]:
        """Plain data; ``episodes=False`` leaves out the per-episode lists."""
        d = asdict(self)
        if not episodes:
            del d["returns"], d["lengths"]
        return d


def eval_seed(seed: int, *key: int) -> int:
    """The env seed of the evaluation named by ``key`` (e.g. (purpose, index)) in a run seeded
    ``seed``: fresh for every key, and apart from the seeds of the training envs."""
    return int(np.random.SeedSequence([seed, _EVAL_STREAM, *key]).generate_state(1)[0])


def evaluation_env(env: EnvConfig, num_envs: int) -> EnvConfig:
    """The env config evaluation steps ``num_envs`` envs with: the training config's env (id,
    kwargs, setup, vectorization), without the training layout's choices that need a given
    number of envs: no double buffering (evaluation steps all of its envs together), and the
    default worker count unless ``workers_per_actor`` divides ``num_envs``."""
    workers = env.workers_per_actor
    if workers is not None and num_envs % workers:
        workers = None
    if workers == env.workers_per_actor and not env.double_buffer:
        return env
    return dataclasses.replace(env, workers_per_actor=workers, double_buffer=False)


def evaluate_policy(
    agent: Agent,
    net: Net,
    params: np.ndarray | Snapshot,
    env: EnvConfig,
    episodes: int = 100,
    greedy: bool = True,
    seed: int = 0,
    max_envs: int = 16,
    stop: threading.Event | None = None,
    max_episode_steps: int | None = DEFAULT_MAX_EPISODE_STEPS,
) -> Evaluation | None:
    """Play ``episodes`` episodes of ``env`` with ``params`` (float32 [num_params], or a pinned
    `Snapshot`), greedily (an agent without `Agent.greedy` samples instead, with a warning) or
    sampled, on ``min(episodes, max_envs)`` new envs reset with ``seed``.

    An episode still running after ``max_episode_steps`` steps (None: no cap) is cut there and
    counted with the return it reached (`Evaluation.truncated`, and a warning): a policy that
    never ends an episode of an env without a time limit (a greedy one that stands still) ends
    the evaluation all the same. An env whose episode was cut waits until every env has cut its
    episode or played its share; then all are reset (with a seed derived from ``seed``) for the
    episodes still to play, as no vector env can reset one of its envs alone.

    ``agent`` must have run ``init_state`` on ``net`` (it knows the net's output layout then);
    this only reads it and ``params``, so it may run on any thread while the agent trains.
    Returns None only when ``stop`` is set before every episode has finished.
    """
    _check_arguments(agent, env, episodes, max_envs, max_episode_steps)
    num_envs = min(episodes, max_envs)
    stage = ["building the envs (make_actor_envs)"]
    try:
        envs = make_actor_envs(evaluation_env(env, num_envs), num_envs)
        try:
            played = _play(
                envs, net, params, agent, episodes, greedy, seed, stop, stage, max_episode_steps
            )
        except BaseException:
            envs.close()
            raise
        stage[0] = "closing the envs"
        envs.close()
    except (ConfigError, TypeError, ValueError) as e:
        if stage[0].startswith("building"):
            raise  # the config's or the env's own word on bad input, as training gives it
        raise EvaluationError(_failed(env, num_envs, stage[0], e)) from e
    except Exception as e:
        raise EvaluationError(_failed(env, num_envs, stage[0], e)) from e
    if played is None:
        return None
    returns, lengths, policy, truncated = played
    if truncated:
        log.warning(
            "evaluation of %r: %d of %d episodes were cut at %d steps (eval.max_episode_steps), "
            "counted with the return they had reached",
            env.id, truncated, len(returns), max_episode_steps,
        )  # fmt: skip
    return _evaluation(returns, lengths, policy, truncated, seed)


def _check_arguments(
    agent: Agent, env: EnvConfig, episodes: int, max_envs: int, max_episode_steps: int | None
) -> None:
    if not isinstance(agent, Agent):
        raise TypeError(f"agent: expected an rlpar.Agent, got {type(agent).__name__}")
    if not isinstance(env, EnvConfig):
        raise TypeError(f"env: expected an rlpar.EnvConfig, got {type(env).__name__}")
    if isinstance(episodes, bool) or not isinstance(episodes, int) or episodes < 1:
        raise ValueError(f"episodes: expected an integer >= 1, got {episodes!r}")
    if isinstance(max_envs, bool) or not isinstance(max_envs, int) or max_envs < 1:
        raise ValueError(f"max_envs: expected an integer >= 1, got {max_envs!r}")
    if max_episode_steps is not None and (
        isinstance(max_episode_steps, bool)
        or not isinstance(max_episode_steps, int)
        or max_episode_steps < 1
    ):
        raise ValueError(
            f"max_episode_steps: expected None or an integer >= 1, got {max_episode_steps!r}"
        )


def _evaluation(
    returns: list[float], lengths: list[int], policy: str, truncated: int, seed: int
) -> Evaluation:
    r = np.asarray(returns)
    return Evaluation(
        policy=policy,
        episodes=len(returns),
        mean_return=float(r.mean()),
        std_return=float(r.std()),
        min_return=float(r.min()),
        max_return=float(r.max()),
        mean_length=float(np.mean(lengths)),
        returns=[float(x) for x in returns],
        lengths=[int(x) for x in lengths],
        truncated=truncated,
        seed=seed,
    )


def policy_actions(
    agent: Agent, net: Net, out: np.ndarray, policy: str, rng: np.random.Generator
) -> tuple[np.ndarray, str]:
    """(actions [K], the policy that chose them) for the net's outputs ``out`` [K, O]: the
    agent's greedy actions for ``policy = "greedy"``, falling back to sampling (with a warning,
    and "sampled" returned, so the caller keeps sampling) when the agent has no greedy policy;
    sampled actions for "sampled"."""
    if policy == "greedy":
        try:
            return agent.greedy(net, out), policy
        except NotImplementedError as e:
            log.warning("%s: sampling actions instead", e)
    return agent.act(net, out, rng), "sampled"


class EvaluationError(RuntimeError):
    """An evaluation failed: its message names the env, its mode and the call that raised
    (the original exception is its ``__cause__``)."""


def _failed(env: EnvConfig, num_envs: int, stage: str, error: BaseException) -> str:
    return (
        f"evaluation of {env.id!r} failed (env.vectorization = {env.vectorization!r}, "
        f"{num_envs} envs) in {stage}: {type(error).__name__}: {error}"
    )


class _Tally:
    """What evaluating K envs together keeps per env: its episode in progress, how many of
    its quota of episodes have finished, and whether its episode was cut at the step cap (it
    then waits for a reset). The envs autoreset on the step after an episode ends: that
    step's reward is not the episode's, and a recurrent net restarts on it (``starts``)."""

    def __init__(self, k: int, episodes: int) -> None:
        self.quota = np.array([episodes // k + (i < episodes % k) for i in range(k)])
        self.finished = np.zeros(k, np.int64)
        self.ep_return, self.ep_length = np.zeros(k), np.zeros(k, np.int64)
        self.prev_done = np.zeros(k, bool)
        self.cut = np.zeros(k, bool)
        self.valid = np.ones(k, bool)  # the last step counted for the env's episode
        self.starts = np.zeros(k, bool)  # bool [K]: the net's recurrent state restarts
        self.num_cut = 0
        self.returns: list[float] = []
        self.lengths: list[int] = []

    def playing(self) -> bool:
        return bool((self.finished < self.quota).any())

    def step(self, reward: np.ndarray, terminated: np.ndarray, truncated: np.ndarray) -> None:
        """Count one step of every env (float [K], bool [K], bool [K])."""
        self.valid = ~(self.prev_done | self.cut)
        np.logical_not(self.valid, out=self.starts)
        self.ep_return += np.where(self.valid, reward, 0.0)
        self.ep_length += self.valid
        self.prev_done = terminated | truncated
        for i in np.flatnonzero(self.prev_done & self.valid):
            self._finish(int(i))
        self.ep_return[self.prev_done] = 0.0
        self.ep_length[self.prev_done] = 0

    def cut_at(self, max_steps: int) -> None:
        """End the episodes that reached ``max_steps`` steps, counted with their return."""
        for i in np.flatnonzero(self.valid & ~self.prev_done & (self.ep_length >= max_steps)):
            self.num_cut += self._finish(int(i))
            self.cut[i] = True
            self.ep_return[i], self.ep_length[i] = 0.0, 0

    def waiting_for_reset(self) -> bool:
        """Every env has a cut episode or its quota, and some quota is left."""
        return bool(self.cut.any() and (self.cut | (self.finished >= self.quota)).all())

    def reset(self) -> None:
        """The envs were all reset: every env starts a new episode."""
        self.cut[:] = False
        self.prev_done[:] = False
        self.starts[:] = True
        self.ep_return[:], self.ep_length[:] = 0.0, 0

    def _finish(self, i: int) -> bool:
        if self.finished[i] >= self.quota[i]:
            return False
        self.returns.append(float(self.ep_return[i]))
        self.lengths.append(int(self.ep_length[i]))
        self.finished[i] += 1
        return True


def _play(
    envs: Any,
    net: Net,
    params: np.ndarray | Snapshot,
    agent: Agent,
    episodes: int,
    greedy: bool,
    seed: int,
    stop: threading.Event | None,
    stage: list[str] | None = None,
    max_episode_steps: int | None = None,
) -> tuple[list[float], list[int], str, int] | None:
    """Step all K envs together until each has finished its quota of episodes (None: ``stop``
    was set first); returns (returns, lengths, policy, episodes cut at the cap).
    ``stage[0]`` names the call in progress, for the error message."""
    stage = stage if stage is not None else [""]
    k = envs.num_envs
    tally = _Tally(k, episodes)
    rng = np.random.default_rng(np.random.SeedSequence([seed, 1 << 21]))
    adapter = ActionAdapter(envs.single_action_space)
    dtype = np.uint8 if net.spec.input_dtype == "uint8" else np.float32
    policy = "greedy" if greedy else "sampled"
    resets = 0
    # A recurrent net carries its state; it restarts after each env's reset step (rlpar.data).
    core: dict[str, Any] = (
        {"state": net.initial_state(k), "resets": tally.starts} if net.recurrent else {}
    )
    if isinstance(params, np.ndarray) and net.spec.core and net.spec.core.matmul == "bf16x3":
        # From a snapshot, the core's weights are packed into tiles once, not on every step.
        store = SnapshotStore(net.num_params, num_slots=3)
        store.publish(params)
        params = store.pin()
    stage[0] = f"envs.reset(seed={seed})"
    obs, _ = envs.reset(seed=seed)
    while tally.playing():
        if stop is not None and stop.is_set():
            return None
        stage[0] = "net.forward"
        out = net.forward(params, np.asarray(obs, dtype), **core)
        stage[0] = f"agent.{'greedy' if policy == 'greedy' else 'act'}"
        actions, policy = policy_actions(agent, net, out, policy, rng)
        actions = adapter.checked(actions, k, agent, "greedy" if policy == "greedy" else "act")
        stage[0] = "envs.step"
        obs, reward, terminated, truncated, _ = envs.step(adapter.to_env(actions))
        tally.step(reward, terminated, truncated)
        if max_episode_steps is None:
            continue
        tally.cut_at(max_episode_steps)
        if tally.waiting_for_reset() and tally.playing():
            resets += 1
            stage[0] = f"envs.reset (after episodes cut at {max_episode_steps} steps)"
            obs, _ = envs.reset(seed=eval_seed(seed, resets))
            tally.reset()
    return tally.returns, tally.lengths, policy, tally.num_cut
