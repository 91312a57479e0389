"""Typed, validated, immutable configuration.

Each section is a frozen dataclass whose fields carry their meaning in the docstring lines
below them; `from_dict` builds one from plain data (a TOML table), naming the offending key,
the expected type and the value given on any error. Unknown keys are reported all at once
(`UnknownKeysError`), each with a "did you mean" that also looks into nested tables
(``agent.lr`` -> ``agent.optim.lr``).
A dataclass that renamed a key keeps the old name readable with a class attribute
``renamed_keys: ClassVar[dict[str, str]] = {"old": "new"}``: `from_dict` reads the old key as
the new one, with a DeprecationWarning and a warning on rlpar's log that names the new key.
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
import types
import typing
import warnings
from dataclasses import dataclass, field
from typing import Any, TypeVar

from rlpar._checks import did_you_mean

#: The ways a learner step can share its threads (`RuntimeConfig.learner_split`).
LEARNER_SPLITS = ("auto", "rows", "shards")

__all__ = [
    "ConfigError",
    "EnvConfig",
    "EvalConfig",
    "RuntimeConfig",
    "UnknownKey",
    "UnknownKeysError",
    "check_env_layout",
    "check_field_types",
    "from_dict",
    "is_ray_address",
    "to_dict",
    "unknown_keys",
]

T = TypeVar("T")

log = logging.getLogger("rlpar")


class ConfigError(ValueError):
    """A configuration key is unknown, of the wrong type, or out of range."""


@dataclass(frozen=True)
class UnknownKey:
    """One key no config field has: its full name, a " (did you mean ...)" or "", and the
    valid keys of its table."""

    key: str
    hint: str
    valid: tuple[str, ...]

    def message(self) -> str:
        valid = f"; valid keys: {', '.join(self.valid)}" if self.valid else ""
        return f"unknown key '{self.key}'{self.hint}{valid}"


class UnknownKeysError(ConfigError):
    """Every unknown key of a config at once (``problems``), so one run names them all."""

    def __init__(self, problems: list[UnknownKey], origins: dict[str, str] | None = None) -> None:
        """``origins``: key -> where it was given (e.g. ``--set agent.lr=0.1``), if known."""
        self.problems = problems
        origins = origins or {}
        if len(problems) == 1:
            text = problems[0].message()
        else:
            lines = [
                f"'{p.key}'"
                + (p.hint if p.hint else f"; valid keys: {', '.join(p.valid)}")
                + (f", from {origins[p.key]}" if p.key in origins else "")
                for p in problems
            ]
            text = f"{len(problems)} unknown keys:\n  " + "\n  ".join(lines)
        super().__init__(text)


def unknown_keys(cls: type, data: dict[str, Any], prefix: str = "") -> list[UnknownKey]:
    """The keys of ``data`` (a table for dataclass ``cls``; ``prefix``: its full name, e.g.
    ``"agent."``) that no field of ``cls`` has, recursively into nested config tables, in
    the order given. A key renamed by ``cls.renamed_keys`` is known."""
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(typing.cast(Any, cls)) if f.init]
    renamed: dict[str, str] = getattr(cls, "renamed_keys", {})
    found: list[UnknownKey] = []
    for key, value in data.items():
        if key in renamed:
            continue
        if key not in names:
            hint = _nested_hint(str(key), cls, prefix)
            found.append(UnknownKey(f"{prefix}{key}", hint, tuple(sorted(names))))
            continue
        nested = _config_class(hints[key])
        if nested is not None and isinstance(value, dict):
            found += unknown_keys(nested, value, f"{prefix}{key}.")
    return found


def _config_class(tp: Any) -> type | None:
    """The dataclass of a field annotated ``tp`` (also ``X | None``), else None."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        classes = [a for a in typing.get_args(tp) if _config_class(a) is not None]
        return classes[0] if len(classes) == 1 else None
    return tp if isinstance(tp, type) and dataclasses.is_dataclass(tp) else None


def _field_paths(cls: type, prefix: str = "") -> list[str]:
    """Every key of ``cls``'s table and of its nested tables, e.g. ``["gamma", "optim",
    "optim.lr", ...]``."""
    hints = typing.get_type_hints(cls)
    paths: list[str] = []
    for f in dataclasses.fields(typing.cast(Any, cls)):
        if not f.init:
            continue
        paths.append(f"{prefix}{f.name}")
        nested = _config_class(hints[f.name])
        if nested is not None:
            paths += _field_paths(nested, f"{prefix}{f.name}.")
    return paths


def _nested_hint(key: str, cls: type, prefix: str) -> str:
    """`` (did you mean '<prefix>optim.lr'?)`` for ``key`` = ``lr``: a nested table's key of
    that name first, else the closest key of this table, else the closest nested key."""
    paths = _field_paths(cls)
    same_leaf = [p for p in paths if "." in p and p.rsplit(".", 1)[1] == key]
    if same_leaf:
        return " (did you mean " + " or ".join(f"'{prefix}{p}'" for p in same_leaf) + "?)"
    direct = did_you_mean(key, [p for p in paths if "." not in p], prefix)
    if direct:
        return direct
    leaves = {p.rsplit(".", 1)[1]: p for p in reversed(paths) if "." in p}
    close = difflib.get_close_matches(key, list(leaves), n=1)
    return f" (did you mean '{prefix}{leaves[close[0]]}'?)" if close else ""


def _type_name(tp: Any) -> str:
    if isinstance(tp, type):
        return tp.__name__
    return str(tp).replace("typing.", "")


def _convert(value: Any, tp: Any, key: str) -> Any:
    """Check ``value`` against the annotation ``tp`` (int accepted for float; no other coercion)."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _convert(value, arg, key)
            except ConfigError:
                pass
        raise ConfigError(f"{key}: expected {_type_name(tp)}, got {value!r}")
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        (item,) = typing.get_args(tp)[:1] or (Any,)
        items = [_convert(v, item, f"{key}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict or tp is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a table, got {value!r}")
        return dict(value)
    if tp is Any:
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key}: expected true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key}: expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key}: expected a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key}: expected a string, got {value!r}")
        return value
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a table, got {value!r}")
        return from_dict(tp, value, prefix=f"{key}.")
    raise ConfigError(f"{key}: unsupported type {_type_name(tp)}")


def from_dict(cls: type[T], data: dict[str, Any], prefix: str = "") -> T:
    """Build dataclass ``cls`` from ``data``; unknown keys and bad values raise ConfigError."""
    unknown = unknown_keys(cls, data, prefix)
    if unknown:
        raise UnknownKeysError(unknown)
    data = _renamed(cls, data, prefix)
    hints = typing.get_type_hints(cls)
    kwargs = {k: _convert(v, hints[k], prefix + k) for k, v in data.items()}
    try:
        return cls(**kwargs)
    except ConfigError as e:
        raise ConfigError(f"{prefix}{e}") from None


def _renamed(cls: type, data: dict[str, Any], prefix: str) -> dict[str, Any]:
    """``data`` with each old key of ``cls.renamed_keys`` given as its new name (warning)."""
    renamed: dict[str, str] = getattr(cls, "renamed_keys", {})
    old_keys = [key for key in data if key in renamed]
    if not old_keys:
        return data
    data = dict(data)
    for old in old_keys:
        new = renamed[old]
        if new in data:
            raise ConfigError(
                f"'{prefix}{old}' is the old name of '{prefix}{new}': give only '{prefix}{new}'"
            )
        message = f"'{prefix}{old}' is deprecated: it is now '{prefix}{new}' (same meaning)"
        warnings.warn(message, DeprecationWarning, stacklevel=4)
        log.warning("%s", message)
        data[new] = data.pop(old)
    return data


def check_field_types(obj: Any) -> None:
    """Check every field of the config dataclass ``obj`` against its annotation, exactly as
    `from_dict` checks a TOML table (so ``RuntimeConfig(num_actors="2")`` fails as the TOML
    would), and store the converted values (an int given for a float becomes a float).
    Call it first in ``__post_init__``."""
    hints = typing.get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        value = _convert(getattr(obj, f.name), hints[f.name], f.name)
        object.__setattr__(obj, f.name, value)  # frozen dataclasses too


def to_dict(obj: Any) -> dict[str, Any]:
    """Plain JSON data from a config dataclass (values JSON cannot hold become their repr)."""

    def plain(v: Any) -> Any:
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            return {f.name: plain(getattr(v, f.name)) for f in dataclasses.fields(v)}
        if isinstance(v, dict):
            return {str(k): plain(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [plain(x) for x in v]
        if v is None or isinstance(v, (bool, int, float, str)):
            return v
        return repr(v)

    return plain(obj)


def _check(ok: bool, key: str, expected: str, value: Any) -> None:
    if not ok:
        raise ConfigError(f"{key}: expected {expected}, got {value!r}")


def is_ray_address(address: str) -> bool:
    """``"auto"`` or ``host:port`` (what ``ray.init`` takes; no Ray Client ``ray://``)."""
    host, _, port = address.rpartition(":")
    return address == "auto" or (
        bool(host) and "/" not in host and port.isdigit() and 0 < int(port) < 65536
    )


@dataclass(frozen=True)
class EnvConfig:
    """Which environment every actor runs."""

    id: str = "CartPole-v1"
    """gymnasium id, e.g. "CartPole-v1", or one registered by a plug-in ("rlpar/CartPole-v1")."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments for the env's constructor (with vectorization "ale": for ale-py's
    `AtariVectorEnv`, over rlpar's Atari defaults; "envpool": for `envpool.make`)."""
    setup: str | None = None
    """Run first, to register the id: "module" (imported) or "module:function" (called), e.g.
    "minatar.gym:register_envs". `rlpar eval` runs a checkpoint's hook only with your word
    (`--set env.setup=...` or `--trust-checkpoint-setup`)."""

    drop_keys: list[str] = field(default_factory=list)
    """Keys of a Dict observation space left out of what the net is fed (e.g. ["mission"]:
    MiniGrid's text, which cannot be). Every other space is encoded as `rlpar.spaces` says:
    Discrete and MultiDiscrete one-hot, Dict and Tuple leaves side by side."""

    vectorization: str = "sync"
    """How an actor's envs are stepped: "sync" (in the actor thread; Python envs hold the GIL,
    so only one actor thread steps at a time), "async" (worker processes, see
    `workers_per_actor`: for Python envs whose step costs far more than a pipe round trip,
    on machines with cores to spare; on 2 cores MinAtar, ~10 µs a step, is faster on "sync":
    docs/runtime.md, Env modes), "ale"
    (ale-py's C++ Atari vector env for ids like "ALE/Pong-v5", standard Atari preprocessing;
    `pip install "rlpar[atari]"`) or "envpool" (EnvPool's C++ envs; `pip install
    "rlpar[envpool]"`). "async", "ale" and "envpool" step with the GIL released."""
    workers_per_actor: int | None = None
    """"async": worker processes per actor, each stepping envs_per_actor / workers_per_actor
    envs in turn (must divide envs_per_actor); None: the number of cores, rounded down to a
    divisor of envs_per_actor."""
    double_buffer: bool = False
    """Split each actor's envs into two halves and run inference on one half while the other
    steps (envs_per_actor must be even). With "sync" the actor thread steps one half while
    the other half's forward and sampling run on a thread of its own without the GIL (an
    agent that samples natively; else the halves take turns): it pays where the forward is
    a large share of an actor's time (a conv policy, MinAtar), not for a small MLP."""

    def __post_init__(self) -> None:
        check_field_types(self)
        _check(bool(self.id), "id", "a gymnasium environment id", self.id)
        modes = ("sync", "async", "ale", "envpool")
        _check(
            self.vectorization in modes,
            "vectorization",
            " | ".join(f'"{m}"' for m in modes),
            self.vectorization,
        )
        _check(
            self.workers_per_actor is None or self.workers_per_actor >= 1,
            "workers_per_actor",
            "None or an integer >= 1",
            self.workers_per_actor,
        )


@dataclass(frozen=True)
class RuntimeConfig:
    """How many actors, envs and steps; what the learner consumes; when the run stops."""

    num_actors: int = 2
    """Actor threads; each owns `envs_per_actor` envs and steps them together."""
    envs_per_actor: int = 16
    """K: envs per actor, stepped as one vector env with one batched forward per step."""
    unroll_length: int = 20
    """T: steps per rollout; a rollout is acted with one parameter version."""
    batch_rollouts: int = 2
    """B: rollouts per learner step (the learner sees [T, B * K])."""
    buffers_per_actor: int = 2
    """Preallocated rollouts per actor: an actor waits when all of its are queued."""
    learner_threads: int = 1
    """Threads for one learner step (see `learner_split` for how they share it). More than 1
    pays where cores are idle (see `rlpar bench net` and `rlpar bench scaling`), also beside
    actors that leave part of a core, as on `minatar_breakout_suite`. With "rows", a built-in
    agent's step on the AVX-512 kernels gives the same floats as one thread's (tested); with
    "shards" the gradient's sum rounds differently, but a given count is still reproducible."""
    learner_split: str = "auto"
    """How a learner step computed with rlpar.loss_gradient (the built-in agents', and any
    agent's that calls it) shares its `learner_threads` threads:
    "rows": the net's forward and backward split the torso's batch rows over the threads inside
    each native call (rlpar.ThreadPool); the loss, the heads and an LSTM core run once.
    "shards": the batch's [T, N] columns are split into one shard per thread, and each thread
    runs forward, loss and backward of its shard; the shards' gradients are summed.
    "auto": "rows" for a net with a conv torso (nearly all of its step), "shards" otherwise
    (on flat inputs the loss, the heads or an LSTM core, which rows run once, are a large share
    of the step). A step too small to pay for the hand-off runs on one thread either way."""
    max_policy_lag: int | None = None
    """Drop rollouts older than this many learner versions (None: keep all)."""
    seed: int = 0
    """Seeds parameters, every env (from seed, actor, env index) and every actor's sampler."""
    deterministic: bool = False
    """Fixed schedule: each learner step consumes exactly the B rollouts made from the previous
    version (B must be a multiple of num_actors), and the run stops after exactly
    ceil(total_env_steps / (B * T * K)) learner steps, so two runs with one seed end with
    bit-identical parameters. target_return is then checked between learner steps, over the
    episodes of the rollouts consumed so far, so it stops a run at the same step every time
    (max_wall_s still stops it at a moment that depends on timing)."""
    total_env_steps: int = 1_000_000
    """Stop after this many env steps."""
    target_return: float | None = None
    """Stop once the mean return of the last `return_window` episodes reaches this."""
    return_window: int = 20
    """Episodes in the moving window for the mean return."""
    max_wall_s: float | None = None
    """Stop after this many seconds (None: no limit)."""
    join_timeout_s: float = 2.0
    """How long shutdown waits for each thread before reporting it as stuck."""
    checkpoint_interval_s: float | None = 60.0
    """Write a checkpoint this often (None: only at the end)."""
    backend: str = "threads"
    """Where the actors run: "threads" (threads of this process: the fastest on one machine) or
    "ray" (Ray actor processes, on this machine or a cluster; the learner stays in this process;
    needs `pip install "rlpar[ray]"`)."""
    ray_address: str | None = None
    """Backend "ray": None starts a local Ray instance (listening on 127.0.0.1 only); "auto" or
    "host:port" joins a running cluster (`ray start --head`)."""
    ray_actor_threads: int = 1
    """Backend "ray": actor threads per Ray actor process (num_actors must be a multiple); the
    threads of one process share one native net and one snapshot store."""

    def __post_init__(self) -> None:
        check_field_types(self)
        at_least_one = ("num_actors", "envs_per_actor", "unroll_length", "batch_rollouts")
        for key in (*at_least_one, "buffers_per_actor", "total_env_steps", "return_window"):
            value = getattr(self, key)
            _check(value >= 1, key, "an integer >= 1", value)
        lag = self.max_policy_lag
        _check(lag is None or lag >= 0, "max_policy_lag", "None or an integer >= 0", lag)
        _check(self.seed >= 0, "seed", "an integer >= 0", self.seed)
        for key in ("max_wall_s", "checkpoint_interval_s"):
            value = getattr(self, key)
            _check(value is None or value > 0, key, "None or a number > 0", value)
        _check(self.join_timeout_s > 0, "join_timeout_s", "a number > 0", self.join_timeout_s)
        threads = self.learner_threads
        _check(1 <= threads <= 256, "learner_threads", "an integer from 1 to 256", threads)
        split = self.learner_split
        _check(split in LEARNER_SPLITS, "learner_split", '"auto", "rows" or "shards"', split)
        self._check_backend()
        # A learner step waits for B rollouts while the actors have only this many: fewer
        # would never make a batch (every buffer queued or held by the learner: a hang).
        need = -(-self.batch_rollouts // self.num_actors)
        _check(
            self.buffers_per_actor >= need,
            "buffers_per_actor",
            f"at least ceil(batch_rollouts / num_actors) = {need} (a learner step takes "
            f"{self.batch_rollouts} rollouts; {self.num_actors} actor(s) with fewer buffers "
            "could never fill it)",
            self.buffers_per_actor,
        )
        if self.deterministic:
            _check(
                self.batch_rollouts % self.num_actors == 0,
                "batch_rollouts",
                f"a multiple of num_actors ({self.num_actors}) in deterministic mode",
                self.batch_rollouts,
            )

    def _check_backend(self) -> None:
        """backend, ray_address and ray_actor_threads, and deterministic mode's backend."""
        _check(self.backend in ("threads", "ray"), "backend", '"threads" or "ray"', self.backend)
        _check(
            self.ray_address is None or is_ray_address(self.ray_address),
            "ray_address",
            'None, "auto" or "host:port" (Ray Client "ray://" addresses are not supported)',
            self.ray_address,
        )
        _check(
            self.ray_actor_threads >= 1 and self.num_actors % self.ray_actor_threads == 0,
            "ray_actor_threads",
            f"an integer >= 1 that divides num_actors ({self.num_actors})",
            self.ray_actor_threads,
        )
        _check(
            not (self.deterministic and self.backend == "ray"),
            "deterministic",
            'false with backend "ray" (the fixed schedule needs backend "threads")',
            self.deterministic,
        )

    @property
    def env_steps_per_rollout(self) -> int:
        return self.unroll_length * self.envs_per_actor

    @property
    def batch_columns(self) -> int:
        """N, the columns of each learner batch [T, N]: batch_rollouts x envs_per_actor."""
        return self.batch_rollouts * self.envs_per_actor


def check_env_layout(env: EnvConfig, runtime: RuntimeConfig) -> None:
    """The [env] keys that depend on how many envs an actor steps, checked against
    ``runtime.envs_per_actor`` (`ConfigError` naming the key), before any env is built."""
    k = runtime.envs_per_actor
    workers = env.workers_per_actor
    if env.vectorization == "async" and workers is not None:
        per_half = k // 2 if env.double_buffer else k
        if env.double_buffer and workers % 2:
            raise ConfigError(
                "env.workers_per_actor: expected an even number with env.double_buffer (each "
                f"half of an actor's envs gets half of the workers), got {workers}"
            )
        share = workers // 2 if env.double_buffer else workers
        if per_half % share:
            raise ConfigError(
                f"env.workers_per_actor: expected a divisor of runtime.envs_per_actor ({k}"
                f"{', halved by env.double_buffer' if env.double_buffer else ''}), got {workers}"
            )
    if env.double_buffer and k % 2:
        raise ConfigError(
            "runtime.envs_per_actor: expected an even number with env.double_buffer (two "
            f"halves of an actor's envs), got {k}"
        )


EVAL_POLICIES = ("greedy", "sampled")


@dataclass(frozen=True)
class EvalConfig:
    """How the trained policy is evaluated: whole episodes on envs of their own, seeded apart
    from the training envs, with the parameters of one version (none of it trains)."""

    episodes: int = 100
    """Episodes of the final evaluation, played with the run's final parameters and written to
    the summary (`evaluation`) and TensorBoard (`eval/return_mean`); 0: no final evaluation.
    Also the episodes of the `check_target` evaluation."""
    policies: list[str] = field(default_factory=lambda: ["greedy"])
    """Which policies to evaluate: "greedy" (argmax / the Gaussian mean) and/or "sampled". The
    first is the one `check_target` and the `eval/return_*` tags use."""
    interval_env_steps: int | None = None
    """Evaluate during training too, every this many env steps, on a thread of its own with a
    pinned snapshot of the latest parameters (None: only at the end)."""
    interval_episodes: int = 10
    """Episodes of each evaluation during training."""
    check_target: bool = True
    """With `runtime.target_return`: when the window mean reaches the target, the learner pauses
    between two steps and evaluates its current parameters (`episodes` episodes, first policy);
    the run stops only if that evaluation reaches the target too, so its final parameters are
    the ones that were evaluated. After a failed check the window must fill with
    `runtime.return_window` new episodes before the next one. false: the window alone stops
    the run."""
    check_return: float | None = None
    """The evaluated mean return a `check_target` evaluation must reach (None: the target
    return). Above the target it leaves a margin, so a policy that passes its check by luck
    does not fall below the target on the fresh seeds of the final evaluation."""
    max_episode_steps: int | None = 27_000
    """Steps after which an evaluation cuts an episode that has not ended (None: never): it
    counts with the return it reached, the evaluation's `truncated` says how many were cut,
    and a warning is logged. The default is Atari's convention (108,000 frames at a frame skip
    of 4); only envs without a time limit of their own reach it, e.g. MinAtar's, where a greedy
    policy that stands still would otherwise play one episode forever."""
    max_envs: int = 100
    """Envs stepped together by one evaluation (at most one per episode; each plays an equal
    share, decided up front). Vectorized envs such as CartPole's step 100 copies about as fast
    as 16, so 100 episodes take one episode's time."""
    video_interval_env_steps: int | None = None
    """Record a clip of one episode while training, every this many env steps (the first when
    the run starts, the last with the final parameters; None: never): the first of `policies`
    plays it with the newest parameters on an env of its own made with
    ``render_mode="rgb_array"``, into ``videos/<env steps>.gif`` in the run directory and the
    animated image ``video/<policy>`` in TensorBoard. Needs Pillow (``pip install
    "rlpar[video]"``) and an env that renders ("sync" or "async" vectorization). The clip
    is played in Python on a thread of its own, beside the actors."""
    video_max_frames: int = 500
    """Frames of a clip at most: a longer episode's clip is its first this many frames."""
    video_size: int = 256
    """Longer side of a clip's frames in pixels: larger renders are shrunk to it (keeping
    their aspect), so clips stay small in the run directory and in TensorBoard."""

    def __post_init__(self) -> None:
        check_field_types(self)
        _check(
            self.video_interval_env_steps is None or self.video_interval_env_steps >= 1,
            "video_interval_env_steps",
            "None or an integer >= 1",
            self.video_interval_env_steps,
        )
        _check(self.video_max_frames >= 2, "video_max_frames", "an integer >= 2",
               self.video_max_frames)  # fmt: skip
        _check(self.video_size >= 16, "video_size", "an integer >= 16", self.video_size)
        _check(self.episodes >= 0, "episodes", "an integer >= 0", self.episodes)
        _check(
            self.episodes >= 1 or not self.check_target,
            "episodes",
            "an integer >= 1 while check_target is true (it plays that many)",
            self.episodes,
        )
        _check(
            len(self.policies) >= 1
            and len(set(self.policies)) == len(self.policies)
            and all(p in EVAL_POLICIES for p in self.policies),
            "policies",
            'a list of distinct policies from "greedy", "sampled"',
            self.policies,
        )
        _check(
            self.interval_env_steps is None or self.interval_env_steps >= 1,
            "interval_env_steps",
            "None or an integer >= 1",
            self.interval_env_steps,
        )
        _check(
            self.max_episode_steps is None or self.max_episode_steps >= 1,
            "max_episode_steps",
            "None or an integer >= 1",
            self.max_episode_steps,
        )
        _check(
            self.interval_episodes >= 1,
            "interval_episodes",
            "an integer >= 1",
            self.interval_episodes,
        )
        _check(self.max_envs >= 1, "max_envs", "an integer >= 1", self.max_envs)
