"""The LSTM core (`rlpar.LSTM`): forward and backpropagation through time against the float64
reference `reference.recurrent_forward` and its finite differences; actor steps against the
learner's sequence; bit-identical gradients whatever the thread; clear errors."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import reference as ref

from rlpar import LSTM, Categorical, Linear, Net, NetSpec, Tanh, Value, _native, amx_available

T, N, D, H = 5, 3, 4, 6


TORSO = (Linear(8), Tanh())


def make_net(hidden: int = H, layers: tuple = TORSO, matmul: str = "float32") -> Net:
    core = LSTM(hidden, matmul=matmul)
    spec = NetSpec((D,), list(layers), [Categorical(3), Value()], core=core)
    return Net(spec)


def sequence(seed: int = 0, t_len: int = T, n: int = N):
    rng = np.random.default_rng(seed)
    obs = rng.standard_normal((t_len, n, D)).astype(np.float32)
    state0 = (0.5 * rng.standard_normal((n, 2 * H))).astype(np.float32)
    resets = rng.random((t_len, n)) < 0.25
    return obs, state0, resets


def random_params(net: Net, seed: int = 1) -> np.ndarray:
    # Random rather than init_params: a zero bias and small weights would hide gate mistakes.
    rng = np.random.default_rng(seed)
    return (0.5 * rng.standard_normal(net.num_params)).astype(np.float32)


def test_param_layout_and_state_size() -> None:
    net = make_net()
    names = [p[0] for p in net.param_info]
    assert names[2:5] == ["core.weight_ih", "core.weight_hh", "core.bias"]
    shapes = {p[0]: p[3] for p in net.param_info}
    assert shapes["core.weight_ih"] == (8, 4 * H)
    assert shapes["core.weight_hh"] == (H, 4 * H)
    assert shapes["heads.0.weight"] == (H, 3)
    assert net.recurrent and net.state_size == 2 * H
    assert net.initial_state(5).shape == (5, 2 * H)
    params = net.init_params(seed=0)
    bias = net.param_views(params)["core.bias"]
    np.testing.assert_array_equal(bias[H : 2 * H], 1.0)  # forget gate
    np.testing.assert_array_equal(np.delete(bias, np.s_[H : 2 * H]), 0.0)


def test_sequence_forward_matches_reference() -> None:
    net = make_net()
    params = random_params(net)
    obs, state0, resets = sequence()
    out, tape = net.forward_train(params, obs.reshape(T * N, D), state=state0, resets=resets)
    tape.release()
    want, _ = ref.recurrent_forward(net.spec, net.param_info, params, obs, state0, resets)
    np.testing.assert_allclose(out.reshape(T, N, -1), want, rtol=1e-4, atol=1e-5)


def test_actor_steps_match_the_learners_sequence() -> None:
    """Carrying the state step by step (in place) gives what the learner recomputes in one
    sequence from the stored start state, and the final state of the reference."""
    net = make_net()
    params = random_params(net)
    obs, state0, resets = sequence()
    state = state0.copy()
    outs = [net.forward(params, obs[t], state=state, resets=resets[t]) for t in range(T)]
    seq_out, tape = net.forward_train(params, obs.reshape(T * N, D), state=state0, resets=resets)
    tape.release()
    np.testing.assert_allclose(np.stack(outs), seq_out.reshape(T, N, -1), rtol=1e-5, atol=1e-6)
    _, want_state = ref.recurrent_forward(net.spec, net.param_info, params, obs, state0, resets)
    np.testing.assert_allclose(state, want_state, rtol=1e-4, atol=1e-5)


def _assert_same(got: np.ndarray, want: np.ndarray) -> None:
    """Bit for bit with rlpar's AVX-512 kernels (each row's sums run in one fixed order whatever
    the batch); within rounding on the portable Eigen build, whose GEMM and GEMV orders differ."""
    if _native.simd_kernels() == "avx512":
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_a_row_gives_the_same_state_in_any_batch() -> None:
    """Wide layers (a 600-unit torso, 640 gate columns) at actor batch sizes, which take the
    few-rows kernel tiles: each row's new state (what the torso and the core compute) against
    the row run alone, and the actors' steps against the learner's sequence. (The heads are
    Eigen GEMMs, whose sums at batch 1 differ from larger batches in the last bit.)"""
    d, hidden, t_len = 20, 160, 3
    spec = NetSpec((d,), [Linear(600), Tanh()], [Categorical(3), Value()], core=LSTM(hidden))
    net = Net(spec)
    params = (0.1 * np.random.default_rng(5).standard_normal(net.num_params)).astype(np.float32)
    rng = np.random.default_rng(6)
    for batch in (2, 3, 4, 8, 16, 32, 33, 80):
        obs = rng.standard_normal((batch, d)).astype(np.float32)
        state0 = (0.5 * rng.standard_normal((batch, 2 * hidden))).astype(np.float32)
        state = state0.copy()
        net.forward(params, obs, state=state)
        for n in (0, batch // 2, batch - 1):
            one = state0[n : n + 1].copy()
            net.forward(params, obs[n : n + 1], state=one)
            _assert_same(one, state[n : n + 1])
    # 16 actors stepping, against the learner's [T, 16] sequence from the same start state.
    obs = rng.standard_normal((t_len, 16, d)).astype(np.float32)
    state0 = (0.5 * rng.standard_normal((16, 2 * hidden))).astype(np.float32)
    state = state0.copy()
    steps = np.stack([net.forward(params, obs[t], state=state) for t in range(t_len)])
    seq_out, tape = net.forward_train(params, obs.reshape(t_len * 16, d), state=state0)
    tape.release()
    _assert_same(seq_out.reshape(steps.shape), steps)


@pytest.mark.parametrize("layers", [TORSO, ()], ids=["torso", "no-torso"])
def test_backward_through_time_matches_finite_differences(layers) -> None:
    net = make_net(layers=layers)
    params = random_params(net)
    obs, state0, resets = sequence(seed=3)
    proj = np.random.default_rng(4).standard_normal((T * N, net.output_size)).astype(np.float32)
    _, tape = net.forward_train(params, obs.reshape(T * N, D), state=state0, resets=resets)
    grad = net.backward(tape, proj)

    def loss(p: np.ndarray) -> float:
        out, _ = ref.recurrent_forward(net.spec, net.param_info, p, obs, state0, resets)
        return float(np.sum(out.reshape(T * N, -1) * proj))

    want = ref.numerical_grad(loss, params)
    np.testing.assert_allclose(grad, want, rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize(
    "matmul",
    [
        "float32",
        pytest.param(
            "bf16x3", marks=pytest.mark.skipif(not amx_available(), reason="no AMX-BF16 tiles")
        ),
    ],
)
def test_gradient_is_bit_identical_across_threads(matmul: str) -> None:
    net = make_net(hidden=16, matmul=matmul)
    params = random_params(net)
    obs, state0, resets = sequence(t_len=7, n=5)
    state0 = np.zeros((5, 32), np.float32)
    dout = np.random.default_rng(5).standard_normal((35, net.output_size)).astype(np.float32)

    def grad() -> np.ndarray:
        _, tape = net.forward_train(params, obs.reshape(35, D), state=state0, resets=resets)
        g = net.backward(tape, dout, release_gil=True)
        tape.release()
        return g

    first = grad()
    results: list[np.ndarray] = []
    errors: list[BaseException] = []

    def work() -> None:
        try:
            for _ in range(20):
                results.append(grad())
        except BaseException as e:  # re-raised below
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    assert len(results) == 80
    for g in results:
        np.testing.assert_array_equal(g, first)


def test_feed_forward_net_is_unchanged_by_the_core_api() -> None:
    spec = NetSpec(input_shape=(D,), layers=[Linear(8), Tanh()], heads=[Value()])
    net = Net(spec)
    assert not net.recurrent and net.state_size == 0
    params = net.init_params(seed=0)
    obs = np.ones((2, D), np.float32)
    with pytest.raises(ValueError, match="no recurrent core: pass no state or resets"):
        net.forward(params, obs, state=np.zeros((2, 0), np.float32))


def test_errors_name_what_was_expected() -> None:
    net = make_net()
    params = net.init_params(seed=0)
    obs = np.zeros((6, D), np.float32)
    with pytest.raises(ValueError, match=r"LSTM core: pass state, float32 \[N, 12\]"):
        net.forward(params, obs)
    with pytest.raises(ValueError, match=r"state must have shape \(6, 12\), got \(6, 11\)"):
        net.forward(params, obs, state=np.zeros((6, 11), np.float32))
    with pytest.raises(TypeError, match="state must be a numpy array, got list"):
        net.forward(params, obs, state=[[0.0] * 12] * 6)
    with pytest.raises(TypeError, match="state must be float32, got float64"):
        net.forward(params, obs, state=np.zeros((6, 12)))
    with pytest.raises(ValueError, match=r"resets must have shape \(6,\), got \(5,\)"):
        net.forward(params, obs, state=np.zeros((6, 12), np.float32), resets=np.zeros(5, bool))
    with pytest.raises(ValueError, match=r"N dividing the 6 rows of obs .* got \(4, 12\)"):
        net.forward_train(params, obs, state=np.zeros((4, 12), np.float32))
    with pytest.raises(ValueError, match=r"resets must have shape \(3, 2\), got \(2, 3\)"):
        net.forward_train(
            params, obs, state=np.zeros((2, 12), np.float32), resets=np.zeros((2, 3), bool)
        )
    with pytest.raises(ValueError, match="state must be finite"):
        bad = np.full((6, 12), np.nan, np.float32)
        net.forward(params, obs, state=bad, check_finite=True)
    with pytest.raises(TypeError, match="core must be an LSTM or None, got int"):
        NetSpec(input_shape=(D,), heads=[Value()], core=4)
    with pytest.raises(ValueError, match=r"LSTM\.hidden: expected an integer >= 1, got 0"):
        LSTM(0)
