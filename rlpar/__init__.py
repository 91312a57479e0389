"""rlpar: actor-learner reinforcement learning on one shared, GIL-free native net.

Public API (everything a user or a plug-in agent needs is importable from here):

- nets: `NetSpec`, layers `Linear`, `Conv2d`, `ReLU`, `Tanh`, `Flatten`, `PyLayer`, heads
  `Categorical`, `Value`, `Gaussian`, helpers `mlp_spec`, `conv_spec`, and `Net`;
- optimizers: `SGD`, `RMSProp`, `Adam`, `clip_grad_norm`, `global_norm`;
- parameter snapshots: `SnapshotStore`, `Snapshot`;
- GIL policy: `gil_release_threshold`, `set_gil_release_threshold`.
"""

from rlpar.nn import (
    Categorical,
    Conv2d,
    Flatten,
    Gaussian,
    Linear,
    Net,
    NetSpec,
    PyLayer,
    ReLU,
    Tanh,
    Tape,
    Value,
    conv_spec,
    gil_release_threshold,
    mlp_spec,
    set_gil_release_threshold,
)
from rlpar.optim import SGD, Adam, Optimizer, RMSProp, clip_grad_norm, global_norm
from rlpar.snapshot import Snapshot, SnapshotStore

__version__ = "0.1.0"

__all__ = [
    "SGD",
    "Adam",
    "Categorical",
    "Conv2d",
    "Flatten",
    "Gaussian",
    "Linear",
    "Net",
    "NetSpec",
    "Optimizer",
    "PyLayer",
    "RMSProp",
    "ReLU",
    "Snapshot",
    "SnapshotStore",
    "Tanh",
    "Tape",
    "Value",
    "__version__",
    "clip_grad_norm",
    "conv_spec",
    "gil_release_threshold",
    "global_norm",
    "mlp_spec",
    "set_gil_release_threshold",
]
