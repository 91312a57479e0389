"""A plug-in agent with its loss written in PyTorch: PPO with an adaptive KL penalty.

Schulman et al. 2017 ("Proximal Policy Optimization Algorithms", section 4) give PPO two
objectives; rlpar's built-in `appo` has the clipped one, this file the other:

    L(theta) = E_t[ r_t(theta) A_t  -  beta KL(pi_old(.|x_t), pi_theta(.|x_t)) ]

with ``r_t = pi_theta(a_t|x_t) / pi_old(a_t|x_t)``. After each batch's epochs, with ``d`` the
mean KL of the last epoch: ``d < kl_target / 1.5`` halves ``beta``, ``d > 1.5 kl_target``
doubles it. ``pi_old`` is the policy that acted (the logits each rollout stores), so a rollout
that waited in a queue is weighed against the policy that drew its actions. Advantages are
GAE(lambda) from the value head at the minibatch's own step (recomputed each minibatch, as
Andrychowicz et al. 2021 recommend), normalized per minibatch; the value head regresses on the
lambda-returns.

The loss is the objective itself, as torch ops: rlpar runs the net natively, torch
differentiates the loss w.r.t. the net's output (`rlpar.TorchLoss`), and the native backward
takes that gradient. ``beta`` lives in the learner state's ``extra``, so checkpoints keep it.

Train it from the command line (after ``pip install ".[torch]"``); the config names this file
as a plug-in module:

    rlpar train experiments/cartpole_ppo_kl_torch.toml

tests/test_examples.py checks its gradient against finite differences of the objective in
numpy, the KL rule, and a short run from that config.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import numpy as np

import rlpar


@dataclass(frozen=True)
class PpoKlConfig:
    lr: float = 3e-4
    """Adam's learning rate."""
    gamma: float = 0.99
    """Discount."""
    gae_lambda: float = 0.95
    """GAE's lambda."""
    epochs: int = 4
    """Passes over each batch."""
    minibatches: int = 4
    """Minibatches of whole unrolls per pass (a divisor of the batch's columns)."""
    kl_target: float = 0.01
    """d_targ: the mean KL per batch the penalty steers to."""
    kl_coef: float = 1.0
    """beta's initial value (then halved or doubled after each batch)."""
    value_cost: float = 0.5
    """Weight of the value regression."""
    entropy_cost: float = 0.0
    """Weight of the entropy bonus."""
    max_grad_norm: float = 0.5
    """Global gradient norm clip."""
    hidden: tuple[int, ...] = (64, 64)
    """MLP torso widths (tanh)."""

    def __post_init__(self) -> None:
        rlpar.check_field_types(self)
        for key in ("lr", "kl_target", "kl_coef"):
            if not getattr(self, key) > 0:
                raise rlpar.ConfigError(f"{key}: expected a number > 0, got {getattr(self, key)}")
        for key in ("epochs", "minibatches"):
            if getattr(self, key) < 1:
                raise rlpar.ConfigError(
                    f"{key}: expected an integer >= 1, got {getattr(self, key)}"
                )


def gae(
    rewards: np.ndarray,
    values: np.ndarray,
    terminated: np.ndarray,
    truncated: np.ndarray,
    mask: np.ndarray,
    gamma: float,
    lam: float,
) -> np.ndarray:
    """GAE(lambda) advantages, float64 [T, N], of ``rewards`` [T, N] and ``values``
    [T + 1, N] (row t + 1 is the observation after step t: after a done step, that episode's
    final observation). After a termination nothing follows; after a truncation the value of
    the final observation does, and no trace crosses either. Zero where ``mask`` is False (the
    env's autoreset steps)."""
    T = rewards.shape[0]
    done = terminated | truncated
    adv = np.zeros(rewards.shape, np.float64)
    trace = np.zeros(rewards.shape[1], np.float64)
    for t in reversed(range(T)):
        nxt = np.where(terminated[t], 0.0, values[t + 1])
        delta = rewards[t] + gamma * nxt - values[t]
        trace = delta + gamma * lam * np.where(done[t], 0.0, trace)
        trace = np.where(mask[t], trace, 0.0)
        adv[t] = trace
    return adv


def adapted_kl_coef(beta: float, kl: float, target: float) -> float:
    """The paper's rule: halve ``beta`` when the mean KL fell under target / 1.5, double it
    above 1.5 target (kept in [1e-4, 1e4], so a long quiet stretch cannot drive it to 0)."""
    if kl < target / 1.5:
        beta /= 2.0
    elif kl > target * 1.5:
        beta *= 2.0
    return float(min(max(beta, 1e-4), 1e4))


class PpoKl(rlpar.Agent):
    """PPO with an adaptive KL penalty, its loss in PyTorch. Discrete actions."""

    Config = PpoKlConfig

    def __init__(self, config: PpoKlConfig) -> None:
        self.config = config

    def check_runtime(self, runtime) -> None:
        if runtime.batch_columns % self.config.minibatches:
            raise rlpar.ConfigError(
                f"minibatches: expected a divisor of the batch's {runtime.batch_columns} "
                f"columns, got {self.config.minibatches}"
            )

    def net_spec(self, obs_space, action_space):
        if len(obs_space.shape) != 1 or not hasattr(action_space, "n"):
            raise rlpar.ConfigError(
                "ppo-kl-torch: expected a vector observation and a Discrete action space, got "
                f"{obs_space} and {action_space}"
            )
        heads = [rlpar.Categorical(int(action_space.n)), rlpar.Value()]
        return rlpar.mlp_spec(obs_space.shape[0], heads, hidden=self.config.hidden)

    def init_state(self, net, params):
        state = rlpar.LearnerState(params, rlpar.Adam(net.num_params, lr=self.config.lr))
        state.extra["kl_coef"] = self.config.kl_coef
        return state

    def act(self, net, out, rng):  # out: [K, output_size]
        logits = net.split(out)["logits"]
        p = np.exp(logits - logits.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        return (p.cumsum(axis=1) > rng.random((len(p), 1))).argmax(axis=1)

    def greedy(self, net, out):
        return net.split(out)["logits"].argmax(axis=1)

    def learn(self, net, state, batch):  # batch arrays [T, N, ...]
        c = self.config
        beta = float(state.extra.get("kl_coef", c.kl_coef))
        loss = rlpar.TorchLoss(partial(self.objective, beta=beta))
        steps = [
            cols
            for _ in range(c.epochs)
            for cols in rlpar.minibatch_columns(batch, c.minibatches, state.rng)
        ]
        metrics = rlpar.train_steps(
            net, state, batch, loss, max_grad_norm=c.max_grad_norm, columns=steps
        )
        last_epoch = metrics[-c.minibatches :]
        kl = float(np.mean([m["kl"] for m in last_epoch]))
        state.extra["kl_coef"] = adapted_kl_coef(beta, kl, c.kl_target)
        return {**metrics[-1], "kl": kl, "kl_coef": state.extra["kl_coef"]}

    def objective(self, out, batch, beta: float):  # out: tensor [T + 1, N, output_size]
        import torch  # here, not at the top: loading the config needs no torch

        c = self.config
        heads = batch.heads(out)  # logits [T + 1, N, n], value [T + 1, N]
        b = batch.batch
        values = heads["value"].detach().numpy().astype(np.float64)
        adv_np = gae(b.rewards, values, b.terminated, b.truncated, b.mask, c.gamma, c.gae_lambda)
        valid = batch.mask
        count = max(1, int(valid.sum()))  # a mean over the valid steps, as every loss returns
        adv = torch.from_numpy(adv_np)
        returns = adv + torch.from_numpy(values[:-1])
        mean = (adv * valid).sum() / count
        std = (((adv - mean) ** 2 * valid).sum() / count).sqrt()
        adv = (adv - mean) / (std + 1e-8)

        logp = heads["logits"][:-1].log_softmax(-1).double()
        logp_old = batch.heads(batch.behaviour)["logits"].log_softmax(-1).double()
        logp_a = logp.gather(-1, batch.actions.unsqueeze(-1)).squeeze(-1)
        logp_old_a = logp_old.gather(-1, batch.actions.unsqueeze(-1)).squeeze(-1)
        ratio = (logp_a - logp_old_a).exp()
        kl = (logp_old.exp() * (logp_old - logp)).sum(-1)  # KL(pi_old || pi_theta), [T, N]
        entropy = -(logp.exp() * logp).sum(-1)
        value_err = heads["value"][:-1].double() - returns

        def mean_valid(x):
            return (x * valid).sum() / count

        loss = (
            -mean_valid(ratio * adv)
            + beta * mean_valid(kl)
            + 0.5 * c.value_cost * mean_valid(value_err**2)
            - c.entropy_cost * mean_valid(entropy)
        )
        return loss, {"kl": mean_valid(kl), "entropy": mean_valid(entropy),
                      "ratio_mean": mean_valid(ratio)}  # fmt: skip


rlpar.register_agent("ppo-kl-torch", PpoKl)
