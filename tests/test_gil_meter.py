"""The GIL meter (rlpar.runtime.gil_meter): a thread that only runs Python reads as holding the
GIL, one in long GIL-free native calls as not, and a released call's time off the CPU counts as
native, not held; threads together never hold more than all of it; the runner reports every
thread's shares and the ceiling they predict."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from test_runtime import small_runtime
from tiny_agent import TinyAgent

import rlpar
from rlpar import _native
from rlpar.config import EnvConfig
from rlpar.runtime import Runner
from rlpar.runtime.gil_meter import GilTimes, ThreadMeter, actor_ceiling

SECONDS = 0.4


def python_only(seconds: float = SECONDS) -> GilTimes:
    meter = ThreadMeter()
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        sum(range(200))
    return meter.read()


NET = rlpar.Net(rlpar.mlp_spec(64, [rlpar.Categorical(4)], [256, 256]))
PARAMS = NET.init_params(seed=0)
OBS = np.ones((256, 64), np.float32)


def native_calls(seconds: float = SECONDS) -> GilTimes:
    meter = ThreadMeter()
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        NET.forward(PARAMS, OBS, release_gil=True)
    return meter.read()


def on_threads(*bodies) -> list:
    out: list = [None] * len(bodies)

    def run(i: int) -> None:
        out[i] = bodies[i]()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(bodies))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def test_a_python_thread_holds_the_gil_and_a_native_one_does_not() -> None:
    (py,) = on_threads(python_only)
    (native,) = on_threads(native_calls)
    # All of a Python thread's CPU time is held (its share of the wall time is what the machine
    # gave it: on a loaded one, less); a native one holds a little and is native most of the time.
    assert py.held_s > 0.9 * py.cpu_s and py.native_s == 0.0, py
    shares = native.shares()
    assert native.held_s < 0.2 * native.cpu_s and shares["native"] > 0.6, native


def test_threads_together_never_hold_more_than_the_whole_gil() -> None:
    times = on_threads(python_only, python_only, native_calls)
    held = sum(t.held_s for t in times)
    wall = max(t.wall_s for t in times)
    assert held <= wall * 1.1, [t.shares() for t in times]


def test_the_native_counters_belong_to_the_calling_thread() -> None:
    before = _native.gil_meter()
    on_threads(native_calls)  # another thread's calls
    assert _native.gil_meter() == before
    NET.forward(PARAMS, OBS, release_gil=True)
    after = _native.gil_meter()
    assert after[2] == before[2] + 1 and after[0] > before[0]
    NET.forward(PARAMS, OBS[:1], release_gil=False)  # kept the GIL: not counted
    assert _native.gil_meter()[2] == after[2]


# A released call that spends most of its time off the CPU, as a learner step waiting for its
# pool's workers does: the torso split in 8 parts, the calling thread computing one of them.
POOLED = rlpar.Net(rlpar.mlp_spec(256, [rlpar.Value()], [512, 512]))
POOL = rlpar.ThreadPool(8)


def python_and_pooled_native_calls(seconds: float = SECONDS) -> tuple[GilTimes, float]:
    """Python, then a released call that mostly waits for its pool: (the thread's times, the
    CPU time of its Python part)."""
    params, x = POOLED.init_params(seed=0), np.ones((512, 256), np.float32)
    assert POOLED.torso_parts(POOL, len(x)) == 8
    # A thread's first long call counts its wall time as CPU time (gil.h, kCpuClockAfterNs).
    POOLED.forward(params, x, pool=POOL, release_gil=True)
    meter = ThreadMeter()
    python_cpu = 0.0
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        busy, cpu = time.perf_counter() + 0.005, time.thread_time()
        while time.perf_counter() < busy:
            sum(range(200))
        python_cpu += time.thread_time() - cpu
        POOLED.forward(params, x, pool=POOL, release_gil=True)
    return meter.read(), python_cpu


def test_held_is_cpu_time_outside_released_calls_not_their_wall_time() -> None:
    """A released call off the CPU counts as native, not as negative held time: before the
    meter read the guard's CPU time, held was the CPU time less the calls' wall time, and a
    learner step blocked on its thread pool read 0 % held (here: about half held, half
    native, the native calls mostly off the CPU)."""
    ((t, python_cpu),) = on_threads(python_and_pooled_native_calls)
    assert 0.0 <= t.native_cpu_s < 0.5 * t.native_s, t
    assert t.held_s > 0.8 * python_cpu, (t, python_cpu)
    assert t.shares()["native"] > 0.2, t


def test_shares_and_the_ceiling() -> None:
    t = GilTimes(wall_s=2.0, cpu_s=1.5, native_s=1.0, wait_s=0.25, native_cpu_s=1.0)
    assert t.held_s == 0.5
    assert GilTimes(wall_s=2.0, cpu_s=1.5, native_s=1.5, native_cpu_s=0.5).held_s == 1.0
    assert t.shares() == {"held": 0.25, "wait": 0.125, "native": 0.5}
    assert GilTimes().shares() == {"held": 0.0, "wait": 0.0, "native": 0.0}
    assert actor_ceiling(0.25) == 4.0 and actor_ceiling(0.25, learner_held=0.5) == 2.0
    assert math.isinf(actor_ceiling(0.0))


def test_the_runner_reports_each_threads_shares() -> None:
    runner = Runner(TinyAgent(), EnvConfig("rlpar-test/Counter-v0"), small_runtime())
    result = runner.run()
    gil = result.gil
    assert set(gil) == {"actor_0", "actor_1", "actors", "learner", "actor_ceiling"}
    for thread in ("actor_0", "actor_1", "actors", "learner"):
        shares = gil[thread]
        assert set(shares) == {"held", "wait", "native"}
        assert all(0.0 <= v <= 1.0 for v in shares.values()), shares
        assert shares["held"] + shares["wait"] + shares["native"] <= 1.05
    # A Python env and a tiny net: the actors' time is Python's, under the GIL.
    assert gil["actors"]["held"] > gil["actors"]["native"]
    assert gil["actor_ceiling"] == pytest.approx(
        actor_ceiling(gil["actors"]["held"], gil["learner"]["held"])
    )
    assert runner.progress(1.0).gil.keys() == gil.keys()


def test_the_release_threshold_is_measured_at_import() -> None:
    """Two hand-offs of the GIL times the kernels' speed, clamped to [70 kflop, 16 Mflop]."""
    c = rlpar.gil_calibration()
    assert c["handoff_ns"] > 0 and c["flops_per_ns"] > 0
    want = min(max(2 * c["handoff_ns"] * c["flops_per_ns"], 70e3), 16e6)
    assert c["threshold_flops"] == pytest.approx(want)


def pinned_threshold(value: str, cwd) -> subprocess.CompletedProcess:
    # cwd: away from a source checkout, whose rlpar/ folder would shadow the installed package
    return subprocess.run(
        [sys.executable, "-c", "import rlpar; print(rlpar.gil_release_threshold())"],
        env={**os.environ, "RLPAR_GIL_RELEASE_THRESHOLD": value},
        capture_output=True, text=True, timeout=120, cwd=cwd,
    )  # fmt: skip


def test_an_environment_variable_pins_the_threshold(tmp_path) -> None:
    ok = pinned_threshold("250000", tmp_path)
    assert ok.returncode == 0 and float(ok.stdout) == 250000.0
    bad = pinned_threshold("fast", tmp_path)
    assert bad.returncode != 0
    assert "RLPAR_GIL_RELEASE_THRESHOLD must be a number of flops >= 0, got 'fast'" in bad.stderr


class SpinLayer(rlpar.PyLayer):
    """An identity layer that runs Python for ``seconds`` on each forward (a Python layer that
    does real work while holding the GIL it re-took)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def forward(self, x: np.ndarray) -> np.ndarray:
        end = time.perf_counter() + self.seconds
        while time.perf_counter() < end:
            sum(range(200))
        return x

    def backward(self, x: np.ndarray, y: np.ndarray, dy: np.ndarray) -> np.ndarray:
        return dy


def test_a_python_layers_time_inside_a_released_call_counts_as_held() -> None:
    """A native call that releases the GIL and runs a Python layer: the layer's time is held,
    not native (it re-takes the GIL for its duration), alone and beside a Python thread."""
    spec = rlpar.NetSpec(
        (64,),
        layers=[rlpar.Linear(256), SpinLayer(0.02), rlpar.ReLU()],
        heads=[rlpar.Categorical(4)],
    )
    net = rlpar.Net(spec)
    params = net.init_params(seed=0)

    def layer_calls() -> GilTimes:
        meter = ThreadMeter()
        end = time.perf_counter() + SECONDS
        while time.perf_counter() < end:
            net.forward(params, OBS, release_gil=True)
        return meter.read()

    for t in (layer_calls(), on_threads(layer_calls, python_only)[0]):
        # nearly all its CPU time is held (before: none of it), and its wall time is not native
        # (before: all of it; on a loaded machine, time preempted in the native part counts)
        assert t.held_s > 0.8 * t.cpu_s, t
        assert t.shares()["native"] < 0.5, t
