"""A small actor-critic agent for the runtime tests, written against the public API only."""

from __future__ import annotations

import gymnasium as gym
import numpy as np

import rlpar
from rlpar import Batch
from rlpar.agent import Agent, LearnerState


class TinyAgent(Agent):
    """One-step actor-critic with a numpy loss: enough to move parameters, not to be good."""

    def __init__(self, lr: float = 1e-3, hidden: int = 32, record: bool = False) -> None:
        self.lr, self.hidden, self.record = lr, hidden, record
        self.batches: list[Batch] = []
        self.params_by_version: dict[int, np.ndarray] = {}

    def net_spec(self, obs_space: gym.Space, action_space: gym.Space) -> rlpar.NetSpec:
        if not isinstance(action_space, gym.spaces.Discrete):
            raise ValueError(f"TinyAgent needs a Discrete action space, got {action_space}")
        return rlpar.mlp_spec(
            int(np.prod(obs_space.shape)),
            [rlpar.Categorical(int(action_space.n)), rlpar.Value()],
            hidden=(self.hidden,),
        )

    def init_state(self, net: rlpar.Net, params: np.ndarray) -> LearnerState:
        if self.record:
            self.params_by_version[1] = params.copy()
        return LearnerState(params=params, optimizer=rlpar.Adam(net.num_params, lr=self.lr))

    def act(self, net: rlpar.Net, out: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        logits = out[:, :-1]
        gumbel = -np.log(-np.log(rng.random(logits.shape)))
        return np.argmax(logits + gumbel, axis=1)

    def learn(self, net: rlpar.Net, state: LearnerState, batch: Batch) -> dict[str, float]:
        t_len, n = batch.rewards.shape
        obs = batch.obs.reshape((t_len + 1) * n, -1).astype(np.float32)
        out, tape = net.forward_train(state.params, obs)
        out = out.reshape(t_len + 1, n, -1)
        logits, values = out[:, :, :-1], out[:, :, -1]
        target = batch.rewards + 0.99 * (~batch.terminated) * values[1:]
        adv = (target - values[:-1]) * batch.mask
        logp = logits[:-1] - logits[:-1].max(-1, keepdims=True)
        probs = np.exp(logp)
        probs /= probs.sum(-1, keepdims=True)
        onehot = np.eye(logits.shape[-1], dtype=np.float32)[batch.actions]
        dout = np.zeros_like(out)
        scale = 1.0 / max(1, int(batch.mask.sum()))
        dout[:-1, :, :-1] = -(onehot - probs) * adv[..., None] * scale
        dout[:-1, :, -1] = -adv * scale
        grad = net.backward(tape, dout.reshape((t_len + 1) * n, -1))
        rlpar.clip_grad_norm(grad, 1.0)
        state.optimizer.step(state.params, grad)
        if self.record:
            self.batches.append(batch)
            self.params_by_version[state.steps + 2] = state.params.copy()
        return {"value_loss": float(np.mean(adv**2))}
