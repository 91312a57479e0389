"""What the built-in actor-critic agents (A3C, IMPALA, APPO) share: the net for the spaces,
acting, the config fields of the actor-critic loss, and the loss itself (the native
`rlpar.actor_critic_loss`). Written against the public `rlpar` API only; each agent's `learn`
is in its own file."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Literal

import gymnasium as gym
import numpy as np

import rlpar


@dataclass(frozen=True)
class NetConfig:
    """Torso sizes; the heads follow from the action space."""

    hidden: tuple[int, ...] = (64, 64)
    """MLP torso widths for vector observations."""
    activation: str = "tanh"
    """MLP activation: "tanh" or "relu"."""
    torso: str = "conv"
    """Torso for image observations: "conv" (the layers of `conv`, a ReLU after each) or
    "impala_cnn" (the IMPALA paper's residual net, rlpar.impala_cnn_spec, with the channels of
    `impala_channels`)."""
    conv: tuple[tuple[int, int, int], ...] = ((16, 3, 1),)
    """Conv torso for image observations: (out_channels, kernel, stride) per layer."""
    impala_channels: tuple[int, ...] = (16, 32, 32)
    """Channels of each section (conv, max-pool, two residual blocks) of the "impala_cnn" torso."""
    conv_hidden: int = 128
    """Width of the Linear layer after the conv torso (either kind)."""
    encoders: str = "flat"
    """For a Dict or Tuple observation (encoded into one vector, `rlpar.spaces`): "flat" (the MLP
    of `hidden` on the whole vector) or "per_leaf" (each image leaf (H, W, C) through a conv
    torso of its own, the layers of `conv` with a ReLU after each, flattened; every other leaf as
    it is; all side by side (`rlpar.Concat`) into the MLP of `hidden`). An image leaf's values
    reach its conv as they are (MiniGrid's object codes; no 1/255). Other observations get the
    torso of their shape either way."""
    init_log_std: float = 0.0
    """Initial log standard deviation of a Gaussian policy."""
    lstm: int = 0
    """Width of an LSTM core between the torso and the heads (0: none, a feed-forward policy).
    Actors carry its state; the learner backpropagates through each unroll from the state the
    actor stored at its start."""
    lstm_matmul: str = "float32"
    """The LSTM's products, the actors' and the learner's: "float32", or "bf16x3" on Intel AMX
    tiles (each float32 split into two bfloat16 halves, three products summed in float32: ~1e-5
    relative error per product instead of ~6e-8; for a 256-unit core 1.5-2.2x faster learner steps
    and 1.6-1.9x faster actor steps where the CPU has AMX; refused where it has not, or with
    RLPAR_DISABLE_AMX=1)."""

    def __post_init__(self) -> None:
        rlpar.check_field_types(self)
        if self.lstm < 0:
            raise rlpar.ConfigError(f"lstm: expected an integer >= 0, got {self.lstm!r}")
        if self.lstm_matmul not in ("float32", "bf16x3"):
            raise rlpar.ConfigError(
                f"lstm_matmul: expected 'float32' or 'bf16x3', got {self.lstm_matmul!r}"
            )
        if self.lstm_matmul == "bf16x3" and not rlpar.amx_available():
            raise rlpar.ConfigError(
                "lstm_matmul: 'bf16x3' needs Intel AMX-BF16 tiles (Xeon Sapphire Rapids or "
                "newer, Linux 5.16+), and this CPU or OS has none (or RLPAR_DISABLE_AMX is set): "
                "use 'float32'"
            )
        if self.torso not in ("conv", "impala_cnn"):
            raise rlpar.ConfigError(f"torso: expected 'conv' or 'impala_cnn', got {self.torso!r}")
        if not self.impala_channels or min(self.impala_channels) < 1:
            raise rlpar.ConfigError(
                "impala_channels: expected a non-empty list of integers >= 1, "
                f"got {list(self.impala_channels)!r}"
            )
        if self.encoders not in ("flat", "per_leaf"):
            raise rlpar.ConfigError(
                f"encoders: expected 'flat' or 'per_leaf', got {self.encoders!r}"
            )
        if self.activation not in ("tanh", "relu"):
            raise rlpar.ConfigError(
                f"activation: expected 'tanh' or 'relu', got {self.activation!r}"
            )


def policy_head(action_space: gym.Space, cfg: NetConfig) -> rlpar.Categorical | rlpar.Gaussian:
    """Discrete: one Categorical. MultiDiscrete, MultiBinary: sum(dims) logits, one Categorical
    per dimension (`rlpar.categorical_dims`). A float Box of any shape: a diagonal Gaussian over
    its elements."""
    dims = rlpar.categorical_dims(action_space)
    if dims is not None:
        return rlpar.Categorical(sum(dims))
    if isinstance(action_space, gym.spaces.Box) and np.issubdtype(action_space.dtype, np.floating):
        size = int(np.prod(action_space.shape))
        return rlpar.Gaussian(size, init_log_std=cfg.init_log_std)
    raise ValueError(
        f"unsupported action space {action_space}: expected Discrete, MultiDiscrete or "
        "MultiBinary (one dimension of choices), or a float Box (any shape)"
    )


def actor_critic_spec(
    obs_space: gym.Space, action_space: gym.Space, cfg: NetConfig
) -> rlpar.NetSpec:
    """MLP for vector observations, conv torso for images [H, W, C]; an LSTM core when
    ``cfg.lstm``; policy head + value head."""
    spec = _torso_spec(obs_space, action_space, cfg)
    return replace(spec, core=rlpar.LSTM(cfg.lstm, matmul=cfg.lstm_matmul)) if cfg.lstm else spec


def _torso_spec(obs_space: gym.Space, action_space: gym.Space, cfg: NetConfig) -> rlpar.NetSpec:
    heads = [policy_head(action_space, cfg), rlpar.Value()]
    if not isinstance(obs_space, gym.spaces.Box):
        raise ValueError(f"unsupported observation space {obs_space}: expected a Box")
    shape = tuple(int(d) for d in obs_space.shape)
    activation: Literal["tanh", "relu"] = "tanh" if cfg.activation == "tanh" else "relu"
    if cfg.encoders == "per_leaf" and isinstance(obs_space, rlpar.EncodedBox):
        return _per_leaf_spec(obs_space, heads, cfg, activation)
    if len(shape) == 1:
        return rlpar.mlp_spec(shape[0], heads, hidden=cfg.hidden, activation=activation)
    if len(shape) == 3:
        frames = obs_space.dtype == np.uint8 and float(np.max(obs_space.high)) > 1
        if cfg.torso == "impala_cnn":
            return rlpar.impala_cnn_spec(
                (shape[0], shape[1], shape[2]),
                heads,
                channels=cfg.impala_channels,
                hidden=cfg.conv_hidden,
                input_scale=1 / 255 if frames else 1.0,
            )
        layers = [*_conv_layers(cfg), rlpar.Linear(cfg.conv_hidden), rlpar.ReLU()]
        return rlpar.NetSpec(
            input_shape=shape,
            layers=layers,
            heads=heads,
            input_dtype="uint8",
            input_scale=1 / 255 if frames else 1.0,
        )
    raise ValueError(
        f"unsupported observation shape {shape}: expected a vector (D,) or an image (H, W, C)"
    )


def _conv_layers(cfg: NetConfig) -> list:
    """The conv torso of ``cfg.conv`` (a ReLU after each conv), flattened."""
    layers: list = []
    for oc, k, s in cfg.conv:
        layers += [rlpar.Conv2d(oc, k, s), rlpar.ReLU()]
    return [*layers, rlpar.Flatten()]


def _per_leaf_spec(
    obs_space: rlpar.EncodedBox,
    heads: list,
    cfg: NetConfig,
    activation: Literal["tanh", "relu"],
) -> rlpar.NetSpec:
    """Each image leaf through its own conv torso, the other leaves' columns as they are (runs
    of them in one branch), side by side, then the MLP of ``cfg.hidden``."""
    branches: list[rlpar.Branch] = []
    run = 0  # columns of non-image leaves not yet in a branch
    for leaf in obs_space.leaves:
        if not leaf.image:
            run += leaf.size
            continue
        if run:
            branches.append(rlpar.Branch((run,)))
            run = 0
        shape = tuple(int(d) for d in leaf.space.shape or ())
        branches.append(rlpar.Branch(shape, _conv_layers(cfg)))
    if run:
        branches.append(rlpar.Branch((run,)))
    act = rlpar.Tanh if activation == "tanh" else rlpar.ReLU
    layers: list = [rlpar.Concat(branches)]
    for h in cfg.hidden:
        layers += [rlpar.Linear(h), act()]
    return rlpar.NetSpec(input_shape=(int(obs_space.shape[0]),), layers=layers, heads=heads)


@dataclass
class PolicyLayout:
    """Where the policy and value live in the net's output row (and, for a Gaussian policy,
    the action bounds its mean is kept within by `rlpar.bound_penalty`). A "multi_categorical"
    policy has one Categorical per action dimension over ``dims`` logits each, side by side."""

    kind: Literal["categorical", "gaussian", "multi_categorical"]
    begin: int
    num_actions: int
    log_std_begin: int
    value_col: int
    low: np.ndarray | None = None
    high: np.ndarray | None = None
    dims: tuple[int, ...] = ()

    @classmethod
    def of(cls, net: rlpar.Net, dims: tuple[int, ...] | None = None) -> PolicyLayout:
        """The layout of ``net``'s heads; ``dims``, the action space's `rlpar.categorical_dims`,
        makes a policy of more than one dimension "multi_categorical"."""
        cols = net.output_slices
        if "logits" in cols:
            s = cols["logits"]
            if dims is not None and len(dims) > 1:
                return cls("multi_categorical", s.start, s.stop - s.start, 0,
                           cols["value"].start, dims=dims)  # fmt: skip
            return cls("categorical", s.start, s.stop - s.start, 0, cols["value"].start)
        s = cols["mean"]
        return cls(
            "gaussian", s.start, s.stop - s.start, cols["log_std"].start, cols["value"].start
        )


def _segments(layout: PolicyLayout, out: np.ndarray) -> list[np.ndarray]:
    """Each action dimension's logits [K, dims[d]] of a multi-categorical policy."""
    bounds = layout.begin + np.cumsum((0, *layout.dims))
    return [out[:, bounds[d] : bounds[d + 1]] for d in range(len(layout.dims))]


def sample_actions(layout: PolicyLayout, out: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Categorical: Gumbel-max over the logits -> int64 [K]. Multi-categorical: the same in
    each dimension -> int64 [K, D]. Gaussian: mean + std * N(0, 1) -> float32 [K, A]
    (unclipped)."""
    b, n = layout.begin, layout.num_actions
    if layout.kind == "categorical":
        gumbel = -np.log(-np.log(rng.random((out.shape[0], n))))
        return np.argmax(out[:, b : b + n] + gumbel, axis=1)
    if layout.kind == "multi_categorical":
        gumbel = -np.log(-np.log(rng.random((out.shape[0], n))))
        noisy = out[:, b : b + n] + gumbel
        shifted = replace(layout, begin=0)
        return np.stack([np.argmax(g, axis=1) for g in _segments(shifted, noisy)], axis=1)
    std = np.exp(out[:, layout.log_std_begin : layout.log_std_begin + n])
    return (out[:, b : b + n] + std * rng.standard_normal((out.shape[0], n))).astype(np.float32)


def greedy_actions(layout: PolicyLayout, out: np.ndarray) -> np.ndarray:
    """Categorical: argmax of the logits -> int64 [K]. Multi-categorical: each dimension's
    argmax -> int64 [K, D]. Gaussian: the mean -> float32 [K, A]."""
    b, n = layout.begin, layout.num_actions
    if layout.kind == "categorical":
        return np.argmax(out[:, b : b + n], axis=1)
    if layout.kind == "multi_categorical":
        return np.stack([np.argmax(g, axis=1) for g in _segments(layout, out)], axis=1)
    return out[:, b : b + n].astype(np.float32)


LR_SCHEDULE_KEY = "lr_schedule_env_steps"  # in LearnerState.extra: env steps learned from


@dataclass(frozen=True)
class OptimConfig:
    """The learner's optimizer."""

    name: str = "adam"
    """"adam" or "rmsprop"."""
    lr: float = 1e-3
    """Learning rate."""
    eps: float = 1e-5
    """Epsilon of Adam/RMSProp, added to the root of the squared-gradient average (PyTorch's
    convention). The built-in losses are means over the batch's T × N steps, so a paper's value
    for summed losses is far too large here (IMPALA's RMSProp 0.01 kept a Pong policy uniform
    for 5.5M frames): ~1e-5 suits."""
    alpha: float = 0.99
    """RMSProp decay."""
    max_grad_norm: float = 40.0
    """Global gradient-norm clipping."""
    lr_decay_env_steps: int | None = None
    """Anneal the learning rate linearly from `lr` to 0 over this many env steps learned from
    (each batch's T × N steps, counted once whatever the agent's `passes`): the IMPALA paper's
    schedule when set to `runtime.total_env_steps`. None: a constant `lr`. The position is
    part of the learner state, so a resumed run continues the schedule."""

    def __post_init__(self) -> None:
        rlpar.check_field_types(self)
        if self.name not in ("adam", "rmsprop"):
            raise rlpar.ConfigError(f"name: expected 'adam' or 'rmsprop', got {self.name!r}")
        for key, value, low in (("lr", self.lr, 0.0), ("eps", self.eps, 0.0)):
            if not value > low or not math.isfinite(value):
                raise rlpar.ConfigError(f"{key}: expected a finite number > {low}, got {value}")
        if not 0.0 <= self.alpha < 1.0:
            raise rlpar.ConfigError(f"alpha: expected a number in [0, 1), got {self.alpha}")
        if not self.max_grad_norm > 0:
            raise rlpar.ConfigError(
                f"max_grad_norm: expected a number > 0, got {self.max_grad_norm}"
            )
        if self.lr_decay_env_steps is not None and self.lr_decay_env_steps < 1:
            raise rlpar.ConfigError(
                f"lr_decay_env_steps: expected an integer >= 1 or none, got "
                f"{self.lr_decay_env_steps}"
            )

    def schedule(self, state: rlpar.LearnerState, batch: rlpar.Batch) -> None:
        """Before the optimizer step(s) on ``batch`` (rewards [T, N]): set the learning rate
        for them and count the batch's T × N env steps as learned from."""
        if self.lr_decay_env_steps is None:
            return
        learned = int(state.extra.get(LR_SCHEDULE_KEY, 0))
        state.optimizer.lr = self.lr * max(0.0, 1.0 - learned / self.lr_decay_env_steps)
        state.extra[LR_SCHEDULE_KEY] = learned + int(batch.rewards.size)

    def make(self, num_params: int) -> rlpar.Optimizer:
        if self.name == "adam":
            return rlpar.Adam(num_params, lr=self.lr, eps=self.eps)
        return rlpar.RMSProp(num_params, lr=self.lr, alpha=self.alpha, eps=self.eps)


@dataclass(frozen=True)
class ActorCriticConfig:
    """The fields every built-in actor-critic agent's config shares (each adds its own); the
    loss options' defaults are `rlpar.LossOptions`'s."""

    gamma: float = rlpar.LossOptions.gamma
    """Discount factor."""
    reward_scale: float = 1.0
    """Rewards are multiplied by this before the loss (keeps value targets near unit size)."""
    reward_clip: float | None = None
    """Rewards are clipped to [-reward_clip, reward_clip] before the loss (and before
    `reward_scale`); Atari: 1.0, as the DQN and IMPALA papers train. None: not clipped. The
    returns the run reports and evaluates stay the env's own."""
    action_bound_cost: float = 1.0
    """Gaussian policies with bounded actions: weight of a penalty on the squared distance of
    the policy's mean beyond the bounds (actions are clipped to them for the env, so out there
    the policy gradient has no signal and the mean drifts). 0: none."""
    baseline_cost: float = rlpar.LossOptions.baseline_cost
    """Weight of the value loss."""
    entropy_cost: float = rlpar.LossOptions.entropy_cost
    """Weight of the entropy bonus."""

    def __post_init__(self) -> None:
        rlpar.check_field_types(self)
        if self.reward_clip is not None and not self.reward_clip > 0:
            raise rlpar.ConfigError(
                f"reward_clip: expected a number > 0 or none, got {self.reward_clip}"
            )
        if self.action_bound_cost < 0:
            raise rlpar.ConfigError(
                f"action_bound_cost: expected a number >= 0, got {self.action_bound_cost}"
            )
        if not 0.0 <= self.gamma <= 1.0:
            raise rlpar.ConfigError(f"gamma: expected a number in [0, 1], got {self.gamma}")

    def loss_options(self) -> rlpar.LossOptions:
        """The loss on n-step returns (no importance weighting), with this config's weights."""
        return rlpar.LossOptions(
            gamma=self.gamma, baseline_cost=self.baseline_cost, entropy_cost=self.entropy_cost
        )

    def loss_rewards(self, rewards: np.ndarray) -> np.ndarray:
        """``rewards`` float32 [T, N] as the loss sees them: clipped to [-reward_clip,
        reward_clip] (when set), then multiplied by ``reward_scale``."""
        if self.reward_clip is not None:
            clip = np.float32(self.reward_clip)
            rewards = np.clip(rewards, -clip, clip)
        return rewards if self.reward_scale == 1.0 else rewards * np.float32(self.reward_scale)


class ActorCriticAgent(rlpar.Agent):
    """What A3C and IMPALA share around their learner step: the net for the spaces, acting
    by sampling the policy head, and `loss`. A subclass sets ``Config`` (an
    `ActorCriticConfig` with ``net`` and ``optim``) and writes `learn`."""

    def __init__(self, config) -> None:
        self.config = config
        self.loss_options: rlpar.LossOptions = config.loss_options()
        self._bounds: tuple[np.ndarray, np.ndarray] | None = None  # finite Box action bounds
        self._dims: tuple[int, ...] | None = None  # choices per dimension of a discrete space

    def net_spec(self, obs_space: gym.Space, action_space: gym.Space) -> rlpar.NetSpec:
        self._bounds = None
        self._dims = rlpar.categorical_dims(action_space)
        if isinstance(action_space, gym.spaces.Box):
            low = action_space.low.astype(np.float64).reshape(-1)
            high = action_space.high.astype(np.float64).reshape(-1)
            if np.isfinite(low).all() and np.isfinite(high).all():
                self._bounds = (low, high)
        return actor_critic_spec(obs_space, action_space, self.config.net)

    def init_state(self, net: rlpar.Net, params: np.ndarray) -> rlpar.LearnerState:
        self.layout = PolicyLayout.of(net, self._dims)
        if self._bounds is not None:
            self.layout.low, self.layout.high = self._bounds
        self.native_sampling = self.layout.kind == "categorical"  # act() samples the softmax
        low, high = self._bounds if self._bounds is not None else (None, None)
        self.native_loss = rlpar.NativeLoss.for_net(
            net, self.native_options(), action_low=low, action_high=high,
            bound_cost=self.config.action_bound_cost, action_dims=self.layout.dims,
        )  # fmt: skip
        return rlpar.LearnerState(params=params, optimizer=self.config.optim.make(net.num_params))

    def native_options(self) -> rlpar.LossOptions | rlpar.PpoOptions:
        """The options of the agent's `rlpar.NativeLoss`."""
        return self.loss_options

    def act(self, net: rlpar.Net, out: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return sample_actions(self.layout, out, rng)

    def greedy(self, net: rlpar.Net, out: np.ndarray) -> np.ndarray:
        return greedy_actions(self.layout, out)

    def loss(
        self, net: rlpar.Net, out: np.ndarray, batch: rlpar.Batch
    ) -> tuple[np.ndarray, dict[str, float]]:
        """An `rlpar.Loss`: from ``out`` float32 [T+1, N, O] (pi and V at x_0..x_T), the
        agent's `rlpar.NativeLoss` (targets, policy, baseline and entropy losses in one native
        call, plus `rlpar.bound_penalty` for a Gaussian policy with bounded actions) on the
        rewards as `ActorCriticConfig.loss_rewards` makes them. Returns (dout [T+1, N, O],
        metrics)."""
        return self.native_loss(net, out, self.loss_batch(batch))

    def loss_batch(self, batch: rlpar.Batch) -> rlpar.Batch:
        """``batch`` with its rewards as the loss sees them (`ActorCriticConfig.loss_rewards`)."""
        rewards = self.config.loss_rewards(batch.rewards)
        return batch if rewards is batch.rewards else replace(batch, rewards=rewards)

    def native_plan(self, state: rlpar.LearnerState, passes: int) -> rlpar.NativeLearn | None:
        """The `rlpar.NativeLearn` of a `learn` that schedules the rate, then takes ``passes``
        `rlpar.train_step`s of `step_loss` on the batch: None where those steps are not the
        native loss's on the batch as it came (rewards clipped or scaled, a subclass's
        `loss`), or a learning-rate schedule moves the rate from batch to batch."""
        c = self.config
        if (
            type(self).loss is not ActorCriticAgent.loss
            or c.reward_clip is not None
            or c.reward_scale != 1.0
            or c.optim.lr_decay_env_steps is not None
        ):
            return None
        return rlpar.NativeLearn(self.native_loss, passes, c.optim.max_grad_norm)

    def step_loss(self, batch: rlpar.Batch) -> tuple[rlpar.Loss, rlpar.Batch]:
        """What `learn` hands `rlpar.train_step`: the agent's `rlpar.NativeLoss` and the
        batch with the loss's rewards (one native call per optimizer step), or, when a
        subclass has its own `loss`, that one and the batch as it came."""
        if type(self).loss is ActorCriticAgent.loss:
            return self.native_loss, self.loss_batch(batch)
        return self.loss, batch
