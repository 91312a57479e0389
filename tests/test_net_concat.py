"""Concat (several encoders side by side) and Embedding blocks of the native net.

Forward against the float64 numpy twin in `reference.py` (``concat``, ``embedding``), backward
against central finite differences of that twin (a layer with parameters below each block shows
a wrong input gradient), the torch twin of `rlpar.bench.twins`, bad specs and bad indices
against their messages, many threads or a thread pool on one net against one thread, and a
small Dict-like net that learns.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import reference as ref
from test_net_blocks import (
    assert_forward_matches_float64_twin,
    assert_many_threads_give_one_threads_bits,
    assert_pool_split_matches_the_whole_call,
)
from test_net_numerics import Square, projection_fd_grad, random_params, rel_err
from test_thread_pool import assert_same_gradient

import rlpar
from rlpar import (
    Adam,
    Branch,
    Categorical,
    Concat,
    Conv2d,
    Embedding,
    Flatten,
    LayerNorm,
    Linear,
    MaxPool2d,
    Net,
    NetSpec,
    ReLU,
    Residual,
    Tanh,
    ThreadPool,
    Value,
    _native,
)

HEADS = [Categorical(3), Value()]


def dict_torso(conv: int = 4, hidden: int = 8) -> Concat:
    """A MiniGrid-like Dict observation, leaves side by side: a 5x5x2 image, 3 features and 2
    discrete fields of 6 values."""
    return Concat(
        [
            Branch((5, 5, 2), [Conv2d(conv, 3), ReLU(), Flatten()]),
            Branch((3,), [Linear(hidden), Tanh()]),
            Branch((2,), [Embedding(6, 3)]),
        ]
    )


def index_columns(spec: NetSpec) -> list[tuple[slice, int]]:
    """The input columns an Embedding reads directly, each with its number of vectors."""
    first = spec.layers[0]
    if isinstance(first, Embedding):
        return [(slice(None), first.num_embeddings)]
    cols: list[tuple[slice, int]] = []
    if isinstance(first, Concat):
        off = 0
        for branch in first.branches:
            if branch.layers and isinstance(branch.layers[0], Embedding):
                cols.append((slice(off, off + branch.size), branch.layers[0].num_embeddings))
            off += branch.size
    return cols


def random_obs(spec: NetSpec, batch: int, seed: int) -> np.ndarray:
    """Standard normal float32 ``[B, *input_shape]``, valid indices where an Embedding reads."""
    rng = np.random.default_rng(seed)
    obs = rng.standard_normal((batch, *spec.input_shape)).astype(np.float32)
    for cols, num in index_columns(spec):
        obs[:, cols] = rng.integers(0, num, obs[:, cols].shape)
    return obs


def relu_inputs(layers, x: np.ndarray, p: dict[str, np.ndarray], prefix: str) -> list:
    """Every ReLU's float64 input in ``layers`` (blocks opened) on the batch ``x``."""
    found = []
    for j, layer in enumerate(layers):
        name = f"{prefix}{j}."
        if isinstance(layer, ReLU):
            found.append(x)
        elif isinstance(layer, Residual):
            found += relu_inputs(layer.body, x, p, name)
        elif isinstance(layer, Concat):
            off = 0
            for k, branch in enumerate(layer.branches):
                h = x[:, off : off + branch.size].reshape(len(x), *branch.shape)
                found += relu_inputs(branch.layers, h, p, f"{name}{k}.")
                off += branch.size
        x = ref.named_layer_forward(layer, x, p, name)
    return found


def away_from_kinks(net: Net, params: np.ndarray, obs: np.ndarray) -> bool:
    p = ref.unpack(net.param_info, params)
    x = np.asarray(obs, np.float64) * net.spec.scale
    return all(np.abs(h).min() > 1e-4 for h in relu_inputs(net.spec.layers, x, p, "layers."))


def check_backward(net: Net, batch: int = 4) -> None:
    """Native grad of ``sum(out * R)`` == finite differences of the float64 twin, as a whole and
    parameter by parameter, at the first seed that keeps every ReLU input away from 0."""
    seed = next(
        s
        for s in range(30)
        if away_from_kinks(net, random_params(net, s), random_obs(net.spec, batch, s + 1))
    )
    params = random_params(net, seed)
    obs = random_obs(net.spec, batch, seed + 1)
    r = np.random.default_rng(seed).standard_normal((batch, net.output_size))
    _, tape = net.forward_train(params, obs)
    grad = net.backward(tape, r.astype(np.float32))
    tape.release()
    fd = projection_fd_grad(net, params, obs, r)
    assert rel_err(grad, fd) < 1e-3
    for name, _role, offset, shape, _index, _in_head in net.param_info:
        block = slice(offset, offset + math.prod(shape))
        assert rel_err(grad[block], fd[block]) < 3e-3, f"gradient of {name}"


# ----------------------------------------------------------------------------------- forward

FORWARD_CASES = {
    "dict_like": NetSpec((55,), [dict_torso(), Linear(8), Tanh()], HEADS),
    "one_branch": NetSpec((6,), [Concat([Branch((6,), [Linear(4), ReLU()])])], HEADS),
    # An empty branch passes its columns on; an image branch's output is flattened (H, W, C).
    "empty_and_image_branches": NetSpec(
        (3 + 18,),
        [Concat([Branch((3,)), Branch((3, 3, 2), [Conv2d(2, 2), MaxPool2d(2, 1)])]), Tanh()],
        HEADS,
    ),
    "residual_in_branch": NetSpec(
        (7,),
        [
            Linear(7),
            Concat(
                [
                    Branch((4,), [Linear(4), Residual([Tanh(), Linear(4)]), LayerNorm()]),
                    Branch((3,), [Tanh()]),
                ]
            ),
            Linear(5),
        ],
        HEADS,
    ),
    "python_layer_in_branch": NetSpec(
        (5,), [Concat([Branch((2,), [Square()]), Branch((3,), [Linear(2)])])], HEADS
    ),
    "embedding_first": NetSpec((3,), [Embedding(5, 2), Linear(4), Tanh()], HEADS),
}


@pytest.mark.parametrize("batch", [1, 7, 64])
@pytest.mark.parametrize("case", sorted(FORWARD_CASES))
def test_forward_matches_float64_twin(case: str, batch: int) -> None:
    net = Net(FORWARD_CASES[case])
    assert_forward_matches_float64_twin(net, random_params(net, 1), random_obs(net.spec, batch, 2))


def test_concat_places_each_branch_in_its_columns() -> None:
    # No parameters but the heads: the features are the block's output itself.
    spec = NetSpec((2 + 8,), [Concat([Branch((2,)), Branch((2, 2, 2), [MaxPool2d(2)])])], HEADS)
    net = Net(spec)
    assert net.activation_shapes[-1] == (4,)
    obs = np.arange(10, dtype=np.float32)[None]
    views = {name: (off, shape) for name, _r, off, shape, _i, _h in net.param_info}
    params = np.zeros(net.num_params, np.float32)
    off, _ = views["heads.0.weight"]
    params[off : off + 12] = np.eye(4, 3).ravel()  # logits = features[:3]
    off, _ = views["heads.1.weight"]
    params[off + 3] = 1.0  # value = features[3]
    # Branch 0: columns 0, 1. Branch 1: the 2x2x2 image of columns 2..9, pooled per channel.
    np.testing.assert_array_equal(net.forward(params, obs), [[0.0, 1.0, 8.0, 9.0]])


def test_embedding_reads_its_rows_side_by_side() -> None:
    net = Net(NetSpec((2,), [Embedding(3, 2)], [Value()]))
    views = {name: (off, shape) for name, _r, off, shape, _i, _h in net.param_info}
    assert views["layers.0.weight"] == (0, (3, 2))
    params = np.zeros(net.num_params, np.float32)
    params[:6] = [10, 11, 20, 21, 30, 31]  # row e = (10 (e + 1), 10 (e + 1) + 1)
    params[6:10] = [1, 10, 100, 1000]  # value = row(x0) . (1, 10) + row(x1) . (100, 1000)
    obs = np.array([[2, 0], [1, 1]], np.float32)
    np.testing.assert_array_equal(
        net.forward(params, obs)[:, 0], [30 + 310 + 1000 + 11000, 20 + 210 + 2000 + 21000]
    )


# ---------------------------------------------------------------------------------- backward
# A layer with parameters below each block: a wrong input gradient shows in its gradient.

BACKWARD_CASES = {
    "dict_like": NetSpec((55,), [dict_torso(), Linear(6), Tanh()], HEADS),
    "linear_below_concat": NetSpec(
        (6,),
        [
            Linear(9),
            ReLU(),
            Concat(
                [Branch((2, 2, 1), [Conv2d(3, 1), ReLU()]), Branch((5,), [LayerNorm(), Linear(3)])]
            ),
            Linear(4),
        ],
        HEADS,
    ),
    "branch_opens_with_relu_and_residual": NetSpec(
        (5,),
        [
            Linear(7),
            Concat(
                [
                    Branch((3,), [ReLU(), Linear(3)]),
                    Branch((4,), [Residual([Tanh(), Linear(4)]), Linear(2)]),
                ]
            ),
            Residual([Linear(5)]),
        ],
        [Value()],
    ),
    "empty_branches": NetSpec(
        (4,), [Linear(5), Concat([Branch((2,)), Branch((3,))]), Tanh(), Linear(3)], [Value()]
    ),
    "embedding_first": NetSpec((3,), [Embedding(4, 2), Linear(4), Tanh()], HEADS),
}


@pytest.mark.parametrize("case", sorted(BACKWARD_CASES))
def test_backward_matches_finite_differences(case: str) -> None:
    check_backward(Net(BACKWARD_CASES[case]))


def test_embedding_scatter_adds_repeated_indices_and_gives_indices_no_gradient() -> None:
    # A Linear of weight 0 and bias (1, 1) feeds index 1 to both columns: the table's row 1 gets
    # the gradient of both, and the Linear none (indices carry no gradient).
    net = Net(NetSpec((2,), [Linear(2), Embedding(3, 2)], [Value()]))
    views = {name: (off, shape) for name, _r, off, shape, _i, _h in net.param_info}
    params = np.zeros(net.num_params, np.float32)
    off, _ = views["layers.0.bias"]
    params[off : off + 2] = 1.0
    off, _ = views["heads.0.weight"]
    params[off : off + 4] = [1, 2, 3, 4]
    obs = np.ones((3, 2), np.float32)
    _, tape = net.forward_train(params, obs)
    grad = net.backward(tape, np.ones((3, 1), np.float32))
    table = grad[views["layers.1.weight"][0] : views["layers.1.weight"][0] + 6].reshape(3, 2)
    np.testing.assert_array_equal(table, [[0, 0], [3 * (1 + 3), 3 * (2 + 4)], [0, 0]])
    np.testing.assert_array_equal(grad[: views["layers.1.weight"][0]], 0.0)  # layers.0.*


# ------------------------------------------------------------------------------ bad indices


def embedding_net() -> tuple[Net, np.ndarray, np.ndarray]:
    net = Net(NetSpec((55,), [dict_torso(conv=8)], HEADS))
    return net, net.init_params(seed=0), random_obs(net.spec, 64, 0)


@pytest.mark.parametrize(
    ("value", "error", "message"),
    [
        (6.0, IndexError, r"index 6 at row 5, column 1 is not an integer in \[0, 6\)"),
        (-1.0, IndexError, r"index -1 at row 5, column 1 is not an integer in \[0, 6\)"),
        (2.5, ValueError, r"index 2.5 at row 5, column 1 is not an integer in \[0, 6\)"),
        (np.nan, ValueError, r"index nan at row 5, column 1"),
        (np.inf, ValueError, r"index inf at row 5, column 1"),
        (1e30, IndexError, r"index 1e\+30 at row 5, column 1"),  # an integer, out of range
    ],
)
@pytest.mark.parametrize("release_gil", [True, False])
def test_bad_indices_raise_and_the_net_works_after(value, error, message, release_gil) -> None:
    net, params, obs = embedding_net()
    want = net.forward(params, obs)
    bad = obs.copy()
    bad[5, 54] = value  # the Embedding branch's column 1
    where = r"layer 0 \(concat\) branch 2 layer 0 \(embedding\): "
    with pytest.raises(error, match=where + message):
        net.forward(params, bad, release_gil=release_gil)
    with pytest.raises(error, match=message):
        net.forward_train(params, bad, release_gil=release_gil)
    stats = net.workspace_stats()
    assert stats["idle"] == stats["workspaces"]  # every workspace given back
    np.testing.assert_array_equal(net.forward(params, obs, release_gil=release_gil), want)


def test_bad_indices_raise_from_a_thread_pool_part() -> None:
    net, params, big, _dout = dict_data(1024)  # enough work to split
    pool = ThreadPool(2)
    assert net.torso_parts(pool, len(big)) == 2
    want = net.forward(params, big)
    bad = big.copy()
    bad[-1, 53] = 7.0  # in the second part's rows
    with pytest.raises(IndexError, match=rf"index 7 at row {len(big) - 1}, column 0"):
        net.forward(params, bad, pool=pool)
    np.testing.assert_array_equal(net.forward(params, big, pool=pool), want)


# ------------------------------------------------------------------------------------ errors


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            NetSpec((10,), [Concat([Branch((3,)), Branch((2, 2, 1))])], [Value()]),
            r"layer 0 \(concat\): its branches' shapes \(3,\), \(2, 2, 1\) take 7 features, "
            r"but its input is \(10,\)",
        ),
        (
            NetSpec((3, 3, 1), [Concat([Branch((9,))])], [Value()]),
            r"layer 0 \(concat\) expects a flat input \(F,\), got \(3, 3, 1\): add a Flatten",
        ),
        (
            NetSpec((5,), [Concat([Branch((2,)), Branch((3,), [Conv2d(2, 1)])])], [Value()]),
            r"layer 0 \(concat\) branch 1 layer 0 \(conv2d\) expects an image input "
            r"\(H, W, C\), got \(3,\)",
        ),
        (
            NetSpec((8,), [Concat([Branch((2, 2, 2), [Linear(2)])])], [Value()]),
            r"layer 0 \(concat\) branch 0 layer 0 \(linear\) expects a flat input",
        ),
        (
            NetSpec((4,), [Tanh(), Concat([Branch((4,), [Residual([Linear(3)])])])], [Value()]),
            r"layer 1 \(concat\) branch 0 layer 0 \(residual\) must output its input's shape",
        ),
        (
            NetSpec((8,), [Concat([Branch((2, 2, 2), [Embedding(3, 2)])])], [Value()]),
            r"layer 0 \(concat\) branch 0 layer 0 \(embedding\) expects a flat input \(K,\) of "
            r"indices, got \(2, 2, 2\)",
        ),
        (
            NetSpec((2, 2, 1), [Embedding(3, 2)], [Value()]),
            r"layer 0 \(embedding\) expects a flat input \(K,\) of indices, got \(2, 2, 1\)",
        ),
    ],
)
def test_bad_specs_are_refused_when_the_net_is_built(spec: NetSpec, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Net(spec)


def test_bad_block_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="Concat needs at least one branch, got none"):
        Concat([])
    with pytest.raises(TypeError, match="Concat branch 1 must be a Branch, got Linear"):
        Concat([Branch((2,)), Linear(2)])  # type: ignore[list-item]
    with pytest.raises(
        ValueError, match=r"Branch.shape must be \(D,\) or \(H, W, C\), got \(2, 3\)"
    ):
        Branch((2, 3))
    with pytest.raises(ValueError, match=r"Branch.shape: expected an integer >= 1, got 0"):
        Branch((0,))
    with pytest.raises(ValueError, match="Branch layer 0 is a Concat: a branch holds no Concat"):
        Branch((2,), [Concat([Branch((2,))])])
    with pytest.raises(TypeError, match="Branch layer 1 must be a layer"):
        Branch((2,), [Linear(2), Value()])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="Residual body layer 0 is a Concat"):
        Residual([Concat([Branch((2,))])])
    with pytest.raises(ValueError, match=r"Embedding.num_embeddings: expected an integer from 1"):
        Embedding(0, 3)
    with pytest.raises(ValueError, match=r"Embedding.num_embeddings: .* to 16777216"):
        Embedding((1 << 24) + 1, 3)
    with pytest.raises(ValueError, match=r"Embedding.dim: expected an integer >= 1, got 0"):
        Embedding(3, 0)


def native_net(layer: _native.LayerSpec, features: int = 4) -> _native.Net:
    spec = _native.NetSpec(input_shape=[features], layers=[layer], heads=[_native.HeadSpec.value()])
    return _native.Net(spec)


def test_the_core_refuses_bad_blocks_built_without_the_dataclasses() -> None:
    L = _native.LayerSpec
    with pytest.raises(ValueError, match=r"layer 0 \(concat\) needs at least one branch"):
        native_net(L.concat([], []))
    with pytest.raises(ValueError, match="has 1 branches but 2 branch shapes"):
        native_net(L.concat([[2], [2]], [[]]))
    with pytest.raises(ValueError, match=r"branch 0 needs a shape \(D,\) or \(H, W, C\)"):
        native_net(L.concat([[2, 2]], [[]]))
    with pytest.raises(ValueError, match="a branch holds no Concat"):
        native_net(L.concat([[4]], [[L.concat([[4]], [[]])]]))
    with pytest.raises(ValueError, match="a residual body holds no Concat"):
        native_net(L.residual([L.concat([[4]], [[]])]))
    with pytest.raises(ValueError, match="needs num_embeddings >= 1 and dim >= 1"):
        native_net(L.embedding(5, 0))
    with pytest.raises(ValueError, match="holds at most 2\\^24"):
        native_net(L.embedding((1 << 24) + 1, 2))
    assert repr(L.concat([[2], [1, 1, 2]], [[L.embedding(3, 2)], []])) == (
        "LayerSpec.concat([(2,), (1, 1, 2)], [[LayerSpec.embedding(3, 2)], []])"
    )


# ----------------------------------------------------------------------- parameters and init


def test_parameters_are_named_by_block_branch_and_layer_and_initialised() -> None:
    spec = NetSpec(
        (3 + 4 + 2,),
        [
            Concat(
                [
                    Branch((3,), [Linear(4, init_gain=0.5), Residual([LayerNorm(), Linear(4)])]),
                    Branch((4,)),
                    Branch((2,), [Embedding(1000, 8)]),
                ]
            ),
            LayerNorm(),
        ],
        [Value()],
    )
    net = Net(spec)
    assert net.activation_shapes[-1] == (4 + 4 + 16,)
    names = [name for name, *_ in net.param_info]
    assert names == [
        "layers.0.0.0.weight", "layers.0.0.0.bias",
        "layers.0.0.1.0.weight", "layers.0.0.1.0.bias",
        "layers.0.0.1.1.weight", "layers.0.0.1.1.bias",
        "layers.0.2.0.weight",
        "layers.1.weight", "layers.1.bias", "heads.0.weight", "heads.0.bias",
    ]  # fmt: skip
    views = net.param_views(net.init_params(seed=0))
    assert views["layers.0.2.0.weight"].shape == (1000, 8)
    np.testing.assert_array_equal(views["layers.0.0.1.0.weight"], np.ones(4, np.float32))
    w = views["layers.0.0.0.weight"].astype(np.float64)  # [3, 4]: orthogonal rows, gain 0.5
    np.testing.assert_allclose(w @ w.T, 0.25 * np.eye(3), atol=1e-5)
    table = views["layers.0.2.0.weight"].astype(np.float64)  # N(0, 1), as torch
    assert abs(table.mean()) < 0.05 and abs(table.std() - 1.0) < 0.05


def test_a_python_layer_in_a_branch_makes_the_net_take_the_gil() -> None:
    assert Net(FORWARD_CASES["python_layer_in_branch"]).has_python_layers
    assert not Net(FORWARD_CASES["dict_like"]).has_python_layers


# ------------------------------------------------------------------------------------ threads


def dict_data(batch: int) -> tuple[Net, np.ndarray, np.ndarray, np.ndarray]:
    net = Net(NetSpec((55,), [dict_torso(conv=16, hidden=32), Linear(32), ReLU()], HEADS))
    obs = random_obs(net.spec, batch, 0)
    dout = np.random.default_rng(1).standard_normal((batch, net.output_size)).astype(np.float32)
    return net, net.init_params(seed=1), obs, dout


def test_many_threads_on_one_net_give_one_threads_bits() -> None:
    assert_many_threads_give_one_threads_bits(*dict_data(12))


@pytest.mark.parametrize("threads", [2, 3])
def test_thread_pool_split_matches_the_whole_call(threads: int) -> None:
    net, params, obs, dout = dict_data(1024)
    pool = ThreadPool(threads)
    assert net.torso_parts(pool, 1024) == threads
    assert_pool_split_matches_the_whole_call(net, params, obs, dout, pool)


def test_learner_threads_take_the_steps_of_one_thread() -> None:
    """The pool a learner with ``learner_threads=2`` gets (`rlpar.ShardPool`, rows split by
    its native pool) on a Concat net: three Adam steps land on one thread's parameters."""
    net, params, obs, dout = dict_data(1024)
    shards = rlpar.ShardPool(2, split="rows")
    stepped = []
    try:
        for pool in (None, shards.native):
            opt = Adam(net.num_params, lr=0.01)
            p = params.copy()
            for _ in range(3):
                _out, tape = net.forward_train(p, obs, pool=pool)
                opt.step(p, net.backward(tape, dout, pool=pool))
                tape.release()
            stepped.append(p)
    finally:
        shards.close()
    assert not np.array_equal(stepped[0], params)
    assert_same_gradient(stepped[1], stepped[0])


# -------------------------------------------------------------------------------- torch twin


def test_forward_matches_torch_where_torch_is_installed() -> None:
    torch = pytest.importorskip("torch")
    from rlpar.bench.twins import check_twin, torch_input, torch_twin

    for case in ("dict_like", "empty_and_image_branches", "residual_in_branch", "embedding_first"):
        net = Net(FORWARD_CASES[case])
        params = random_params(net, 3)
        obs = random_obs(net.spec, 5, 4)
        with torch.no_grad():
            got = torch_twin(net, params, torch)(torch_input(net, obs, torch)).numpy()
        check_twin("torch", got, net.forward(params, obs))
        np.testing.assert_allclose(got, net.forward(params, obs), rtol=1e-4, atol=1e-4)


# -------------------------------------------------------------------------------- end to end


def test_a_dict_like_net_learns() -> None:
    """Image (5x5x2, conv), 3 features (Linear) and 2 discrete fields (Embedding) regress a
    target that needs all three; a few Adam steps bring the loss down."""
    net = Net(NetSpec((55,), [dict_torso(), Linear(16), Tanh()], [Value()]))
    rng = np.random.default_rng(0)
    obs = random_obs(net.spec, 64, 1)
    target = np.tanh(obs[:, :50].mean(1) + obs[:, 50]) + 0.3 * (obs[:, 53] == obs[:, 54])

    def loss_fn(out: np.ndarray) -> tuple[float, np.ndarray]:
        err = out[:, 0] - target
        return float(np.mean(err**2)), (2 * err / len(err))[:, None]

    params = net.init_params(seed=int(rng.integers(1000)))
    opt = Adam(net.num_params, lr=0.01)
    losses = []
    for _ in range(60):
        loss, grad, _out = net.value_and_grad(params, obs, loss_fn)
        losses.append(loss)
        opt.step(params, grad)
    assert losses[-1] < 0.3 * losses[0], losses[::10]
