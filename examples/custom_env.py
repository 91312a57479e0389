"""A custom env for rlpar: any gymnasium env, registered under an id of your own.

Run it (after ``pip install .``): ``python examples/custom_env.py``. The README shows this file
and tests/test_examples.py runs it.
"""

import gymnasium as gym
import numpy as np

import rlpar


class Corridor(gym.Env):
    """Walk from cell 0 to the last of ``n`` cells: +1 there, -0.01 a step, 4n steps at most."""

    def __init__(self, n: int = 8) -> None:
        self.n, self.cell, self.steps = n, 0, 0
        self.observation_space = gym.spaces.Box(0.0, 1.0, (n,), np.float32)  # one-hot cell
        self.action_space = gym.spaces.Discrete(2)  # 0: left, 1: right

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)  # rlpar seeds every env differently
        self.cell = self.steps = 0
        return np.eye(self.n, dtype=np.float32)[self.cell], {}

    def step(self, action):
        self.cell = min(max(self.cell + (1 if action == 1 else -1), 0), self.n - 1)
        self.steps += 1
        terminated = self.cell == self.n - 1  # the end: nothing follows
        truncated = self.steps >= 4 * self.n  # cut short: the learner bootstraps from V(obs)
        obs = np.eye(self.n, dtype=np.float32)[self.cell]  # float32, as the space says
        return obs, 1.0 if terminated else -0.01, terminated, truncated, {}


def register() -> None:
    """Make ``Corridor-v0`` known to gymnasium, and so to rlpar (calling it twice is fine)."""
    if "Corridor-v0" not in gym.registry:
        gym.register("Corridor-v0", entry_point=f"{__name__}:Corridor", kwargs={"n": 8})


if __name__ == "__main__":
    register()
    runner = rlpar.Runner(
        rlpar.make_agent("impala", {"optim": {"lr": 0.003}}),
        rlpar.EnvConfig("Corridor-v0"),
        rlpar.RuntimeConfig(num_actors=1, envs_per_actor=8, total_env_steps=100_000, seed=0),
        evaluation=rlpar.EvalConfig(episodes=20),
    )
    result = runner.run()
    assert result.evaluation is not None  # the final parameters, greedy, on fresh env seeds
    print(f"evaluated return {result.evaluation[0]['mean_return']:.2f} (best possible: 0.94)")
