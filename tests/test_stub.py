"""rlpar/_native.pyi names every public function and class of the compiled module."""

from __future__ import annotations

import ast
from pathlib import Path

from rlpar import _native

STUB = Path(__file__).resolve().parent.parent / "rlpar" / "_native.pyi"


def test_stub_matches_the_compiled_module() -> None:
    tree = ast.parse(STUB.read_text())
    stubbed = {
        node.name
        for node in tree.body
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and not node.name.startswith("_")
    }
    public = {name for name in dir(_native) if not name.startswith("_")}
    assert stubbed == public, f"missing: {public - stubbed}, stale: {stubbed - public}"
