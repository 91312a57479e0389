"""Action spaces beyond Discrete: MultiDiscrete and MultiBinary (one Categorical per dimension,
their log-probabilities and entropies summed: the losses' float64 twins are in test_losses.py
and test_ppo_loss.py) and Box actions of any shape, through the runtime's paths."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.spaces import Box, Discrete, MultiBinary, MultiDiscrete

import rlpar
from rlpar.config import EnvConfig, EvalConfig, RuntimeConfig
from rlpar.runtime.envs import ActionAdapter


class CueEnv(gym.Env):
    """The observation is a cue (one-hot of 3); the action pays 1 when every dimension names
    what the cue asks of it, so each head must read the cue, and a policy that gets one
    dimension right but not the other earns nothing. 10 steps an episode."""

    observation_space = Box(0.0, 1.0, (3,), np.float32)

    def __init__(self, action_space: gym.Space) -> None:
        self.action_space = action_space
        self.t = 0

    def _draw(self) -> np.ndarray:
        self.cue = int(self.np_random.integers(3))
        return np.eye(3, dtype=np.float32)[self.cue]

    def wanted(self) -> np.ndarray:
        space = self.action_space
        if isinstance(space, MultiDiscrete):  # dimension d: (cue + d) mod its choices, + start
            return np.array([(self.cue + d) % n for d, n in enumerate(space.nvec)]) + space.start
        return np.array([(self.cue >> d) & 1 for d in range(space.n)], np.int8)  # MultiBinary

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._draw(), {}

    def step(self, action):
        assert self.action_space.contains(action), action
        reward = 1.0 if np.array_equal(np.asarray(action), self.wanted()) else 0.0
        self.t += 1
        return self._draw(), reward, False, self.t >= 10, {}


class CueMultiDiscrete(CueEnv):
    def __init__(self) -> None:
        super().__init__(MultiDiscrete([3, 4], start=[0, 2]))


class CueMultiBinary(CueEnv):
    def __init__(self) -> None:
        super().__init__(MultiBinary(2))


gym.register("rlpar-test/CueMultiDiscrete-v0", CueMultiDiscrete)
gym.register("rlpar-test/CueMultiBinary-v0", CueMultiBinary)


class BoxActionEnv(gym.Env):
    """A (2, 2) Box action: reward -|a - target|^2, the target fixed; 5 steps an episode."""

    observation_space = Box(-1.0, 1.0, (2,), np.float32)
    action_space = Box(-1.0, 1.0, (2, 2), np.float32)
    target = np.array([[0.5, -0.5], [0.25, 0.0]], np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(2, np.float32), {}

    def step(self, action):
        assert action.shape == (2, 2) and self.action_space.contains(action), action
        self.t += 1
        reward = -float(np.sum((action - self.target) ** 2))
        return np.zeros(2, np.float32), reward, False, self.t >= 5, {}


gym.register("rlpar-test/BoxMatrixAction-v0", BoxActionEnv)


def test_the_adapter_turns_sampled_actions_into_the_env_s() -> None:
    md = ActionAdapter(MultiDiscrete([3, 4], start=[0, 2]))
    assert md.shape == (2,) and md.dtype == np.int64
    np.testing.assert_array_equal(md.to_env(np.array([[2, 0], [0, 3]])), [[2, 2], [0, 5]])
    mb = ActionAdapter(MultiBinary(3))
    got = mb.to_env(np.array([[1, 0, 1]], np.int64))
    assert got.dtype == np.int8 and mb.space.contains(got[0])
    box = ActionAdapter(Box(-1.0, 1.0, (2, 2), np.float32))
    assert box.shape == (4,) and box.dtype == np.float32
    out = box.to_env(np.array([[2.0, -3.0, 0.5, 0.0]], np.float32))
    np.testing.assert_array_equal(out, [[[1.0, -1.0], [0.5, 0.0]]])


@pytest.mark.parametrize(
    ("space", "match"),
    [
        (gym.spaces.Tuple((Discrete(2), Discrete(3))), "Tuple"),
        (MultiDiscrete([[2, 3], [4, 5]]), "more than one dimension"),
        (Box(0, 5, (2,), np.int64), "integer Box"),
    ],
)
def test_an_action_space_without_a_policy_head_is_named(space, match) -> None:
    with pytest.raises(ValueError, match=f"(?s)unsupported action space .*{match}"):
        ActionAdapter(space)


def test_categorical_dims() -> None:
    assert rlpar.categorical_dims(Discrete(4)) == (4,)
    assert rlpar.categorical_dims(MultiDiscrete([3, 4])) == (3, 4)
    assert rlpar.categorical_dims(MultiBinary(3)) == (2, 2, 2)
    assert rlpar.categorical_dims(Box(-1, 1, (2,))) is None


def runtime(steps: int, **kw) -> RuntimeConfig:
    return RuntimeConfig(num_actors=1, envs_per_actor=8, unroll_length=10, seed=0,
                         total_env_steps=steps, checkpoint_interval_s=None, target_return=9.0,
                         max_wall_s=240, **kw)  # fmt: skip


def trained(agent: str, env: EnvConfig, steps: int = 80_000, **kw) -> rlpar.RunResult:
    options = {"optim": {"lr": 3e-3}, "gamma": 0.5}  # rewards come at once
    runner = rlpar.Runner(rlpar.make_agent(agent, options), env, runtime(steps, **kw),
                          evaluation=EvalConfig(episodes=20))  # fmt: skip
    return runner.run()


@pytest.mark.parametrize(
    ("agent", "env_id", "modes"),
    [
        ("impala", "rlpar-test/CueMultiDiscrete-v0", {}),
        ("impala", "rlpar-test/CueMultiDiscrete-v0", {"double_buffer": True}),
        ("impala", "rlpar-test/CueMultiDiscrete-v0",
         {"vectorization": "async", "workers_per_actor": 2}),
        ("appo", "rlpar-test/CueMultiDiscrete-v0", {}),
        ("a3c", "rlpar-test/CueMultiDiscrete-v0", {}),
        ("impala", "rlpar-test/CueMultiBinary-v0", {}),
    ],
    ids=["impala-sync", "impala-double-buffered", "impala-async", "appo", "a3c", "multibinary"],
)  # fmt: skip
def test_coordinated_discrete_actions_are_learned(agent, env_id, modes) -> None:
    """Random play scores 10/12 (MultiDiscrete) or 10/4 (MultiBinary) an episode, a policy that
    gets one dimension right at most 10/3 or 10/2: the greedy policy must score >= 8."""
    result = trained(agent, EnvConfig(env_id, **modes))
    assert result.evaluation is not None
    greedy = result.evaluation[0]
    assert greedy["mean_return"] >= 8.0, result


def test_a_matrix_box_action_is_learned() -> None:
    options = {"optim": {"lr": 3e-3}, "net": {"init_log_std": -1.0}}
    run = RuntimeConfig(num_actors=1, envs_per_actor=8, unroll_length=5, seed=0,
                        total_env_steps=60_000, checkpoint_interval_s=None)  # fmt: skip
    runner = rlpar.Runner(rlpar.make_agent("impala", options),
                          EnvConfig("rlpar-test/BoxMatrixAction-v0"), run,
                          evaluation=EvalConfig(episodes=5, policies=("greedy",)))  # fmt: skip
    assert runner.net.output_slices["mean"].stop - runner.net.output_slices["mean"].start == 4
    result = runner.run()
    assert result.evaluation is not None
    assert result.evaluation[0]["mean_return"] > -0.5, result  # random play: about -11


def test_a_multidiscrete_policy_with_an_lstm_core_runs_and_evaluates() -> None:
    """The LSTM core's actors carry their state beside a factorized head; every action reaches
    the env inside its space (the env asserts it) in training and in evaluation."""
    options = {"optim": {"lr": 3e-3}, "gamma": 0.5, "net": {"lstm": 16}}
    runner = rlpar.Runner(rlpar.make_agent("impala", options),
                          EnvConfig("rlpar-test/CueMultiDiscrete-v0"), runtime(4_000),
                          evaluation=EvalConfig(episodes=4))  # fmt: skip
    result = runner.run()
    assert result.env_steps >= 4_000 and result.learner_steps > 0
    assert result.evaluation is not None and result.evaluation[0]["episodes"] == 4


def test_joint_reach_pays_for_moving_both_joints_at_once() -> None:
    """From a start two angle steps from the target on each joint, moving both joints together
    reaches it in 2 steps (1 - 0.1), one at a time in 4 (1 - 0.3); each leaf of the observation
    shows one half of what the policy needs."""
    import rlpar.envs  # noqa: F401  (registers rlpar/JointReach-v0)

    env = gym.make("rlpar/JointReach-v0").unwrapped
    env.reset(seed=0)
    env.q[:] = (0, 0)
    env.target = env.cells[2, 2].copy()
    assert not env._reached() and (env.cells[1, 1] != env.target).any()
    obs = env._obs()
    assert obs["target"].sum() == 1 and obs["target"][env.target[0], env.target[1], 0] == 1
    np.testing.assert_allclose(obs["joints"], [1, 0, 1, 0], atol=1e-6)
    rewards = [env.step(np.array([2, 2]))[1] for _ in range(2)]
    assert rewards == [-0.1, 1.0]
    with pytest.raises(ValueError, match="expected two choices in"):
        env.step(np.array([3, 0]))


def test_joint_reach_renders_the_target_the_base_and_the_fingertip() -> None:
    import rlpar.envs

    env = gym.make("rlpar/JointReach-v0", render_mode="rgb_array").unwrapped
    env.reset(seed=3)
    frame = env.render()
    cell, colors = rlpar.envs.JointReachEnv.CELL, rlpar.envs.JointReachEnv.COLORS
    assert frame.shape == (11 * cell, 11 * cell, 3) and frame.dtype == np.uint8
    grid = frame[::cell, ::cell]
    tip = env.cells[env.q[0], env.q[1]]
    assert tuple(grid[env.target[0], env.target[1]]) == colors["target"]
    assert tuple(grid[tip[0], tip[1]]) == colors["tip"]
    assert tuple(grid[5, 5]) == colors["base"]
    with pytest.raises(ValueError, match="render_mode: expected None or 'rgb_array'"):
        rlpar.envs.JointReachEnv(render_mode="human")


class CueDiscrete7(CueEnv):
    """The cue env's observation with a Discrete(7) action: a net of the same size as
    MultiDiscrete([3, 4])'s, which means something else."""

    def __init__(self) -> None:
        super().__init__(Discrete(7))


gym.register("rlpar-test/CueDiscrete7-v0", CueDiscrete7)


def test_a_checkpoint_records_its_spaces_and_resume_checks_them(tmp_path) -> None:
    options = {"optim": {"lr": 3e-3}}
    first = rlpar.Runner(rlpar.make_agent("impala", options),
                         EnvConfig("rlpar-test/CueMultiDiscrete-v0"), runtime(2_000),
                         checkpoint_dir=tmp_path)  # fmt: skip
    first.run()
    path = rlpar.checkpoint.latest_checkpoint(tmp_path)
    assert path is not None
    recorded = rlpar.checkpoint.load_checkpoint(path).extra["spaces"]
    assert recorded == {"observation": repr(Box(0.0, 1.0, (3,), np.float32)),
                        "action": repr(MultiDiscrete([3, 4], start=[0, 2]))}  # fmt: skip
    again = rlpar.Runner(rlpar.make_agent("impala", options),
                         EnvConfig("rlpar-test/CueMultiDiscrete-v0"), runtime(4_000),
                         resume=path)  # fmt: skip
    assert again.run().env_steps >= 4_000
    with pytest.raises(rlpar.checkpoint.CheckpointError, match=r"action space MultiDiscrete"):
        rlpar.Runner(rlpar.make_agent("impala", options), EnvConfig("rlpar-test/CueDiscrete7-v0"),
                     runtime(4_000), resume=path)  # fmt: skip
