"""The documents: every link and anchor resolves, every path a command names exists, every Python
block runs, and the documents speak about the software (not about how they were written).

A block right after a ``<!-- name -->`` marker shows a file as it is; tests/test_examples.py
checks those. Every other Python block of a page runs, in order, as one script, in a folder of
its own.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [ROOT / "README.md", *DOCS, ROOT / "experiments" / "RESULTS.md", ROOT / "CHANGELOG.md"]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```\n", re.S | re.M)
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def _name(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _prose(text: str) -> str:
    """``text`` without its fenced code blocks (a ``#`` there is a comment, not a heading)."""
    return FENCE.sub("", text)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in _prose(path.read_text()).splitlines():
        m = re.match(r"#{1,6} (.+)", line)
        if m:
            base = slug(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return out


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_every_link_and_anchor_resolves(page: Path) -> None:
    for target in LINK.findall(_prose(page.read_text())):
        if re.match(r"[a-z]+://", target):
            continue
        file, _, anchor = target.partition("#")
        dest = (page.parent / file).resolve() if file else page
        assert dest.exists(), f"{_name(page)} links to {target}, which does not exist"
        if anchor:
            assert anchor in anchors(dest), f"{_name(page)} links to {target}: no such heading"


@pytest.mark.parametrize("page", PAGES[:-1], ids=_name)  # a changelog may name what is gone
def test_every_path_a_page_names_exists(page: Path) -> None:
    named = r"\b((?:experiments|examples|tests|docs)/[\w./-]+\.(?:toml|py|sh|md))"
    for path in sorted(set(re.findall(named, page.read_text()))):
        if re.search(r"/[A-Z_]+\.\w+$", path) and not (ROOT / path).exists():
            continue  # a placeholder, as in experiments/CONFIG.toml
        assert (ROOT / path).exists(), f"{_name(page)} names {path}, which does not exist"


def test_the_readme_points_to_every_docs_page() -> None:
    links = set(LINK.findall((ROOT / "README.md").read_text()))
    for page in DOCS:
        assert f"docs/{page.name}" in links, f"the README's contents table lacks docs/{page.name}"


def test_the_quickstart_is_what_ci_runs() -> None:
    readme = (ROOT / "README.md").read_text()
    quickstart = re.search(r"## Quickstart\n\n```bash\n(.*?)```", readme, re.S)
    assert quickstart, "the README lost its quickstart"
    assert quickstart.group(1) == (
        "pip install . && rlpar train experiments/cartpole_impala.toml\n"
        'pip install ".[dev]" && pytest\n'
    )
    ci = (ROOT / ".ci" / "run").read_text()
    assert '\npip install -q ".[dev]"\npytest\n' in ci


def python_blocks(page: Path) -> list[str]:
    """The page's Python blocks that do not show a file (no ``<!-- name -->`` line above)."""
    text = page.read_text()
    blocks = []
    for m in FENCE.finditer(text):
        shown = text[: m.start()].rstrip().endswith("-->")
        if m.group(1) == "python" and not shown:
            blocks.append(m.group(2))
    return blocks


RUN = [p for p in [ROOT / "README.md", *DOCS] if python_blocks(p)]


@pytest.mark.parametrize("page", RUN, ids=_name)
def test_the_python_blocks_run(page: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # runs/ckpt and the like land here
    namespace: dict = {"__name__": "docs"}
    for i, block in enumerate(python_blocks(page)):
        exec(compile(block, f"{_name(page)}, python block {i + 1}", "exec"), namespace)


def test_the_documents_speak_about_the_software() -> None:
    """What the issue asked: no sessions, VM phases or people in the project's documents."""
    pattern = re.compile(
        r"\bsessions?\b|\bVM's (slow|fast|calm) phases?\b|\b(the lead|other engineers)\b", re.I
    )
    for page in PAGES:
        for n, line in enumerate(page.read_text().splitlines(), 1):
            assert not pattern.search(line), f"{_name(page)}:{n}: {line.strip()}"
