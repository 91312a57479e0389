"""Learning curves over seeds from the runs' TensorBoard event files, read with TensorBoard's own
`EventAccumulator`: per config, the mean over seeds with a band from the min to the max.

    pip install matplotlib          # or: pip install ".[experiments]"
    python experiments/plot_curves.py runs/results/minatar_breakout_suite \\
        runs/results/minatar_asterix_suite --tag eval/return_mean --out curves.png \\
        --ref 17.5 19 --ref-label "paper AC(λ) at 5M"

Each argument is a folder of runs of one config (`<logdir>/<name>/`, one `<timestamp>/` per
seed, as `rlpar train` and `run_results.py` lay them out). The seeds' curves are interpolated
onto one env-step grid over the steps they all reached.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.util.tensor_util import make_ndarray


def read_curve(run_dir: Path, tag: str) -> tuple[np.ndarray, np.ndarray]:
    """(env steps [P], values [P]) of the scalar ``tag`` in one run directory."""
    acc = EventAccumulator(str(run_dir), size_guidance={"tensors": 0})
    acc.Reload()
    if tag not in acc.Tags()["tensors"]:
        raise ValueError(f"{run_dir}: no scalar {tag!r} in its event files")
    events = acc.Tensors(tag)
    steps = np.array([e.step for e in events], np.float64)
    values = np.array([float(make_ndarray(e.tensor_proto)) for e in events])
    order = np.argsort(steps, kind="stable")
    return steps[order], values[order]


def seed_band(
    curves: list[tuple[np.ndarray, np.ndarray]], points: int = 200
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(grid [G], mean [G], min [G], max [G]) over seeds, on the steps every seed reached."""
    start = max(s[0] for s, _ in curves)
    stop = min(s[-1] for s, _ in curves)
    grid = np.linspace(start, stop, points) if stop > start else np.array([start])
    ys = np.stack([np.interp(grid, s, v) for s, v in curves])  # [seeds, G]
    return grid, ys.mean(axis=0), ys.min(axis=0), ys.max(axis=0)


def parse_refs(values: list[str] | None, n: int) -> list[float | None]:
    """``--ref`` values, one per config (``none`` for no line); none given: no lines."""
    if not values:
        return [None] * n
    if len(values) != n:
        raise SystemExit(f"--ref takes one value per config ({n}), got {len(values)}")
    try:
        return [None if v.lower() == "none" else float(v) for v in values]
    except ValueError:
        raise SystemExit(f"--ref values must be numbers or 'none', got {values}") from None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("configs", nargs="+", type=Path, help="folders <logdir>/<name>/")
    parser.add_argument("--tag", default="eval/return_mean", help="scalar tag to plot")
    parser.add_argument("--out", type=Path, default=Path("curves.png"))
    parser.add_argument(
        "--ref", nargs="+", metavar="Y", help="a reference return per config, drawn dashed"
    )
    parser.add_argument("--ref-label", default="reference", help="legend of the --ref lines")
    args = parser.parse_args()
    refs = parse_refs(args.ref, len(args.configs))
    import matplotlib  # an experiments-only dependency

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(
        1, len(args.configs), figsize=(4 * len(args.configs), 3.2), squeeze=False
    )
    for ax, folder, ref in zip(axes[0], args.configs, refs, strict=True):
        runs = sorted(p for p in folder.iterdir() if p.is_dir())
        if not runs:
            raise SystemExit(f"{folder}: no run directories")
        grid, mean, low, high = seed_band([read_curve(r, args.tag) for r in runs])
        ax.plot(grid, mean, label=f"mean of {len(runs)} seeds")
        ax.fill_between(grid, low, high, alpha=0.3, label="min–max")
        if ref is not None:
            ax.axhline(ref, color="gray", linestyle="--", label=args.ref_label)
        ax.set_title(folder.name)
        ax.set_xlabel("env steps")
        ax.set_ylabel(args.tag)
        ax.legend(loc="lower right", fontsize="small")
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    print(args.out)


if __name__ == "__main__":
    main()
