"""Atomic file writes: a file appears whole at its path, or the old one stays.

Every file rlpar writes for a user to read back (checkpoints, summaries, aggregates, plots,
videos) is written to a temporary file beside its path and renamed onto it, so a reader (or a
resumed run) never sees half a file, and a writer killed mid-write leaves only a temporary
file named ``.<stem>.<random>.tmp<suffix>``::

    with atomic_path(out) as tmp:      # tmp ends in out's suffix: writers that pick a format
        fig.savefig(tmp)               # by suffix (matplotlib, imageio) work on it
    write_atomically(path, text)       # the same for a text

``durable=True`` also flushes the file and then its folder to the disk (`os.fsync`), so the
rename survives a power cut: checkpoints use it.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
from collections.abc import Iterator
from pathlib import Path

__all__ = ["atomic_path", "temp_name_pattern", "write_atomically"]


def temp_name_pattern(stem_pattern: str, suffix: str) -> str:
    """A regular expression for the temporary files `atomic_path` makes for paths whose stem
    matches ``stem_pattern`` and whose suffix is ``suffix`` (to find those a killed writer
    left)."""
    return rf"\.{stem_pattern}\.[0-9a-f]{{16}}\.tmp{re.escape(suffix)}"


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str], durable: bool = False) -> Iterator[Path]:
    """Yield a temporary path beside ``path`` for the caller to write; when the block ends,
    rename it onto ``path``. If the block raises, the temporary file is removed and ``path``
    is left as it was."""
    path = Path(path)
    tmp = path.with_name(f".{path.stem}.{secrets.token_hex(8)}.tmp{path.suffix}")
    try:
        yield tmp
        if durable:
            fd = os.open(tmp, os.O_RDONLY | getattr(os, "O_BINARY", 0))
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)  # nothing left after the rename
    if durable:
        _fsync_directory(path.parent)


def write_atomically(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` through `atomic_path`."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def _fsync_directory(directory: Path) -> None:
    # Makes the rename itself durable. Some platforms (Windows) cannot open a directory; the
    # rename is still atomic there.
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
