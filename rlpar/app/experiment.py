"""Experiment files: one TOML file says which env, which agent with which hyper-parameters, how
the runtime runs and where the run's files go::

    name = "cartpole_impala"   # runs go to <log.logdir>/<name>/<timestamp>/
    plugins = ["my_agent"]     # optional: modules to import first (they register agents, envs)
    [env]                      # EnvConfig
    [agent]                    # name = "impala" and that agent's config keys;
    [agent.optim]              #   its nested tables ([agent.optim], [agent.net])
    [runtime]                  # RuntimeConfig
    [eval]                     # EvalConfig: how the trained policy is evaluated
    [log]                      # LogConfig

`load_experiment(path, overrides)` reads a file, applies ``--set`` overrides
(``"runtime.seed=3"``: the value is read as a TOML value, else taken as a string), imports the
``plugins`` and checks every key against the typed dataclasses: an unknown key is an error
naming it with a "did you mean", a wrong type or range names the key, what was expected and
the value given, and whether the file or a ``--set`` override said it.

Plug-ins: ``plugins`` lists modules to import before the rest is checked, so that a module
that calls `rlpar.register_agent` (or registers an env) makes its names valid in the same file.
The modules, and the ``env.setup`` hook's, are looked for among the installed packages and in
the folders of ``plugin_path`` (relative to the file; default ``["."]``: beside the experiment
file), see `rlpar.runtime.env_setup`. A file that names plugins or an ``env.setup`` has those
folders, made absolute, in its resolved config as ``plugin_path``, so a run directory's
``config.toml`` finds the same modules. `experiment_from_dict` (data, e.g. a checkpoint's
config) imports nothing. TOML has no
null, so an optional key is unset with the string ``"none"``. `Experiment.to_dict` is the
resolved config (every default filled in); `to_toml` writes it as a file that loads back to
the same experiment.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import re
import sys
import types
import typing
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlpar._checks import did_you_mean
from rlpar.agent import Agent
from rlpar.config import (
    ConfigError,
    EnvConfig,
    EvalConfig,
    RuntimeConfig,
    UnknownKey,
    UnknownKeysError,
    check_env_layout,
    check_field_types,
    from_dict,
    to_dict,
    unknown_keys,
)
from rlpar.registry import how_to_register, registered_agents
from rlpar.runtime.env_setup import add_import_folders, import_user_module

if sys.version_info >= (3, 11):
    import tomllib
else:  # the same parser, from PyPI
    import tomli as tomllib

__all__ = [
    "Experiment",
    "LogConfig",
    "apply_overrides",
    "experiment_from_dict",
    "import_given_plugins",
    "import_plugins",
    "import_run_plugins",
    "load_experiment",
    "parse_override",
    "read_toml",
    "to_toml",
]

SECTIONS = ("name", "plugins", "plugin_path", "env", "agent", "runtime", "eval", "log")
NONE = "none"
_SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


@dataclass(frozen=True)
class LogConfig:
    """Where a run's files go and how often it reports."""

    logdir: str = "runs"
    """Runs go to `<logdir>/<name>/<timestamp>/` (the `--logdir` option overrides this)."""
    scalar_points: int = 1000
    """Write the TensorBoard scalars about this many times over `runtime.total_env_steps`
    (every total / scalar_points env steps), so even a run of seconds draws a detailed curve."""
    scalar_interval_s: float = 10.0
    """Also write them when this many seconds have passed since the last time, so a slow run
    still updates live."""
    log_interval_s: float = 5.0
    """Off a TTY, log one progress line this often (seconds)."""
    histogram_interval: int = 1000
    """Learner steps between histograms of the parameters and of the actions (0: none)."""
    keep_checkpoints: int = 3
    """How many of the newest checkpoints the run keeps in its `checkpoints/` folder."""

    def __post_init__(self) -> None:
        check_field_types(self)
        if not self.logdir:
            raise ConfigError(f"logdir: expected a directory, got {self.logdir!r}")
        for key in ("scalar_interval_s", "log_interval_s"):
            if not getattr(self, key) > 0:
                raise ConfigError(f"{key}: expected a number > 0, got {getattr(self, key)!r}")
        if self.scalar_points < 1:
            raise ConfigError(f"scalar_points: expected an integer >= 1, got {self.scalar_points}")
        if self.histogram_interval < 0:
            raise ConfigError(
                f"histogram_interval: expected an integer >= 0, got {self.histogram_interval}"
            )
        if self.keep_checkpoints < 1:
            raise ConfigError(
                f"keep_checkpoints: expected an integer >= 1, got {self.keep_checkpoints}"
            )


@dataclass(frozen=True)
class Experiment:
    """A whole run's configuration, validated: what an experiment file resolves to."""

    name: str
    env: EnvConfig
    agent_name: str
    agent: Any
    """An instance of the registered agent's config dataclass."""
    runtime: RuntimeConfig
    log: LogConfig
    eval: EvalConfig = dataclasses.field(default_factory=EvalConfig)
    plugins: tuple[str, ...] = ()
    """Modules imported before the file was checked (they register agents or envs)."""
    plugin_path: tuple[str, ...] = ()
    """Folders searched for the plugins' and ``env.setup``'s modules (absolute once loaded)."""

    def make_agent(self) -> Agent:
        return registered_agents()[self.agent_name].factory(self.agent)

    def to_dict(self) -> dict[str, Any]:
        """The resolved config as plain data (what run directories and checkpoints keep);
        ``plugins`` and ``plugin_path`` only where they are set."""
        found = {"plugins": list(self.plugins), "plugin_path": list(self.plugin_path)}
        return {
            "name": self.name,
            **{key: value for key, value in found.items() if value},
            "env": to_dict(self.env),
            "agent": {"name": self.agent_name, **to_dict(self.agent)},
            "runtime": to_dict(self.runtime),
            "eval": to_dict(self.eval),
            "log": to_dict(self.log),
        }


def load_experiment(path: str | Path, overrides: Iterable[str] = ()) -> Experiment:
    """Read the experiment file ``path``, apply ``--set`` overrides, import its ``plugins``
    (looked for beside the file first), validate.

    Raises `ConfigError` for anything wrong, including a TOML syntax error, a missing file or
    a plugin that cannot be imported: the message starts with the file's name, or with
    ``--set KEY=VALUE`` when an override is what is wrong.
    """
    path = Path(path)
    file_data = read_toml(path, str(path), "no such experiment file")
    overrides = list(overrides)
    data = apply_overrides(file_data, overrides)
    try:
        return _checked(data, path)
    except ConfigError as e:
        raise ConfigError(_blame(path, file_data, overrides, e)) from None


def read_toml(path: Path, where: str, missing: str) -> dict[str, Any]:
    """The TOML file ``path`` as a dict; `ConfigError` starting with ``where`` when it is
    missing (``missing`` says so), unreadable or not valid TOML."""
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{where}: {missing}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{where}: cannot read: {e}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{where}: not valid TOML: {e}") from None


def import_plugins(path: str | Path) -> tuple[str, ...]:
    """Import the ``plugins`` the experiment file ``path`` names, as `load_experiment` does
    (the rest of the file is not checked); returns their names. Raises `ConfigError` naming
    the file when it cannot be read or a plugin cannot be imported."""
    path = Path(path)
    data = read_toml(path, str(path), "no such experiment file")
    try:
        return tuple(_import_plugins(data, path.resolve().parent).get("plugins", ()))
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None


def import_run_plugins(run_file: Path, config: Any) -> None:
    """For a run rebuilt from a checkpoint: import the plugins of the run's own experiment
    file ``run_file`` (a run directory's config.toml) when the agent that ``config`` (the
    checkpoint's) names is not registered without them."""
    agent = config.get("agent") if isinstance(config, dict) else None
    name = agent.get("name") if isinstance(agent, dict) else None
    if isinstance(name, str) and name not in registered_agents():
        import_plugins(run_file)


def import_given_plugins(overrides: Iterable[str], folder: Path) -> tuple[str, ...]:
    """For a run rebuilt from a checkpoint: import the ``plugins`` that the user's ``--set``
    ``overrides`` name (a checkpoint's own list is data and imports nothing), looked for in
    ``--set plugin_path=[...]`` (relative to ``folder``) or else in ``folder`` (the working
    directory), which also serve a ``--set env.setup`` module. Returns the plugins imported;
    `ConfigError` naming the ``--set`` key when one cannot be imported."""
    keys = ("plugins", "plugin_path", "env")
    given = apply_overrides({}, [t for t in overrides if parse_override(t)[0][0] in keys])
    try:
        return tuple(_import_plugins(given, folder).get("plugins", ()))
    except ConfigError as e:
        raise ConfigError(f"--set {e}") from None


def _checked(data: dict[str, Any], path: Path) -> Experiment:
    return experiment_from_dict(_import_plugins(data, path.resolve().parent), path.stem)


def _import_plugins(data: dict[str, Any], folder: Path) -> dict[str, Any]:
    """Import ``data``'s plugins with its ``plugin_path`` (default: ``folder``, the file's; its
    entries are relative to ``folder``) on the search path; returns ``data`` with
    ``plugin_path`` made absolute, where plugins or an ``env.setup`` are named."""
    plugins = _names(data, "plugins", "module names", _MODULE)
    path = _names(data, "plugin_path", "folders")
    env = data.get("env")
    setup = env.get("setup") if isinstance(env, dict) else None
    if not plugins and setup in (None, "", NONE):
        return data
    folders = list(dict.fromkeys(str((folder / p).resolve()) for p in path or ["."]))
    add_import_folders(folders)
    for module in plugins:
        try:
            import_user_module(module, "plugins")
        except ValueError as e:
            raise ConfigError(str(e)) from None
    return {**data, "plugin_path": folders}


def _names(
    data: dict[str, Any], key: str, what: str, pattern: re.Pattern[str] | None = None
) -> list[str]:
    value = data.get(key, [])
    ok = isinstance(value, list) and all(isinstance(v, str) and v for v in value)
    if ok and pattern is not None:
        ok = all(pattern.fullmatch(v) for v in value)
    if not ok:
        example = '["my_agent"]' if pattern is not None else '["../shared"]'
        raise ConfigError(
            f"{key}: expected a list of {what} (e.g. {key} = {example}), got {value!r}"
        )
    return value


def _blame(path: Path, file_data: dict, overrides: list[str], error: ConfigError) -> str:
    """``error``'s message, prefixed by what said the wrong thing: the first ``--set`` override
    after which the config fails with this message, else the file."""
    message = str(error)
    if isinstance(error, UnknownKeysError) and len(error.problems) > 1:
        given = {".".join(parse_override(text)[0]): f"--set {text}" for text in overrides}
        return f"{path}: {UnknownKeysError(error.problems, given)}"
    if overrides and _error_of(file_data, path) != message:
        for i, text in enumerate(overrides):
            if _error_of(apply_overrides(file_data, overrides[: i + 1]), path) == message:
                return f"--set {text}: {message}"
    return f"{path}: {message}"


def _error_of(data: dict[str, Any], path: Path) -> str | None:
    """The message that loading ``data`` as the file ``path`` fails with, or None."""
    try:
        _checked(data, path)
    except ConfigError as e:
        return str(e)
    return None


def experiment_from_dict(data: dict[str, Any], default_name: str = "experiment") -> Experiment:
    """Validate plain data (a parsed experiment file, or a checkpoint's config). Every unknown
    key is named in one `UnknownKeysError`."""
    unknown = _unknown_keys(data)
    if unknown:
        raise UnknownKeysError(unknown)
    name = data.get("name", default_name)
    if not isinstance(name, str) or not _SAFE_NAME.fullmatch(name):
        raise ConfigError(
            f"name: expected a name usable as a folder (letters, digits, '.', '_', '-'), "
            f"got {name!r}"
        )
    agent_table = dict(_table(data, "agent"))
    agent_name = agent_table.pop("name", None)
    agents = registered_agents()
    if agent_name not in agents:
        if agent_name is None:
            raise ConfigError(f"agent.name: required; registered agents: {', '.join(agents)}")
        raise ConfigError(
            f"agent.name: unknown agent {agent_name!r}{did_you_mean(agent_name, agents)}; "
            f"registered agents: {', '.join(agents)}; {_how_to_plug_in(agent_name, data)}"
        )
    agent_cls = agents[agent_name].config
    env, runtime = _section(EnvConfig, data, "env"), _section(RuntimeConfig, data, "runtime")
    check_env_layout(env, runtime)
    return Experiment(
        name=name,
        env=env,
        agent_name=agent_name,
        agent=from_dict(agent_cls, _nones(agent_cls, agent_table), prefix="agent."),
        runtime=runtime,
        log=_section(LogConfig, data, "log"),
        eval=_section(EvalConfig, data, "eval"),
        plugins=tuple(_names(data, "plugins", "module names", _MODULE)),
        plugin_path=tuple(_names(data, "plugin_path", "folders")),
    )


def _how_to_plug_in(name: str, data: dict[str, Any]) -> str:
    plugins = data.get("plugins")
    named = f"; this file's plugins: {', '.join(map(str, plugins))}" if plugins else ""
    where = (
        'in a module the experiment file names, plugins = ["my_agent"] for my_agent.py '
        f"beside the file{named}"
    )
    return how_to_register(name, where)


def _section(cls: type, data: dict[str, Any], key: str) -> Any:
    return from_dict(cls, _nones(cls, _table(data, key)), prefix=f"{key}.")


def _table(data: dict[str, Any], key: str) -> dict[str, Any]:
    value = data.get(key, {})
    if not isinstance(value, dict):
        raise ConfigError(f"{key}: expected a table ([{key}]), got {value!r}")
    return value


def _unknown_keys(data: dict[str, Any]) -> list[UnknownKey]:
    """Every unknown key of ``data``: of the top level and of each section's table (the
    agent's only when its name is registered: else the name is what is wrong)."""
    agent_table = data.get("agent")
    agent_name = agent_table.get("name") if isinstance(agent_table, dict) else None
    entry = registered_agents().get(agent_name) if isinstance(agent_name, str) else None
    sections: dict[str, type] = {
        "env": EnvConfig,
        "runtime": RuntimeConfig,
        "eval": EvalConfig,
        "log": LogConfig,
    }
    if entry is not None:
        sections["agent"] = entry.config
    found = [_unknown_section(key, sections) for key in data if key not in SECTIONS]
    for section, table in data.items():  # in the file's order
        cls = sections.get(section)
        if cls is not None and isinstance(table, dict):
            keys = {k: v for k, v in table.items() if not (section == "agent" and k == "name")}
            found += unknown_keys(cls, keys, prefix=f"{section}.")
    return found


def _unknown_section(key: str, sections: dict[str, type]) -> UnknownKey:
    """A top-level ``key`` that is no section; a key of a section (``seed``) is answered with
    its full name (``runtime.seed``)."""
    owners = [s for s, cls in sections.items() if key in {f.name for f in dataclasses.fields(cls)}]
    if owners:
        full = " or ".join(f"'{s}.{key}'" for s in owners)
        hint = (
            f": it belongs to a section, did you mean {full}? "
            f"(on the command line: --set {owners[0]}.{key}=...)"
        )
        return UnknownKey(key, hint, ())
    return UnknownKey(key, did_you_mean(key, SECTIONS), SECTIONS)


def _accepts_none(tp: Any) -> bool:
    origin = typing.get_origin(tp)
    return origin in (typing.Union, types.UnionType) and type(None) in typing.get_args(tp)


def _nones(cls: Any, table: dict[str, Any]) -> dict[str, Any]:
    """``table`` with ``"none"`` replaced by None where ``cls``'s field is optional (TOML has no
    null), recursively into nested config tables."""
    hints = typing.get_type_hints(cls)
    out = dict(table)
    for key, value in table.items():
        tp = hints.get(key)
        if tp is None:
            continue
        if value == NONE and _accepts_none(tp):
            out[key] = None
        elif isinstance(value, dict) and dataclasses.is_dataclass(tp):
            out[key] = _nones(tp, value)
    return out


# --------------------------------------------------------------------------------- overrides


def parse_override(text: str) -> tuple[list[str], Any]:
    """``"section.key=value"`` -> (``["section", "key"]``, value).

    The value is read as a TOML value (``3``, ``0.5``, ``true``, ``[64, 64]``, ``"x"``); what
    TOML cannot read is taken as a string (``CartPole-v1``, ``none``).
    """
    key, sep, raw = text.partition("=")
    path = key.strip().split(".")
    if not sep or not all(re.fullmatch(r"[A-Za-z0-9_-]+", p) for p in path):
        raise ConfigError(f"--set {text!r}: expected section.key=value, e.g. runtime.seed=3")
    raw = raw.strip()
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return path, value


def apply_overrides(data: dict[str, Any], overrides: Iterable[str]) -> dict[str, Any]:
    """A copy of ``data`` with each ``section.key=value`` override set (keys are checked later,
    by `experiment_from_dict`)."""
    out = copy.deepcopy(data)
    for text in overrides:
        path, value = parse_override(text)
        table = out
        for i, part in enumerate(path[:-1]):
            table = table.setdefault(part, {})
            if not isinstance(table, dict):
                inner = ".".join(path[: i + 1])
                raise ConfigError(f"--set {text!r}: '{inner}' is a value, not a table")
        table[path[-1]] = value
    return out


# ------------------------------------------------------------------------------ TOML writing


def to_toml(data: dict[str, Any]) -> str:
    """A TOML document for plain config data (None is written as ``"none"``)."""
    lines: list[str] = []
    _emit(lines, data, [])
    return "\n".join(lines).lstrip("\n") + "\n"


def _emit(lines: list[str], table: dict[str, Any], path: list[str]) -> None:
    values = {k: v for k, v in table.items() if not (isinstance(v, dict) and v)}
    tables = {k: v for k, v in table.items() if isinstance(v, dict) and v}
    if path and (values or not tables):
        lines += ["", f"[{'.'.join(_toml_key(p) for p in path)}]"]
    lines += [f"{_toml_key(k)} = {toml_value(v)}" for k, v in values.items()]
    for key, sub in tables.items():
        _emit(lines, sub, [*path, key])


def _toml_key(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else toml_value(key)


def toml_value(value: Any) -> str:
    """One value as a TOML literal (None as ``"none"``)."""
    if value is None:
        return f'"{NONE}"'
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return f"{value:_}" if abs(value) >= 10_000 else str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        items = ", ".join(f"{_toml_key(str(k))} = {toml_value(v)}" for k, v in value.items())
        return "{ " + items + " }" if items else "{}"
    raise TypeError(f"cannot write {value!r} ({type(value).__name__}) as TOML")
