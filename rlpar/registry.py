"""Plug-in registries: agents by name (environments use gymnasium's own registry).

A user's agent is a first-class citizen beside the built-ins, and is found the same way::

    @dataclass(frozen=True)
    class MyConfig:
        lr: float = 1e-3

    class MyAgent(rlpar.Agent):
        def __init__(self, config: MyConfig) -> None: ...

    rlpar.register_agent("my_agent", MyAgent, MyConfig)
    # or, from an installed package, an entry point in the group "rlpar.agents":
    #   [project.entry-points."rlpar.agents"]
    #   my_agent = "my_package.agents:MyAgent"     (a class with a nested `Config` dataclass)

An experiment file reaches a module that calls `register_agent` with ``plugins = ["module"]``
(`rlpar.app.experiment`). rlpar's own agents are entry points of that group too: declared in
rlpar's ``pyproject.toml`` and listed in `BUILT_IN_AGENTS`, which is read first, so that an
install whose metadata predates a declaration (an old editable install) still finds them.
Nothing is imported until the first lookup (`registered_agents`, `make_agent`).

Configs (TOML ``[agent]`` tables) are validated against the registered dataclass, so a typo in
a key is an error naming the key, not a silently ignored setting.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from typing import Any

import gymnasium as gym

from rlpar._checks import did_you_mean
from rlpar.agent import Agent
from rlpar.config import from_dict

__all__ = [
    "BUILT_IN_AGENTS",
    "ENTRY_POINT_GROUP",
    "AgentEntry",
    "how_to_register",
    "make_agent",
    "register_agent",
    "register_env",
    "registered_agents",
]

log = logging.getLogger("rlpar")

ENTRY_POINT_GROUP = "rlpar.agents"
#: rlpar's own agents: name -> entry point (the same lines as in pyproject.toml).
BUILT_IN_AGENTS = {
    "a3c": "rlpar.agents.a3c:A3C",
    "appo": "rlpar.agents.appo:Appo",
    "impala": "rlpar.agents.impala:Impala",
}


@dataclass(frozen=True)
class AgentEntry:
    """A registered agent: ``factory(config) -> Agent`` and its config dataclass."""

    name: str
    factory: Callable[[Any], Agent]
    config: type
    source: str  # "built-in", "entry point", or "register_agent"


_AGENTS: dict[str, AgentEntry] = {}
_loaded = False


def register_agent(
    name: str,
    factory: Callable[[Any], Agent],
    config: type | None = None,
    *,
    overwrite: bool = False,
    source: str = "register_agent",
) -> None:
    """Register ``factory`` (called with a ``config`` instance) under ``name``.

    ``config`` defaults to ``factory.Config``; it must be a dataclass. A name that is taken
    (a built-in, an installed entry point, an earlier call) is an error unless ``overwrite``.
    """
    _load_plugins()  # so that a name taken by an entry point is refused here, not shadowed
    if not isinstance(name, str) or not name:
        raise ValueError(f"agent name must be a non-empty string, got {name!r}")
    config = config if config is not None else getattr(factory, "Config", None)
    if config is None or not dataclasses.is_dataclass(config):
        raise TypeError(
            f"agent {name!r} needs a config dataclass: pass config=... or give the factory a "
            f"nested `Config` dataclass (got {config!r})"
        )
    if name in _AGENTS and not overwrite:
        raise ValueError(f"an agent named {name!r} is already registered ({_AGENTS[name].source})")
    _AGENTS[name] = AgentEntry(name, factory, config, source)


def register_env(env_id: str, entry_point: Any, **kwargs: Any) -> None:
    """Register an environment for configs; the same as ``gymnasium.register``."""
    gym.register(env_id, entry_point=entry_point, **kwargs)


def _load_plugins() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    built_in = [metadata.EntryPoint(n, v, ENTRY_POINT_GROUP) for n, v in BUILT_IN_AGENTS.items()]
    for ep in built_in:
        if ep.name not in _AGENTS:
            _register_entry_point(ep, "built-in")
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        if ep.name in _AGENTS:  # rlpar's own declaration, or a name register_agent took
            if BUILT_IN_AGENTS.get(ep.name) not in (None, ep.value):
                log.warning(
                    "entry point %s = %r (group %s) ignored: %r is rlpar's built-in agent",
                    ep.name,
                    ep.value,
                    ENTRY_POINT_GROUP,
                    ep.name,
                )
            continue
        _register_entry_point(ep, "entry point")


def _register_entry_point(ep: metadata.EntryPoint, source: str) -> None:
    try:
        factory = ep.load()
    except ImportError as e:
        raise ImportError(
            f"agent {ep.name!r}: cannot load its entry point {ep.value!r} (group "
            f"{ENTRY_POINT_GROUP}): {e}"
        ) from e
    register_agent(ep.name, factory, source=source)


def how_to_register(name: str, where: str = "before this call") -> str:
    """How to make agent ``name`` known, for an error message; ``where`` says where the
    `register_agent` call goes."""
    return (
        f"register one with rlpar.register_agent({name!r}, YourAgent, YourConfig) {where}, or "
        f"with an entry point in the group {ENTRY_POINT_GROUP!r} of an installed package"
    )


def registered_agents() -> dict[str, AgentEntry]:
    """Every registered agent, built-in and plug-in, by name."""
    _load_plugins()
    return dict(sorted(_AGENTS.items()))


def make_agent(name: str, params: dict[str, Any] | None = None) -> Agent:
    """Build agent ``name`` from plain config data (e.g. the TOML ``[agent]`` table)."""
    if not isinstance(name, str):
        raise TypeError(
            f"agent name: expected a string such as 'impala', got {type(name).__name__} {name!r}"
        )
    if params is not None and not isinstance(params, dict):
        raise TypeError(
            f"agent params: expected a dict of config keys (e.g. {{'gamma': 0.9}}), got "
            f"{type(params).__name__} {params!r}"
        )
    entry = registered_agents().get(name)
    if entry is None:
        known = sorted(_AGENTS)
        raise ValueError(
            f"unknown agent {name!r}{did_you_mean(name, known)}; registered agents: "
            f"{', '.join(known)}; {how_to_register(name)}"
        )
    config: Any = from_dict(entry.config, dict(params or {}), prefix="agent.")
    return entry.factory(config)
