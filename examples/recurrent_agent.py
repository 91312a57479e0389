"""The custom agent of examples/custom_agent.py with a memory: an LSTM core between its torso
and its heads. The runtime carries the state on the actors, and `rlpar.loss_gradient`, which the
agent's learner step calls, hands each unroll's start state back to the net
(``batch.core_args()``), so this is all it takes.

Run it (after ``pip install .``): ``python examples/recurrent_agent.py``. On rlpar's memory task
(name a cue seen 9 steps earlier; chance is 0) it learns what a feed-forward policy cannot.
"""

import dataclasses

from custom_agent import Reinforce  # the file next to this one

import rlpar


class RecurrentReinforce(Reinforce):
    def net_spec(self, obs_space, action_space):
        spec = super().net_spec(obs_space, action_space)
        return dataclasses.replace(spec, core=rlpar.LSTM(32))  # state: [h, c], 64 floats


if __name__ == "__main__":
    rlpar.register_agent("recurrent-reinforce", RecurrentReinforce)
    runner = rlpar.Runner(
        rlpar.make_agent("recurrent-reinforce", {"lr": 0.005}),
        rlpar.EnvConfig("rlpar/MemoryChain-v0"),
        rlpar.RuntimeConfig(
            num_actors=2, envs_per_actor=16, unroll_length=20, total_env_steps=100_000, seed=0
        ),
    )
    result = runner.run()
    print(f"window mean return {result.mean_return:.2f} after {result.env_steps} env steps")
