"""A checkpoint is data: which code its config may select when a run is rebuilt from it.

An experiment file (TOML) is code-bearing, like a script: its ``env.setup`` names a module to
import and a function to call, and `rlpar train` runs it. A checkpoint is data: rebuilding a run
from one (``rlpar eval``) never imports or calls anything the file names, unless the user says
so. Each value of a checkpoint's config that could select code:

- ``env.setup`` ("module" or "module:function"): dropped, unless the env id is not registered
  without it and the user vouches for a hook: ``--set env.setup=...`` (the user's own value),
  ``--trust-checkpoint-setup`` (the checkpoint's, announced before it runs) or, for
  ``rlpar eval RUN_DIR``, the ``config.toml`` the run wrote (the user's experiment file, as
  ``rlpar train RUN_DIR/config.toml`` would run it). Otherwise the error names the hook and
  both ways to allow it.
- ``env.id``: looked up in gymnasium's registry, which only installed or user-imported code
  fills. A "module:Env-v0" id, which gymnasium answers by importing "module", is refused.
- ``env.kwargs``: JSON values (never callables) handed to the registered env's constructor.
- ``agent.name``: looked up among the registered agents (built-ins, installed entry points,
  `register_agent`); an unknown name is an error, never an import.
- ``plugins``: never imported; the user's ``--set plugins=[...]`` are (from the working
  directory or ``--set plugin_path``), and for ``rlpar eval RUN_DIR`` those of the run's
  ``config.toml`` (`rlpar.app.evaluate.load_policy`).

``--resume`` takes nothing from the checkpoint's config: the env and the agent come from the
experiment file, the checkpoint gives parameters, optimizer state, counters and RNG states.
"""

from __future__ import annotations

import copy
import logging
import shlex
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import gymnasium as gym

from rlpar.app.experiment import NONE, apply_overrides, load_experiment, parse_override
from rlpar.checkpoint import CheckpointError
from rlpar.config import ConfigError

__all__ = ["checkpoint_config"]

log = logging.getLogger("rlpar")


def checkpoint_config(
    config: Any,
    path: Path,
    overrides: Iterable[str] = (),
    trust_setup: bool = False,
    run_file: Path | None = None,
) -> dict[str, Any]:
    """The config to rebuild a run from: checkpoint ``path``'s ``config`` with the ``--set``
    ``overrides`` applied and ``env.setup`` only where the user vouched for it (see the module
    docstring). ``run_file``: the ``config.toml`` of the run directory the user named, if any.
    Call after the installed env plugins are imported (`load_env_plugins`): the hook is only
    wanted when the env id is not registered without it.

    Raises `CheckpointError` for a hook nobody vouched for or a "module:Env" id.
    """
    if not isinstance(config, dict):
        raise CheckpointError(f"{path}: its config is not a table, got {type(config).__name__}")
    overrides = list(overrides)
    given = {tuple(parse_override(text)[0]) for text in overrides}
    env = config.get("env")
    if not isinstance(env, dict):  # experiment_from_dict names what is wrong
        return apply_overrides(config, overrides)
    data = copy.deepcopy(config)
    env_id = env.get("id")
    if ("env", "id") not in given and isinstance(env_id, str) and ":" in env_id:
        module = env_id.partition(":")[0]
        raise CheckpointError(
            f"{path}: env.id {env_id!r} would make gymnasium import module {module!r}, and a "
            "checkpoint is data: rlpar does not import what it names. If you trust that "
            f"module, register the env with --set env.setup={module} and name its plain id "
            "with --set env.id=..."
        )
    asked = env.get("setup")
    data["env"]["setup"] = None
    data = apply_overrides(data, overrides)
    if ("env", "setup") in given or asked in (None, "", NONE):
        return data
    final_id = data["env"].get("id")
    if isinstance(final_id, str) and final_id in gym.registry:
        return data  # registered without the hook: nothing to run
    data["env"]["setup"] = _vouched_setup(asked, final_id, path, trust_setup, run_file)
    return data


def _vouched_setup(
    asked: Any, env_id: Any, path: Path, trust_setup: bool, run_file: Path | None
) -> Any:
    """The hook to run for ``asked`` (the checkpoint's ``env.setup``): the checkpoint's own
    under ``trust_setup``, else the run directory's config.toml's; else a `CheckpointError`."""
    if trust_setup:
        log.warning(
            "--trust-checkpoint-setup: running %s's env.setup %s to register %r",
            path,
            _describe_setup(asked),
            env_id,
        )
        return asked
    if run_file is not None:
        try:
            setup = load_experiment(run_file).env.setup
        except ConfigError as e:
            raise CheckpointError(f"the run's experiment file, for its env.setup: {e}") from None
        if setup:
            log.info(
                "env.setup of %s (the run's own experiment file): %s",
                run_file,
                _describe_setup(setup),
            )
            return setup
    raise CheckpointError(
        f"{path}: to rebuild env {env_id!r} the checkpoint asks to run env.setup {asked!r} "
        f"({_describe_setup(asked)}); a checkpoint is data, so rlpar does not run code it names. "
        f"If you trust that hook, allow it with --set {shlex.quote(f'env.setup={asked}')} (or "
        "--trust-checkpoint-setup; from Python: evaluate(..., trust_setup=True))"
    )


def _describe_setup(setup: Any) -> str:
    """What running ``setup`` ("module" or "module:function") does, in words."""
    module, _, function = str(setup).partition(":")
    called = f" and call {module}.{function}()" if function else ""
    return f"import module {module!r}{called}"
