"""Checkpoints: everything needed to resume a run exactly, in one file written atomically.

::

    ckpt = Checkpoint(
        params=params, optimizer=opt.state_dict(),
        counters={"env_steps": env_steps, "learner_steps": learner_steps},
        rng_states={"learner": rng.bit_generator.state}, config=asdict(config),
        net_signature=net_signature(net),
    )
    save_checkpoint(checkpoint_path(run_dir, learner_steps), ckpt)
    prune_checkpoints(run_dir, keep=3)

    path = latest_checkpoint(run_dir)                 # None on a fresh run
    ckpt = load_checkpoint(path, expected_signature=net_signature(net))
    params[:] = ckpt.params
    opt.load_state_dict(ckpt.optimizer)
    rng.bit_generator.state = ckpt.rng_states["learner"]

File layout (little-endian)::

    magic     8 bytes   b"RLPARCKP"
    version   uint32    FORMAT_VERSION
    meta_len  uint64    bytes of JSON metadata
    data_len  uint64    bytes of array data
    sha256    32 bytes  of the 28 header bytes above, then the metadata, then the array data
    metadata  meta_len bytes of UTF-8 JSON (counters, rng states, config, signature, ...)
    arrays    data_len bytes: one .npy record per name in metadata["arrays"], in that order:
              "params", "optimizer/<name>" (optimizer buffers), "state/<name>" (`Checkpoint.arrays`)

The lengths catch truncation and the checksum catches any damaged byte, so a bad file fails loudly
instead of resuming from wrong numbers. Arrays are .npy records read with ``allow_pickle=False``
(dtype, shape and byte order travel with the data, and nothing is ever unpickled); everything
else is JSON, whose integers are exact at any size (PCG64 states exceed 2**64).
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import re
import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from rlpar.files import atomic_path, temp_name_pattern
from rlpar.nn import aligned_zeros

if TYPE_CHECKING:
    from rlpar.nn import Net

__all__ = [
    "FORMAT_VERSION",
    "Checkpoint",
    "CheckpointError",
    "check_signature",
    "checkpoint_path",
    "find_checkpoint",
    "latest_checkpoint",
    "load_checkpoint",
    "net_signature",
    "prune_checkpoints",
    "save_checkpoint",
]

FORMAT_VERSION = 1
_MAGIC = b"RLPARCKP"
_PREFIX = struct.Struct("<8sIQQ")  # magic, version, meta_len, data_len; then the 32-byte digest
_HEADER_SIZE = _PREFIX.size + 32
_NAME = re.compile(r"ckpt-(\d+)\.rlpar")
# `atomic_path`'s temporary files, and those of rlpar 0.1.0 (``.<name>.<random>.tmp``).
_TEMP = re.compile(temp_name_pattern(r"ckpt-\d+", ".rlpar") + r"|\.ckpt-\d+\.rlpar\.[0-9a-f]+\.tmp")
#: A temporary file older than this is what a killed writer left (a write takes well under it).
STALE_TEMP_S = 60.0

Signature = list[tuple[str, tuple[int, ...]]]


class CheckpointError(ValueError):
    """A checkpoint file is missing, damaged, not a checkpoint, or for another architecture."""


@dataclass(eq=False)
class Checkpoint:
    """The state of a run at one learner step."""

    params: np.ndarray
    """float32 ``[P]``: the flat parameter vector (64-byte aligned when loaded)."""
    optimizer: dict[str, np.ndarray | int | float]
    """What `Optimizer.state_dict` returned: flat buffers, ``steps`` and ``lr``."""
    counters: dict[str, int]
    """Progress counters, e.g. ``env_steps``, ``learner_steps``, ``version``, ``episodes``."""
    rng_states: dict[str, Any]
    """JSON data, e.g. ``Generator.bit_generator.state`` per stream; integers stay exact."""
    config: dict[str, Any]
    """The resolved run config as plain JSON data (tuples come back as lists)."""
    net_signature: Signature
    """``(name, shape)`` of every parameter, from `net_signature`."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Free JSON metadata."""
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    """Named arrays of the run's state besides parameters and optimizer, e.g. an actor's
    episodes in progress (``actors/0/core/state`` float32 [K, state_size]); bool, integer or
    float dtypes only (saved as .npy records, like the rest)."""


def net_signature(net: Net) -> Signature:
    """``(name, shape)`` of each parameter of ``net``, in the order of the flat vector."""
    return [
        (name, tuple(shape)) for name, _role, _offset, shape, _index, _in_head in net.param_info
    ]


def checkpoint_path(directory: str | os.PathLike[str], learner_steps: int) -> Path:
    """``directory/ckpt-<learner_steps, 12 digits>.rlpar``: names sort in step order."""
    if learner_steps < 0:
        raise ValueError(f"learner_steps must be >= 0, got {learner_steps}")
    return Path(directory) / f"ckpt-{int(learner_steps):012d}.rlpar"


def save_checkpoint(path: str | os.PathLike[str], ckpt: Checkpoint) -> Path:
    """Write ``ckpt`` to ``path`` atomically and durably; return ``path``.

    The bytes go to a uniquely named temporary file in the same directory (created if needed),
    which is fsynced and then renamed over ``path``, and the directory is fsynced. A reader sees
    the old file or the new one, never a mix (`rlpar.files.atomic_path`); on any error the
    temporary file is removed (only a killed process leaves one, ``.<stem>.<random>.tmp.rlpar``:
    `prune_checkpoints`, called after every save and when a run starts, removes those older than
    `STALE_TEMP_S`).
    Raises ``ValueError``/``TypeError`` (before touching the disk) if ``ckpt`` is malformed.
    """
    path = Path(path)
    data = _encode(ckpt)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path, durable=True) as tmp:
        # 0o666 lets the umask decide the final file's mode, as for any other file (mkstemp:
        # 0o600).
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
        with open(os.open(tmp, flags, 0o666), "wb") as f:
            f.write(data)
    return path


def load_checkpoint(
    path: str | os.PathLike[str],
    expected_signature: Sequence[tuple[str, Sequence[int]]] | None = None,
) -> Checkpoint:
    """Read and verify a checkpoint written by `save_checkpoint`.

    Raises `CheckpointError`, naming ``path``, if the file is missing, unreadable, truncated,
    damaged, not a checkpoint or of another format version, or, when ``expected_signature`` is
    given, if its parameters differ from it (the first differing name and shape are named).
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError as e:
        raise CheckpointError(f"{path}: no such checkpoint file") from e
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read checkpoint: {e.strerror or e}") from e
    meta, arrays = _verify(path, data)
    try:
        ckpt = _decode(meta, arrays)
    except (AttributeError, KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"{path}: malformed checkpoint contents: {e!r}") from e
    if expected_signature is not None:
        _check_signature(path, _normalise(expected_signature), ckpt.net_signature)
    return ckpt


def latest_checkpoint(directory: str | os.PathLike[str]) -> Path | None:
    """The checkpoint in ``directory`` with the most learner steps, or None if there is none."""
    found = _checkpoints(Path(directory))
    return found[-1] if found else None


def find_checkpoint(path: str | os.PathLike[str]) -> Path:
    """``path`` if it is not a directory; for a run directory or a checkpoints directory, its
    newest checkpoint (`CheckpointError` if it holds none). What ``rlpar eval`` and
    ``rlpar train --resume`` accept."""
    path = Path(path)
    if not path.is_dir():
        return path
    found = latest_checkpoint(path / "checkpoints") or latest_checkpoint(path)
    if found is None:
        raise CheckpointError(f"{path}: no checkpoint in this directory or its checkpoints/")
    return found


def prune_checkpoints(directory: str | os.PathLike[str], keep: int) -> list[Path]:
    """Delete all but the newest ``keep`` (>= 1) checkpoints in ``directory``, and the temporary
    files of writers killed mid-write (older than `STALE_TEMP_S`); return the deleted.

    Only files named by `checkpoint_path` (or their temporary files) are considered; anything
    else is left alone.
    """
    if keep < 1:
        raise ValueError(f"keep must be >= 1 (pruning never deletes every checkpoint), got {keep}")
    doomed = _checkpoints(Path(directory))[:-keep] + _stale_temp_files(Path(directory))
    for path in doomed:
        path.unlink(missing_ok=True)
    return doomed


def _stale_temp_files(directory: Path) -> list[Path]:
    if not directory.is_dir():
        return []
    now = time.time()
    stale = []
    for path in directory.iterdir():
        if _TEMP.fullmatch(path.name):
            try:
                if now - path.stat().st_mtime > STALE_TEMP_S:
                    stale.append(path)
            except FileNotFoundError:  # its writer just renamed it
                continue
    return stale


def _checkpoints(directory: Path) -> list[Path]:
    """Checkpoint files in ``directory``, oldest first (by step number, not by name)."""
    if not directory.is_dir():
        return []
    steps = {}
    for path in directory.iterdir():
        match = _NAME.fullmatch(path.name)
        if match and path.is_file():
            steps[path] = int(match.group(1))
    return sorted(steps, key=steps.__getitem__)


def _encode(ckpt: Checkpoint) -> bytes:
    params = np.asarray(ckpt.params)
    if params.dtype != np.float32 or params.ndim != 1:
        raise ValueError(f"params must be float32 [P], got {params.dtype} {params.shape}")
    signature = _normalise(ckpt.net_signature)
    _check_size(params, signature)
    arrays: dict[str, np.ndarray] = {"params": params}
    scalars: dict[str, Any] = {}
    for name, value in ckpt.optimizer.items():
        if isinstance(value, np.ndarray):
            arrays[f"optimizer/{name}"] = value
        else:
            scalars[name] = value.item() if isinstance(value, np.generic) else value
    for name, value in ckpt.arrays.items():
        if not isinstance(value, np.ndarray) or value.dtype.kind not in "biuf":
            what = value.dtype if isinstance(value, np.ndarray) else type(value).__name__
            raise TypeError(
                f"checkpoint array '{name}' must be a numpy array of bool, integer or float "
                f"dtype, got {what}"
            )
        arrays[f"state/{name}"] = value
    meta: dict[str, Any] = {
        "arrays": list(arrays),
        "optimizer_scalars": scalars,
        "counters": {str(k): int(v) for k, v in ckpt.counters.items()},
        "rng_states": ckpt.rng_states,
        "config": ckpt.config,
        "net_signature": [[name, list(shape)] for name, shape in signature],
        "extra": ckpt.extra,
    }
    for key, value in meta.items():
        try:
            json.dumps(value)
        except (TypeError, ValueError) as e:
            raise TypeError(f"checkpoint field '{key}' must be plain JSON data: {e}") from e
    meta_bytes = json.dumps(meta).encode()
    buf = io.BytesIO()
    for array in arrays.values():
        np.lib.format.write_array(buf, np.ascontiguousarray(array), allow_pickle=False)
    array_bytes = buf.getvalue()
    prefix = _PREFIX.pack(_MAGIC, FORMAT_VERSION, len(meta_bytes), len(array_bytes))
    return prefix + _digest(prefix, meta_bytes, array_bytes) + meta_bytes + array_bytes


def _digest(*parts: bytes | memoryview) -> bytes:
    h = hashlib.sha256()
    for part in parts:
        h.update(part)
    return h.digest()


def _verify(path: Path, data: bytes) -> tuple[dict[str, Any], bytes]:
    """Check magic, version, length and checksum; return the metadata and the array bytes."""
    if not data:
        raise CheckpointError(f"{path}: empty file, not a checkpoint")
    if not data.startswith(_MAGIC[: len(data)]):
        raise CheckpointError(f"{path}: not an rlpar checkpoint (wrong magic bytes)")
    if len(data) < _HEADER_SIZE:
        raise CheckpointError(
            f"{path}: truncated: {len(data)} bytes, shorter than the {_HEADER_SIZE}-byte header"
        )
    _, version, meta_len, data_len = _PREFIX.unpack_from(data)
    if version != FORMAT_VERSION:
        raise CheckpointError(
            f"{path}: unsupported checkpoint format version {version} "
            f"(this rlpar reads version {FORMAT_VERSION})"
        )
    expected = _HEADER_SIZE + meta_len + data_len
    if len(data) != expected:
        what = "truncated" if len(data) < expected else "corrupt (trailing bytes)"
        raise CheckpointError(f"{path}: {what}: header says {expected} bytes, file has {len(data)}")
    view = memoryview(data)
    meta_bytes = view[_HEADER_SIZE : _HEADER_SIZE + meta_len]
    array_bytes = view[_HEADER_SIZE + meta_len :]
    if _digest(view[: _PREFIX.size], meta_bytes, array_bytes) != view[_PREFIX.size : _HEADER_SIZE]:
        raise CheckpointError(f"{path}: corrupt: SHA-256 checksum mismatch")
    try:
        meta = json.loads(bytes(meta_bytes))
    except ValueError as e:
        raise CheckpointError(f"{path}: malformed checkpoint metadata: {e}") from e
    if not isinstance(meta, dict):
        raise CheckpointError(f"{path}: malformed checkpoint metadata: not a JSON object")
    return meta, bytes(array_bytes)


def _decode(meta: dict[str, Any], array_bytes: bytes) -> Checkpoint:
    """Build a Checkpoint from verified bytes; malformed contents raise the builtin errors."""
    buf = io.BytesIO(array_bytes)
    arrays = {name: np.lib.format.read_array(buf, allow_pickle=False) for name in meta["arrays"]}
    if buf.tell() != len(array_bytes):
        raise ValueError(f"{len(array_bytes) - buf.tell()} bytes of array data left unread")
    loaded = arrays.pop("params")
    if loaded.dtype != np.float32 or loaded.ndim != 1:
        raise ValueError(f"params must be float32 [P], got {loaded.dtype} {loaded.shape}")
    params = aligned_zeros(loaded.size)
    params[:] = loaded
    signature = _normalise(meta["net_signature"])
    _check_size(params, signature)
    optimizer: dict[str, np.ndarray | int | float] = {}
    state: dict[str, np.ndarray] = {}
    for name, array in arrays.items():
        if name.startswith("optimizer/"):
            optimizer[name.removeprefix("optimizer/")] = array
        elif name.startswith("state/"):
            state[name.removeprefix("state/")] = array
        else:
            raise ValueError(f"unknown array '{name}' (expected optimizer/... or state/...)")
    optimizer.update(meta["optimizer_scalars"])
    return Checkpoint(
        params=params,
        optimizer=optimizer,
        counters={str(k): int(v) for k, v in meta["counters"].items()},
        rng_states=meta["rng_states"],
        config=meta["config"],
        net_signature=signature,
        extra=meta["extra"],
        arrays=state,
    )


def _normalise(signature: Sequence[tuple[str, Sequence[int]]]) -> Signature:
    return [(str(name), tuple(int(d) for d in shape)) for name, shape in signature]


def _check_size(params: np.ndarray, signature: Signature) -> None:
    total = sum(math.prod(shape) for _, shape in signature)
    if total != params.size:
        raise ValueError(f"net_signature describes {total} parameters but params has {params.size}")


def check_signature(
    ckpt: Checkpoint, expected: Sequence[tuple[str, Sequence[int]]], path: str | os.PathLike[str]
) -> None:
    """Raise CheckpointError unless ``ckpt`` (loaded from ``path``) is for ``expected``."""
    _check_signature(Path(path), _normalise(expected), _normalise(ckpt.net_signature))


def _check_signature(path: Path, expected: Signature, found: Signature) -> None:
    problem = f"{path}: checkpoint is for a different architecture"
    counts = f"{len(expected)} parameters expected, {len(found)} found"
    for i, (want, got) in enumerate(zip(expected, found, strict=False)):
        if want != got:
            also = f" ({counts})" if len(expected) != len(found) else ""
            raise CheckpointError(
                f"{problem}: parameter {i} is '{got[0]}' {got[1]} in the checkpoint, "
                f"expected '{want[0]}' {want[1]}{also}"
            )
    if len(expected) != len(found):
        raise CheckpointError(f"{problem}: {counts}")
