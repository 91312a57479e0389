"""Checkpoints: exact round trips, atomic writes, and loud failures on damaged or foreign files."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import numpy as np
import pytest

import rlpar
from rlpar.checkpoint import (
    FORMAT_VERSION,
    Checkpoint,
    CheckpointError,
    checkpoint_path,
    latest_checkpoint,
    load_checkpoint,
    net_signature,
    prune_checkpoints,
    save_checkpoint,
)


def make_net(hidden: tuple[int, ...] = (16, 16)) -> rlpar.Net:
    return rlpar.Net(rlpar.mlp_spec(4, [rlpar.Categorical(2), rlpar.Value()], hidden=hidden))


def make_checkpoint(net: rlpar.Net, seed: int = 0) -> tuple[Checkpoint, np.random.Generator]:
    """A checkpoint after a few real RMSProp steps, and the generator whose state it holds."""
    params = net.init_params(seed=seed)
    opt = rlpar.RMSProp(net.num_params, lr=7e-4, momentum=0.9, centered=True)
    rng = np.random.default_rng(seed + 123)
    for _ in range(3):
        opt.step(params, rng.standard_normal(net.num_params).astype(np.float32))
    ckpt = Checkpoint(
        params=params,
        optimizer=opt.state_dict(),
        # env_steps is past float64's exact integers: counters must stay ints.
        counters={"env_steps": 2**53 + 1, "learner_steps": 3, "version": 3, "episodes": 7},
        rng_states={"learner": rng.bit_generator.state},
        config={"lr": 7e-4, "hidden": [16, 16], "env": {"id": "CartPole-v1", "num": 8}},
        net_signature=net_signature(net),
        extra={"git": "0e96f3c", "note": "ünïcode"},
    )
    return ckpt, rng


@pytest.fixture
def saved(tmp_path: Path) -> tuple[Path, bytes]:
    """A valid checkpoint file and its bytes."""
    path = save_checkpoint(tmp_path / "run.rlpar", make_checkpoint(make_net())[0])
    return path, path.read_bytes()


def test_net_signature_lists_every_parameter_in_flat_order() -> None:
    net = make_net()
    sig = net_signature(net)
    assert sig == [(name, tuple(shape)) for name, _r, _o, shape, _i, _h in net.param_info]
    assert sig[0] == ("layers.0.weight", (4, 16))
    assert sum(int(np.prod(shape)) for _, shape in sig) == net.num_params


def test_round_trip_is_exact_and_resumes_optimizer_and_rng(tmp_path: Path) -> None:
    net = make_net()
    ckpt, rng = make_checkpoint(net)
    assert ckpt.rng_states["learner"]["state"]["state"] > 2**64  # exercises big JSON integers

    loaded = load_checkpoint(save_checkpoint(tmp_path / "c.rlpar", ckpt), net_signature(net))

    assert loaded.params.dtype == np.float32
    assert loaded.params.ctypes.data % 64 == 0
    np.testing.assert_array_equal(loaded.params.view(np.uint32), ckpt.params.view(np.uint32))
    assert set(loaded.optimizer) == set(ckpt.optimizer)
    for name, value in ckpt.optimizer.items():
        if isinstance(value, np.ndarray):
            assert value.any()
            np.testing.assert_array_equal(
                loaded.optimizer[name].view(np.uint32), value.view(np.uint32)
            )
        else:
            assert type(loaded.optimizer[name]) is type(value)
            assert loaded.optimizer[name] == value
    assert loaded.counters == ckpt.counters
    assert loaded.config == ckpt.config
    assert loaded.extra == ckpt.extra
    assert loaded.net_signature == ckpt.net_signature

    # Resuming: the restored optimizer and generator continue exactly like the originals.
    opt = rlpar.RMSProp(net.num_params, lr=1.0, momentum=0.9, centered=True)
    opt.load_state_dict(loaded.optimizer)
    original = rlpar.RMSProp(net.num_params, lr=1.0, momentum=0.9, centered=True)
    original.load_state_dict(ckpt.optimizer)
    resumed = np.random.default_rng()
    resumed.bit_generator.state = loaded.rng_states["learner"]
    grad = rng.standard_normal(net.num_params).astype(np.float32)
    np.testing.assert_array_equal(resumed.standard_normal(net.num_params).astype(np.float32), grad)
    a, b = ckpt.params.copy(), loaded.params
    original.step(a, grad)
    opt.step(b, grad)
    np.testing.assert_array_equal(a, b)


def test_same_checkpoint_gives_same_bytes(tmp_path: Path) -> None:
    ckpt = make_checkpoint(make_net())[0]
    first = save_checkpoint(tmp_path / "a.rlpar", ckpt).read_bytes()
    assert save_checkpoint(tmp_path / "b.rlpar", ckpt).read_bytes() == first


def test_save_replaces_an_existing_checkpoint_and_creates_the_directory(tmp_path: Path) -> None:
    path = tmp_path / "new" / "dir" / "c.rlpar"
    first, second = make_checkpoint(make_net(), seed=1)[0], make_checkpoint(make_net(), seed=2)[0]
    save_checkpoint(path, first)
    save_checkpoint(path, second)
    np.testing.assert_array_equal(load_checkpoint(path).params, second.params)
    assert os.listdir(path.parent) == ["c.rlpar"]


def test_save_fsyncs_the_file_before_the_rename_and_the_directory_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    events = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        events.append("fsync dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "fsync file")
        real_fsync(fd)

    def replace(src: Path, dst: Path) -> None:
        events.append("replace")
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    save_checkpoint(tmp_path / "c.rlpar", make_checkpoint(make_net())[0])
    assert events == ["fsync file", "replace", "fsync dir"]


@pytest.mark.parametrize("fail", ["replace", "fsync"])
@pytest.mark.parametrize("exc", [OSError("disk on fire"), KeyboardInterrupt()])
def test_crash_during_save_keeps_old_file_and_leaves_no_temp(
    saved: tuple[Path, bytes], monkeypatch: pytest.MonkeyPatch, fail: str, exc: BaseException
) -> None:
    path, before = saved

    def boom(*args: object) -> None:
        raise exc

    monkeypatch.setattr(os, fail, boom)
    with pytest.raises(type(exc)):
        save_checkpoint(path, make_checkpoint(make_net(), seed=9)[0])
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert os.listdir(path.parent) == [path.name]
    load_checkpoint(path)


def test_crash_on_first_save_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def boom(*args: object) -> None:
        raise OSError("no space left on device")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError, match="no space"):
        save_checkpoint(tmp_path / "c.rlpar", make_checkpoint(make_net())[0])
    assert os.listdir(tmp_path) == []


def test_invalid_checkpoint_is_refused_before_touching_the_disk(tmp_path: Path) -> None:
    ckpt = make_checkpoint(make_net())[0]
    ckpt.config = {"not json": {1, 2}}
    with pytest.raises(TypeError, match="'config'"):
        save_checkpoint(tmp_path / "c.rlpar", ckpt)
    ckpt = make_checkpoint(make_net())[0]
    ckpt.params = ckpt.params.astype(np.float64)
    with pytest.raises(ValueError, match="float32"):
        save_checkpoint(tmp_path / "c.rlpar", ckpt)
    ckpt = make_checkpoint(make_net())[0]
    ckpt.net_signature = ckpt.net_signature[:-1]
    with pytest.raises(ValueError, match="net_signature describes"):
        save_checkpoint(tmp_path / "c.rlpar", ckpt)
    assert os.listdir(tmp_path) == []


def refusal(path: Path, **kwargs: object) -> str:
    """Why `load_checkpoint` refuses ``path``: its message after the path, which it must name.

    (Matching the whole message would also match tmp_path, which contains the test's name.)
    """
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(path, **kwargs)  # type: ignore[arg-type]
    message = str(info.value)
    assert message.startswith(f"{path}: ")
    return message.removeprefix(f"{path}: ")


@pytest.mark.parametrize("cut", [0, 3, 8, 40, 60, 61, -4000, -1])
def test_truncated_file_is_refused(saved: tuple[Path, bytes], cut: int) -> None:
    path, data = saved
    path.write_bytes(data[:cut])
    assert refusal(path).startswith("empty file" if cut == 0 else "truncated: ")


def test_flipped_byte_in_the_middle_is_refused(saved: tuple[Path, bytes]) -> None:
    path, data = saved
    damaged = bytearray(data)
    damaged[len(data) // 2] ^= 0x10
    path.write_bytes(damaged)
    assert refusal(path) == "corrupt: SHA-256 checksum mismatch"


def test_any_flipped_bit_is_refused(saved: tuple[Path, bytes]) -> None:
    path, data = saved
    for i in range(0, len(data), max(1, len(data) // 300)):
        damaged = bytearray(data)
        damaged[i] ^= 1 << (i % 8)
        path.write_bytes(damaged)
        with pytest.raises(CheckpointError):
            load_checkpoint(path)


def test_trailing_bytes_are_refused(saved: tuple[Path, bytes]) -> None:
    path, data = saved
    path.write_bytes(data + b"\0")
    assert refusal(path).startswith("corrupt (trailing bytes): ")


def test_other_format_version_is_refused(saved: tuple[Path, bytes]) -> None:
    path, data = saved
    newer = FORMAT_VERSION + 1
    path.write_bytes(data[:8] + newer.to_bytes(4, "little") + data[12:])
    assert refusal(path).startswith(f"unsupported checkpoint format version {newer} ")


@pytest.mark.parametrize(
    "content",
    [
        np.random.default_rng(0).bytes(5000),
        b'{"params": [1, 2, 3]}',
        b"PK\x03\x04 a zip file",
        b"RLPARCKX" + bytes(100),
    ],
)
def test_non_checkpoint_file_is_refused(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "random.bin"
    path.write_bytes(content)
    assert refusal(path).startswith("not an rlpar checkpoint")


def test_npz_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "params.npz"
    np.savez(path, params=np.zeros(3, np.float32))
    assert refusal(path).startswith("not an rlpar checkpoint")


def test_missing_path_and_directory_are_refused(tmp_path: Path) -> None:
    assert refusal(tmp_path / "absent.rlpar") == "no such checkpoint file"
    assert refusal(tmp_path).startswith("cannot read checkpoint: ")


def test_failed_load_changes_nothing_on_disk(saved: tuple[Path, bytes]) -> None:
    path, data = saved
    good = save_checkpoint(path.with_name("good.rlpar"), make_checkpoint(make_net(), seed=4)[0])
    good_bytes = good.read_bytes()
    damaged = data[:100] + bytes([data[100] ^ 0xFF]) + data[101:]
    path.write_bytes(damaged)
    mtime = path.stat().st_mtime_ns
    for _ in range(2):
        refusal(path)
    assert path.read_bytes() == damaged and path.stat().st_mtime_ns == mtime
    assert good.read_bytes() == good_bytes
    assert sorted(os.listdir(path.parent)) == ["good.rlpar", "run.rlpar"]


def test_different_shape_names_the_parameter(saved: tuple[Path, bytes]) -> None:
    path, _ = saved
    wider = net_signature(make_net(hidden=(32, 16)))
    assert refusal(path, expected_signature=wider) == (
        "checkpoint is for a different architecture: parameter 0 is 'layers.0.weight' (4, 16) "
        "in the checkpoint, expected 'layers.0.weight' (4, 32)"
    )


def test_different_parameter_count_is_refused(saved: tuple[Path, bytes]) -> None:
    path, _ = saved
    deeper = net_signature(make_net(hidden=(16, 16, 16)))
    assert refusal(path, expected_signature=deeper) == (
        "checkpoint is for a different architecture: parameter 4 is 'heads.0.weight' (16, 2) "
        "in the checkpoint, expected 'layers.4.weight' (16, 16) (10 parameters expected, 8 found)"
    )
    own = net_signature(make_net())
    different = "checkpoint is for a different architecture: "
    assert (
        refusal(path, expected_signature=own[:-2]) == different + "6 parameters expected, 8 found"
    )
    extended = [*own, ("extra.bias", (3,))]
    assert (
        refusal(path, expected_signature=extended) == different + "9 parameters expected, 8 found"
    )
    # Shapes that arrive as lists (e.g. from JSON) compare equal to tuples.
    load_checkpoint(path, expected_signature=[(name, list(shape)) for name, shape in own])


def test_checkpoint_path_zero_pads_so_names_sort_by_step(tmp_path: Path) -> None:
    assert checkpoint_path(tmp_path, 42) == tmp_path / "ckpt-000000000042.rlpar"
    steps = [0, 9, 10, 99, 1000, 123_456_789]
    names = [checkpoint_path(tmp_path, s).name for s in steps]
    assert sorted(names) == names
    with pytest.raises(ValueError, match="learner_steps"):
        checkpoint_path(tmp_path, -1)


def test_latest_and_prune(tmp_path: Path) -> None:
    assert latest_checkpoint(tmp_path / "absent") is None
    assert latest_checkpoint(tmp_path) is None
    ckpt = make_checkpoint(make_net())[0]
    # 10**12 needs a 13th digit, so it sorts before 999_999_999_999 by name: order by number.
    steps = [20, 5, 10**12, 999_999_999_999, 100]
    for s in steps:
        save_checkpoint(checkpoint_path(tmp_path, s), ckpt)
    others = ["notes.txt", ".ckpt-000000000007.rlpar.1234.tmp", "ckpt-latest.rlpar"]
    for name in others:
        (tmp_path / name).write_text("not a checkpoint")

    assert latest_checkpoint(tmp_path) == checkpoint_path(tmp_path, 10**12)
    deleted = prune_checkpoints(tmp_path, keep=2)
    assert deleted == [checkpoint_path(tmp_path, s) for s in (5, 20, 100)]
    kept = {checkpoint_path(tmp_path, s).name for s in (999_999_999_999, 10**12)}
    assert set(os.listdir(tmp_path)) == kept | set(others)
    assert prune_checkpoints(tmp_path, keep=5) == []
    with pytest.raises(ValueError, match="keep must be >= 1"):
        prune_checkpoints(tmp_path, keep=0)
    assert latest_checkpoint(tmp_path) == checkpoint_path(tmp_path, 10**12)
