"""The command line of a child ``rlpar`` process that imports this process's rlpar.

``python -m rlpar`` (and ``python -c``) puts the working directory first on ``sys.path``: run
from a source checkout, a child started that way imports the checkout's ``rlpar/`` folder,
which has no compiled core, instead of the installed package. `rlpar_command` starts the
child without the working directory on its import path (as the ``rlpar`` command runs, and
``python -P``) and imports rlpar from the folder this process imported it from, so the child
runs exactly this rlpar whatever its working directory. Worker processes it starts with
"spawn" inherit that import path.
"""

from __future__ import annotations

import sys
from pathlib import Path

import rlpar

__all__ = ["rlpar_command", "rlpar_root"]

# Run by the child as ``python -c``: sys.path[0] is "" (the working directory) there, unless
# PYTHONSAFEPATH left it out.
_CHILD_MAIN = """\
import runpy, sys
if sys.path[:1] == [""]:
    del sys.path[0]
sys.path.insert(0, {root!r})
import rlpar
del sys.path[0]
runpy.run_module("rlpar", run_name="__main__", alter_sys=True)
"""


def rlpar_root() -> str:
    """The folder that holds the package directory of this process's rlpar (site-packages
    for an installed rlpar, the checkout for an editable one)."""
    return str(Path(rlpar.__file__).resolve().parent.parent)


def rlpar_command(*args: str) -> list[str]:
    """``python -m rlpar ARGS`` for `subprocess`, that imports this process's rlpar in the
    child whatever its working directory (and leaves the working directory off its import
    path, as the ``rlpar`` command does)."""
    return [sys.executable, "-c", _CHILD_MAIN.format(root=rlpar_root()), *args]
