"""The layout's rules, checked.

1. Each floor imports only the floors below it (docs/design.md): app -> bench -> runtime -> API.
2. No import cycle among the project's modules: rlpar/, agents/ (shipped as ``rlpar.agents``),
   envs/ (``rlpar.envs``) and examples/. Every import that can run counts, function-local
   (lazy) ones included: a lazy import back up only hides a cycle until the function runs.
   Only imports under ``if TYPE_CHECKING:`` are left out (they never run). Importing
   ``a.b.c`` also runs the packages ``a.b`` and ``a`` unless the importer is inside them.
3. No module imports another project module's ``_private`` name (``from m import _x``,
   ``m._x``, ``import m._x``): a helper two modules share is a public name of a leaf module.
   Other libraries' privates (``argparse._SubParsersAction`` in a type hint) are not judged.
   Private *modules* of a package are its internals: rlpar's own (``rlpar._native``, the
   compiled bindings, and ``rlpar._checks``) may be imported by any module shipped inside the
   rlpar package (agents/ and envs/ included), never by examples/. The ``_`` names inside
   ``rlpar._native`` are the bindings' own: only rlpar's API floor (``rlpar/*.py``) may touch
   them. tests/ is not checked: a test may reach into its helpers' privates.
4. No module reaches into another module's private members: an attribute ``x._name`` read or
   written where ``x`` is not the object itself (``self``, ``cls``, ``super()``,
   ``type(self)``) must name something the same module defines (a def, a class, an assigned
   name or attribute). One piece asks another through public methods and properties, or
   gets what it needs as an argument. A module bound by an import is rule 3's; other
   libraries' modules are not judged. The same folders as rule 3; tests/ is not checked.
"""

from __future__ import annotations

import ast
import itertools
import re
import subprocess
import sys
import typing
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


# ---------------------------------------------------------------- import cycles, private names

# source folder -> the package its modules are imported as
SOURCES = {
    ROOT / "rlpar": "rlpar",
    ROOT / "agents": "rlpar.agents",
    ROOT / "envs": "rlpar.envs",
    ROOT / "examples": "examples",
}
COMPILED = ("rlpar._native",)  # first-party modules without a .py file
FIRST_PARTY = {"rlpar", "examples"}  # whose private names the rules below guard


def _module_name(path: Path) -> str:
    for folder, package in SOURCES.items():
        if path.is_relative_to(folder):
            parts = [*package.split("."), *path.relative_to(folder).with_suffix("").parts]
            return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
    raise ValueError(f"{path} is in none of {list(SOURCES)}")


MODULES = {_module_name(p): p for folder in SOURCES for p in sorted(folder.rglob("*.py"))}
KNOWN = set(MODULES) | set(COMPILED)


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _is_package(module: str) -> bool:
    return module in MODULES and MODULES[module].name == "__init__.py"


class _Import(typing.NamedTuple):
    target: str  # the module that runs
    name: str | None  # the name taken from it (``from target import name``), if not a module
    line: int


def _runtime_imports(module: str) -> tuple[list[_Import], dict[str, str]]:
    """Every import of ``module`` that can run (not under ``if TYPE_CHECKING:``), and the local
    names bound to modules (``alias -> module``)."""
    package = module if _is_package(module) else module.rpartition(".")[0]
    found: list[_Import] = []
    aliases: dict[str, str] = {}

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            for a in node.names:
                found.append(_Import(a.name, None, node.lineno))
                if a.asname:
                    aliases[a.asname] = a.name
                else:  # `import a.b` binds `a`
                    aliases[a.name.partition(".")[0]] = a.name.partition(".")[0]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            for a in node.names:
                sub = f"{base}.{a.name}"
                if sub in KNOWN:  # `from package import module`
                    found.append(_Import(sub, None, node.lineno))
                    aliases[a.asname or a.name] = sub
                else:
                    found.append(_Import(base, a.name, node.lineno))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(MODULES[module].read_text()))
    return found, aliases


def _edges(module: str) -> dict[str, int]:
    """First-party module -> line of the first import in ``module`` that runs it."""
    out: dict[str, int] = {}
    for imp in _runtime_imports(module)[0]:
        parts = imp.target.split(".")
        for i in range(1, len(parts) + 1):
            target = ".".join(parts[:i])
            # a package above the importer already runs; one named outright is still an edge
            named = i == len(parts)
            if target in MODULES and target != module:
                if named or not module.startswith(target + "."):
                    out.setdefault(target, imp.line)
    return out


def _cycles() -> list[list[str]]:
    """A shortest cycle through each module on one (a module already shown is not a start)."""
    graph = {m: _edges(m) for m in MODULES}
    shown: set[str] = set()
    cycles = []
    for start in sorted(graph):
        cycle = None if start in shown else _shortest_cycle(graph, start)
        if cycle:
            cycles.append(cycle)
            shown.update(cycle)
    return cycles


def _shortest_cycle(graph: dict[str, dict[str, int]], start: str) -> list[str] | None:
    came_from: dict[str, str | None] = {start: None}
    queue = [start]
    for module in queue:  # breadth first: the queue grows while it is read
        for target in graph[module]:
            if target == start:
                path = [module]
                while (before := came_from[path[-1]]) is not None:
                    path.append(before)
                return [*reversed(path), start]
            if target not in came_from:
                came_from[target] = module
                queue.append(target)
    return None


def _describe(cycle: list[str]) -> str:
    steps = [f"{a} (line {_edges(a)[b]})" for a, b in itertools.pairwise(cycle)]
    return " -> ".join([*steps, cycle[-1]])


def test_no_import_cycles() -> None:
    cycles = _cycles()
    assert not cycles, "import cycles (lazy imports count):\n" + "\n".join(map(_describe, cycles))


def _allowed_private_module(importer: str, module: str) -> bool:
    """``module`` (some segment private) may be imported from ``importer``: it is a private
    module of a package that contains ``importer``."""
    parts = module.split(".")
    for i, part in enumerate(parts):
        if _is_private(part):
            owner = ".".join(parts[:i])
            if not (importer == owner or importer.startswith(owner + ".")):
                return False
    return True


def _api_floor(module: str) -> bool:
    return module in MODULES and MODULES[module].parent == PACKAGE


def _private_uses(module: str) -> list[str]:
    imports, aliases = _runtime_imports(module)
    bad = []
    for imp in [i for i in imports if i.target.partition(".")[0] in FIRST_PARTY]:
        if not _allowed_private_module(module, imp.target):
            bad.append(f"line {imp.line}: imports private module {imp.target}")
        if imp.name is not None and _is_private(imp.name):
            if not (imp.target in COMPILED and _api_floor(module)):
                bad.append(f"line {imp.line}: from {imp.target} import {imp.name}")
    for node in ast.walk(ast.parse(MODULES[module].read_text())):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in aliases
            and aliases[node.value.id].partition(".")[0] in FIRST_PARTY
            and _is_private(node.attr)
        ):
            target = aliases[node.value.id]
            if not (target in COMPILED and _api_floor(module)):
                bad.append(f"line {node.lineno}: {node.value.id}.{node.attr} ({target})")
    return bad


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_module_imports_another_modules_private_name(module: str) -> None:
    bad = _private_uses(module)
    assert not bad, f"{MODULES[module].relative_to(ROOT)}: " + "; ".join(bad)


def test_the_checks_see_cycles_and_private_names(tmp_path: Path, monkeypatch) -> None:
    """The checks above, on a made-up package: they must fail where they should."""
    files = {
        "a.py": "def f():\n    from rlpar.fake.b import g  # lazy, still a cycle\n",
        "b.py": "from rlpar.fake import a\nfrom rlpar.fake.c import _helper\n",
        "c.py": "import rlpar.fake.b as b\n_helper = 1\nx = b._hidden\n",
    }
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    fake = {f"rlpar.fake.{Path(n).stem}": tmp_path / n for n in files}
    monkeypatch.setattr(sys.modules[__name__], "MODULES", {**MODULES, **fake})
    monkeypatch.setattr(sys.modules[__name__], "KNOWN", KNOWN | set(fake))
    cycles = {frozenset(c) for c in _cycles()}
    assert frozenset({"rlpar.fake.a", "rlpar.fake.b"}) in cycles
    assert _private_uses("rlpar.fake.b") == ["line 2: from rlpar.fake.c import _helper"]
    assert _private_uses("rlpar.fake.c") == ["line 3: b._hidden (rlpar.fake.b)"]


def _defined_names(tree: ast.AST) -> set[str]:
    """Every name a module defines: defs, classes, assigned names and assigned attributes."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
    return names


def _is_itself(node: ast.expr) -> bool:
    """``self``, ``cls``, ``super()`` or ``type(self)``: the object reaching into itself."""
    if isinstance(node, ast.Name):
        return node.id in ("self", "cls")
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        return node.func.id == "super" or (
            node.func.id == "type" and len(node.args) == 1 and _is_itself(node.args[0])
        )
    return False


def _foreign_private_members(module: str) -> list[str]:
    tree = ast.parse(MODULES[module].read_text())
    modules = _runtime_imports(module)[1]  # local names bound to modules: rule 3's
    own = _defined_names(tree)
    bad = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and _is_private(node.attr)
            and node.attr not in own
            and not _is_itself(node.value)
            and not (isinstance(node.value, ast.Name) and node.value.id in modules)
        ):
            bad.append(f"line {node.lineno}: {ast.unparse(node)}")
    return bad


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_module_reaches_into_another_modules_private_members(module: str) -> None:
    bad = _foreign_private_members(module)
    assert not bad, f"{MODULES[module].relative_to(ROOT)}: " + "; ".join(bad)


def test_the_check_sees_private_members_reached_into(tmp_path: Path, monkeypatch) -> None:
    """Rule 4 on a made-up module: another object's private member is reported; the object's
    own, and a name the module defines, are not."""
    text = (
        "class A:\n"
        "    def __init__(self, other):\n"
        "        self._mine = other._theirs\n"
        "        super()._base()\n"
        "        type(self)._kind\n"
        "        other._mine = 1\n"
        "        other.state._hidden()\n"
    )
    (tmp_path / "d.py").write_text(text)
    monkeypatch.setattr(
        sys.modules[__name__], "MODULES", {**MODULES, "rlpar.fake.d": tmp_path / "d.py"}
    )
    assert _foreign_private_members("rlpar.fake.d") == [
        "line 3: other._theirs",
        "line 7: other.state._hidden",
    ]


def test_rlpar_train_imports_no_benchmark_code(tmp_path: Path) -> None:
    """The command line imports a benchmark only to run it: ``rlpar train`` (its help, and a
    run that gets as far as reading the experiment file) imports no benchmark module, only the
    catalogue that names them."""
    code = (
        "import sys\n"
        "from rlpar.app.cli import main\n"
        "assert main(['train', '--help']) == 0\n"
        "assert main(['train', 'missing.toml']) == 2\n"
        "print(sorted(m for m in sys.modules if m.startswith('rlpar.bench')))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "['rlpar.bench', 'rlpar.bench.catalogue']"
    assert "no such experiment file" in proc.stderr
