"""Every gymnasium observation space is fed to the net (rlpar.spaces): the encodings against
hand-written vectors, the refusals and their messages, and runs on gymnasium's own
Discrete- and Tuple-observation envs and on a Dict env (with a text leaf to drop), in the sync,
async and double-buffered modes and in evaluation."""

from __future__ import annotations

import re

import gymnasium as gym
import numpy as np
import pytest

import rlpar
from rlpar.config import EnvConfig, EvalConfig, RuntimeConfig
from rlpar.runtime.envs import make_actor_envs
from rlpar.spaces import FlatObservation, encoded, encoder_for, fed_as_is

Box, Discrete, Dict, Tuple = gym.spaces.Box, gym.spaces.Discrete, gym.spaces.Dict, gym.spaces.Tuple


class SpaceEnv(gym.Env):
    """Observations of any space: ``space``'s fixed sample after reset, then one per step."""

    def __init__(self, space: gym.Space, obs: list) -> None:
        self.observation_space, self.action_space = space, Discrete(2)
        self.obs, self.t = obs, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self.obs[0], {}

    def step(self, action):
        self.t += 1
        return self.obs[self.t % len(self.obs)], 1.0, False, self.t >= 5, {}


def flat(space: gym.Space, obs) -> np.ndarray:
    return FlatObservation(SpaceEnv(space, [obs])).observation(obs)


@pytest.mark.parametrize(
    ("space", "obs", "want"),
    [
        (Discrete(4), 2, [0, 0, 1, 0]),
        (Discrete(3, start=-1), 0, [0, 1, 0]),
        (gym.spaces.MultiDiscrete([2, 3]), np.array([1, 2]), [0, 1, 0, 0, 1]),
        (gym.spaces.MultiBinary(3), np.array([1, 0, 1], np.int8), [1, 0, 1]),
        (Box(0, 9, (2, 3)), np.arange(6, dtype=np.float32).reshape(2, 3), [0, 1, 2, 3, 4, 5]),
        (Box(0, 9, (3,), np.int64), np.array([1, 5, 9]), [1, 5, 9]),
        (Box(0, 1, ()), np.float32(0.5), [0.5]),
        (Tuple([Discrete(2), Box(-1, 1, (2,))]), (1, np.array([0.5, -0.5], np.float32)),
         [0, 1, 0.5, -0.5]),
        # a Dict's keys in sorted order, nested leaves in place
        (Dict({"b": Discrete(2), "a": Dict({"x": gym.spaces.MultiBinary(2)})}),
         {"b": 0, "a": {"x": np.array([0, 1], np.int8)}}, [0, 1, 1, 0]),
    ],
)  # fmt: skip
def test_each_space_is_encoded_into_one_float32_vector(space, obs, want) -> None:
    got = flat(space, obs)
    assert got.dtype == np.float32 and got.shape == (len(want),)
    np.testing.assert_array_equal(got, np.array(want, np.float32))
    wrapped = FlatObservation(SpaceEnv(space, [obs]))
    assert wrapped.observation_space.shape == (len(want),)
    assert wrapped.observation_space.dtype == np.float32
    assert wrapped.observation_space.contains(got)


def test_boxes_the_net_takes_pass_unwrapped_and_integer_images_keep_their_shape() -> None:
    for space in (Box(-1, 1, (4,)), Box(0, 255, (8, 8, 3), np.uint8), Box(0, 1, (5, 5, 2), bool)):
        assert fed_as_is(space) and encoder_for(space) is None
    image = Box(0, 255, (4, 4, 3), np.int64)
    env = encoded(SpaceEnv(image, [np.full((4, 4, 3), 7)]))
    assert env.observation_space.shape == (4, 4, 3)
    assert env.observation_space.dtype == np.float32
    obs, _ = env.reset()
    assert obs.dtype == np.float32 and obs.shape == (4, 4, 3) and obs[0, 0, 0] == 7


MISSION = Dict({"image": Box(0, 255, (3, 3, 2), np.uint8), "direction": Discrete(4),
                "mission": gym.spaces.Text(20)})  # fmt: skip


@pytest.mark.parametrize(
    ("space", "drop", "match"),
    [
        (MISSION, (), r"leaf \['mission'\] is Text.*env.drop_keys=\[\"mission\"\]"),
        (Dict({"goal": Dict({"s": gym.spaces.Sequence(Discrete(2))})}), (),
         r"leaf \['goal'\]\['s'\] is Sequence.*env.drop_keys=\[\"goal\"\]"),
        (gym.spaces.Text(5), (), "text cannot be fed to the net; wrap the env"),
        (Tuple([Discrete(2), gym.spaces.Sequence(Discrete(2))]), (), r"leaf \[1\] is Sequence"),
        (gym.spaces.Graph(Box(0, 1, (2,)), None), (), "without a fixed size"),
        (MISSION, ("goal",), r"\['goal'\] are not keys of the observation space; its keys: "
                             r"\['direction', 'image', 'mission'\]"),
        (Box(0, 1, (3,)), ("mission",), "expected a Dict observation space to drop keys"),
    ],
)  # fmt: skip
def test_a_space_that_cannot_be_fed_is_refused_naming_the_leaf(space, drop, match) -> None:
    with pytest.raises(ValueError, match=match) as info:
        encoder_for(space, drop, "Mine-v0")
    assert str(info.value).startswith("env 'Mine-v0': ")


def test_dropped_keys_are_left_out() -> None:
    obs = {"image": np.ones((3, 3, 2), np.uint8), "direction": 3, "mission": "go"}
    env = encoded(SpaceEnv(MISSION, [obs]), ["mission"])
    assert env.observation_space.shape == (4 + 18,)
    got, _ = env.reset()
    np.testing.assert_array_equal(got[:4], [0, 0, 0, 1])  # "direction" sorts before "image"
    assert np.all(got[4:] == 1)  # a uint8 leaf's values as they are (MiniGrid: object codes)
    assert env.observation_space.high[4] == np.float32(255.0)


class DictEnv(gym.Env):
    """A Dict observation whose two leaves together say which action pays: the image's
    marked column (left or right) when the flag is 1, the other one when it is 0; and a mission
    text to drop."""

    observation_space = Dict({"image": Box(0, 255, (3, 4, 1), np.uint8), "flag": Discrete(2),
                              "mission": gym.spaces.Text(10)})  # fmt: skip
    action_space = Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._draw(), {}

    def _draw(self):
        self.side, self.flag = self.np_random.integers(0, 2, 2)
        image = np.zeros((3, 4, 1), np.uint8)
        image[:, 3 * self.side] = 5  # an object code, as MiniGrid's view holds
        return {"image": image, "flag": int(self.flag), "mission": "pick"}

    def step(self, action):
        good = self.side if self.flag else 1 - self.side
        reward = 1.0 if action == good else 0.0
        self.t += 1
        return self._draw(), reward, False, self.t >= 10, {}


gym.register("rlpar-test/DictObs-v0", DictEnv)


def test_a_dict_env_with_a_text_leaf_says_how_to_drop_it() -> None:
    with pytest.raises(ValueError, match=r"env 'rlpar-test/DictObs-v0'.*env.drop_keys"):
        make_actor_envs(EnvConfig("rlpar-test/DictObs-v0"), 2)


@pytest.mark.parametrize(
    "modes",
    [{}, {"vectorization": "async", "workers_per_actor": 2}, {"double_buffer": True}],
    ids=["sync", "async", "double-buffered"],
)
def test_a_dict_env_trains_in_every_env_mode(modes) -> None:
    """Both leaves are needed (the flag flips which side pays): a policy that reads only one
    scores 5 of 10; the run must do better, and its final evaluation too."""
    env = EnvConfig("rlpar-test/DictObs-v0", drop_keys=["mission"], **modes)
    runtime = RuntimeConfig(num_actors=1, envs_per_actor=8, unroll_length=10, seed=0,
                            total_env_steps=60_000, checkpoint_interval_s=None,
                            target_return=9.0, max_wall_s=240)  # fmt: skip
    agent = rlpar.make_agent("impala", {"optim": {"lr": 3e-3}, "gamma": 0.5})  # rewards: at once
    runner = rlpar.Runner(agent, env, runtime, evaluation=EvalConfig(episodes=20))
    assert runner.net.spec.input_shape == (12 + 2,)
    result = runner.run()
    assert result.evaluation is not None
    assert result.evaluation[0]["mean_return"] >= 8.0, result


@pytest.mark.parametrize(
    ("env_id", "size"),
    [("FrozenLake-v1", 16), ("CliffWalking-v1", 48), ("Blackjack-v1", 32 + 11 + 2)],
)
def test_gymnasium_s_discrete_and_tuple_envs_run(env_id: str, size: int) -> None:
    runtime = RuntimeConfig(num_actors=1, envs_per_actor=4, unroll_length=8,
                            total_env_steps=800, checkpoint_interval_s=None)  # fmt: skip
    runner = rlpar.Runner(rlpar.make_agent("impala"), EnvConfig(env_id), runtime)
    assert runner.net.spec.input_shape == (size,)
    result = runner.run()
    assert result.env_steps >= 800 and result.learner_steps > 0


def test_a_missing_env_dependency_is_one_line() -> None:
    def needs_box2d(**kwargs):
        raise gym.error.DependencyNotInstalled(
            'Box2D is not installed: pip install "gymnasium[box2d]"'
        )

    gym.register("rlpar-test/NeedsBox2D-v0", needs_box2d)
    match = r"env 'rlpar-test/NeedsBox2D-v0' needs a package that is not installed: Box2D is"
    with pytest.raises(ValueError, match=match) as info:
        make_actor_envs(EnvConfig("rlpar-test/NeedsBox2D-v0"), 2)
    assert info.value.__cause__ is None and "\n" not in str(info.value)


NESTED = Dict({"image": Box(0, 255, (3, 4, 1), np.uint8),
               "t": gym.spaces.Tuple((Discrete(3), Box(-1.0, 1.0, (2,), np.float32)))})  # fmt: skip
GOOD = {"image": np.zeros((3, 4, 1), np.uint8), "t": (1, np.zeros(2, np.float32))}


@pytest.mark.parametrize(
    ("obs", "match"),
    [
        ({"t": GOOD["t"]}, 'obs["image"] is missing: its space is Box(0, 255, (3, 4, 1), uint8)'),
        ({**GOOD, "image": np.zeros((4, 3, 1), np.uint8)},
         'obs["image"] should be shape (3, 4, 1), got uint8 array of shape (4, 3, 1)'),
        ({**GOOD, "t": (5, np.zeros(2))}, 'obs["t"][0] should be an integer in [0, 3), got 5'),
        ({**GOOD, "t": (1,)}, 'obs["t"][1] is missing'),
        ({**GOOD, "t": (1, np.zeros(3))}, 'obs["t"][1] should be shape (2,), got float64 array'),
    ],
)  # fmt: skip
def test_an_observation_that_does_not_fit_its_leaf_names_the_leaf(obs, match) -> None:
    env = encoded(SpaceEnv(NESTED, [obs]), env_id="rlpar-test/Nested-v0")
    with pytest.raises(ValueError, match=re.escape(f"env 'rlpar-test/Nested-v0': {match}")):
        env.reset()
    good = encoded(SpaceEnv(NESTED, [GOOD]))
    assert good.reset()[0].shape == (12 + 3 + 2,)


def test_an_lstm_core_runs_on_an_encoded_dict_observation() -> None:
    """Actors carry the core's state beside a flattened Dict observation, and the learner
    backpropagates through it: the run steps, learns and evaluates."""
    env = EnvConfig("rlpar-test/DictObs-v0", drop_keys=["mission"])
    runtime = RuntimeConfig(num_actors=1, envs_per_actor=4, unroll_length=8, seed=0,
                            total_env_steps=2_000, checkpoint_interval_s=None)  # fmt: skip
    agent = rlpar.make_agent("impala", {"net": {"lstm": 16}})
    runner = rlpar.Runner(agent, env, runtime, evaluation=EvalConfig(episodes=2))
    assert runner.net.spec.input_shape == (12 + 2,) and runner.net.recurrent
    result = runner.run()
    assert result.learner_steps > 0 and result.evaluation is not None
    assert result.evaluation[0]["episodes"] == 2
