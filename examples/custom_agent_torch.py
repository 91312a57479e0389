"""The REINFORCE agent of examples/custom_agent.py with its loss written in PyTorch: the loss
itself, no hand-derived gradient. rlpar runs the net natively; torch differentiates the loss
with respect to the net's output, and that gradient goes into the native backward.

Run it (after ``pip install ".[torch]"``): ``python examples/custom_agent_torch.py``.
tests/test_torch_loss.py checks that its gradient equals the numpy version's.
"""

import torch
from custom_agent import Reinforce  # the file next to this one

import rlpar


class TorchReinforce(Reinforce):
    def __init__(self, config) -> None:
        super().__init__(config)
        self.torch_loss = rlpar.TorchLoss(self.reinforce_loss)

    def loss(self, net, out, batch):  # what `learn` hands loss_gradient: d loss / d out
        return self.torch_loss(net, out, batch)

    def reinforce_loss(self, out, batch):  # out: tensor [T + 1, N, output_size]
        heads = batch.heads(out)  # logits [T + 1, N, n], value [T + 1, N]
        value = heads["value"].detach().double()
        done = batch.terminated | batch.truncated
        returns, g = [], value[-1]
        for t in reversed(range(batch.rewards.shape[0])):
            # After a termination nothing follows; after a truncation, V of the final obs.
            tail = torch.where(batch.terminated[t], 0.0, torch.where(done[t], value[t + 1], g))
            g = batch.rewards[t] + self.config.gamma * tail
            returns.insert(0, g)
        valid = batch.mask  # False on the env's autoreset steps: no loss there
        count = max(1, int(valid.sum()))  # a mean over the valid steps, as loss_gradient asks
        adv = torch.stack(returns) - heads["value"][:-1].double()
        logp = heads["logits"][:-1].log_softmax(-1)
        logp_a = logp.gather(-1, batch.actions.unsqueeze(-1)).squeeze(-1)
        policy = -(logp_a * adv.detach() * valid).sum() / count
        baseline = 0.5 * self.config.baseline_cost * (adv**2 * valid).sum() / count
        return policy + baseline, {"mean_return_estimate": torch.stack(returns).mean()}


if __name__ == "__main__":
    torch.set_num_threads(1)  # the loss is small: torch's own threads would only compete
    rlpar.register_agent("torch-reinforce", TorchReinforce)
    runner = rlpar.Runner(
        rlpar.make_agent("torch-reinforce", {"lr": 0.01}),
        rlpar.EnvConfig("CartPole-v1"),
        rlpar.RuntimeConfig(
            num_actors=2, envs_per_actor=8, unroll_length=32, total_env_steps=100_000, seed=0
        ),
    )
    result = runner.run()
    print(f"window mean return {result.mean_return:.1f} after {result.env_steps} env steps")
