"""One Net shared by many threads: same bits as one thread, bounded memory, Python layers, exit."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import rlpar


def _mlp() -> rlpar.Net:
    return rlpar.Net(rlpar.mlp_spec(4, [rlpar.Categorical(2), rlpar.Value()]))


def _run_threads(n: int, target, *args) -> list:
    """Start n threads on target(i, *args), join them, re-raise the first error."""
    results: list = [None] * n
    errors: list[BaseException] = []
    start = threading.Barrier(n)

    def body(i: int) -> None:
        try:
            start.wait()
            results[i] = target(i, *args)
        except BaseException as e:  # re-raised in the test thread below
            errors.append(e)

    threads = [threading.Thread(target=body, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
        assert not t.is_alive(), "a worker thread hung"
    if errors:
        raise errors[0]
    return results


@pytest.mark.parametrize("release_gil", [True, False, None])
def test_sixteen_threads_give_bit_identical_outputs_and_grads(release_gil) -> None:
    net = rlpar.Net(
        rlpar.NetSpec(
            input_shape=(8, 8, 3),
            layers=[rlpar.Conv2d(8, 3, 1, 1), rlpar.ReLU(), rlpar.Flatten(), rlpar.Linear(32)],
            heads=[rlpar.Categorical(4), rlpar.Value(), rlpar.Gaussian(2)],
        )
    )
    params = net.init_params(seed=1)
    rng = np.random.default_rng(0)
    batches = [rng.standard_normal((b, 8, 8, 3)).astype(np.float32) for b in (1, 5, 32)]
    douts = [rng.standard_normal((x.shape[0], net.output_size)).astype(np.float32) for x in batches]

    def compute(_i: int) -> list[tuple[np.ndarray, np.ndarray]]:
        res = []
        for _ in range(20):
            for x, d in zip(batches, douts, strict=True):
                out, tape = net.forward_train(params, x, release_gil=release_gil)
                grad = net.backward(tape, d, release_gil=release_gil)
                res.append((out, grad))
        return res

    reference = compute(0)
    for per_thread in _run_threads(16, compute):
        for (out, grad), (ref_out, ref_grad) in zip(per_thread, reference, strict=True):
            assert np.array_equal(out, ref_out)
            assert np.array_equal(grad, ref_grad)


def test_workspaces_are_reused_and_bounded() -> None:
    net = _mlp()
    params = net.init_params(seed=0)
    x = np.ones((64, 4), np.float32)

    def work(_i: int) -> None:
        for _ in range(300):
            out, tape = net.forward_train(params, x)
            net.backward(tape, np.ones_like(out))
            tape.release()
            net.forward(params, x[:1])

    # One thread: one workspace, grown once to what these calls need.
    alone = _mlp()
    for _ in range(3):
        out, tape = alone.forward_train(params, x)
        alone.backward(tape, np.ones_like(out))
        tape.release()
        alone.forward(params, x[:1])
    one = alone.workspace_stats()
    assert one["workspaces"] == 1
    # A workspace a thread first used for the one-row call grows its buffers again for the
    # 64-row one: that order is the most (re)allocations one workspace can make here.
    small_first = _mlp()
    for _ in range(3):
        small_first.forward(params, x[:1])
        out, tape = small_first.forward_train(params, x)
        small_first.backward(tape, np.ones_like(out))
        tape.release()
    worst = small_first.workspace_stats()
    assert worst["workspaces"] == 1
    assert worst["allocations"] > one["allocations"]
    assert worst["bytes"] == one["bytes"]
    # Four threads, many rounds: at most one workspace per call in flight (+1), each grown at
    # most as the lone ones were, whichever interleaving the threads took: memory and
    # allocations stay bounded however long it runs (which workspace a call gets depends on
    # timing, so the exact count does not).
    for _ in range(3):
        _run_threads(4, work)
        after = net.workspace_stats()
        assert after["workspaces"] <= 4 + 1
        assert after["allocations"] <= after["workspaces"] * worst["allocations"]
        assert after["bytes"] <= after["workspaces"] * one["bytes"]
        assert after["idle"] == after["workspaces"]


def test_tape_keeps_its_workspace_until_released() -> None:
    net = _mlp()
    params = net.init_params(seed=0)
    _, tape = net.forward_train(params, np.zeros((3, 4), np.float32))
    assert net.workspace_stats()["idle"] == 0
    tape.release()
    assert net.workspace_stats()["idle"] == 1


class Square(rlpar.PyLayer):
    """y = x * x, elementwise: stateless, so safe from many threads."""

    def forward(self, x: np.ndarray) -> np.ndarray:
        return x * x

    def backward(self, x: np.ndarray, y: np.ndarray, dy: np.ndarray) -> np.ndarray:
        return 2.0 * x * dy


def test_python_layer_in_the_middle_eight_threads() -> None:
    """8 threads x 1000 forward+backward through a net with a Python layer: no deadlock, and
    gradients equal the single-threaded ones."""
    spec = rlpar.NetSpec(
        input_shape=(6,),
        layers=[rlpar.Linear(16), rlpar.Tanh(), Square(), rlpar.Linear(16), rlpar.Tanh()],
        heads=[rlpar.Categorical(3), rlpar.Value()],
    )
    net = rlpar.Net(spec)
    params = net.init_params(seed=3)
    rng = np.random.default_rng(1)
    xs = [rng.standard_normal((b, 6)).astype(np.float32) for b in (1, 16, 64)]
    expected = []
    for x in xs:
        out, tape = net.forward_train(params, x)
        expected.append((out, net.backward(tape, np.ones_like(out))))

    def work(i: int) -> int:
        for k in range(1000):
            j = (i + k) % len(xs)
            out, tape = net.forward_train(params, xs[j])
            grad = net.backward(tape, np.ones_like(out))
            assert np.array_equal(out, expected[j][0])
            assert np.array_equal(grad, expected[j][1])
        return 1000

    assert sum(_run_threads(8, work)) == 8000


def test_python_layer_gradient_matches_finite_differences() -> None:
    spec = rlpar.NetSpec(
        input_shape=(3,), layers=[rlpar.Linear(5), Square()], heads=[rlpar.Value()]
    )
    net = rlpar.Net(spec)
    params = net.init_params(seed=0).astype(np.float64)
    x = np.array([[0.3, -0.2, 0.5]], np.float32)

    def loss(p: np.ndarray) -> float:
        return float(net.forward(p.astype(np.float32), x)[0, 0])

    _, tape = net.forward_train(params.astype(np.float32), x)
    grad = net.backward(tape, np.ones((1, 1), np.float32))
    eps = 1e-3
    for i in range(net.num_params):
        e = np.zeros_like(params)
        e[i] = eps
        fd = (loss(params + e) - loss(params - e)) / (2 * eps)
        assert abs(fd - grad[i]) < 2e-3 * max(1.0, abs(fd))


EXIT_SCRIPT = textwrap.dedent(
    """
    import threading, numpy as np, rlpar

    class Square(rlpar.PyLayer):
        def forward(self, x):
            return x * x
        def backward(self, x, y, dy):
            return 2 * x * dy

    middle = [Square()] if WITH_PYTHON_LAYER else []
    spec = rlpar.NetSpec(input_shape=(64,), layers=[rlpar.Linear(256), *middle, rlpar.Tanh(),
                         rlpar.Linear(256), rlpar.Tanh()], heads=[rlpar.Categorical(4)])
    net = rlpar.Net(spec)
    params = net.init_params(seed=0)
    x = np.ones((256, 64), np.float32)
    started = threading.Barrier(9)

    def spin():
        started.wait()
        while True:
            out, tape = net.forward_train(params, x, release_gil=True)
            net.backward(tape, out, release_gil=True)

    for _ in range(8):
        threading.Thread(target=spin, daemon=True).start()
    started.wait()
    print("exiting", flush=True)
    """
)


@pytest.mark.parametrize("with_python_layer", [True, False])
def test_interpreter_exit_while_threads_run_does_not_crash(tmp_path, with_python_layer) -> None:
    """Daemon threads still inside forward/backward when the main thread exits: exit code 0."""
    script = f"WITH_PYTHON_LAYER = {with_python_layer}\n{EXIT_SCRIPT}"
    for _ in range(3):
        proc = subprocess.run(
            [sys.executable, "-c", script],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=tmp_path,  # import the installed rlpar, not the source tree
        )
        assert proc.returncode == 0, proc.stderr
        assert "exiting" in proc.stdout
