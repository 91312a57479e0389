"""Tests import the installed rlpar (with its compiled `_native`), never the bare source tree.

`python -m pytest` puts the working directory first on sys.path, where `rlpar/` has no compiled
module; drop that entry so the installed package is the one imported.
"""

import sys
from pathlib import Path

import pytest

_ROOT = Path(__file__).resolve().parent.parent
if not any((_ROOT / "rlpar").glob("_native*.so")):
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _ROOT]


@pytest.fixture
def release_floor():
    """The GIL release threshold at its floor (70 kflop) for one test, then as it was: measured
    at import, it rises with the hand-off cost of a loaded machine (up to 16 Mflop), and a
    small step then keeps the GIL. For tests that count released calls."""
    from rlpar import _native

    before = _native.gil_release_threshold()
    _native.set_gil_release_threshold(70e3)
    yield
    _native.set_gil_release_threshold(before)
