"""An encoder per leaf of a Dict observation: `rlpar.EncodedBox` says where each leaf lies in
the encoded vector, and the built-in agents' ``[agent.net] encoders = "per_leaf"`` gives each
image leaf a conv torso of its own (`rlpar.Concat`) in the one native net; it trains in every
env mode, with an LSTM core, and evaluates from its checkpoint."""

from __future__ import annotations

import pickle

import gymnasium as gym
import numpy as np
import pytest
from test_spaces import DictEnv  # registers rlpar-test/DictObs-v0

import rlpar
from rlpar import EnvConfig, EvalConfig, RuntimeConfig
from rlpar.app.evaluate import evaluate
from rlpar.app.experiment import experiment_from_dict
from rlpar.spaces import FlatObservation

Box, Discrete, Dict, Tuple = gym.spaces.Box, gym.spaces.Discrete, gym.spaces.Dict, gym.spaces.Tuple

NESTED = Dict({
    "cam": Box(0, 255, (4, 3, 2), np.uint8),
    "pose": Tuple((Discrete(3), Box(-1, 1, (2,), np.float32))),
    "map": Box(0, 9, (2, 2, 1), np.int64),
})  # fmt: skip


class NestedEnv(gym.Env):
    observation_space = NESTED
    action_space = Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self.observation_space.sample(), {}

    def step(self, action):
        return self.observation_space.sample(), 0.0, False, False, {}


def test_each_leaf_s_columns_hold_that_leaf() -> None:
    env = FlatObservation(NestedEnv())
    space = env.observation_space
    assert isinstance(space, rlpar.EncodedBox) and isinstance(space, Box)
    assert [(leaf.path, leaf.offset, leaf.size, leaf.image) for leaf in space.leaves] == [
        ('obs["cam"]', 0, 24, True),
        ('obs["map"]', 24, 4, True),
        ('obs["pose"][0]', 28, 3, False),
        ('obs["pose"][1]', 31, 2, False),
    ]
    obs = NESTED.sample()
    flat = env.observation(obs)
    assert flat.shape == space.shape == (33,)
    cam, pose = space.leaves[0], space.leaves[2]
    np.testing.assert_array_equal(flat[cam.offset : cam.offset + cam.size].reshape(4, 3, 2),
                                  obs["cam"])  # fmt: skip
    assert flat[pose.offset + obs["pose"][0]] == 1.0  # one-hot
    # A Box still: equal to the plain Box of the same bounds, and it survives pickling (the
    # async env mode and Ray send spaces between processes).
    assert space == Box(space.low, space.high, dtype=np.float32)
    assert pickle.loads(pickle.dumps(space)).leaves == space.leaves


def test_a_box_or_discrete_observation_is_no_encoded_box() -> None:
    assert not isinstance(FlatObservation(gym.make("FrozenLake-v1")).observation_space,
                          rlpar.EncodedBox)  # fmt: skip


def test_per_leaf_gives_each_image_its_conv_and_joins_the_rest() -> None:
    space = FlatObservation(NestedEnv()).observation_space
    agent = rlpar.make_agent("impala", {"net": {"encoders": "per_leaf", "conv": [[4, 2, 1]]}})
    spec = agent.net_spec(space, Discrete(2))
    concat = spec.layers[0]
    assert isinstance(concat, rlpar.Concat)
    conv = (rlpar.Conv2d(4, 2, 1), rlpar.ReLU(), rlpar.Flatten())
    assert concat.branches == (
        rlpar.Branch((4, 3, 2), conv),
        rlpar.Branch((2, 2, 1), conv),
        rlpar.Branch((5,)),  # the two pose leaves, one run of columns
    )
    assert spec.layers[1:] == (rlpar.Linear(64), rlpar.Tanh(), rlpar.Linear(64), rlpar.Tanh())
    net = rlpar.Net(spec)
    obs = np.stack([FlatObservation(NestedEnv()).observation(NESTED.sample()) for _ in range(3)])
    assert np.isfinite(net.forward(net.init_params(seed=0), obs)).all()
    # The default stays the MLP over the whole vector.
    flat = rlpar.make_agent("impala").net_spec(space, Discrete(2))
    assert flat.layers[0] == rlpar.Linear(64)


def test_a_bad_encoders_value_names_the_choices() -> None:
    with pytest.raises(rlpar.ConfigError, match="encoders: expected 'flat' or 'per_leaf', got 'x'"):
        rlpar.make_agent("impala", {"net": {"encoders": "x"}})


@pytest.mark.parametrize(
    "modes",
    [{}, {"vectorization": "async", "workers_per_actor": 2}, {"double_buffer": True}],
    ids=["sync", "async", "double-buffered"],
)
def test_per_leaf_trains_in_every_env_mode_and_evaluates_from_its_checkpoint(
    modes, tmp_path
) -> None:
    """DictEnv needs both leaves (a policy reading one scores 5 of 10); the image's side goes
    through the conv branch."""
    assert DictEnv.observation_space["image"].shape == (3, 4, 1)
    config = {
        "agent": {"name": "impala", "gamma": 0.5, "optim": {"lr": 3e-3},  # rewards: at once
                  "net": {"encoders": "per_leaf", "conv": [[8, 2, 1]]}},
        "env": {"id": "rlpar-test/DictObs-v0", "drop_keys": ["mission"], **modes},
        "runtime": {"num_actors": 1, "envs_per_actor": 8, "unroll_length": 10, "seed": 0,
                    "total_env_steps": 60_000, "target_return": 9.0, "max_wall_s": 240},
        "eval": {"episodes": 20},
    }  # fmt: skip
    exp = experiment_from_dict(config)
    runner = rlpar.Runner(exp.make_agent(), exp.env, exp.runtime, checkpoint_dir=tmp_path,
                          config=exp.to_dict(), evaluation=exp.eval)  # fmt: skip
    assert isinstance(runner.net.spec.layers[0], rlpar.Concat)
    result = runner.run()
    assert result.evaluation is not None
    assert result.evaluation[0]["mean_return"] >= 8.0, result
    # The same net again, built from the checkpoint's config.
    again = evaluate(rlpar.checkpoint.latest_checkpoint(tmp_path), episodes=10)
    assert again.mean_return >= 8.0


def test_per_leaf_with_an_lstm_core_runs() -> None:
    env = EnvConfig("rlpar-test/DictObs-v0", drop_keys=["mission"])
    runtime = RuntimeConfig(num_actors=1, envs_per_actor=4, unroll_length=8, seed=0,
                            total_env_steps=2_000, checkpoint_interval_s=None)  # fmt: skip
    agent = rlpar.make_agent("appo", {"net": {"encoders": "per_leaf", "lstm": 16}})
    runner = rlpar.Runner(agent, env, runtime, evaluation=EvalConfig(episodes=2))
    assert runner.net.recurrent and isinstance(runner.net.spec.layers[0], rlpar.Concat)
    result = runner.run()
    assert result.learner_steps > 0 and result.evaluation is not None
