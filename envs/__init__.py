"""rlpar's native environments, registered with gymnasium (installed as ``rlpar.envs``).

Importing this package registers (once; importing again is harmless)::

    rlpar/CartPole-v1   gymnasium's CartPole-v1 dynamics, float32 [4], Discrete(2), 500 steps
    rlpar/Acrobot-v1    gymnasium's Acrobot-v1 dynamics, float32 [6], Discrete(3), 500 steps
    rlpar/Catch-v0      bsuite's Catch, uint8 frames [10, 10, 1], Discrete(3), 9 steps
    rlpar/MemoryChain-v0  remember a cue over 8 steps, float32 [4], Discrete(2), 10 steps (Python;
                          a feed-forward policy scores 0, a memory 1: envs/memory.py)
    rlpar/JointReach-v0   a two-joint arm reaching a target cell: Dict(target image, joint
                          angles), MultiDiscrete([3, 3]) joint moves, 20 steps (Python:
                          envs/reach.py)

so that both ``gymnasium.make(id)`` (one env) and ``gymnasium.make_vec(id, num_envs=K)`` (K
envs stepped in one native call) work, and rlpar configs can name them
(``EnvConfig(id="rlpar/CartPole-v1")``). Without importing rlpar first, gymnasium can import
it by itself: ``gymnasium.make("rlpar.envs:rlpar/CartPole-v1")``.
"""

from __future__ import annotations

import gymnasium

from .memory import MemoryChainEnv
from .native import (
    AcrobotEnv,
    AcrobotVectorEnv,
    CartPoleEnv,
    CartPoleVectorEnv,
    CatchEnv,
    CatchVectorEnv,
    CategoricalSampler,
    NativeEnv,
    NativeVectorEnv,
)
from .reach import JointReachEnv

__all__ = [
    "ENV_IDS",
    "AcrobotEnv",
    "AcrobotVectorEnv",
    "CartPoleEnv",
    "CartPoleVectorEnv",
    "CatchEnv",
    "CatchVectorEnv",
    "CategoricalSampler",
    "JointReachEnv",
    "MemoryChainEnv",
    "NativeEnv",
    "NativeVectorEnv",
    "register_envs",
    "register_memory_envs",
]

# id -> (single-env class, vector class, time limit, reward threshold), thresholds as gymnasium's
_ENVS = {
    "rlpar/CartPole-v1": ("CartPoleEnv", "CartPoleVectorEnv", 500, 475.0),
    "rlpar/Acrobot-v1": ("AcrobotEnv", "AcrobotVectorEnv", 500, -100.0),
    "rlpar/Catch-v0": ("CatchEnv", "CatchVectorEnv", None, 0.9),
}
ENV_IDS = tuple(_ENVS)


def register_envs() -> None:
    """Register the native envs with gymnasium; ids already registered are left alone."""
    for env_id, (single, vector, max_steps, threshold) in _ENVS.items():
        if env_id in gymnasium.registry:
            continue
        gymnasium.register(
            id=env_id,
            entry_point=f"{__name__}.native:{single}",
            vector_entry_point=f"{__name__}.native:{vector}",
            max_episode_steps=max_steps,
            reward_threshold=threshold,
        )


def register_memory_envs() -> None:
    """Register the Python memory task (``kwargs`` such as ``delay`` go to `MemoryChainEnv`)."""
    if "rlpar/MemoryChain-v0" not in gymnasium.registry:
        gymnasium.register(
            id="rlpar/MemoryChain-v0",
            entry_point=f"{__name__}.memory:MemoryChainEnv",
            reward_threshold=0.9,
        )
    if "rlpar/JointReach-v0" not in gymnasium.registry:
        gymnasium.register(
            id="rlpar/JointReach-v0",
            entry_point=f"{__name__}.reach:JointReachEnv",
            reward_threshold=0.7,
        )


register_envs()
register_memory_envs()
