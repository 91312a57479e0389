"""``rlpar plot``: learning curves from runs' TensorBoard event files, mean and band over seeds.

::

    rlpar plot runs/minatar_breakout_suite/seeds-20261202-070000 --tag eval/return_mean \\
        --out curves.png --ref 17.5 --ref-label "paper AC(λ) at 5M"

Each argument is one *group* of runs, drawn as one panel: a run directory (one curve), or a
folder of run directories (``rlpar train --seeds``' parent, or ``<logdir>/<name>/``): the mean
over its seeds with a band from the min to the max, interpolated onto one grid over the x range
every seed reached. The x axis is env steps (the event steps) or, with ``--x seconds``, wall
seconds since each run's first point. Scalars are read back with TensorBoard's own
`EventAccumulator` (``Scalars(tag)``; runs written before rlpar wrote ``simple_value`` scalars
(rlpar 0.1.0) hold them as tensor summaries, read with ``Tensors(tag)``). Drawing needs matplotlib
(``pip install "rlpar[plot]"``); reading does not.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from rlpar.files import atomic_path

__all__ = ["find_runs", "panel_title", "plot_groups", "read_curve", "seed_band"]

X_AXES = ("steps", "seconds")


def read_curve(run_dir: str | Path, tag: str, x: str = "steps") -> tuple[np.ndarray, np.ndarray]:
    """(x [P], values [P]) of the scalar ``tag`` in one run directory, sorted by x: env steps,
    or wall seconds since the run's first point (``x="seconds"``)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.util.tensor_util import make_ndarray

    if x not in X_AXES:
        raise ValueError(f"--x: expected one of {', '.join(X_AXES)}, got {x!r}")
    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0, "tensors": 0})  # all
    acc.Reload()
    tags = acc.Tags()
    if tag in tags["scalars"]:
        points = [(e.step, e.wall_time, e.value) for e in acc.Scalars(tag)]
    elif tag in tags["tensors"]:  # a run that rlpar 0.1.0 wrote: scalars as tensor summaries
        points = [
            (e.step, e.wall_time, float(make_ndarray(e.tensor_proto))) for e in acc.Tensors(tag)
        ]
    else:
        known = ", ".join(sorted([*tags["scalars"], *tags["tensors"]])[:12])
        raise ValueError(f"{run_dir}: no scalar {tag!r} in its event files (it has: {known})")
    steps, walls, values = (np.array(column, np.float64) for column in zip(*points, strict=True))
    xs = steps if x == "steps" else walls - walls.min()
    order = np.argsort(xs, kind="stable")
    return xs[order], values[order]


def seed_band(
    curves: Sequence[tuple[np.ndarray, np.ndarray]], points: int = 200
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(grid [G], mean [G], min [G], max [G]) over seeds, on the x range every seed reached."""
    start = max(s[0] for s, _ in curves)
    stop = min(s[-1] for s, _ in curves)
    grid = np.linspace(start, stop, points) if stop > start else np.array([start])
    ys = np.stack([np.interp(grid, s, v) for s, v in curves])  # [seeds, G]
    return grid, ys.mean(axis=0), ys.min(axis=0), ys.max(axis=0)


def _is_run(path: Path) -> bool:
    return path.is_dir() and any(p.name.startswith("events.out.tfevents") for p in path.iterdir())


def find_runs(group: str | Path) -> list[Path]:
    """The run directories of ``group``: itself when it is one, else its subfolders that are
    (sorted), else those of its subfolders (``<logdir>/<name>/`` holding ``rlpar train
    --seeds`` parents). ValueError when there are none."""
    path = Path(group)
    if not path.is_dir():
        raise ValueError(f"{path}: expected a run directory or a folder of them, got no folder")
    if _is_run(path):
        return [path]
    runs = sorted(p for p in path.iterdir() if _is_run(p))
    if not runs:
        runs = sorted(q for p in path.iterdir() if p.is_dir() for q in p.iterdir() if _is_run(q))
    if not runs:
        raise ValueError(f"{path}: no run directories (folders with TensorBoard event files)")
    return runs


def panel_title(group: Path) -> str:
    """A group's name: the experiment's for an ``rlpar train --seeds`` parent
    (``<name>/seeds-<timestamp>``), else the folder's own."""
    return group.resolve().parent.name if group.name.startswith("seeds-") else group.name


def parse_refs(values: Sequence[str] | None, n: int) -> list[float | None]:
    """``--ref`` values, one per group (``none`` for no line); none given: no lines."""
    if not values:
        return [None] * n
    if len(values) != n:
        raise ValueError(f"--ref: expected one value per group ({n}), got {len(values)}")
    try:
        return [None if v.lower() == "none" else float(v) for v in values]
    except ValueError:
        raise ValueError(f"--ref: expected numbers or 'none', got {list(values)}") from None


def plot_groups(
    groups: Sequence[str | Path],
    out: str | Path,
    tag: str = "eval/return_mean",
    x: str = "steps",
    refs: Sequence[str] | None = None,
    ref_label: str = "reference",
) -> Path:
    """Draw one panel per group into the image ``out`` (written to a temporary file, then
    renamed: no half-written image is left behind). Returns ``out``."""
    lines = parse_refs(refs, len(groups))
    data = [(Path(g), [read_curve(r, tag, x) for r in find_runs(g)]) for g in groups]
    out = Path(out)
    if not out.parent.is_dir():
        raise ValueError(f"--out: expected a file in an existing folder, got {out}")
    try:
        import matplotlib
    except ImportError:
        raise ValueError(
            'rlpar plot draws with matplotlib: pip install "rlpar[plot]" (or matplotlib)'
        ) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(data), figsize=(4 * len(data), 3.2), squeeze=False)
    for ax, (folder, curves), ref in zip(axes[0], data, lines, strict=True):
        grid, mean, low, high = seed_band(curves)
        label = f"mean of {len(curves)} seeds" if len(curves) > 1 else "one run"
        ax.plot(grid, mean, label=label)
        if len(curves) > 1:
            ax.fill_between(grid, low, high, alpha=0.3, label="min–max")
        if ref is not None:
            ax.axhline(ref, color="gray", linestyle="--", label=ref_label)
        ax.set_title(panel_title(folder))
        ax.set_xlabel("env steps" if x == "steps" else "wall seconds")
        ax.set_ylabel(tag)
        ax.legend(loc="lower right", fontsize="small")
    fig.tight_layout()
    try:
        with atomic_path(out) as tmp:
            fig.savefig(tmp, dpi=120)
    finally:
        plt.close(fig)
    return out
