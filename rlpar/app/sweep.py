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

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import logging
import math
import random
import shutil
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlpar.app.experiment import apply_overrides, load_experiment, read_toml, to_toml, toml_value
from rlpar.app.seeds import error_line
from rlpar.app.train import make_run_dir
from rlpar.config import ConfigError, is_ray_address
from rlpar.files import write_atomically

__all__ = ["KINDS", "Dimension", "SweepSpec", "load_space", "ranked", "run_sweep"]

log = logging.getLogger("rlpar")

KINDS = ("grid", "choice", "uniform", "loguniform", "randint")
"""How a dimension is drawn: ``grid`` (every value, crossed with the other grids), ``choice``
(one value per draw), ``uniform`` / ``loguniform`` [low, high] floats, ``randint`` [low, high)
integers."""

_SWEEP_KEYS = {
    "num_samples": (int, 1),
    "max_concurrent": (int, 1),
    "cpus_per_trial": (float, 0.01),
    "seed": (int, 0),
    "scheduler": (str, None),
    "grace_env_steps": (int, 1),
    "reduction_factor": (float, 1.0001),
    "perturbation_env_steps": (int, 1),
    "quantile_fraction": (float, 0.01),
    "resample_probability": (float, 0.0),
    "synch": (bool, None),
}
SCHEDULERS = ("asha", "fifo", "pbt")
_SCHEDULER_OF = {
    "grace_env_steps": "asha", "reduction_factor": "asha", "perturbation_env_steps": "pbt",
    "quantile_fraction": "pbt", "resample_probability": "pbt", "synch": "pbt",
}  # fmt: skip
"""The settings only one scheduler reads; beside another they are refused, not ignored."""
_MAXIMA = {"quantile_fraction": 0.5, "resample_probability": 1.0}
METRIC = "eval_return"
"""What each trial reports and what ranks them: the evaluated mean return."""


@dataclass(frozen=True)
class Dimension:
    """One swept key: ``key`` as ``--set`` names it, ``kind`` one of `KINDS`, ``values`` the
    list (grid, choice) or [low, high] (the ranges)."""

    key: str
    kind: str
    values: list[Any]

    def candidates(self) -> list[Any]:
        """Values that stand for the dimension when the config checks it: every listed value,
        or a range's ends."""
        if self.kind == "randint":
            return [self.values[0], self.values[1] - 1]
        return list(self.values)

    def tune_domain(self, tune: Any) -> Any:
        lo_hi = self.values
        return {
            "grid": lambda: tune.grid_search(list(self.values)),
            "choice": lambda: tune.choice(list(self.values)),
            "uniform": lambda: tune.uniform(*lo_hi),
            "loguniform": lambda: tune.loguniform(*lo_hi),
            "randint": lambda: tune.randint(*lo_hi),
        }[self.kind]()


@dataclass(frozen=True)
class SweepSpec:
    """A space file, read and checked against the experiment (see the module docstring)."""

    dimensions: list[Dimension]
    num_samples: int = 1
    max_concurrent: int | None = None
    cpus_per_trial: float = 1.0
    seed: int = 0
    scheduler: str = "asha"
    grace_env_steps: int | None = None
    reduction_factor: float = 2.0
    perturbation_env_steps: int | None = None
    quantile_fraction: float = 0.25
    resample_probability: float = 0.25
    synch: bool = True

    @property
    def grid_size(self) -> int:
        return math.prod(len(d.values) for d in self.dimensions if d.kind == "grid")

    @property
    def num_trials(self) -> int:
        return self.grid_size * self.num_samples


def _number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


def _dimension(where: str, key: str, spec: Any) -> Dimension:
    if not isinstance(spec, dict) or len(spec) != 1 or next(iter(spec)) not in KINDS:
        raise ConfigError(
            f"{where}: {key!r}: expected a table with one of {', '.join(KINDS)} "
            f"(e.g. {{ grid = [1, 2] }}), got {spec!r}"
        )
    kind, values = next(iter(spec.items()))
    if kind in ("grid", "choice"):
        if not isinstance(values, list) or not values:
            raise ConfigError(f"{where}: {key!r}: {kind} expects a non-empty list, got {values!r}")
        return Dimension(key, kind, values)
    ok = isinstance(values, list) and len(values) == 2 and all(_number(v) for v in values)
    if ok and kind == "randint":
        ok = all(isinstance(v, int) for v in values) and values[0] < values[1]
    elif ok:
        ok = values[0] < values[1] and (kind != "loguniform" or values[0] > 0)
    if not ok:
        expected = {
            "uniform": "[low, high] numbers with low < high",
            "loguniform": "[low, high] numbers with 0 < low < high",
            "randint": "[low, high) integers with low < high",
        }[kind]
        raise ConfigError(f"{where}: {key!r}: {kind} expects {expected}, got {values!r}")
    return Dimension(key, kind, [float(v) for v in values] if kind != "randint" else values)


def _flatten(table: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"agent": {"optim": {"lr": {...}}}}`` or ``{"agent.optim.lr": {...}}`` -> dotted keys
    of the leaves (tables whose one key is a kind)."""
    out: dict[str, Any] = {}
    for k, v in table.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and not (len(v) == 1 and next(iter(v)) in KINDS):
            out |= _flatten(v, key + ".")
        else:
            out[key] = v
    return out


def load_space(path: str | Path, config: str | Path, overrides: list[str] = []) -> SweepSpec:  # noqa: B006
    """Read the space file ``path`` and check it against the experiment ``config``: every key
    must be one the config accepts (a did-you-mean when not, as ``--set`` says) and every value
    of the right type and range (each listed value and each range's ends go through the
    config's own checks). `ConfigError` naming the key, what was expected and what came."""
    path = Path(path)
    where = f"--space {path}"
    data = read_toml(path, where, "no such file")
    unknown = sorted(set(data) - {"sweep", "space"})
    if unknown:
        raise ConfigError(f"{where}: unknown table(s) {unknown}: expected [sweep] and [space]")
    space = data.get("space")
    if not isinstance(space, dict) or not space:
        raise ConfigError(f"{where}: expected a [space] table naming at least one config key")
    dims = [_dimension(where, k, v) for k, v in _flatten(space).items()]
    settings = data.get("sweep", {})
    if not isinstance(settings, dict):
        raise ConfigError(f"{where}: [sweep] must be a table, got {settings!r}")
    kwargs: dict[str, Any] = {}
    for key, value in settings.items():
        if key not in _SWEEP_KEYS:
            raise ConfigError(
                f"{where}: [sweep] {key!r} is not a sweep setting; expected one of "
                f"{', '.join(_SWEEP_KEYS)}"
            )
        _check_setting(where, key, value)
        kwargs[key] = value
    scheduler = kwargs.get("scheduler", "asha")
    for key in kwargs:
        if _SCHEDULER_OF.get(key, scheduler) != scheduler:
            raise ConfigError(
                f'{where}: [sweep] {key} is a setting of scheduler "{_SCHEDULER_OF[key]}": '
                f'expected it only with that scheduler, got scheduler "{scheduler}"'
            )
    spec = SweepSpec(dims, **kwargs)
    _check_against_config(where, spec, config, overrides)
    return spec


def _check_setting(where: str, key: str, value: Any) -> None:
    tp, minimum = _SWEEP_KEYS[key]
    if key == "scheduler":
        if value not in SCHEDULERS:
            raise ConfigError(
                f'{where}: [sweep] scheduler: expected "asha", "fifo" or "pbt", got {value!r}'
            )
        return
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: [sweep] {key}: expected true or false, got {value!r}")
        return
    maximum = _MAXIMA.get(key)
    bad = not _number(value) or (tp is int and not isinstance(value, int)) or value < minimum
    if bad or (maximum is not None and value > maximum):
        kind = "an integer" if tp is int else "a number"
        bounds = f">= {minimum}" + (f" and <= {maximum}" if maximum is not None else "")
        raise ConfigError(f"{where}: [sweep] {key}: expected {kind} {bounds}, got {value!r}")


def _check_against_config(
    where: str, spec: SweepSpec, config: str | Path, overrides: list[str]
) -> None:
    exp = load_experiment(config, overrides)  # the experiment itself must be fine first
    for d in spec.dimensions:
        for value in d.candidates():
            try:
                load_experiment(config, [*overrides, f"{d.key}={toml_value(value)}"])
            except ConfigError as e:
                raise ConfigError(f"{where}: [space] {d.key!r} = {value!r}: {e}") from None
    if spec.scheduler == "asha" and exp.eval.interval_env_steps is None:
        raise ConfigError(
            f'{where}: scheduler "asha" stops trials on their evaluations during training: '
            "expected eval.interval_env_steps to be set in the config (or --set), got none; "
            'or use scheduler = "fifo"'
        )
    if spec.scheduler == "pbt":
        _check_pbt(where, spec, exp)


def _check_pbt(where: str, spec: SweepSpec, exp: Any) -> None:
    total, every = exp.runtime.total_env_steps, spec.perturbation_env_steps
    if every is None or every >= total:
        raise ConfigError(
            f'{where}: scheduler "pbt": expected [sweep] perturbation_env_steps, an integer '
            f"below runtime.total_env_steps ({total:,}), got {every!r}"
        )
    if exp.eval.episodes < 1:
        raise ConfigError(
            f'{where}: scheduler "pbt" scores each segment by its final evaluation: expected '
            f"eval.episodes >= 1 in the config (or --set), got {exp.eval.episodes}"
        )
    if spec.max_concurrent is not None:
        raise ConfigError(
            f'{where}: scheduler "pbt" makes the whole population at once and runs as many '
            "trials as Ray's CPUs take (the rest wait their turn): expected no [sweep] "
            f"max_concurrent, got {spec.max_concurrent}; bound it with cpus_per_trial instead"
        )
    if spec.num_trials < 2:
        raise ConfigError(
            f'{where}: scheduler "pbt" needs a population: expected at least 2 trials (grid '
            f"points x num_samples), got {spec.num_trials}"
        )


# ------------------------------------------------------------------------------ the trials


def _trial(tune_config: dict[str, Any], *, config: str, overrides: list[str], root: str) -> None:
    """One trial, in a Ray worker: train ``config`` with the trial's values, reporting each
    evaluated return to Tune."""
    from ray import tune

    from rlpar.app.train import Training

    ctx = tune.get_context()
    values = [f"{k}={toml_value(v)}" for k, v in tune_config.items()]
    exp = load_experiment(config, [*overrides, *values])
    run_dir = Path(root) / f"trial-{ctx.get_trial_id()}"
    training = Training(exp, run_dir=run_dir)
    seen = 0
    t0, started_at = time.perf_counter(), time.time()

    def on_progress(_: Any) -> None:
        nonlocal seen
        points, seen = training.runner.evaluations.since(seen)
        for point in points:
            tune.report({
                METRIC: point.results[0].mean_return, "env_steps": point.env_steps,
                "wall_s": time.perf_counter() - t0, "final": False, "run_dir": str(run_dir),
                "started_at": started_at, "reported_at": time.time(),
            })  # fmt: skip

    summary = training.run(quiet=True, on_progress=on_progress)
    evaluation = summary.get("evaluation") or []
    last = evaluation[0]["mean_return"] if evaluation else None
    if last is None:  # no final evaluation ([eval] episodes = 0): the last periodic one
        points, _ = training.runner.evaluations.since(0)
        last = points[-1].results[0].mean_return if points else float("nan")
    tune.report({
        METRIC: last, "env_steps": summary["env_steps"], "wall_s": summary["wall_s"],
        "final": True, "run_dir": summary["run_dir"],
        "started_at": started_at, "reported_at": time.time(),
    })  # fmt: skip


PBT_STATE = "pbt.json"
"""In each PBT checkpoint given to Tune, beside the rlpar checkpoint ``rlpar.ckpt``: the trial
that wrote it, the segments done, its env steps and the schedule that led to it."""


def _pbt_trial(
    tune_config: dict[str, Any], *, config: str, overrides: list[str], root: str, every: int
) -> None:
    """One PBT trial, in a Ray worker: train ``config`` with the trial's values in segments of
    ``every`` env steps, each resumed from the last one's checkpoint (or, after an exploit,
    from the checkpoint Tune hands over: another trial's), reporting each segment's final
    evaluation with its checkpoint. Tune's clock (``pbt_env_steps``) is the segment ends'
    ``k * every``; the last report repeats the previous end, so no perturbation follows the
    budget's end."""
    from ray import tune

    from rlpar.app.train import Training

    trial_id = tune.get_context().get_trial_id()
    trial_dir = Path(root) / f"trial-{trial_id}"
    trial_dir.mkdir(parents=True, exist_ok=True)
    values = [f"{k}={toml_value(v)}" for k, v in tune_config.items()]
    exp = load_experiment(config, [*overrides, *values])
    total = exp.runtime.total_env_steps
    done, resume, history, source, state = 0, None, [], None, {}
    given = tune.get_checkpoint()
    if given is not None:  # a restart: this trial's own checkpoint, or an exploited trial's
        with given.as_directory() as d:
            state = json.loads((Path(d) / PBT_STATE).read_text())
            done, history = int(state["segments"]), list(state["history"])
            resume = _unique(trial_dir / f"resume-{state['trial']}-{done}.ckpt")
            shutil.copyfile(Path(d) / "rlpar.ckpt", resume)
        if state["trial"] != trial_id:
            source = {"trial": state["trial"], "env_steps": state["env_steps"]}
    # A trial restarted from its own checkpoint (a pause) keeps the time it first started.
    started_at = state["started_at"] if given is not None and source is None else time.time()
    while True:
        end = min(total, (done + 1) * every)
        runtime = dataclasses.replace(exp.runtime, total_env_steps=end)
        training = Training(
            dataclasses.replace(exp, runtime=runtime),
            resume=resume,
            run_dir=_unique(trial_dir / f"segment-{done + 1}"),
        )
        summary = training.run(quiet=True)
        done += 1
        score = summary["evaluation"][0]["mean_return"]
        history.append({
            "trial": trial_id, "config": dict(tune_config), "env_steps": summary["env_steps"],
            METRIC: score, "wall_s": summary["wall_s"], "run_dir": summary["run_dir"],
            "continued_from": source,
        })  # fmt: skip
        source = None
        resume = summary["checkpoint"]
        final = summary["env_steps"] >= total or summary["stopped_by"] != "total_env_steps"
        with tempfile.TemporaryDirectory() as d:
            shutil.copyfile(resume, Path(d) / "rlpar.ckpt")
            state = {"trial": trial_id, "segments": done, "env_steps": summary["env_steps"],
                     "history": history, "started_at": started_at}  # fmt: skip
            (Path(d) / PBT_STATE).write_text(json.dumps(state))
            tune.report(
                {
                    METRIC: score, "env_steps": summary["env_steps"],
                    "pbt_env_steps": (done - 1 if final else done) * every,
                    "wall_s": sum(h["wall_s"] for h in history), "final": final,
                    "run_dir": summary["run_dir"], "history": json.dumps(history),
                    "started_at": started_at, "reported_at": time.time(),
                },
                checkpoint=tune.Checkpoint.from_directory(d),
            )  # fmt: skip
        if final:
            return


def _unique(path: Path) -> Path:
    """``path``, or ``path`` with ``-r2``, ``-r3``, ... added to its stem when that exists (a
    segment run again after a restart keeps the first one's files)."""
    for i in itertools.count(1):
        candidate = path if i == 1 else path.with_name(f"{path.stem}-r{i}{path.suffix}")
        if not candidate.exists():
            return candidate
    raise AssertionError("unreachable")


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
    from rlpar.runtime.ray_backend import connect_ray

    exp = load_experiment(config, overrides)
    if logdir is not None:
        exp = dataclasses.replace(exp, log=dataclasses.replace(exp.log, logdir=logdir))
    # Connected first: an address that does not answer leaves no empty sweep directory.
    ray, owned = connect_ray(address, num_cpus, what="--address")
    try:
        root = make_run_dir(Path(exp.log.logdir).resolve() / exp.name, prefix="sweep-")
        grid = _fit(spec, exp, str(Path(config).resolve()), list(overrides), root)
    finally:
        if owned:  # a connection the caller had stays theirs
            ray.shutdown()
    rows = ranked(_rows(grid, spec))
    _write_results(root, exp.name, spec, rows, config, overrides)
    return root, rows


def _fit(spec: SweepSpec, exp: Any, config: str, overrides: list[str], root: Path) -> Any:
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler
    from ray.tune.search.basic_variant import BasicVariantGenerator

    scheduler: Any
    trial: Any = _trial
    extra: dict[str, Any] = {}
    if spec.scheduler == "pbt":
        scheduler = _pbt(spec)
        trial, extra = _pbt_trial, {"every": spec.perturbation_env_steps}
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
        trial, config=config, overrides=overrides, root=str(root), **extra
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


def _rows(grid: Any, spec: SweepSpec) -> list[dict[str, Any]]:
    rows = []
    for i, result in enumerate(grid):
        m = result.metrics or {}
        keys = [d.key for d in spec.dimensions]
        row: dict[str, Any] = {
            "trial": i,
            "trial_id": m.get("trial_id"),
            "config": {k: result.config.get(k) for k in keys},
            METRIC: m.get(METRIC),
            "env_steps": m.get("env_steps"),
            "wall_s": m.get("wall_s"),
            "run_dir": m.get("run_dir"),
            # Unix times: when the trial started, and its last report (its end, or its stop).
            "started_at": m.get("started_at"),
            "ended_at": m.get("reported_at"),
        }
        if result.error is not None:
            row["status"] = f"crashed: {error_line(str(result.error))}"
        elif m.get("final"):
            row["status"] = "finished"
        elif spec.scheduler == "pbt":  # PBT stops no trial: this one did not report its end
            row["status"] = f"ended at {m.get('env_steps') or 0:,} env steps"
        else:
            row["status"] = f"stopped by ASHA at {m.get('env_steps') or 0:,} env steps"
        if spec.scheduler == "pbt":
            row["schedule"] = json.loads(m["history"]) if m.get("history") else []
        if isinstance(row[METRIC], float) and math.isnan(row[METRIC]):
            row[METRIC] = None
        rows.append(row)
    return rows


def ranked(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Finished trials first, then stopped ones, then crashed; each by return, best first."""

    def key(r: dict[str, Any]) -> tuple[int, float]:
        order = 0 if r["status"] == "finished" else 2 if r["status"].startswith("crashed") else 1
        value = r[METRIC]
        return order, -(value if value is not None else -math.inf)

    return sorted(rows, key=key)


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return "" if v is None else str(v)


def _schedules(rows: list[dict[str, Any]], keys: list[str]) -> list[str]:
    """results.md's PBT part: each trial's segments, in order, with the values each ran with
    and the trial whose checkpoint a segment continued from."""
    lines = ["", "## Schedules", ""]
    for rank, r in enumerate(rows, 1):
        lines += [
            f"### {rank}. trial {r.get('trial_id')}", "",
            "| segment | ran in trial | " + " | ".join(f"`{k}`" for k in keys)
            + " | env steps | evaluated return | continued from |",
            "|---" * (len(keys) + 5) + "|",
        ]  # fmt: skip
        for i, seg in enumerate(r.get("schedule", []), 1):
            source = seg.get("continued_from")
            came = f"trial {source['trial']} at {source['env_steps']:,}" if source else ""
            cells = " | ".join(_fmt(seg["config"].get(k)) for k in keys)
            lines.append(
                f"| {i} | {seg['trial']} | {cells} | {seg['env_steps']:,} "
                f"| {_fmt(seg[METRIC])} | {came} |"
            )
        lines.append("")
    return lines


def _write_results(
    root: Path, name: str, spec: SweepSpec, rows: list[dict[str, Any]], config: str,
    overrides: list[str],
) -> None:  # fmt: skip
    keys = [d.key for d in spec.dimensions]
    best = next((r for r in rows if r["status"] == "finished"), None)
    write_atomically(
        root / "results.json",
        json.dumps({"metric": METRIC, "mode": "max", "trials": rows, "best": best}, indent=2),
    )
    lines = [
        f"# Sweep of {name}: {len(rows)} trials, ranked by the evaluated return",
        "",
        "| rank | " + " | ".join(f"`{k}`" for k in keys) + " | evaluated return | env steps "
        "| wall s | status |",
        "|---" * (len(keys) + 5) + "|",
    ]
    for rank, r in enumerate(rows, 1):
        cells = [_fmt(r["config"][k]) for k in keys]
        lines.append(
            f"| {rank} | " + " | ".join(cells)
            + f" | {_fmt(r[METRIC])} | {_fmt(r['env_steps'])} | {_fmt(r['wall_s'])} "
            f"| {r['status']} |"
        )  # fmt: skip
    if spec.scheduler == "pbt":
        lines += _schedules(rows, keys)
    write_atomically(root / "results.md", "\n".join(lines) + "\n")
    if best is None:
        log.warning("sweep: no trial finished, so no best.toml")
        return
    file_data = read_toml(Path(config), str(config), "no such experiment file")
    values = [f"{k}={toml_value(v)}" for k, v in best["config"].items()]
    data = apply_overrides(file_data, [*overrides, *values])
    header = (
        f"# {Path(config).name} with the best values of the sweep in {root}\n"
        f"# ({', '.join(values)}: evaluated return {_fmt(best[METRIC])} after "
        f"{_fmt(best['env_steps'])} env steps)\n"
    )
    if spec.scheduler == "pbt":
        header += "# PBT: the best trial's last values; its schedule is in results.md\n"
    write_atomically(root / "best.toml", header + to_toml(data))
