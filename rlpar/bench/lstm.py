"""The LSTM core against torch.nn.LSTM (same weights, one thread each), part of ``rlpar bench
net``: a learner's forward + backward through time over ``[T=20, B=256]`` (256 inputs -> 256
hidden), and an actor's single step at batch 16 carrying the state.

Both sides run the core plus one value head (a Linear to 1), from the same fixed output gradient,
with no episode resets inside the sequence (torch.nn.LSTM has none). torch is optional: without
it only the native figures are reported. Where the CPU has AMX tiles, both are also timed with
``LSTM(matmul="bf16x3")`` ("native_bf16x3": the same weights, its outputs checked against the
float32 net's; the actor step from a pinned snapshot, as rlpar's actors step, so the core's
weights are packed once); torch's float32 matmul precision settings ("high", "medium", or
oneDNN's bf16) left its CPU LSTM's time unchanged here, so torch runs float32 only.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

import rlpar
from rlpar.bench.timing import sig, time_interleaved

__all__ = ["bench_lstm", "lstm_ratios"]

SEQ_STEPS, SEQ_BATCH, FEATURES, HIDDEN = 20, 256, 256, 256
ACTOR_BATCH = 16


def _net(matmul: str = "float32") -> rlpar.Net:
    core = rlpar.LSTM(HIDDEN, matmul=matmul)
    return rlpar.Net(rlpar.NetSpec(input_shape=(FEATURES,), heads=[rlpar.Value()], core=core))


def _torch_twin(net: rlpar.Net, params: np.ndarray, torch):
    """(torch.nn.LSTM, torch.nn.Linear) with the net's weights. torch's gate order is also
    [i, f, g, o]; its weights are [4H, in] (ours transposed) and it has two biases (ours + 0)."""
    views = net.param_views(params)
    lstm, head = torch.nn.LSTM(FEATURES, HIDDEN), torch.nn.Linear(HIDDEN, 1)
    with torch.no_grad():
        lstm.weight_ih_l0.copy_(torch.tensor(views["core.weight_ih"].T))
        lstm.weight_hh_l0.copy_(torch.tensor(views["core.weight_hh"].T))
        lstm.bias_ih_l0.copy_(torch.tensor(views["core.bias"]))
        lstm.bias_hh_l0.zero_()
        head.weight.copy_(torch.tensor(views["heads.0.weight"].T))
        head.bias.copy_(torch.tensor(views["heads.0.bias"]))
    return lstm, head


def _check_twin(got: np.ndarray, want: np.ndarray, twin: str = "torch LSTM twin") -> None:
    if not np.allclose(got, want, rtol=1e-3, atol=1e-4):
        raise RuntimeError(
            f"the {twin} disagrees with the native net (max |diff| "
            f"{float(np.max(np.abs(got - want))):.3g}): the comparison would be meaningless"
        )


def _train_fns(net: rlpar.Net, params: np.ndarray, torch) -> dict[str, Callable[[], object]]:
    rng = np.random.default_rng(0)
    rows = SEQ_STEPS * SEQ_BATCH
    obs = rng.standard_normal((rows, FEATURES)).astype(np.float32)
    state0 = (0.1 * rng.standard_normal((SEQ_BATCH, net.state_size))).astype(np.float32)
    dout = rng.standard_normal((rows, 1)).astype(np.float32)
    out = np.empty((rows, 1), np.float32)
    grad = np.empty(net.num_params, np.float32)

    def learner_step(n: rlpar.Net) -> Callable[[], np.ndarray]:
        def step() -> np.ndarray:
            _, tape = n.forward_train(params, obs, out=out, state=state0)
            n.backward(tape, dout, grad=grad)
            tape.release()
            return out

        return step

    native = learner_step(net)
    fns: dict[str, Callable[[], object]] = {"native": native}
    if rlpar.amx_available():
        bf16x3 = learner_step(_net("bf16x3"))
        _check_twin(bf16x3().copy(), native().copy(), "bf16x3 LSTM")
        fns["native_bf16x3"] = bf16x3
    if torch:
        lstm, head = _torch_twin(net, params, torch)
        x = torch.from_numpy(obs.reshape(SEQ_STEPS, SEQ_BATCH, FEATURES))
        h0 = torch.from_numpy(state0[None, :, :HIDDEN].copy())
        c0 = torch.from_numpy(state0[None, :, HIDDEN:].copy())
        dout_t = torch.from_numpy(dout)

        def torch_step() -> np.ndarray:
            y = head(lstm(x, (h0, c0))[0].reshape(rows, HIDDEN))
            y.backward(dout_t)
            lstm.zero_grad()
            head.zero_grad()
            return y.detach().numpy()

        _check_twin(torch_step(), native().copy())
        fns["torch"] = torch_step
    return fns


def _step_fns(net: rlpar.Net, params: np.ndarray, torch) -> dict[str, Callable[[], object]]:
    rng = np.random.default_rng(1)
    obs = rng.standard_normal((ACTOR_BATCH, FEATURES)).astype(np.float32)
    start = (0.1 * rng.standard_normal((ACTOR_BATCH, net.state_size))).astype(np.float32)
    state = start.copy()
    out = np.empty((ACTOR_BATCH, 1), np.float32)

    def native() -> np.ndarray:
        # Carries the state in place, as an actor does (the values stay bounded: |h|, |c| small).
        return net.forward(params, obs, out, state=state)

    fns: dict[str, Callable[[], object]] = {"native": native}
    if rlpar.amx_available():
        # As an actor steps: from a pinned snapshot, whose packed core the net keeps.
        bf16x3, store = _net("bf16x3"), rlpar.SnapshotStore(net.num_params, num_slots=4)
        store.publish(params)
        snap = store.pin()
        bf_state = start.copy()

        def native_bf16x3() -> np.ndarray:
            return bf16x3.forward(snap, obs, out, state=bf_state)

        want = net.forward(params, obs, state=start.copy())  # leaves `state` for the torch check
        _check_twin(native_bf16x3().copy(), want, "bf16x3 LSTM")
        fns["native_bf16x3"] = native_bf16x3
    if torch:
        lstm, head = _torch_twin(net, params, torch)
        x = torch.from_numpy(obs[None])
        hc = [torch.from_numpy(start[None, :, :HIDDEN].copy()),
              torch.from_numpy(start[None, :, HIDDEN:].copy())]  # fmt: skip

        def torch_step() -> np.ndarray:
            with torch.no_grad():
                y, (hc[0], hc[1]) = lstm(x, (hc[0], hc[1]))
                return head(y[0]).numpy()

        _check_twin(torch_step(), native().copy())
        fns["torch"] = torch_step
    return fns


def bench_lstm(chunk_s: float, repeats: int, torch) -> dict:
    """``{"lstm_train_ms": {"native"|"native_bf16x3"|"torch": ms}, "lstm_step_us":
    {"native"|"native_bf16x3"|"torch": µs}}``: medians, the implementations taking turns (callers
    limit torch to one thread)."""
    net = _net()
    params = net.init_params(seed=0)
    train = time_interleaved(_train_fns(net, params, torch), chunk_s, repeats)
    step = time_interleaved(_step_fns(net, params, torch), chunk_s, repeats)
    return {
        "lstm_train_ms": {name: sig(s * 1e3) for name, s in train.items()},
        "lstm_step_us": {name: sig(s * 1e6) for name, s in step.items()},
    }


def lstm_ratios(r: dict) -> dict:
    """torch time / native time (> 1: native is faster), when torch was measured."""
    out = {}
    for key, name in (("lstm_train_ms", "lstm_train"), ("lstm_step_us", "lstm_step_b16")):
        if "torch" in r[key]:
            out[f"{name}_native_vs_torch"] = sig(r[key]["torch"] / r[key]["native"], 3)
    for key, name in (("lstm_train_ms", "lstm_train"), ("lstm_step_us", "lstm_step_b16")):
        times = r[key]
        if "native_bf16x3" in times:
            out[f"{name}_bf16x3_vs_float32"] = sig(times["native"] / times["native_bf16x3"], 3)
            if "torch" in times:
                out[f"{name}_bf16x3_vs_torch"] = sig(times["torch"] / times["native_bf16x3"], 3)
    return out
