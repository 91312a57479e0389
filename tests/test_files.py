"""rlpar.files: a file appears whole at its path or the old one stays, and no temporary file
is left behind, whatever the writer does."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rlpar.files import atomic_path, temp_name_pattern, write_atomically


def test_a_write_replaces_the_file_and_leaves_no_temporary_file(tmp_path: Path) -> None:
    out = tmp_path / "summary.json"
    out.write_text("old")
    write_atomically(out, "new ✓")
    assert out.read_text(encoding="utf-8") == "new ✓"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.json"]


@pytest.mark.parametrize("durable", [False, True])
def test_a_writer_that_raises_leaves_the_old_file(tmp_path: Path, durable: bool) -> None:
    out = tmp_path / "curves.png"
    out.write_bytes(b"old")
    with pytest.raises(RuntimeError, match="encoder died"), atomic_path(out, durable) as tmp:
        tmp.write_bytes(b"half a fi")
        raise RuntimeError("encoder died")
    assert out.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["curves.png"]


def test_the_temporary_file_keeps_the_suffix_and_matches_its_pattern(tmp_path: Path) -> None:
    out = tmp_path / "ckpt-000000000012.rlpar"
    with atomic_path(out, durable=True) as tmp:
        assert tmp.parent == tmp_path and tmp.suffix == ".rlpar"
        assert re.fullmatch(temp_name_pattern(r"ckpt-\d+", ".rlpar"), tmp.name), tmp.name
        assert not re.fullmatch(temp_name_pattern(r"ckpt-\d+", ".rlpar"), out.name)
        tmp.write_bytes(b"data")
    assert out.read_bytes() == b"data"
