"""``rlpar eval``: play whole episodes with a checkpoint's policy.

The env, agent and net are rebuilt from the config the checkpoint carries (``--set`` overrides
apply to it), so a checkpoint is all it takes; the code that config may select is limited by
`rlpar.app.trust` (a checkpoint is data: its ``env.setup`` hook runs only with the user's
word). `rlpar.runtime.evaluation.evaluate_policy` plays the episodes.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from rlpar.agent import Agent
from rlpar.app.experiment import (
    Experiment,
    experiment_from_dict,
    import_given_plugins,
    import_run_plugins,
    parse_override,
)
from rlpar.app.train import load_env_plugins
from rlpar.app.trust import checkpoint_config
from rlpar.checkpoint import (
    Checkpoint,
    CheckpointError,
    find_checkpoint,
    load_checkpoint,
    net_signature,
)
from rlpar.config import ConfigError
from rlpar.nn import Net
from rlpar.registry import registered_agents
from rlpar.runtime.envs import make_actor_envs
from rlpar.runtime.evaluation import Evaluation, evaluate_policy, evaluation_env

__all__ = ["EvalResult", "LoadedPolicy", "evaluate", "find_checkpoint", "load_policy"]


@dataclass
class EvalResult(Evaluation):
    """An `Evaluation` of a checkpoint's parameters, and what they were trained on."""

    checkpoint: str
    env: str
    agent: str
    trained_env_steps: int
    trained_learner_steps: int


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
    p = load_policy(checkpoint, overrides, trust_setup)
    e = evaluate_policy(
        p.agent,
        p.net,
        p.params,
        p.experiment.env,
        episodes,
        greedy,
        seed,
        max_envs,
        max_episode_steps=p.experiment.eval.max_episode_steps,
    )
    assert e is not None  # no stop event: it plays every episode
    return EvalResult(
        **asdict(e),
        checkpoint=str(p.path),
        env=p.experiment.env.id,
        agent=p.experiment.agent_name,
        trained_env_steps=int(p.ckpt.counters.get("env_steps", 0)),
        trained_learner_steps=int(p.ckpt.counters.get("learner_steps", 0)),
    )


def _plugins_hint(config: Any, overrides: list[str]) -> str:
    """How to import the plugins a checkpoint's run named, when its agent is not registered
    and the user did not name them (a checkpoint is data: its plugins are not imported)."""
    if not isinstance(config, dict) or any(parse_override(t)[0] == ["plugins"] for t in overrides):
        return ""
    agent = config.get("agent")
    name = agent.get("name") if isinstance(agent, dict) else None
    plugins = config.get("plugins")
    if not plugins or not isinstance(plugins, list) or name in registered_agents():
        return ""
    listed = json.dumps([str(p) for p in plugins])
    return (
        f". A checkpoint is data: rlpar does not import the plugins its run named ({listed}). "
        f"If you trust them, import them with --set {shlex.quote(f'plugins={listed}')} "
        "(looked for in the working directory, or in --set plugin_path=[...]), or name the "
        "run directory instead of the file: its config.toml names them"
    )


@dataclass
class LoadedPolicy:
    """What a checkpoint rebuilds: its experiment (with overrides), agent, net and parameters."""

    experiment: Experiment
    agent: Agent
    net: Net
    params: np.ndarray
    ckpt: Checkpoint
    path: Path


def load_policy(
    checkpoint: str | Path, overrides: Iterable[str] = (), trust_setup: bool = False
) -> LoadedPolicy:
    """Rebuild the env config, agent and net of ``checkpoint`` (a file, or a run directory: its
    newest checkpoint) and load its parameters; `CheckpointError` as for `evaluate`.

    A plug-in agent is found through the ``config.toml`` of a run directory named, or through
    the user's ``--set plugins=[...]`` (looked for in the working directory or in ``--set
    plugin_path=[...]``); a checkpoint's own ``plugins`` are data and import nothing.
    """
    path = find_checkpoint(checkpoint)
    # A file names no run: only a run directory's own config.toml vouches for its code.
    found = Path(checkpoint) / "config.toml"
    run_file = found if found.is_file() else None
    ckpt = load_checkpoint(path)
    load_env_plugins()
    overrides = list(overrides)
    try:
        import_given_plugins(overrides, Path.cwd())  # the user's --set plugins=[...]
        if run_file is not None:  # the run's own experiment file: its plugins register its agent
            import_run_plugins(run_file, ckpt.config)
        config = checkpoint_config(ckpt.config, path, overrides, trust_setup, run_file)
        exp = experiment_from_dict(config)
    except ConfigError as err:
        hint = _plugins_hint(ckpt.config, overrides)
        raise CheckpointError(f"{path}: its config cannot rebuild the run: {err}{hint}") from None
    agent = exp.make_agent()
    try:
        envs = make_actor_envs(evaluation_env(exp.env, 1), 1)
    except (TypeError, gym.error.Error) as err:  # the env's or make_vec's view of env.kwargs
        raise CheckpointError(
            f"{path}: env {exp.env.id!r} cannot be built with env.kwargs {exp.env.kwargs}: {err}"
        ) from None
    try:
        net = Net(agent.net_spec(envs.single_observation_space, envs.single_action_space))
    finally:
        envs.close()
    params = load_checkpoint(path, expected_signature=net_signature(net)).params
    agent.init_state(net, params)
    return LoadedPolicy(exp, agent, net, params, ckpt, path)
