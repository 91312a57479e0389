"""Networks: a small validated spec, and one native `Net` shared by every thread.

A `Net` holds only the architecture. Parameters are one flat float32 vector that every call takes
explicitly, and activations live in a workspace borrowed for the duration of the call, so any
number of threads can share one net with no per-thread setup::

    spec = NetSpec(input_shape=(4,), layers=[Linear(64), Tanh(), Linear(64), Tanh()],
                   heads=[Categorical(2), Value()])
    net = Net(spec)
    params = net.init_params(seed=0)                  # float32 [num_params]
    out = net.forward(params, obs)                    # obs float32 [B, 4] -> out [B, 3]
    heads = net.split(out)                            # {"logits": [B, 2], "value": [B]}

    out, tape = net.forward_train(params, obs)        # keeps activations for backward
    grad = net.backward(tape, dout)                   # dout [B, 3] -> grad float32 [num_params]

Forward, backward and the optimizers release the GIL when the call's work is above
`gil_release_threshold()` flops (or always/never with ``release_gil=True/False``). The
threshold is measured when rlpar is imported (`gil_calibration`: what handing the GIL to a
waiting thread costs here, times the kernels' speed), unless ``RLPAR_GIL_RELEASE_THRESHOLD``
pins it.

Layout: images are channels-last ``[B, H, W, C]``; a Linear weight is ``[in, out]`` and a Conv2d
weight ``[KH, KW, C, OC]``, all views into the flat parameter vector (see `Net.param_views`).
"""

from __future__ import annotations

import math
import os
import platform
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal, TypedDict

import numpy as np

from rlpar import _native
from rlpar._checks import check_int

__all__ = [
    "LSTM",
    "Branch",
    "Categorical",
    "Concat",
    "Conv2d",
    "Embedding",
    "Flatten",
    "Gaussian",
    "Head",
    "Layer",
    "LayerNorm",
    "Linear",
    "MaxPool2d",
    "Net",
    "NetSpec",
    "PyLayer",
    "ReLU",
    "Residual",
    "Tanh",
    "Tape",
    "Value",
    "amx_available",
    "conv_spec",
    "cpu_info",
    "gil_calibration",
    "gil_release_threshold",
    "impala_cnn_spec",
    "mlp_spec",
    "set_gil_release_threshold",
]

Tape = _native.Tape
gil_release_threshold = _native.gil_release_threshold
set_gil_release_threshold = _native.set_gil_release_threshold
gil_calibration = _native.gil_calibration


def _pin_release_threshold(value: str | None) -> None:
    """``RLPAR_GIL_RELEASE_THRESHOLD`` (flops), when set, replaces the threshold measured at
    import (`gil_calibration`): for runs that must not depend on the machine's timing."""
    if value is None or value == "":
        return
    try:
        flops = float(value)
    except ValueError:
        flops = float("nan")
    if not flops >= 0:
        raise ValueError(
            f"RLPAR_GIL_RELEASE_THRESHOLD must be a number of flops >= 0, got {value!r}"
        )
    set_gil_release_threshold(flops)


_pin_release_threshold(os.environ.get("RLPAR_GIL_RELEASE_THRESHOLD"))


def amx_available() -> bool:
    """True when this CPU and OS run Intel AMX-BF16 tiles (Xeon Sapphire Rapids or newer, Linux
    5.16+), which ``LSTM(matmul="bf16x3")`` needs; False also when the environment variable
    ``RLPAR_DISABLE_AMX`` is set (to anything but "" or "0") before rlpar first asks."""
    return bool(_native.amx_available())


# The CPU flags (as /proc/cpuinfo spells them) that decide which of rlpar's kernels can run.
_CPU_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")


class CpuInfo(TypedDict):
    """What `cpu_info` returns."""

    model: str  #: the CPU's model name ("" when unknown)
    flags: list[str]  #: those of avx2, fma, avx512f, avx512_bf16, amx_bf16, amx_tile it lists
    compiled_for: str  #: the -march of the native core ("native", "x86-64-v3", "x86-64", ...)
    kernels: str  #: the kernel set that runs: "avx512", "avx2" or "" (Eigen alone)
    max_isa: str | None  #: RLPAR_MAX_ISA as set ("avx512", "avx2", "none"), None when unset
    amx: bool  #: `amx_available()`


def _proc_cpuinfo(path: str = "/proc/cpuinfo") -> dict[str, str]:
    """The first processor's ``key: value`` lines of /proc/cpuinfo ({} where unreadable)."""
    fields: dict[str, str] = {}
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                if not line.strip():
                    if fields:
                        break
                    continue
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        return {}
    return fields


def cpu_info() -> CpuInfo:
    """The CPU, the build and the kernels rlpar runs, for logs and benchmark reports.

    ``model`` comes from /proc/cpuinfo's "model name" (else `platform.processor()`), ``flags``
    from its "flags" line (empty where it cannot be read). ``kernels`` is what
    `rlpar._native.simd_kernels()` reports: the best kernel set that the build (``compiled_for``),
    the CPU and the environment variable ``RLPAR_MAX_ISA`` (``max_isa``; read once, when rlpar is
    imported) allow. See docs/performance.md, "Kernel sets and RLPAR_MAX_ISA".
    """
    fields = _proc_cpuinfo()
    listed = set(fields.get("flags", "").split())
    return {
        "model": fields.get("model name") or platform.processor(),
        "flags": [flag for flag in _CPU_FLAGS if flag in listed],
        "compiled_for": str(_native.build_arch()),
        "kernels": str(_native.simd_kernels()),
        "max_isa": os.environ.get("RLPAR_MAX_ISA") or None,
        "amx": amx_available(),
    }


def _sample_shape(name: str, shape: Sequence[int]) -> tuple[int, ...]:
    """``shape`` as a tuple of ints, if it is a per-sample ``(D,)`` or ``(H, W, C)``."""
    shape = tuple(shape)
    if len(shape) not in (1, 3):
        raise ValueError(f"{name} must be (D,) or (H, W, C), got {shape}")
    return tuple(check_int(name, d, minimum=1) for d in shape)


def _check_inner_layers(owner: str, layers: Sequence[object]) -> None:
    """TypeError unless every one of a block's ``layers`` is a layer."""
    for j, layer in enumerate(layers):
        if not isinstance(layer, _LAYER_TYPES):
            raise TypeError(
                f"{owner} layer {j} must be a layer ({_LAYER_NAMES}), got {type(layer).__name__}"
            )


def _gain(owner: str, value: float | None) -> None:
    if value is not None and not (isinstance(value, (int, float)) and math.isfinite(value)):
        raise ValueError(f"{owner}.init_gain must be a finite number or None, got {value!r}")


# ------------------------------------------------------------------------------------- layers


@dataclass(frozen=True)
class Linear:
    """Fully connected layer: ``[B, in] -> [B, out_features]``; weight ``[in, out]``.

    ``init_gain``: gain of the orthogonal initialisation (default sqrt(2)).
    """

    out_features: int
    init_gain: float | None = None

    def __post_init__(self) -> None:
        check_int("Linear.out_features", self.out_features, minimum=1)
        _gain("Linear", self.init_gain)


@dataclass(frozen=True)
class Conv2d:
    """2-D convolution, channels last: ``[B, H, W, C] -> [B, OH, OW, out_channels]``.

    Square ``kernel``; weight ``[kernel, kernel, C, out_channels]``.
    """

    out_channels: int
    kernel: int
    stride: int = 1
    padding: int = 0
    init_gain: float | None = None

    def __post_init__(self) -> None:
        check_int("Conv2d.out_channels", self.out_channels, minimum=1)
        check_int("Conv2d.kernel", self.kernel, minimum=1)
        check_int("Conv2d.stride", self.stride, minimum=1)
        check_int("Conv2d.padding", self.padding, minimum=0)
        _gain("Conv2d", self.init_gain)


@dataclass(frozen=True)
class ReLU:
    """max(x, 0), elementwise."""


@dataclass(frozen=True)
class Tanh:
    """tanh(x), elementwise."""


@dataclass(frozen=True)
class Flatten:
    """``[B, *shape] -> [B, prod(shape)]``."""


class PyLayer:
    """A layer written in Python/numpy, placed anywhere in a native net.

    The native net takes the GIL back only around these calls. Both methods are stateless and
    receive float32 arrays with a leading batch axis; subclasses must be safe to call from several
    threads at once (they are, if they keep no per-call state on ``self``).
    """

    def output_shape(self, input_shape: tuple[int, ...]) -> tuple[int, ...]:
        """Per-sample output shape for a per-sample input shape (default: unchanged)."""
        return tuple(input_shape)

    def forward(self, x: np.ndarray) -> np.ndarray:
        """``x [B, *in_shape] -> y [B, *out_shape]``."""
        raise NotImplementedError

    def backward(self, x: np.ndarray, y: np.ndarray, dy: np.ndarray) -> np.ndarray:
        """Input gradient ``dx [B, *in_shape]`` from ``dy [B, *out_shape]``."""
        raise NotImplementedError


@dataclass(frozen=True)
class MaxPool2d:
    """Max pooling, channels last: ``[B, H, W, C] -> [B, OH, OW, C]``, no parameters.

    Square ``kernel`` windows every ``stride`` pixels (default: ``kernel``); ``padding`` pixels
    on each side count as -inf, so they never win (as ``torch.nn.MaxPool2d``; ``padding <=
    kernel // 2``). The gradient goes to each window's maximum; on ties to the first one in
    row-major order within the window, as torch's CPU kernel does.
    """

    kernel: int
    stride: int | None = None
    padding: int = 0

    def __post_init__(self) -> None:
        check_int("MaxPool2d.kernel", self.kernel, minimum=1)
        if self.stride is None:
            object.__setattr__(self, "stride", self.kernel)
        check_int("MaxPool2d.stride", self.stride, minimum=1)
        check_int("MaxPool2d.padding", self.padding, minimum=0)
        if 2 * self.padding > self.kernel:
            raise ValueError(
                f"MaxPool2d.padding must be at most kernel // 2 = {self.kernel // 2}, "
                f"got {self.padding}"
            )


@dataclass(frozen=True)
class LayerNorm:
    """Layer normalization over the last dimension (``torch.nn.LayerNorm(D)``, eps 1e-5).

    ``y = (x - mean) / sqrt(var + eps) * weight + bias`` with the mean and (biased) variance of
    each row's last ``D`` values: the features of ``(D,)``, the channels of each pixel of
    ``(H, W, C)``. Parameters ``weight [D]`` (init 1) and ``bias [D]`` (init 0). ``features``:
    the expected ``D`` (checked when the net is built), or None for whatever comes.
    """

    features: int | None = None

    def __post_init__(self) -> None:
        if self.features is not None:
            check_int("LayerNorm.features", self.features, minimum=2)


@dataclass(frozen=True)
class Residual:
    """``y = x + body(x)``: a block whose ``body`` is a sequence of layers.

    The body must output its input's shape (checked when the net is built). Its parameters are
    named ``layers.<i>.<j>.weight`` (block ``i``, body layer ``j``) in the one flat vector.
    Blocks nest one level: a body holds no Residual.
    """

    body: Sequence[Layer]

    def __post_init__(self) -> None:
        object.__setattr__(self, "body", tuple(self.body))
        if not self.body:
            raise ValueError("Residual needs at least one layer in its body, got none")
        for j, layer in enumerate(self.body):
            if isinstance(layer, Residual):
                raise ValueError(
                    f"Residual body layer {j} is a Residual: blocks nest one level only; "
                    "place the blocks one after the other"
                )
            if isinstance(layer, Concat):
                raise ValueError(
                    f"Residual body layer {j} is a Concat: a body holds no Concat; "
                    "place the Concat before the block"
                )
        _check_inner_layers("Residual body", self.body)


@dataclass(frozen=True)
class Embedding:
    """A table of learned vectors: ``[B, K]`` indices -> ``[B, K * dim]``.

    Each of the ``K`` input columns holds an index, a float32 integer in ``[0, num_embeddings)``
    (e.g. a discrete field of the observation), replaced by its row of ``weight
    [num_embeddings, dim]``: column ``k``'s vector is at output columns ``[k dim, (k + 1) dim)``.
    ``weight`` is initialised N(0, 1), as ``torch.nn.Embedding``. Backward adds each output
    gradient to its row of the weight's gradient; the indices get a zero gradient. A value that
    is not an integer in range raises (IndexError out of range, ValueError not an integer) naming
    it, its row and its column, before anything is read.
    """

    num_embeddings: int
    dim: int

    def __post_init__(self) -> None:
        # Float32 holds every integer up to 2^24 exactly: the indices it can name.
        check_int("Embedding.num_embeddings", self.num_embeddings, minimum=1, maximum=1 << 24)
        check_int("Embedding.dim", self.dim, minimum=1)


@dataclass(frozen=True)
class Branch:
    """One encoder of a `Concat`: its input ``shape`` and its ``layers``.

    ``shape``: ``(D,)`` or ``(H, W, C)`` (channels last), the view of the branch's
    ``prod(shape)`` columns of the Concat's input. ``layers``: any layers but a Concat
    (Residual blocks included); none: the columns as they are.
    """

    shape: tuple[int, ...]
    layers: Sequence[Layer] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", _sample_shape("Branch.shape", self.shape))
        object.__setattr__(self, "layers", tuple(self.layers))
        for j, layer in enumerate(self.layers):
            if isinstance(layer, Concat):
                raise ValueError(
                    f"Branch layer {j} is a Concat: a branch holds no Concat; "
                    "give the outer Concat more branches"
                )
        _check_inner_layers("Branch", self.layers)

    @property
    def size(self) -> int:
        """Columns of the Concat's input the branch takes: ``prod(shape)``."""
        return math.prod(self.shape)


@dataclass(frozen=True)
class Concat:
    """Several encoders side by side: ``[B, F] -> [B, sum of the branches' output sizes]``.

    The input is flat, ``F = sum(branch.size)`` (e.g. a `FlatObservation` of a Dict space, its
    leaves side by side): branch ``k`` takes the next ``branch.size`` columns, viewed as
    ``[B, *branch.shape]``, runs its layers, and the branch outputs, flattened (an image's in
    ``(H, W, C)`` order), are concatenated in branch order. Parameters are named
    ``layers.<i>.<k>.<j>.weight`` (block ``i``, branch ``k``, branch layer ``j``; a Residual's
    body layer ``m`` there: ``layers.<i>.<k>.<j>.<m>.weight``). Checked when the net is built:
    the input is flat, the branch sizes add up to ``F``, each layer fits its input.
    """

    branches: Sequence[Branch]

    def __post_init__(self) -> None:
        object.__setattr__(self, "branches", tuple(self.branches))
        if not self.branches:
            raise ValueError("Concat needs at least one branch, got none")
        for k, branch in enumerate(self.branches):
            if not isinstance(branch, Branch):
                raise TypeError(f"Concat branch {k} must be a Branch, got {type(branch).__name__}")


Layer = (
    Linear
    | Conv2d
    | ReLU
    | Tanh
    | Flatten
    | MaxPool2d
    | LayerNorm
    | Residual
    | Concat
    | Embedding
    | PyLayer
)


@dataclass(frozen=True)
class LSTM:
    """A recurrent core between the torso and the heads: ``[T N, F] -> [T N, hidden]``.

    Gates ``[i, f, g, o]``; parameters ``core.weight_ih [F, 4 hidden]``, ``core.weight_hh
    [hidden, 4 hidden]``, ``core.bias [4 hidden]`` (forget-gate bias initialised to
    ``forget_bias``). The state of one sequence is ``[h, c]``: float32 ``[2 hidden]``.

    ``matmul``: ``"float32"``, or ``"bf16x3"`` for the core's products on Intel AMX tiles, each
    float32 operand split into two bfloat16 halves and three of their products summed in
    float32: ~1e-5 relative error per product instead of ~6e-8, and faster where AMX is
    (`rlpar.amx_available()`; elsewhere the net refuses to build). Every call runs them, the
    actors' and the learner's alike. The weights are packed into tiles once per pinned
    `Snapshot` passed as params (as rlpar's actors step), or in each call from an array.
    """

    hidden: int
    forget_bias: float = 1.0
    matmul: str = "float32"

    def __post_init__(self) -> None:
        check_int("LSTM.hidden", self.hidden, minimum=1)
        if not math.isfinite(self.forget_bias):
            raise ValueError(f"LSTM.forget_bias must be finite, got {self.forget_bias}")
        if self.matmul not in ("float32", "bf16x3"):
            raise ValueError(f"LSTM.matmul must be 'float32' or 'bf16x3', got {self.matmul!r}")


# -------------------------------------------------------------------------------------- heads


@dataclass(frozen=True)
class Categorical:
    """``n`` action logits (output name ``logits``); init gain 0.01 keeps the policy uniform."""

    n: int
    init_gain: float = 0.01

    def __post_init__(self) -> None:
        check_int("Categorical.n", self.n, minimum=1)
        _gain("Categorical", self.init_gain)


@dataclass(frozen=True)
class Value:
    """One state value (output name ``value``)."""

    init_gain: float = 1.0

    def __post_init__(self) -> None:
        _gain("Value", self.init_gain)


@dataclass(frozen=True)
class Gaussian:
    """Diagonal Gaussian over ``n`` dimensions: outputs ``mean [B, n]`` and ``log_std [B, n]``.

    ``log_std`` is one state-independent parameter per dimension, broadcast over the batch.
    """

    n: int
    init_log_std: float = 0.0
    init_gain: float = 0.01

    def __post_init__(self) -> None:
        check_int("Gaussian.n", self.n, minimum=1)
        _gain("Gaussian", self.init_gain)
        if not math.isfinite(self.init_log_std):
            raise ValueError(f"Gaussian.init_log_std must be finite, got {self.init_log_std}")


Head = Categorical | Value | Gaussian

_LAYER_TYPES = (
    Linear,
    Conv2d,
    ReLU,
    Tanh,
    Flatten,
    MaxPool2d,
    LayerNorm,
    Residual,
    Concat,
    Embedding,
    PyLayer,
)
_LAYER_NAMES = (
    "Linear, Conv2d, ReLU, Tanh, Flatten, MaxPool2d, LayerNorm, Residual, Concat, Embedding "
    "or a PyLayer"
)
_HEAD_TYPES = (Categorical, Value, Gaussian)


@dataclass(frozen=True)
class NetSpec:
    """Architecture of a net.

    ``input_shape``: per-sample shape, ``(D,)`` or ``(H, W, C)``.
    ``input_dtype``: ``"float32"``, or ``"uint8"`` for frames converted and scaled natively.
    ``input_scale``: multiplies every input; default 1/255 for uint8 and 1 for float32.
    ``core``: an `LSTM` after the layers and before the heads (None: feed-forward).
    """

    input_shape: tuple[int, ...]
    layers: Sequence[Layer] = field(default_factory=tuple)
    heads: Sequence[Head] = field(default_factory=tuple)
    input_dtype: Literal["float32", "uint8"] = "float32"
    input_scale: float | None = None
    core: LSTM | None = None

    def __post_init__(self) -> None:
        if self.core is not None and not isinstance(self.core, LSTM):
            raise TypeError(f"core must be an LSTM or None, got {type(self.core).__name__}")
        object.__setattr__(
            self, "input_shape", _sample_shape("NetSpec.input_shape", self.input_shape)
        )
        object.__setattr__(self, "layers", tuple(self.layers))
        object.__setattr__(self, "heads", tuple(self.heads))
        for i, layer in enumerate(self.layers):
            if not isinstance(layer, _LAYER_TYPES):
                raise TypeError(
                    f"layer {i} must be one of {_LAYER_NAMES}, got {type(layer).__name__}"
                )
        if not self.heads:
            raise ValueError("a net needs at least one head (Categorical, Value or Gaussian)")
        for i, head in enumerate(self.heads):
            if not isinstance(head, _HEAD_TYPES):
                raise TypeError(
                    f"head {i} must be Categorical, Value or Gaussian, got {type(head).__name__}"
                )
        if self.input_dtype not in ("float32", "uint8"):
            raise ValueError(f"input_dtype must be 'float32' or 'uint8', got {self.input_dtype!r}")
        if self.input_scale is not None and not (
            math.isfinite(self.input_scale) and self.input_scale != 0
        ):
            raise ValueError(f"input_scale must be finite and non-zero, got {self.input_scale}")

    @property
    def scale(self) -> float:
        """The input scale in effect."""
        if self.input_scale is not None:
            return float(self.input_scale)
        return 1.0 / 255.0 if self.input_dtype == "uint8" else 1.0


def mlp_spec(
    obs_dim: int,
    heads: Sequence[Head],
    hidden: Sequence[int] = (64, 64),
    activation: Literal["tanh", "relu"] = "tanh",
) -> NetSpec:
    """An MLP torso ``obs_dim -> hidden... `` with the given heads."""
    activations: dict[str, type[Tanh] | type[ReLU]] = {"tanh": Tanh, "relu": ReLU}
    act = activations[activation]
    layers: list[Layer] = []
    for h in hidden:
        layers += [Linear(h), act()]
    return NetSpec(input_shape=(obs_dim,), layers=layers, heads=heads)


def conv_spec(
    frame_shape: tuple[int, int, int],
    heads: Sequence[Head],
    convs: Sequence[tuple[int, int, int]] = ((32, 8, 4), (64, 4, 2), (64, 3, 1)),
    hidden: int = 512,
) -> NetSpec:
    """A conv torso on uint8 frames ``[H, W, C]`` (default: Nature-DQN sizes).

    ``convs`` lists ``(out_channels, kernel, stride)``; ReLU after each layer.
    """
    layers: list[Layer] = []
    for oc, k, s in convs:
        layers += [Conv2d(oc, k, s), ReLU()]
    layers += [Flatten(), Linear(hidden), ReLU()]
    return NetSpec(input_shape=tuple(frame_shape), layers=layers, heads=heads, input_dtype="uint8")


def impala_cnn_spec(
    frame_shape: tuple[int, int, int],
    heads: Sequence[Head],
    channels: Sequence[int] = (16, 32, 32),
    hidden: int = 256,
    input_dtype: Literal["float32", "uint8"] = "uint8",
    input_scale: float | None = None,
) -> NetSpec:
    """The IMPALA paper's deep torso (Espeholt et al. 2018, "ResNet") on frames ``[H, W, C]``.

    For each ``c`` in ``channels``: Conv2d(c, 3, 1, 1), MaxPool2d(3, 2, 1), then two residual
    blocks ``x + Conv(ReLU(Conv(ReLU(x))))`` of 3x3 convs with ``c`` channels; then ReLU,
    Flatten, Linear(hidden), ReLU and the heads.
    """
    layers: list[Layer] = []
    for c in channels:
        check_int("impala_cnn_spec.channels", c, minimum=1)
        block = Residual([ReLU(), Conv2d(c, 3, 1, 1), ReLU(), Conv2d(c, 3, 1, 1)])
        layers += [Conv2d(c, 3, 1, 1), MaxPool2d(3, 2, 1), block, block]
    layers += [ReLU(), Flatten(), Linear(hidden), ReLU()]
    return NetSpec(
        input_shape=tuple(frame_shape),
        layers=layers,
        heads=heads,
        input_dtype=input_dtype,
        input_scale=input_scale,
    )


def _native_layer(layer: Layer) -> _native.LayerSpec:
    if isinstance(layer, Linear):
        return _native.LayerSpec.linear(layer.out_features)
    if isinstance(layer, Conv2d):
        return _native.LayerSpec.conv2d(
            layer.out_channels, layer.kernel, layer.stride, layer.padding
        )
    if isinstance(layer, ReLU):
        return _native.LayerSpec.relu()
    if isinstance(layer, Tanh):
        return _native.LayerSpec.tanh()
    if isinstance(layer, Flatten):
        return _native.LayerSpec.flatten()
    if isinstance(layer, MaxPool2d):
        stride = layer.kernel if layer.stride is None else layer.stride
        return _native.LayerSpec.maxpool2d(layer.kernel, stride, layer.padding)
    if isinstance(layer, LayerNorm):
        return _native.LayerSpec.layernorm(layer.features or 0)
    if isinstance(layer, Residual):
        return _native.LayerSpec.residual([_native_layer(inner) for inner in layer.body])
    if isinstance(layer, Concat):
        return _native.LayerSpec.concat(
            [list(b.shape) for b in layer.branches],
            [[_native_layer(inner) for inner in b.layers] for b in layer.branches],
        )
    if isinstance(layer, Embedding):
        return _native.LayerSpec.embedding(layer.num_embeddings, layer.dim)
    return _native.LayerSpec.python(layer)


def _run_layers(layers: Sequence[Layer]) -> list[Layer]:
    """The spec's layers as run, blocks opened: each Residual's body and each Concat branch's
    layers in their place (the adds, slices and joins left out)."""
    out: list[Layer] = []
    for layer in layers:
        if isinstance(layer, Residual):
            out += list(layer.body)
        elif isinstance(layer, Concat):
            for branch in layer.branches:
                out += _run_layers(branch.layers)
        else:
            out.append(layer)
    return out


def _param_owner(spec: NetSpec, name: str) -> Layer:
    """The layer of a torso parameter named ``layers.<i>.<role>``, ``layers.<i>.<j>.<role>``
    (Residual body layer ``j``) or ``layers.<i>.<k>.<j>[.<m>].<role>`` (Concat branch ``k``)."""
    parts = name.split(".")
    layer = spec.layers[int(parts[1])]
    if isinstance(layer, Residual):
        return layer.body[int(parts[2])]
    if isinstance(layer, Concat):
        inner = layer.branches[int(parts[2])].layers[int(parts[3])]
        return inner.body[int(parts[4])] if isinstance(inner, Residual) else inner
    return layer


def _native_head(head: Head) -> _native.HeadSpec:
    if isinstance(head, Categorical):
        return _native.HeadSpec.categorical(head.n)
    if isinstance(head, Value):
        return _native.HeadSpec.value()
    return _native.HeadSpec.gaussian(head.n)


def _native_spec(spec: NetSpec) -> _native.NetSpec:
    """The validated spec as the core's types (the bindings take it as is)."""
    return _native.NetSpec(
        input_shape=list(spec.input_shape),
        input_uint8=spec.input_dtype == "uint8",
        input_scale=spec.scale,
        layers=[_native_layer(layer) for layer in spec.layers],
        heads=[_native_head(head) for head in spec.heads],
        lstm_hidden=0 if spec.core is None else spec.core.hidden,
        lstm_bf16x3=spec.core is not None and spec.core.matmul == "bf16x3",
    )


def _orthogonal(rng: np.random.Generator, rows: int, cols: int, gain: float) -> np.ndarray:
    a = rng.standard_normal((max(rows, cols), min(rows, cols)))
    q, r = np.linalg.qr(a)
    q *= np.sign(np.diag(r))
    if rows < cols:
        q = q.T
    return (gain * q).astype(np.float32)


def aligned_zeros(n: int, align: int = 64) -> np.ndarray:
    """A zeroed float32 vector of ``n`` values whose data starts on an ``align``-byte boundary."""
    raw = np.zeros(n + align // 4, dtype=np.float32)
    start = (-raw.ctypes.data % align) // 4
    return raw[start : start + n]


class Net(_native.Net):
    """One native network, shared by every thread (see the module docstring).

    Methods implemented natively (GIL released above the work threshold):

    - ``forward(params, obs, out=None, release_gil=None, check_finite=False, *, state=None,
      resets=None) -> out``: ``params`` float32 ``[num_params]``, ``obs`` ``[B, *input_shape]``
      of the input dtype, ``out`` float32 ``[B, output_size]``. A recurrent net (``spec.core``)
      needs ``state`` float32 ``[B, state_size]``: one step of B sequences, the state is read
      and overwritten in place with the state after the step; ``resets`` bool ``[B]`` zeroes
      the state of the rows where an episode starts first.
    - ``forward_train(...)`` -> ``(out, tape)``: the same, keeping activations in ``tape``. For a
      recurrent net ``obs`` is ``T`` steps of ``N`` sequences, time-major ``[T N, ...]``,
      ``state`` ``[N, state_size]`` is the state before step 0 (only read), ``resets`` bool
      ``[T, N]`` the episode starts; backward then runs back through the T steps (truncated:
      no gradient into ``state``).
    - ``backward(tape, dout, grad=None, accumulate=False, release_gil=None, check_finite=False)
      -> grad``: ``dout`` float32 ``[B, output_size]``, ``grad`` float32 ``[num_params]``
      (overwritten, or added to with ``accumulate=True``).

    - All three take ``pool=``, an `rlpar.ThreadPool` (keyword only; None: the calling thread
      alone). With one, the torso (the layers before the core and the heads) runs in up to
      ``pool.threads`` parts side by side: forward by batch rows, backward layer by layer (each
      part its rows' data gradient and a slice of the weight gradients over the whole batch).
      Outputs and gradients are the unsplit call's bit for bit, whatever the pool size (AVX-512
      kernels; the portable build within rounding). ``torso_parts(pool, batch)`` says how many
      parts a call makes (small batches stay whole). A net with a Python layer ignores the
      pool.

    Non-contiguous ``obs``/``dout`` are copied; everything else that does not match raises
    ``TypeError``/``ValueError`` naming what was expected and what came.
    """

    spec: NetSpec

    def __init__(self, spec: NetSpec) -> None:
        if not isinstance(spec, NetSpec):
            raise TypeError(f"Net expects a NetSpec, got {type(spec).__name__}")
        super().__init__(_native_spec(spec))
        self.spec = spec

    def initial_state(self, n: int) -> np.ndarray:
        """The recurrent state at an episode start: float32 zeros ``[n, state_size]``
        (``[n, 0]`` for a feed-forward net)."""
        return np.zeros((n, self.state_size), np.float32)

    @property
    def has_python_layers(self) -> bool:
        """Whether a layer runs Python (a `PyLayer`): the net's calls then take the GIL."""
        return any(isinstance(layer, PyLayer) for layer in _run_layers(self.spec.layers))

    @property
    def output_slices(self) -> dict[str, slice]:
        """Columns of the ``[B, output_size]`` output for each named output."""
        return {name: slice(b, b + n) for name, _head, b, n in self.outputs}

    def split(self, out: np.ndarray) -> dict[str, np.ndarray]:
        """Named views of ``out [B, output_size]``: ``value`` is ``[B]``, the others ``[B, n]``."""
        parts = {}
        for name, _head, b, n in self.outputs:
            parts[name] = out[:, b] if name == "value" else out[:, b : b + n]
        return parts

    def join(self, parts: dict[str, np.ndarray]) -> np.ndarray:
        """The inverse of `split`: a float32 ``[B, output_size]`` array with each named part
        in its columns and zeros elsewhere, e.g. an output gradient for `backward` built head
        by head (``net.join({"logits": dlogits, "value": dvalue})``). Parts are ``[B, n]``
        (``value``: ``[B]``); unknown names or shapes that do not fit raise ValueError."""
        layout = {name: (b, n) for name, _head, b, n in self.outputs}
        unknown = sorted(set(parts) - set(layout))
        if unknown:
            raise ValueError(f"join: unknown output {unknown[0]!r}; outputs: {', '.join(layout)}")
        if not parts:
            raise ValueError(f"join: expected at least one of the outputs {', '.join(layout)}")
        batch = len(next(iter(parts.values())))
        out = np.zeros((batch, self.output_size), np.float32)
        for name, part in parts.items():
            b, n = layout[name]
            want = (batch,) if name == "value" else (batch, n)
            got = np.shape(part)
            if got != want:
                raise ValueError(f"join: {name} must have shape {list(want)}, got {list(got)}")
            out[:, b : b + n] = np.reshape(part, (batch, n))
        return out

    def param_views(self, params: np.ndarray) -> dict[str, np.ndarray]:
        """Read-only named views (e.g. ``layers.0.weight`` ``[in, out]``) into a flat vector."""
        if params.shape != (self.num_params,):
            raise ValueError(
                f"params must have shape ({self.num_params},), got {tuple(params.shape)}"
            )
        views = {}
        for name, _role, offset, shape, _index, _in_head in self.param_info:
            v = params[offset : offset + math.prod(shape)].reshape(shape)
            v.flags.writeable = False
            views[name] = v
        return views

    def init_params(self, seed: int) -> np.ndarray:
        """Seeded orthogonal initialisation: float32 ``[num_params]``, 64-byte aligned.

        Weights are orthogonal with gain sqrt(2) in the torso (or the layer's ``init_gain``)
        and the head's ``init_gain`` in heads; an Embedding's table N(0, 1); biases are 0;
        ``log_std`` is ``init_log_std``.
        """
        rng = np.random.default_rng(seed)
        params = aligned_zeros(self.num_params)
        for name, role, offset, shape, index, in_head in self.param_info:
            size = math.prod(shape)
            if self.spec.core is not None and name.startswith("core."):
                self._init_core(params[offset : offset + size], name, shape, self.spec.core, rng)
            elif role == "gain":
                params[offset : offset + size] = 1.0
            elif role == "weight":
                owner = self.spec.heads[index] if in_head else _param_owner(self.spec, name)
                if isinstance(owner, Embedding):
                    params[offset : offset + size] = rng.standard_normal(size)
                    continue
                gain = getattr(owner, "init_gain", None)
                gain = math.sqrt(2.0) if gain is None else gain
                fan_out = shape[-1]
                params[offset : offset + size] = _orthogonal(
                    rng, size // fan_out, fan_out, gain
                ).ravel()
            elif role == "log_std":
                params[offset : offset + size] = self.spec.heads[index].init_log_std
        return params

    @staticmethod
    def _init_core(
        view: np.ndarray, name: str, shape: tuple[int, ...], core: LSTM, rng: np.random.Generator
    ) -> None:
        """LSTM: each gate's weight block orthogonal (gain 1), biases 0 but the forget gate's."""
        hidden = shape[-1] // 4
        if name == "core.bias":
            view[hidden : 2 * hidden] = core.forget_bias
            return
        w = view.reshape(shape)
        for k in range(4):
            w[:, k * hidden : (k + 1) * hidden] = _orthogonal(rng, shape[0], hidden, 1.0)

    def value_and_grad(
        self,
        params: np.ndarray,
        obs: np.ndarray,
        loss_fn: Callable[[np.ndarray], tuple[float, np.ndarray]],
    ) -> tuple[float, np.ndarray, np.ndarray]:
        """Loss and gradient for a loss written in numpy.

        ``loss_fn(out [B, output_size]) -> (loss, dloss/dout [B, output_size])``.
        Returns ``(loss, grad [num_params], out)``.
        """
        out, tape = self.forward_train(params, obs)
        loss, dout = loss_fn(out)
        grad = self.backward(tape, np.asarray(dout, dtype=np.float32))
        tape.release()
        return float(loss), grad, out
