"""The layout's rule, checked: each floor imports only the floors below it (README, Design)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "rlpar"

# floor -> the rlpar subpackages it must not import (the floors above it)
ABOVE = {
    "api": ("rlpar.runtime", "rlpar.app", "rlpar.bench"),
    "runtime": ("rlpar.app", "rlpar.bench"),
    "bench": ("rlpar.app",),
    "app": (),
}


def _floor(path: Path) -> str:
    if path.name == "__main__.py":
        return "app"  # `python -m rlpar` is the command line
    parts = path.relative_to(PACKAGE).parts
    return parts[0] if len(parts) > 1 and parts[0] in ("runtime", "app", "bench") else "api"


def _imports(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
            names += [f"{node.module}.{a.name}" for a in node.names]
    return names


@pytest.mark.parametrize(
    "path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT))
)
def test_no_module_imports_a_floor_above_its_own(path: Path) -> None:
    floor = _floor(path)
    if path.name == "__init__.py" and path.parent == PACKAGE:
        return  # the public API re-exports the runtime's Runner (a face onto it)
    for name in _imports(path):
        for above in ABOVE[floor]:
            assert not (name == above or name.startswith(above + ".")), (
                f"{path.relative_to(ROOT)} ({floor} floor) imports {name}"
            )


def test_the_public_init_imports_no_face() -> None:
    for name in _imports(PACKAGE / "__init__.py"):
        assert not name.startswith(("rlpar.app", "rlpar.bench")), name


@pytest.mark.parametrize(
    "path",
    sorted([*(ROOT / "native" / "include").rglob("*.h"), *(ROOT / "native" / "src").glob("*")]),
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_the_native_core_knows_nothing_of_python(path: Path) -> None:
    text = path.read_text()
    assert not re.search(r"#include\s*[<\"](pybind11/|Python\.h)", text), path
