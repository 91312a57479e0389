"""`run_sweep`: the Tune run of ``rlpar sweep`` (the scheduler, the trials, the search)."""

from __future__ import annotations

import contextlib
import dataclasses
import random
import sys
import warnings
from pathlib import Path
from typing import Any

from rlpar.app.experiment import load_experiment
from rlpar.app.sweep.results import ranked, trial_rows, write_results
from rlpar.app.sweep.space import METRIC, SweepSpec, load_space
from rlpar.app.sweep.trials import pbt_trial, trial
from rlpar.app.train import make_run_dir
from rlpar.config import ConfigError, is_ray_address

__all__ = ["fit", "run_sweep"]


def run_sweep(
    config: str,
    space: str,
    overrides: list[str] = [],  # noqa: B006
    logdir: str | None = None,
    address: str | None = None,
    num_cpus: int | None = None,
) -> tuple[Path, list[dict[str, Any]]]:
    """Run the sweep (module docstring); returns (the sweep directory, the ranked rows)."""
    if address is not None and not is_ray_address(address):
        raise ConfigError(
            f'--address: expected "auto" or host:port of a Ray cluster, got {address!r}'
        )
    spec = load_space(space, config, overrides)
    try:
        from ray import tune  # noqa: F401  (checked before anything is made)
    except ImportError:
        raise ConfigError('rlpar sweep needs Ray Tune: pip install "rlpar[sweep]"') from None
    from rlpar.runtime.ray import connect_ray

    exp = load_experiment(config, overrides)
    if logdir is not None:
        exp = dataclasses.replace(exp, log=dataclasses.replace(exp.log, logdir=logdir))
    # Connected first: an address that does not answer leaves no empty sweep directory.
    ray, owned = connect_ray(address, num_cpus, what="--address")
    try:
        root = make_run_dir(Path(exp.log.logdir).resolve() / exp.name, prefix="sweep-")
        grid = fit(spec, exp, str(Path(config).resolve()), list(overrides), root)
    finally:
        if owned:  # a connection the caller had stays theirs
            ray.shutdown()
    rows = ranked(trial_rows(grid, spec))
    write_results(root, exp.name, spec, rows, config, overrides)
    return root, rows


def fit(spec: SweepSpec, exp: Any, config: str, overrides: list[str], root: Path) -> Any:
    """Tune's result grid of the sweep ``spec`` of ``config`` (with ``overrides``), its trials
    under ``root``."""
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler
    from ray.tune.search.basic_variant import BasicVariantGenerator

    scheduler: Any
    trainable_fn: Any = trial
    extra: dict[str, Any] = {}
    if spec.scheduler == "pbt":
        scheduler = _pbt(spec)
        trainable_fn, extra = pbt_trial, {"every": spec.perturbation_env_steps}
    elif spec.scheduler == "asha":
        total = exp.runtime.total_env_steps
        scheduler = ASHAScheduler(
            time_attr="env_steps", max_t=total,
            grace_period=spec.grace_env_steps or max(1, exp.eval.interval_env_steps),
            reduction_factor=spec.reduction_factor,
        )  # fmt: skip
    else:
        scheduler = FIFOScheduler()
    trainable = tune.with_parameters(
        trainable_fn, config=config, overrides=overrides, root=str(root), **extra
    )
    tuner = tune.Tuner(
        tune.with_resources(trainable, {"cpu": spec.cpus_per_trial}),
        param_space={d.key: d.tune_domain(tune) for d in spec.dimensions},
        tune_config=tune.TuneConfig(
            metric=METRIC, mode="max", num_samples=spec.num_samples, scheduler=scheduler,
            # The generator limits concurrency itself (Tune ignores max_concurrent_trials
            # next to a search generator, with a warning).
            # (PBT: None; load_space refuses it, the population is made at once.)
            search_alg=BasicVariantGenerator(
                random_state=spec.seed, max_concurrent=spec.max_concurrent or 0
            ),
        ),
        run_config=tune.RunConfig(
            name="tune", storage_path=str(root), verbose=0,
            failure_config=tune.FailureConfig(max_failures=0),
        ),
    )  # fmt: skip
    saved = random.getstate()
    if spec.scheduler == "pbt":
        random.seed(spec.seed)  # PBT explores with the random module's draws
    # Tune prints its own tables; stdout is the command's (the ranked table, or --json).
    try:
        with contextlib.redirect_stdout(sys.stderr), warnings.catch_warnings():
            # Reusing actors would not help: each PBT segment is a new rlpar run anyway.
            warnings.filterwarnings("ignore", message="Consider boosting PBT performance")
            return tuner.fit()
    finally:
        random.setstate(saved)  # the caller's stream, as it was


def _pbt(spec: SweepSpec) -> Any:
    """Tune's PBT over the space: ranges perturbed (and kept inside their bounds), listed
    values moved to a neighbour, or either drawn anew."""
    from ray import tune
    from ray.tune.schedulers import PopulationBasedTraining

    def keep_inside(config: dict[str, Any]) -> dict[str, Any]:
        for d in spec.dimensions:
            if d.kind in ("uniform", "loguniform"):
                config[d.key] = min(max(float(config[d.key]), d.values[0]), d.values[1])
            elif d.kind == "randint":
                config[d.key] = min(max(int(config[d.key]), d.values[0]), d.values[1] - 1)
        return config

    every = spec.perturbation_env_steps
    if every is None:  # load_space refuses a "pbt" space without it
        raise ValueError("a PBT sweep needs perturbation_env_steps")
    mutations = {
        d.key: list(d.values) if d.kind in ("grid", "choice") else d.tune_domain(tune)
        for d in spec.dimensions
    }
    return PopulationBasedTraining(
        time_attr="pbt_env_steps", perturbation_interval=every,
        hyperparam_mutations=mutations, quantile_fraction=spec.quantile_fraction,
        resample_probability=spec.resample_probability, custom_explore_fn=keep_inside,
        synch=spec.synch,
    )  # fmt: skip
