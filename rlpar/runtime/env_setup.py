"""Importing the user's modules that a config names: an experiment file's ``plugins`` and the
``env.setup`` hook (`EnvConfig.setup`). A leaf that every env mode and worker process imports.

Where a module is looked for: on ``sys.path`` (the installed packages; the current directory
only where Python put it there, as ``python script.py`` and ``python -m`` do, but the ``rlpar``
command does not), then in the folders added with `add_import_folders`: loading an experiment
file adds its own folder, so a module beside the config file is found from any working
directory. They go to the end of ``sys.path``, so an installed package is never shadowed by a
file beside a config. Worker processes started with "spawn" (the "async" env modes) inherit
``sys.path``; a Ray worker gets the added folders from the Ray backend (`import_folders`).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType

__all__ = ["add_import_folders", "import_folders", "import_user_module", "run_setup"]

_ADDED: list[str] = []


def add_import_folders(folders: Iterable[str | Path]) -> None:
    """Search ``folders`` (absolute, or relative to the working directory) for the user's
    modules, after everything already on ``sys.path``."""
    for folder in folders:
        path = str(Path(folder).resolve())
        if path not in _ADDED:
            _ADDED.append(path)
        if path not in sys.path:
            sys.path.append(path)
    importlib.invalidate_caches()  # a folder's listing may be cached from before a file was added


def import_folders() -> list[str]:
    """The folders `add_import_folders` added in this process, in order."""
    return list(_ADDED)


def import_user_module(name: str, what: str) -> ModuleType:
    """Import module ``name`` for ``what`` (e.g. ``"env.setup"``); when no module has that name,
    a ValueError that says where it looked and how to make it findable."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name is not None and e.name != name and not name.startswith(e.name + "."):
            raise ValueError(f"{what}: importing {name!r} failed: {e}") from e  # one it imports
        raise ValueError(f"{what}: no module named {name!r}; {_where(name)}") from e
    except ImportError as e:
        raise ValueError(f"{what}: importing {name!r} failed: {e}") from e


def _where(name: str) -> str:
    file = name.replace(".", "/")
    folders = f"the experiment files' folders ({', '.join(_ADDED)}) and " if _ADDED else ""
    return (
        f"looked for {file}.py (or {file}/__init__.py) in {folders}the installed packages and "
        "folders on sys.path; put it beside the experiment file, install it, or add its folder "
        "to PYTHONPATH"
    )


def run_setup(setup: str | None) -> None:
    """Import "module" or call "module:function" (what `EnvConfig.setup` names); ValueError
    naming where it looked when the module is not found or has no such function."""
    if not setup:
        return
    module_name, _, function = setup.partition(":")
    module = import_user_module(module_name, f"env.setup {setup!r}")
    if function:
        fn = getattr(module, function, None)
        if not callable(fn):
            raise ValueError(
                f"env.setup {setup!r}: module {module_name!r} ({module.__file__}) has no "
                f"function {function!r}"
            )
        fn()
