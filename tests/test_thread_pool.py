"""`rlpar.ThreadPool` and the ``pool=`` argument of `rlpar.Net` calls: the torso split over native
threads (forward by batch rows; backward layer by layer, rows for the data gradient and slices of
the weight gradients) gives the whole call's outputs and, with the AVX-512 kernels, its gradients
bit for bit, whatever the pool size, from any number of Python threads."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import rlpar
from rlpar import Conv2d, Flatten, Linear, NetSpec, ReLU, ThreadPool, _native

#: The AVX-512 kernels sum every gradient in one order whatever the split; Eigen's GEMMs (the
#: portable build) may round differently for another block of rows.
EXACT = _native.simd_kernels() == "avx512"


def assert_same_gradient(got: np.ndarray, want: np.ndarray) -> None:
    if EXACT:
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * np.abs(want).max())


def assert_same_output(got: np.ndarray, want: np.ndarray) -> None:
    if EXACT:  # rows are independent and each is summed in one order
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def conv_net(lstm: int = 0) -> rlpar.Net:
    spec = NetSpec(
        input_shape=(9, 9, 3), input_dtype="uint8",
        layers=[Conv2d(24, 3, 1, padding=1), ReLU(), Conv2d(16, 3, 2), ReLU(), Flatten(),
                Linear(64), ReLU()],
        heads=[rlpar.Categorical(4), rlpar.Value(), rlpar.Gaussian(2)],
        core=rlpar.LSTM(12) if lstm else None,
    )  # fmt: skip
    return rlpar.Net(spec)


def data(net: rlpar.Net, rows: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    obs = rng.integers(0, 256, (rows, *net.input_shape), dtype=np.uint8)
    dout = rng.standard_normal((rows, net.output_size)).astype(np.float32)
    return net.init_params(seed=seed), obs, dout


def train(net, params, obs, dout, pool, **core) -> tuple[np.ndarray, np.ndarray]:
    out, tape = net.forward_train(params, obs, pool=pool, **core)
    try:
        return out, net.backward(tape, dout, pool=pool)
    finally:
        tape.release()


@pytest.mark.parametrize("threads", [2, 3, 5])
def test_split_call_matches_the_whole_call(threads: int) -> None:
    net = conv_net()
    params, obs, dout = data(net, 150)
    pool = ThreadPool(threads)
    assert pool.threads == threads and net.torso_parts(pool, 150) == threads
    out1, g1 = train(net, params, obs, dout, None)
    out2, g2 = train(net, params, obs, dout, pool)
    assert_same_output(out2, out1)
    assert_same_gradient(g2, g1)
    np.testing.assert_array_equal(train(net, params, obs, dout, pool)[1], g2)  # reproducible
    assert_same_output(net.forward(params, obs, pool=pool), out1)
    # accumulate=True adds the same gradient.
    base = np.random.default_rng(3).standard_normal(net.num_params).astype(np.float32)
    _, tape = net.forward_train(params, obs, pool=pool)
    acc = net.backward(tape, dout, grad=base.copy(), accumulate=True, pool=pool)
    _, tape = net.forward_train(params, obs)
    assert_same_gradient(acc, net.backward(tape, dout, grad=base.copy(), accumulate=True))
    np.testing.assert_allclose(acc, base + g2, rtol=1e-5, atol=1e-5)


def test_split_call_with_an_lstm_core() -> None:
    net = conv_net(lstm=1)
    T, N = 6, 9
    params, obs, dout = data(net, T * N, seed=1)
    rng = np.random.default_rng(2)
    core = {"state": rng.standard_normal((N, net.state_size)).astype(np.float32),
            "resets": rng.random((T, N)) < 0.2}  # fmt: skip
    pool = ThreadPool(3)
    out1, g1 = train(net, params, obs, dout, None, **core)
    out2, g2 = train(net, params, obs, dout, pool, **core)
    assert_same_output(out2, out1)
    assert_same_gradient(g2, g1)


def test_many_python_threads_share_one_net_and_one_pool() -> None:
    net = conv_net()
    params, obs, dout = data(net, 40)
    shared = ThreadPool(3)
    want = train(net, params, obs, dout, shared)
    bad: list[str] = []

    def worker(i: int) -> None:
        own = ThreadPool(3)
        for k in range(6):
            out, grad = train(net, params, obs, dout, shared if (i + k) % 2 else own)
            if not (np.array_equal(out, want[0]) and np.array_equal(grad, want[1])):
                bad.append(f"thread {i} call {k}")

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    assert bad == []
    stats = net.workspace_stats()
    assert stats["idle"] == stats["workspaces"]


def test_small_batches_and_python_layers_stay_whole() -> None:
    net = conv_net()
    pool = ThreadPool(4)
    assert net.torso_parts(pool, 1) == 1
    assert net.torso_parts(ThreadPool(1), 500) == 1
    tiny = rlpar.Net(rlpar.mlp_spec(4, [rlpar.Categorical(2), rlpar.Value()], hidden=(8,)))
    assert tiny.torso_parts(pool, 64) == 1  # a few kFLOP: the hand-off would cost more

    class Double(rlpar.PyLayer):
        def output_shape(self, in_shape):
            return in_shape

        def forward(self, x):
            return 2 * x

        def backward(self, x, y, dy):
            return 2 * dy

    spec = NetSpec(input_shape=(32,), layers=[Double(), Linear(256), ReLU(), Linear(256)],
                   heads=[rlpar.Value()])  # fmt: skip
    py_net = rlpar.Net(spec)
    assert py_net.torso_parts(pool, 4096) == 1  # a Python layer runs on the calling thread
    params, _, _ = data(py_net, 1)
    x = np.random.default_rng(0).standard_normal((300, 32)).astype(np.float32)
    np.testing.assert_array_equal(py_net.forward(params, x, pool=pool), py_net.forward(params, x))
    dout = np.ones((300, py_net.output_size), np.float32)
    grads = []
    for p in (pool, None):
        _, tape = py_net.forward_train(params, x, pool=p)
        grads.append(py_net.backward(tape, dout, pool=p))
    np.testing.assert_array_equal(grads[0], grads[1])


def test_bad_pools_are_refused() -> None:
    net = conv_net()
    params, obs, dout = data(net, 8)
    with (
        rlpar.ShardPool(2) as shard_pool,
        pytest.raises(TypeError, match=r"pool must be an rlpar\.ThreadPool or None, got ShardPool"),
    ):
        net.forward(params, obs, pool=shard_pool)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"pool must be an rlpar\.ThreadPool or None, got int"):
        net.forward_train(params, obs, pool=2)
    _, tape = net.forward_train(params, obs)
    with pytest.raises(TypeError, match="got str"):
        net.backward(tape, dout, pool="threads")
    with pytest.raises(TypeError, match=r"pool must be an rlpar\.ThreadPool or None, got list"):
        net.torso_parts([], 8)  # type: ignore[arg-type]
    assert net.torso_parts(None, 10_000) == 1  # no pool: one part, as the calls do
    for bad in (0, -3, 2000, 2**80):
        with pytest.raises(ValueError, match=f"expected an integer from 1 to 1024, got {bad}$"):
            ThreadPool(bad)
    for bad, name in (("4", "str"), (2.0, "float"), (True, "bool"), (None, "NoneType")):
        with pytest.raises(TypeError, match=f"threads: expected an integer, got {name}"):
            ThreadPool(bad)  # type: ignore[arg-type]
