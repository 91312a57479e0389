"""experiments/plot_curves.py reads scalars back with TensorBoard's own reader and bands seeds."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from rlpar.app.monitor import EventWriter

SCRIPT = Path(__file__).resolve().parent.parent / "experiments" / "plot_curves.py"
spec = importlib.util.spec_from_file_location("plot_curves", SCRIPT)
assert spec is not None and spec.loader is not None
plot_curves = importlib.util.module_from_spec(spec)
spec.loader.exec_module(plot_curves)


def write_run(run_dir: Path, points: dict[int, float]) -> None:
    writer = EventWriter(run_dir)
    for step, value in points.items():
        writer.scalars({"eval/return_mean": value}, step)
    writer.close()


def test_curves_are_read_back_and_banded_over_the_common_steps(tmp_path) -> None:
    write_run(tmp_path / "a", {0: 0.0, 100: 10.0, 200: 20.0})
    write_run(tmp_path / "b", {0: 2.0, 100: 2.0, 150: 2.0})
    steps, values = plot_curves.read_curve(tmp_path / "a", "eval/return_mean")
    np.testing.assert_array_equal(steps, [0, 100, 200])
    np.testing.assert_array_equal(values, [0, 10, 20])
    curves = [plot_curves.read_curve(tmp_path / r, "eval/return_mean") for r in ("a", "b")]
    grid, mean, low, high = plot_curves.seed_band(curves, points=4)
    np.testing.assert_allclose(grid, [0, 50, 100, 150])  # up to the step both reached
    np.testing.assert_allclose(mean, [1, 3.5, 6, 8.5])
    np.testing.assert_allclose(low, [0, 2, 2, 2])
    np.testing.assert_allclose(high, [2, 5, 10, 15])
    with pytest.raises(ValueError, match="no scalar 'return/mean'"):
        plot_curves.read_curve(tmp_path / "a", "return/mean")


def test_reference_lines_take_one_value_per_config() -> None:
    assert plot_curves.parse_refs(None, 2) == [None, None]
    assert plot_curves.parse_refs(["17.5", "none"], 2) == [17.5, None]
    with pytest.raises(SystemExit, match="one value per config"):
        plot_curves.parse_refs(["1"], 2)
    with pytest.raises(SystemExit, match="numbers or 'none'"):
        plot_curves.parse_refs(["x", "1"], 2)
