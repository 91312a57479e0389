"""Learning curves over seeds for RESULTS.md: a thin user of ``rlpar plot`` (rlpar/app/plot.py).

    pip install ".[plot]"
    python experiments/plot_curves.py runs/results/minatar_breakout_suite \\
        runs/results/minatar_asterix_suite --tag eval/return_mean --out curves.png \\
        --ref 17.5 19 --ref-label "paper AC(λ) at 5M"

is ``rlpar plot`` with the same arguments; each argument is a folder of runs of one config.
"""

from __future__ import annotations

import sys

from rlpar.app.cli import main

if __name__ == "__main__":
    sys.exit(main(["plot", *sys.argv[1:]]))
