"""Reference documentation generated from the code: config keys (from the dataclasses' field
docstrings) and TensorBoard tags (from `rlpar.app.monitor`).

The config reference (``docs/config.md``) and the tag list (``docs/cli.md``) are this module's
output between marker comments; a test keeps them in sync. After changing a config field or a
tag, regenerate them with (-P: the installed rlpar, not the source tree)::

    python -P -m rlpar.app.reference docs/config.md docs/cli.md
"""

from __future__ import annotations

import ast
import builtins
import dataclasses
import inspect
import itertools
import json
import re
import sys
import textwrap
import types
import typing
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlpar.app.experiment import LogConfig, toml_value
from rlpar.config import EnvConfig, EvalConfig, RuntimeConfig
from rlpar.registry import registered_agents

__all__ = [
    "DOCUMENTS",
    "FieldDoc",
    "agent_reference",
    "config_reference",
    "describe",
    "field_docs",
    "format_agents",
    "render_sections",
    "sections_in",
    "tag_reference",
]


@dataclass(frozen=True)
class FieldDoc:
    """One config key: its name, type, default and meaning; ``table`` for a nested table."""

    name: str
    type: str
    default: Any
    doc: str
    table: builtins.type | None = None  # `type` is a field here


def field_docs(cls: type) -> dict[str, str]:
    """The docstring under each field of dataclass ``cls`` (PEP 257 attribute docstrings),
    including the fields it inherits (a subclass's docstring wins)."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__[:-1]):  # base classes first, object left out
        docs.update(_own_field_docs(klass))
    return docs


def _own_field_docs(cls: type) -> dict[str, str]:
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    body = ast.parse(source).body[0]
    docs = {}
    statements = getattr(body, "body", [])
    for stmt, after in itertools.pairwise(statements):
        if (
            isinstance(stmt, ast.AnnAssign)
            and isinstance(stmt.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            docs[stmt.target.id] = " ".join(inspect.cleandoc(after.value.value).split())
    return docs


def type_name(tp: Any) -> str:
    """A config type in words: ``int``, ``float or none``, ``list of int``, ``table``."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        names = [type_name(a) for a in args if a is not type(None)]
        return " or ".join(names + (["none"] if type(None) in args else []))
    if origin in (list, tuple):
        items = [a for a in typing.get_args(tp) if a is not Ellipsis]
        if origin is tuple and len(items) > 1 and Ellipsis not in typing.get_args(tp):
            return "[" + ", ".join(type_name(a) for a in items) + "]"
        return f"list of {type_name(items[0])}" if items else "list"
    if origin is dict or tp is dict or dataclasses.is_dataclass(tp):
        return "table"
    return {str: "string", bool: "bool", int: "int", float: "float"}.get(tp, str(tp))


def describe(cls: type) -> list[FieldDoc]:
    """Every key of config dataclass ``cls``, in declaration order."""
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    out = []
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = dataclasses.MISSING
        tp = hints[f.name]
        nested = tp if isinstance(tp, type) and dataclasses.is_dataclass(tp) else None
        out.append(FieldDoc(f.name, type_name(tp), default, docs.get(f.name, ""), nested))
    return out


def default_text(value: Any) -> str:
    if value is dataclasses.MISSING:
        return "(required)"
    if dataclasses.is_dataclass(value):
        return "(table)"
    return toml_value(value)


def _table_md(title: str, intro: str, rows: list[FieldDoc], prefix: str = "") -> list[str]:
    lines = [f"#### `{title}`", ""]
    if intro:
        lines += [intro, ""]
    lines += ["| key | type | default | meaning |", "|---|---|---|---|"]
    for r in rows:
        doc = r.doc + (f" See `[{prefix}{r.name}]`." if r.table else "")
        cells = [f"`{r.name}`", r.type, f"`{default_text(r.default)}`", doc]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return [*lines, ""]


def _first_line(obj: Any) -> str:
    return (inspect.getdoc(obj) or "").split("\n\n")[0].replace("\n", " ")


def config_reference() -> str:
    """Markdown: every key of every experiment-file section and of each built-in agent."""
    lines = [
        "#### `name`",
        "",
        "A string, default: the file's name without `.toml`. Names the run's folder "
        "`<log.logdir>/<name>/<timestamp>/`.",
        "",
        "#### `plugins`",
        "",
        "A list of module names, default `[]`. Imported in order before the rest of the file is "
        "checked, so that a module that calls `rlpar.register_agent` (or registers an env) makes "
        "its names valid in the same file. Looked for among the installed packages and in the "
        "folders of `plugin_path`.",
        "",
        "#### `plugin_path`",
        "",
        'A list of folders, default `["."]`: beside the experiment file (relative paths are the '
        "file's). Searched for the modules of `plugins` and `env.setup`; a run directory's "
        "`config.toml` holds them as absolute paths, so it finds the same modules.",
        "",
    ]
    sections = (
        ("env", EnvConfig),
        ("runtime", RuntimeConfig),
        ("eval", EvalConfig),
        ("log", LogConfig),
    )
    for section, cls in sections:
        lines += _table_md(f"[{section}]", _first_line(cls), describe(cls))
    nested: dict[type, tuple[str, list[str]]] = {}  # config class -> (key, agents using it)
    for name, entry in registered_agents().items():
        if entry.source != "built-in":  # the reference documents what rlpar ships
            continue
        rows = describe(entry.config)
        intro = (
            f'`name = "{name}"` ({entry.source}): {_first_line(entry.factory)} '
            f"The table also takes these keys:"
        )
        lines += _table_md(f'[agent] name = "{name}"', intro, rows, prefix="agent.")
        for r in rows:
            if r.table is not None:
                nested.setdefault(r.table, (r.name, []))[1].append(name)
    for table, (key, users) in nested.items():
        intro = f"{_first_line(table)} In {', '.join(users)}."
        lines += _table_md(f"[agent.{key}]", intro, describe(table))
    return "\n".join(lines).rstrip() + "\n"


def flat_keys(cls: type, prefix: str = "") -> list[FieldDoc]:
    """Every key of ``cls`` with nested tables spelled out: ``net.hidden``, ``optim.lr``."""
    out = []
    for r in describe(cls):
        if r.table is not None:
            out += flat_keys(r.table, f"{prefix}{r.name}.")
        else:
            out.append(dataclasses.replace(r, name=prefix + r.name))
    return out


def agent_reference() -> dict[str, dict[str, Any]]:
    """Each registered agent: source, class, summary and config keys (plain JSON data)."""
    out = {}
    for name, entry in registered_agents().items():
        factory = entry.factory
        keys = {
            r.name: {
                "type": r.type,
                "default": None
                if r.default is dataclasses.MISSING
                else json.loads(json.dumps(r.default, default=repr)),
                "required": r.default is dataclasses.MISSING,
                "doc": r.doc,
            }
            for r in flat_keys(entry.config)
        }
        out[name] = {
            "source": entry.source,
            "class": f"{factory.__module__}.{getattr(factory, '__qualname__', factory)}",
            "config_class": f"{entry.config.__module__}.{entry.config.__qualname__}",
            "doc": _first_line(factory),
            "keys": keys,
        }
    return out


def format_agents(agents: dict[str, dict[str, Any]]) -> str:
    """`agent_reference` as text: one block per agent, one line per config key."""
    blocks = []
    for name, a in agents.items():
        rows = [
            (key, k["type"], "(required)" if k["required"] else toml_value(k["default"]), k["doc"])
            for key, k in a["keys"].items()
        ]
        widths = [max((len(r[i]) for r in rows), default=0) for i in range(3)]
        lines = [f"{name}  ({a['source']}: {a['class']})"]
        if a["doc"]:
            lines.append(f"  {a['doc']}")
        lines.append(f"  [agent] keys (name = {toml_value(name)}):")
        for r in rows:
            cols = "  ".join(c.ljust(w) for c, w in zip(r[:3], widths, strict=True))
            lines.append(f"    {cols}  {r[3]}".rstrip())
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def tag_reference() -> str:
    """Markdown: every TensorBoard tag rlpar writes and what it tells."""
    from rlpar.app.monitor import OTHER_TAGS, SCALAR_TAGS

    lines = ["| tag | what it tells |", "|---|---|"]
    for tag, meaning in {**SCALAR_TAGS, **OTHER_TAGS}.items():
        lines.append(f"| `{tag}` | {meaning.replace('|', chr(92) + '|')} |")
    return "\n".join(lines) + "\n"


SECTIONS = {"config-reference": config_reference, "tensorboard-tags": tag_reference}

#: Where each generated section lives: document (relative to the repository root) -> sections.
DOCUMENTS = {"docs/config.md": ("config-reference",), "docs/cli.md": ("tensorboard-tags",)}


def _marker(name: str) -> re.Pattern[str]:
    return re.compile(rf"(<!-- {name}:begin -->\n).*?(<!-- {name}:end -->)", re.S)


def sections_in(text: str) -> list[str]:
    """The generated sections whose ``<!-- NAME:begin/end -->`` markers ``text`` holds."""
    return [name for name in SECTIONS if _marker(name).search(text)]


def render_sections(text: str, names: Iterable[str]) -> str:
    """``text`` with each named generated section (between ``<!-- NAME:begin -->`` and
    ``<!-- NAME:end -->``) replaced by what the code says now. A name without its markers in
    ``text`` is a ValueError."""
    for name in names:
        pattern = _marker(name)
        if not pattern.search(text):
            raise ValueError(f"no <!-- {name}:begin/end --> markers")

        def replace(m: re.Match[str], body: str = SECTIONS[name]()) -> str:
            return m.group(1) + "\n" + body + "\n" + m.group(2)

        text = pattern.sub(replace, text)
    return text


def main(argv: list[str]) -> int:
    """Regenerate the sections of each document named in ``argv`` (each must hold one)."""
    if not argv:
        print(f"usage: python -m rlpar.app.reference {' '.join(DOCUMENTS)}", file=sys.stderr)
        return 2
    for arg in argv:
        path = Path(arg)
        text = path.read_text(encoding="utf-8")
        names = sections_in(text)
        if not names:
            markers = ", ".join(f"<!-- {n}:begin/end -->" for n in SECTIONS)
            print(f"{path}: holds none of the generated sections ({markers})", file=sys.stderr)
            return 1
        path.write_text(render_sections(text, names), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
