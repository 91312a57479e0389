"""Tests import the installed rlpar (with its compiled `_native`), never the bare source tree.

`python -m pytest` puts the working directory first on sys.path, where `rlpar/` has no compiled
module; drop that entry so the installed package is the one imported.
"""

import sys
from pathlib import Path

_ROOT = Path(__file__).resolve().parent.parent
if not any((_ROOT / "rlpar").glob("_native*.so")):
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _ROOT]
