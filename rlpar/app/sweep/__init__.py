"""``rlpar sweep CONFIG --space SPACE.toml``: hyper-parameter sweeps on Ray Tune.

The space file names config keys (as ``--set`` does) and how to draw each::

    [sweep]
    num_samples = 4          # draws of the random dimensions (each grid point gets them all)
    max_concurrent = 2       # trials at a time (default: the CPUs Ray sees / cpus_per_trial;
                             # PBT: not set, the CPUs bound it)
    cpus_per_trial = 1
    seed = 0                 # Tune's draws: the same space and seed give the same trials
    scheduler = "asha"       # or "fifo": every trial runs its whole budget
    grace_env_steps = 200000 # ASHA: no trial stops before this many env steps
    reduction_factor = 2     # ASHA: the best 1/reduction_factor of a rung goes on

    # scheduler = "pbt": population-based training (below); a setting of another scheduler
    # than the one named is refused
    # perturbation_env_steps = 500000  # PBT: exploit and explore every this many env steps
    # quantile_fraction = 0.25         # PBT: the bottom quarter copies the top quarter
    # resample_probability = 0.25      # PBT: a value is drawn anew instead of perturbed
    # synch = true                     # PBT: the population perturbs at the same env steps

    [space]
    "agent.optim.lr" = { loguniform = [1e-4, 3e-3] }
    "agent.passes" = { grid = [1, 2, 3] }
    "agent.epochs" = { choice = [2, 4] }
    "agent.entropy_cost" = { uniform = [0.001, 0.02] }
    "runtime.unroll_length" = { randint = [16, 33] }   # [low, high)

Each trial is one training run of CONFIG with its values set, in a Ray worker process, in a
run directory of its own (``trial-<Tune's trial id>/``, what ``rlpar train`` makes for one).
It reports the evaluated return (the first policy of ``[eval]``) of every periodic evaluation
(``eval.interval_env_steps``) and of the final one, with the env steps so far; ASHA stops a
trial at a rung (in env steps) when its return is below the rung's best 1/reduction_factor.

With ``scheduler = "pbt"`` the trials are a population (the space's grid points and draws,
``num_samples`` each) trained in segments of ``perturbation_env_steps``: each segment is an
rlpar run resumed from the previous segment's final checkpoint, and its final evaluation
(``[eval] episodes``, the same parameters as the checkpoint) is the score. At each segment
end a trial in the bottom ``quantile_fraction`` continues from the exact checkpoint of one in
the top (parameters, optimizer moments, counters and RNG states), with that trial's values
explored: a range's value times 0.8 or 1.2, kept inside the range, a listed value moved to a
neighbour, or, with ``resample_probability``, drawn anew. The learning rate of the resumed run
is the new config's. Keys that change the net cannot be mutated (its checkpoint would not fit).
Each trial's schedule (the values and return of each segment, and whose checkpoint it
continued from) goes into ``results.json`` and ``results.md``; ``best.toml`` holds the best
trial's last values.

The sweep directory ``<log.logdir>/<name>/sweep-<timestamp>/`` gets ``results.json`` and
``results.md`` (the trials ranked by their last evaluated return, finished trials first, with
how each ended: "finished", "stopped by ASHA at N env steps", "crashed: ...") and
``best.toml``: CONFIG's own tables with the best finished trial's values set, ready to commit.
Each is written to a temporary file and renamed.

Ray is started on this machine (127.0.0.1 only, no dashboard, no usage statistics) unless
``address`` names a cluster. Needs ``pip install "rlpar[sweep]"`` (Ray Tune).
"""

from rlpar.app.sweep.results import ranked, trial_rows
from rlpar.app.sweep.run import run_sweep
from rlpar.app.sweep.space import KINDS, METRIC, SCHEDULERS, Dimension, SweepSpec, load_space
from rlpar.app.sweep.trials import PBT_STATE

__all__ = [
    "KINDS",
    "METRIC",
    "PBT_STATE",
    "SCHEDULERS",
    "Dimension",
    "SweepSpec",
    "load_space",
    "ranked",
    "run_sweep",
    "trial_rows",
]
