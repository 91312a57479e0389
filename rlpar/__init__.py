"""rlpar: actor-learner reinforcement learning on one shared, GIL-free native net.

Public API (everything a user or a plug-in agent needs is importable from here):

- nets: `NetSpec`, layers `Linear`, `Conv2d`, `ReLU`, `Tanh`, `Flatten`, `MaxPool2d`,
  `LayerNorm`, `Residual`, `Concat` of `Branch`es, `Embedding`, `PyLayer`, heads
  `Categorical`, `Value`, `Gaussian`, helpers `mlp_spec`, `conv_spec`, `impala_cnn_spec`, and
  `Net`;
- optimizers: `SGD`, `RMSProp`, `Adam`, `clip_grad_norm`, `global_norm`,
  `skip_nonfinite_step` (skip and count a step whose gradient is NaN/inf);
- parameter snapshots: `SnapshotStore`, `Snapshot`;
- the agent seam and runtime: `Agent`, `LearnerState`, `Rollout`, `Batch`, `Runner`, `RunResult`,
  `Progress`, configs `EnvConfig`, `RuntimeConfig`, `EvalConfig`;
- the learner step: `loss_gradient` (forward -> an agent's `Loss` -> backward, over the
  learner's threads) and `learner_split` (how it shares them), `train_step` (gradient, clip,
  optimizer: one native call for a `NativeLoss`) and `train_steps` (several in a row, one
  call), `NativeLearn` (a built-in agent's step, for the runtime's native learner loop),
  `minibatches` and `minibatch_columns` (epochs x minibatches of whole unrolls), the native
  losses `actor_critic_loss` (its `LossOptions`) and `ppo_loss` (its `PpoOptions`),
  `NativeLoss` (either as a `Loss`), `TorchLoss` (a `Loss` written with PyTorch's autodiff;
  torch is imported only when one is called) and its `TorchBatch`, `bound_penalty`,
  `ShardPool` (the threads of a learner step: batch rows inside the net's calls, or column
  shards) and `ThreadPool` (native intra-op threads for `Net` calls);
- evaluation: `evaluate_policy` (play whole episodes with one parameter vector) and its
  `Evaluation`; a run's final parameters are `Runner.params` after `Runner.run`;
- plug-ins: `register_agent`, `make_agent`, `registered_agents`, `register_env`,
  `check_field_types` (a plug-in config dataclass checks its fields as the built-ins do);
- GIL policy: `gil_release_threshold`, `set_gil_release_threshold`, `gil_calibration`;
- the machine: `amx_available`, `cpu_info` (CPU model and flags, the build's -march, the kernel
  set that runs and its cap ``RLPAR_MAX_ISA``).
"""

import os as _os

try:
    from rlpar import _native  # noqa: F401  (the compiled core; everything below needs it)
except ImportError as _e:  # pragma: no cover - exercised in a child process by the tests
    if str(_e).startswith("RLPAR_MAX_ISA"):  # the core refused the kernel-set cap (rlpar/isa.h)
        raise ValueError(str(_e)) from None
    raise ImportError(
        f"rlpar's compiled core (rlpar._native) cannot be imported from "
        f"{_os.path.dirname(__file__)} ({_e}). If this is the source checkout, Python found "
        "this folder before the installed package: run from another directory, or install the "
        "checkout in editable mode for development: pip install -e '.[dev]' (see "
        "docs/cli.md, 'Building from source')."
    ) from _e

from rlpar.agent import Agent, LearnerState
from rlpar.config import ConfigError, EnvConfig, EvalConfig, RuntimeConfig, check_field_types
from rlpar.data import Batch, Rollout
from rlpar.learner_step import (
    Loss,
    NativeLearn,
    learner_split,
    loss_gradient,
    minibatch_columns,
    minibatches,
    train_step,
    train_steps,
)
from rlpar.losses import (
    LossOptions,
    NativeLoss,
    PpoOptions,
    actor_critic_loss,
    bound_penalty,
    ppo_loss,
)
from rlpar.nn import (
    LSTM,
    Branch,
    Categorical,
    Concat,
    Conv2d,
    Embedding,
    Flatten,
    Gaussian,
    LayerNorm,
    Linear,
    MaxPool2d,
    Net,
    NetSpec,
    PyLayer,
    ReLU,
    Residual,
    Tanh,
    Tape,
    Value,
    amx_available,
    conv_spec,
    cpu_info,
    gil_calibration,
    gil_release_threshold,
    impala_cnn_spec,
    mlp_spec,
    set_gil_release_threshold,
)
from rlpar.optim import (
    SGD,
    Adam,
    Optimizer,
    RMSProp,
    clip_grad_norm,
    global_norm,
    skip_nonfinite_step,
)
from rlpar.parallel import ShardPool, ThreadPool
from rlpar.registry import make_agent, register_agent, register_env, registered_agents
from rlpar.runtime import Progress, Runner, RunResult
from rlpar.runtime.evaluation import Evaluation, evaluate_policy
from rlpar.snapshot import Snapshot, SnapshotStore
from rlpar.spaces import EncodedBox, categorical_dims
from rlpar.torch_loss import TorchBatch, TorchLoss

__version__ = "0.1.0"

__all__ = [
    "LSTM",
    "SGD",
    "Adam",
    "Agent",
    "Batch",
    "Branch",
    "Categorical",
    "Concat",
    "ConfigError",
    "Conv2d",
    "Embedding",
    "EncodedBox",
    "EnvConfig",
    "EvalConfig",
    "Evaluation",
    "Flatten",
    "Gaussian",
    "LayerNorm",
    "LearnerState",
    "Linear",
    "Loss",
    "LossOptions",
    "MaxPool2d",
    "NativeLearn",
    "NativeLoss",
    "Net",
    "NetSpec",
    "Optimizer",
    "PpoOptions",
    "Progress",
    "PyLayer",
    "RMSProp",
    "ReLU",
    "Residual",
    "Rollout",
    "RunResult",
    "Runner",
    "RuntimeConfig",
    "ShardPool",
    "Snapshot",
    "SnapshotStore",
    "Tanh",
    "Tape",
    "ThreadPool",
    "TorchBatch",
    "TorchLoss",
    "Value",
    "__version__",
    "actor_critic_loss",
    "amx_available",
    "bound_penalty",
    "categorical_dims",
    "check_field_types",
    "clip_grad_norm",
    "conv_spec",
    "cpu_info",
    "evaluate_policy",
    "gil_calibration",
    "gil_release_threshold",
    "global_norm",
    "impala_cnn_spec",
    "learner_split",
    "loss_gradient",
    "make_agent",
    "minibatch_columns",
    "minibatches",
    "mlp_spec",
    "ppo_loss",
    "register_agent",
    "register_env",
    "registered_agents",
    "set_gil_release_threshold",
    "skip_nonfinite_step",
    "train_step",
    "train_steps",
]
