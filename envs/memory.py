"""A memory task that a feed-forward policy cannot beat: remember a cue over a delay.

``rlpar/MemoryChain-v0`` (bsuite's memory_len in spirit): at the first step the observation shows
one of ``num_cues`` cues (one-hot); for the next ``delay`` steps it shows only a clock; then a
query flag asks for the cue, and the action taken then ends the episode with reward +1 when it
names the cue and -1 otherwise. Actions before the query earn nothing. The query observation is
the same whatever the cue, so a policy without memory scores 0 in expectation (chance), and one
that remembers scores 1.

Observation float32 ``[num_cues + 2]``: ``[cue one-hot (first step only), t / delay, query]``;
actions ``Discrete(num_cues)``; every episode lasts ``delay + 2`` steps.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

__all__ = ["MemoryChainEnv"]


class MemoryChainEnv(gym.Env):
    """Remember the first observation's cue for ``delay`` steps, then name it."""

    def __init__(self, delay: int = 8, num_cues: int = 2) -> None:
        if isinstance(delay, bool) or not isinstance(delay, int) or delay < 0:
            raise ValueError(f"delay: expected an integer >= 0, got {delay!r}")
        if isinstance(num_cues, bool) or not isinstance(num_cues, int) or num_cues < 2:
            raise ValueError(f"num_cues: expected an integer >= 2, got {num_cues!r}")
        self.delay, self.num_cues = delay, num_cues
        self.observation_space = gym.spaces.Box(0.0, 1.0, (num_cues + 2,), np.float32)
        self.action_space = gym.spaces.Discrete(num_cues)
        self.cue, self.t = 0, 0

    def _obs(self) -> np.ndarray:
        obs = np.zeros(self.num_cues + 2, np.float32)
        if self.t == 0:
            obs[self.cue] = 1.0
        obs[-2] = min(self.t, self.delay + 1) / (self.delay + 1)
        obs[-1] = float(self.t == self.delay + 1)
        return obs

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.cue = int(self.np_random.integers(self.num_cues))
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        if self.t == self.delay + 1:  # the query: this action is graded
            reward = 1.0 if int(action) == self.cue else -1.0
            return self._obs(), reward, True, False, {}
        self.t += 1
        return self._obs(), 0.0, False, False, {}
