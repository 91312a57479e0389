"""A custom agent on rlpar's public API: REINFORCE with a learned baseline, its loss in numpy.

Run it (after ``pip install .``): ``python examples/custom_agent.py``. The README shows this file
and tests/test_examples.py runs it.
"""

from dataclasses import dataclass

import numpy as np

import rlpar


@dataclass(frozen=True)
class ReinforceConfig:
    lr: float = 0.01
    gamma: float = 0.99
    baseline_cost: float = 0.5

    def __post_init__(self) -> None:
        rlpar.check_field_types(self)  # ReinforceConfig(lr="x") fails as a TOML file would


def softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise softmax of ``logits [B, n]``."""
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    return p / p.sum(axis=1, keepdims=True)


class Reinforce(rlpar.Agent):
    """REINFORCE: returns to the episode's end (bootstrapped at the unroll's), minus V(x)."""

    Config = ReinforceConfig

    def __init__(self, config: ReinforceConfig) -> None:
        self.config = config

    def net_spec(self, obs_space, action_space):
        # The net's output [B, output_size] holds the heads side by side, in this order:
        # net.output_slices == {"logits": slice(0, n), "value": slice(n, n + 1)}.
        heads = [rlpar.Categorical(action_space.n), rlpar.Value()]
        return rlpar.mlp_spec(obs_space.shape[0], heads, hidden=(32,))

    def init_state(self, net, params):
        return rlpar.LearnerState(params, rlpar.Adam(net.num_params, lr=self.config.lr))

    def act(self, net, out, rng):  # out: [K, output_size], on an actor thread
        p = softmax(net.split(out)["logits"])
        return (p.cumsum(axis=1) > rng.random((len(p), 1))).argmax(axis=1)

    def greedy(self, net, out):  # for `rlpar eval` and rlpar.evaluate
        return net.split(out)["logits"].argmax(axis=1)

    def learn(self, net, state, batch):  # batch arrays are [T, N, ...]; obs has T + 1 rows
        # forward -> self.loss -> backward, on the learner's threads (runtime.learner_threads)
        grad, metrics = rlpar.loss_gradient(net, state.params, batch, self.loss, state.pool)
        norm = rlpar.clip_grad_norm(grad, 40.0, state.pool)
        if not rlpar.skip_nonfinite_step(state, norm):
            state.optimizer.step(state.params, grad, state.pool)
        return {**metrics, "grad_norm": norm}

    def loss(self, net, out, batch):  # out: [T + 1, N, output_size], the net at batch.obs
        T, N = batch.rewards.shape
        heads = net.split(out.reshape((T + 1) * N, -1))
        logits = heads["logits"].reshape(T + 1, N, -1)[:T]
        value = heads["value"].reshape(T + 1, N)
        done = batch.terminated | batch.truncated
        returns, g = np.zeros((T, N)), value[T].astype(np.float64)
        for t in reversed(range(T)):
            # After a termination nothing follows; after a truncation, V of the final obs.
            tail = np.where(batch.terminated[t], 0.0, np.where(done[t], value[t + 1], g))
            g = batch.rewards[t] + self.config.gamma * tail
            returns[t] = g
        valid = batch.mask  # False on the env's autoreset steps: no loss there
        count = max(1, int(valid.sum()))  # a mean over the valid steps, as loss_gradient asks
        adv = (returns - value[:T]) * valid
        p = softmax(logits.reshape(T * N, -1))
        onehot = np.eye(p.shape[1])[batch.actions.reshape(-1)]
        dlogits = -(onehot - p) * adv.reshape(-1, 1) / count
        dvalue = -self.config.baseline_cost * adv / count
        # One gradient for both heads, zero on the bootstrap row T.
        dout = np.zeros(((T + 1) * N, net.output_size), np.float32)
        dout[: T * N] = net.join({"logits": dlogits, "value": dvalue.reshape(-1)})
        return dout, {"mean_return_estimate": float(returns.mean())}


if __name__ == "__main__":
    rlpar.register_agent("reinforce", Reinforce)
    runner = rlpar.Runner(
        rlpar.make_agent("reinforce", {"lr": 0.01}),
        rlpar.EnvConfig("CartPole-v1"),
        rlpar.RuntimeConfig(
            num_actors=2, envs_per_actor=8, unroll_length=32, total_env_steps=100_000, seed=0
        ),
    )
    result = runner.run()
    print(f"window mean return {result.mean_return:.1f} after {result.env_steps} env steps")
