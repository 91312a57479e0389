"""``rlpar eval``: play whole episodes with a checkpoint's policy.

The env, agent and net are rebuilt from the config the checkpoint carries (``--set`` overrides
apply to it), so a checkpoint is all it takes; the code that config may select is limited by
`rlpar.app.trust` (a checkpoint is data: its ``env.setup`` hook runs only with the user's
word). Each of K envs plays a fixed quota of episodes
(N split evenly, decided up front), so short episodes are not favoured the way "the first N to
finish" would favour them.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from rlpar.app.experiment import experiment_from_dict
from rlpar.app.train import load_env_plugins
from rlpar.app.trust import checkpoint_config
from rlpar.checkpoint import CheckpointError, latest_checkpoint, load_checkpoint, net_signature
from rlpar.config import ConfigError
from rlpar.nn import Net
from rlpar.runtime.envs import ActionAdapter, make_actor_envs

__all__ = ["EvalResult", "evaluate", "find_checkpoint"]

log = logging.getLogger("rlpar")


@dataclass
class EvalResult:
    """Returns and lengths of the episodes played, and what was played."""

    checkpoint: str
    env: str
    agent: str
    policy: str
    episodes: int
    mean_return: float
    std_return: float
    min_return: float
    max_return: float
    mean_length: float
    returns: list[float]
    lengths: list[int]
    trained_env_steps: int
    trained_learner_steps: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def evaluate(
    checkpoint: str | Path,
    episodes: int = 10,
    greedy: bool = True,
    overrides: Iterable[str] = (),
    seed: int = 0,
    max_envs: int = 16,
    trust_setup: bool = False,
) -> EvalResult:
    """Play ``episodes`` episodes with the parameters of ``checkpoint`` (a checkpoint file, or
    a run or checkpoints directory: its newest checkpoint), greedily (falling back to
    sampling, with a warning, for an agent without `Agent.greedy`) or sampled.

    The checkpoint's ``env.setup`` hook, where its env id needs one, runs only when the user
    vouches for it: an ``env.setup=...`` override, ``trust_setup=True`` (the checkpoint's own
    hook, logged before it runs), or, when ``checkpoint`` is a run directory, the hook of the
    ``config.toml`` that run wrote.

    Raises `CheckpointError` for a missing or damaged file, a checkpoint whose config cannot
    rebuild the run (including a hook nobody vouched for), or one whose parameters do not fit
    the net that config builds.
    """
    if episodes < 1:
        raise ValueError(f"episodes: expected an integer >= 1, got {episodes}")
    path = find_checkpoint(checkpoint)
    run_file = Path(checkpoint) / "config.toml"
    ckpt = load_checkpoint(path)
    load_env_plugins()
    try:
        config = checkpoint_config(
            ckpt.config, path, overrides, trust_setup, run_file if run_file.is_file() else None
        )
        exp = experiment_from_dict(config)
    except ConfigError as e:
        raise CheckpointError(f"{path}: its config cannot rebuild the run: {e}") from None
    agent = exp.make_agent()
    try:
        envs = make_actor_envs(exp.env, min(episodes, max_envs))
    except (TypeError, gym.error.Error) as e:  # the env's or make_vec's view of env.kwargs
        raise CheckpointError(
            f"{path}: env {exp.env.id!r} cannot be built with env.kwargs {exp.env.kwargs}: {e}"
        ) from None
    try:
        net = Net(agent.net_spec(envs.single_observation_space, envs.single_action_space))
        params = load_checkpoint(path, expected_signature=net_signature(net)).params
        agent.init_state(net, params)
        returns, lengths, policy = _play(envs, net, params, agent, episodes, greedy, seed)
    finally:
        envs.close()
    r = np.asarray(returns)
    return EvalResult(
        checkpoint=str(path),
        env=exp.env.id,
        agent=exp.agent_name,
        policy=policy,
        episodes=len(returns),
        mean_return=float(r.mean()),
        std_return=float(r.std()),
        min_return=float(r.min()),
        max_return=float(r.max()),
        mean_length=float(np.mean(lengths)),
        returns=[float(x) for x in returns],
        lengths=[int(x) for x in lengths],
        trained_env_steps=int(ckpt.counters.get("env_steps", 0)),
        trained_learner_steps=int(ckpt.counters.get("learner_steps", 0)),
    )


def find_checkpoint(path: str | Path) -> Path:
    """``path`` if it is a file; for a run directory or a checkpoints directory, its newest
    checkpoint."""
    path = Path(path)
    if not path.is_dir():
        return path
    found = latest_checkpoint(path / "checkpoints") or latest_checkpoint(path)
    if found is None:
        raise CheckpointError(f"{path}: no checkpoint in this directory or its checkpoints/")
    return found


def _play(
    envs: Any, net: Net, params: np.ndarray, agent: Any, episodes: int, greedy: bool, seed: int
) -> tuple[list[float], list[int], str]:
    """Step all K envs together until each has finished its quota of episodes. The envs
    autoreset on the step after an episode ends (that step's reward is not the episode's)."""
    k = envs.num_envs
    quota = np.array([episodes // k + (i < episodes % k) for i in range(k)])
    finished = np.zeros(k, np.int64)
    rng = np.random.default_rng(np.random.SeedSequence([seed, 1 << 21]))
    adapter = ActionAdapter(envs.single_action_space)
    dtype = np.uint8 if net.spec.input_dtype == "uint8" else np.float32
    policy = "greedy" if greedy else "sampled"
    ep_return, ep_length = np.zeros(k), np.zeros(k, np.int64)
    prev_done = np.zeros(k, bool)
    returns: list[float] = []
    lengths: list[int] = []
    # A recurrent net carries its state; it restarts after each env's reset step (rlpar.data).
    starts = np.zeros(k, bool)
    core: dict[str, Any] = (
        {"state": net.initial_state(k), "resets": starts} if net.recurrent else {}
    )
    obs, _ = envs.reset(seed=seed)
    while (finished < quota).any():
        out = net.forward(params, np.asarray(obs, dtype), **core)
        if policy == "greedy":
            try:
                actions = agent.greedy(net, out)
            except NotImplementedError as e:
                log.warning("%s: sampling actions instead", e)
                policy = "sampled"
        if policy == "sampled":
            actions = agent.act(net, out, rng)
        obs, reward, terminated, truncated, _ = envs.step(adapter.to_env(actions))
        valid = ~prev_done
        np.logical_not(valid, out=starts)
        ep_return += np.where(valid, reward, 0.0)
        ep_length += valid
        prev_done = terminated | truncated
        for i in np.flatnonzero(prev_done & valid):
            if finished[i] < quota[i]:
                returns.append(float(ep_return[i]))
                lengths.append(int(ep_length[i]))
                finished[i] += 1
        ep_return[prev_done] = 0.0
        ep_length[prev_done] = 0
    return returns, lengths, policy
