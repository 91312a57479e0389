"""The space file of ``rlpar sweep`` (the package docstring shows one): its dimensions and
settings, read and checked against the experiment before anything runs."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlpar.app.experiment import load_experiment, read_toml, toml_value
from rlpar.config import ConfigError

__all__ = ["KINDS", "METRIC", "SCHEDULERS", "Dimension", "SweepSpec", "load_space"]


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
