"""``rlpar plot`` (rlpar/app/plot.py): scalars read back with TensorBoard's own reader, seeds
banded over the steps they all reached, run groups found, bad input named; the image drawn
where matplotlib is installed (CI installs the plot extra)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from rlpar.app.monitor import EventWriter
from rlpar.app.plot import find_runs, panel_title, parse_refs, read_curve, seed_band


def write_run(run_dir: Path, points: dict[int, float]) -> None:
    writer = EventWriter(run_dir)
    for step, value in points.items():
        writer.scalars({"eval/return_mean": value}, step)
    writer.close()


def test_curves_are_read_back_and_banded_over_the_common_steps(tmp_path) -> None:
    write_run(tmp_path / "a", {0: 0.0, 100: 10.0, 200: 20.0})
    write_run(tmp_path / "b", {0: 2.0, 100: 2.0, 150: 2.0})
    steps, values = read_curve(tmp_path / "a", "eval/return_mean")
    np.testing.assert_array_equal(steps, [0, 100, 200])
    np.testing.assert_array_equal(values, [0, 10, 20])
    seconds, again = read_curve(tmp_path / "a", "eval/return_mean", x="seconds")
    assert seconds[0] == 0.0 and np.all(np.diff(seconds) >= 0)
    np.testing.assert_array_equal(again, values)
    curves = [read_curve(tmp_path / r, "eval/return_mean") for r in ("a", "b")]
    grid, mean, low, high = seed_band(curves, points=4)
    np.testing.assert_allclose(grid, [0, 50, 100, 150])  # up to the step both reached
    np.testing.assert_allclose(mean, [1, 3.5, 6, 8.5])
    np.testing.assert_allclose(low, [0, 2, 2, 2])
    np.testing.assert_allclose(high, [2, 5, 10, 15])
    with pytest.raises(ValueError, match="no scalar 'return/mean'"):
        read_curve(tmp_path / "a", "return/mean")
    with pytest.raises(ValueError, match="--x: expected one of steps, seconds"):
        read_curve(tmp_path / "a", "eval/return_mean", x="time")


def test_runs_that_hold_their_scalars_as_tensor_summaries_are_read_too(tmp_path) -> None:
    """rlpar 0.1.0 wrote every curve as a tensor summary (the scalar plugin's ``scalar_pb``)."""
    from tensorboard.plugins.scalar import summary_v2 as scalar_summary

    writer = EventWriter(tmp_path)
    for step, value in {0: 1.0, 100: 3.0}.items():
        writer.write(scalar_summary.scalar_pb("eval/return_mean", value), step)
    writer.close()
    steps, values = read_curve(tmp_path, "eval/return_mean")
    np.testing.assert_array_equal(steps, [0, 100])
    np.testing.assert_array_equal(values, [1.0, 3.0])


def test_a_group_is_a_run_or_a_folder_of_runs(tmp_path) -> None:
    write_run(tmp_path / "seeds" / "seed-0", {0: 1.0})
    write_run(tmp_path / "seeds" / "seed-1", {0: 1.0})
    (tmp_path / "seeds" / "seed-0.log").write_text("not a run")
    assert find_runs(tmp_path / "seeds") == [tmp_path / "seeds" / f"seed-{s}" for s in (0, 1)]
    assert find_runs(tmp_path / "seeds" / "seed-1") == [tmp_path / "seeds" / "seed-1"]
    # <logdir>/<name>/ holding a --seeds parent: the parent's runs
    assert find_runs(tmp_path) == [tmp_path / "seeds" / f"seed-{s}" for s in (0, 1)]
    (tmp_path / "empty" / "inside").mkdir(parents=True)
    with pytest.raises(ValueError, match="no run directories"):
        find_runs(tmp_path / "empty")
    assert panel_title(tmp_path / "cartpole" / "seeds-20261206-0435") == "cartpole"
    assert panel_title(tmp_path / "seeds" / "seed-1") == "seed-1"
    with pytest.raises(ValueError, match="got no folder"):
        find_runs(tmp_path / "missing")


def test_reference_lines_take_one_value_per_group() -> None:
    assert parse_refs(None, 2) == [None, None]
    assert parse_refs(["17.5", "none"], 2) == [17.5, None]
    with pytest.raises(ValueError, match="one value per group"):
        parse_refs(["1"], 2)
    with pytest.raises(ValueError, match="numbers or 'none'"):
        parse_refs(["x", "1"], 2)


def rlpar_plot(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rlpar", "plot", *args],
        cwd=cwd, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
    )  # fmt: skip


def test_bad_plot_input_is_a_one_line_error(tmp_path) -> None:
    write_run(tmp_path / "run", {0: 1.0, 10: 2.0})
    for args, said in [
        ([str(tmp_path / "nothing")], "got no folder"),
        ([str(tmp_path / "run"), "--tag", "loss/x"], "no scalar 'loss/x'"),
        ([str(tmp_path / "run"), "--out", str(tmp_path / "no" / "x.png")], "--out: expected"),
        ([str(tmp_path / "run"), "--ref", "1", "2"], "--ref: expected one value per group"),
    ]:
        proc = rlpar_plot(tmp_path, *args)
        assert proc.returncode == 2, proc.stderr
        assert said in proc.stderr and "Traceback" not in proc.stderr
    assert not list(tmp_path.rglob("*.png"))


def test_rlpar_plot_draws_the_image(tmp_path) -> None:
    pytest.importorskip("matplotlib")
    from PIL import Image  # matplotlib depends on Pillow

    write_run(tmp_path / "seeds" / "seed-0", {0: 0.0, 100: 10.0})
    write_run(tmp_path / "seeds" / "seed-1", {0: 2.0, 100: 4.0})
    write_run(tmp_path / "single", {0: 1.0, 50: 3.0})
    out = tmp_path / "curves.png"
    proc = rlpar_plot(tmp_path, str(tmp_path / "seeds"), str(tmp_path / "single"), "--out",
                      str(out), "--ref", "5", "none", "--x", "seconds")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(out)
    with Image.open(out) as image:
        width, height = image.size
        assert width > 2 * height > 0  # two panels side by side
    assert not list(tmp_path.glob(".curves.*.tmp*"))
