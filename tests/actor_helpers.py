"""A single `Actor` built by hand (no Runner), with weights large enough that a recurrent
core's state matters for its outputs: for tests that drive unrolls one by one."""

from __future__ import annotations

import numpy as np

import rlpar
from rlpar.config import EnvConfig
from rlpar.runtime.actor import Actor
from rlpar.runtime.envs import make_actor_envs


def make_actor(
    env_id: str = "CartPole-v1",
    lstm: int = 8,
    *,
    num_envs: int = 3,
    generation: int = 0,
    keep_resume_state: bool = False,
    lstm_matmul: str = "float32",
) -> Actor:
    """IMPALA (hidden [16], ``lstm`` units, its products in ``lstm_matmul``) on ``num_envs``
    envs of ``env_id``, T = 7, one published version; ``actor.params`` holds its parameters."""
    net_cfg = {"hidden": [16], "lstm": lstm, "lstm_matmul": lstm_matmul}
    agent = rlpar.make_agent("impala", {"net": net_cfg})
    envs = make_actor_envs(EnvConfig(env_id), num_envs)
    net = rlpar.Net(agent.net_spec(envs.single_observation_space, envs.single_action_space))
    params = net.init_params(seed=0)
    # Large random weights make the state matter for the outputs.
    params += np.random.default_rng(1).standard_normal(params.size).astype(np.float32) * 0.3
    agent.init_state(net, params)
    store = rlpar.SnapshotStore(net.num_params, num_slots=4)
    store.publish(params, version=1)
    actor = Actor(
        0, envs=envs, agent=agent, net=net, store=store, unroll_length=7, num_buffers=3,
        seed=0, generation=generation, keep_resume_state=keep_resume_state,
    )  # fmt: skip
    actor.params = params  # type: ignore[attr-defined]
    return actor
