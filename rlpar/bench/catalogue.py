"""The catalogue of ``rlpar bench`` commands: each one's name, help, and where its measuring
and formatting functions live. The command line builds its ``bench`` subcommands from
`BENCHES` and imports a benchmark's module only to run it (`load`), so ``rlpar train``
imports no benchmark code. A new benchmark is one `Bench` here and its module."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["BENCHES", "Bench", "load"]


@dataclass(frozen=True)
class Bench:
    """One ``rlpar bench`` subcommand. ``measure`` and ``table`` are "module:function" in
    `rlpar.bench` (see `load`); ``table=None`` prints the result as indented JSON."""

    name: str
    help: str
    description: str
    measure: str
    table: str | None = None
    threads: bool = False  # takes --threads N,N,.. (passed as the first argument)
    seconds: float | None = None  # takes --seconds S (this default), passed as ``seconds``


BENCHES: tuple[Bench, ...] = (
    Bench(
        "net",
        "native net vs numpy and torch twins, thread scaling, training step",
        "Forward latency of the native net against numpy and torch twins with the same "
        "weights (an MLP and a Nature-DQN conv net), forwards/s of 1 and 2 Python threads with "
        "the GIL released or held, and one RMSProp training step against torch. torch entries "
        "appear only when torch is installed. Takes about a minute.",
        "net:bench_net",
        "net:format_net",
    ),
    Bench(
        "snapshot",
        "snapshot store: pin/unpin cost, publish vs memcpy",
        "Pin + unpin while another thread publishes, and publish against a plain memcpy of the "
        "same size (timed natively), plus a pin + release from Python.",
        "net:bench_snapshot",
        "net:format_snapshot",
    ),
    Bench(
        "gil",
        "from which batch size releasing the GIL pays off",
        "For the MLP at batches 1..64: forwards/s of 1 and 2 Python threads with the GIL "
        "released and held, to set the release threshold (rlpar.set_gil_release_threshold) "
        "from data. Takes about half a minute.",
        "net:bench_gil_threshold",
        "net:format_gil_threshold",
    ),
    Bench(
        "runtime",
        "env steps/s of the actor/learner runtime",
        "gymnasium CartPole-v1 with the IMPALA mlp policy: env steps/s with 1 and 2 actor "
        "threads, the learner idle (in its native loop, and taking batches in Python) and busy "
        "training, beside one thread stepping the same vector env alone; MinAtar Breakout "
        '"sync" with a conv policy the same way, and with double buffering, where MinAtar is '
        "installed. Takes about 2 minutes.",
        "runtime:bench_runtime",
    ),
    Bench(
        "envs",
        "native envs vs gymnasium (and EnvPool when installed)",
        "64 CartPoles: env-only stepping of rlpar's native envs, gymnasium and EnvPool (when "
        "importable), and actor loops with 1 and 2 threads on Python envs, native envs and the "
        "fused native unroll.",
        "envs:bench_envs",
    ),
    Bench(
        "ray",
        "env steps/s and policy lag: threads vs Ray backend (needs rlpar[ray])",
        "cartpole_impala with the same number of actors on the threads backend and on a local "
        "Ray instance (127.0.0.1 only): env steps/s and mean policy lag.",
        "ray:bench_ray",
    ),
    Bench(
        "scaling",
        "throughput at 1, 2, 4, ... threads: net forward, snapshot pins, actors, runtime",
        "For each thread count: forwards/s of threads sharing one net (GIL released), snapshot "
        "pins/s of native readers while one thread publishes, env steps/s of actor threads on "
        "Python and fused native envs, and of the whole runtime with that many actors. Takes "
        "about 30 s per thread count with the default budget.",
        "scaling:bench_scaling",
        "scaling:format_scaling",
        threads=True,
    ),
    Bench(
        "soak",
        "RSS of a long rlpar train: growth per million env steps",
        "Runs `rlpar train` (IMPALA CartPole, no target, TensorBoard and periodic "
        "evaluations on) for --seconds on gymnasium's CartPole and on rlpar's native one, "
        "samples the process's resident memory, and reports its growth per million env steps "
        "after a warm-up (the first quarter). Takes twice --seconds.",
        "soak:bench_soak",
        seconds=300.0,
    ),
)


def load(ref: str) -> Callable[..., Any]:
    """The function a "module:function" reference in `rlpar.bench` names (imports it)."""
    module, _, function = ref.partition(":")
    return getattr(importlib.import_module(f"rlpar.bench.{module}"), function)
