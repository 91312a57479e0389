"""A two-joint arm that reaches a target cell: a MultiDiscrete action whose dimensions must be
coordinated, and a Dict observation whose image and vector both carry what the policy needs.

``rlpar/JointReach-v0``: a planar arm of two links (lengths 2.4 and 2.4 cells) on a grid of
``size x size`` cells centred on its base. Each joint takes ``steps`` angles (``2 pi q / steps``).
The target is a cell the fingertip can reach, drawn at reset with a start that does not touch
it. Each step moves both joints at once, each by -1, 0 or +1 angle step: the action is
``MultiDiscrete([3, 3])``. The episode ends with reward +1 when the fingertip's cell is the
target's; every other step costs 0.1; it is cut at ``max_steps``.

Observation ``Dict``:

- ``"target"``: uint8 ``[size, size, 1]``, 1 at the target's cell, 0 elsewhere (the only place
  the target is shown);
- ``"joints"``: float32 ``[4]``, (cos, sin) of each joint's angle (the only place the arm is
  shown).

``render_mode="rgb_array"`` draws the grid (target, base, elbow, fingertip) for videos.

A policy that reads only one of them cannot do better than chance. Moving the joints one at a
time takes up to ``d1 + d2`` steps where moving them together takes ``max(d1, d2)``, so the
best return asks for coordinated dimensions: 1 - 0.1 (k - 1) for a reach in k steps (about
0.8 on average with the default sizes; a random policy scores below 0).
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np

__all__ = ["JointReachEnv"]


class JointReachEnv(gym.Env):
    """Move a two-joint arm's fingertip onto the target cell, both joints at once.

    ``render_mode="rgb_array"``: a frame of the grid, ``CELL`` pixels a cell: the target red,
    the base grey, the elbow's cell blue, the fingertip's green (over the target once there)."""

    metadata: dict[str, Any] = {"render_modes": ["rgb_array"], "render_fps": 5}  # noqa: RUF012
    CELL = 12
    COLORS: ClassVar[dict[str, tuple[int, int, int]]] = {
        "target": (220, 40, 40),
        "base": (128, 128, 128),
        "elbow": (60, 90, 230),
        "tip": (40, 200, 70),
    }

    def __init__(
        self, size: int = 11, steps: int = 8, max_steps: int = 20, render_mode: str | None = None
    ) -> None:
        if render_mode not in (None, "rgb_array"):
            raise ValueError(f"render_mode: expected None or 'rgb_array', got {render_mode!r}")
        self.render_mode = render_mode
        for key, value, low in (
            ("size", size, 5),
            ("steps", steps, 4),
            ("max_steps", max_steps, 1),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{key}: expected an integer >= {low}, got {value!r}")
        self.size, self.steps, self.max_steps = size, steps, max_steps
        self.observation_space = gym.spaces.Dict(
            {
                "target": gym.spaces.Box(0, 1, (size, size, 1), np.uint8),
                "joints": gym.spaces.Box(-1.0, 1.0, (4,), np.float32),
            }
        )
        self.action_space = gym.spaces.MultiDiscrete([3, 3])
        reach = (size - 1) / 2 - 0.6
        self.links = (reach / 2, reach / 2)
        # The fingertip's cell of every joint configuration: [steps, steps, 2] (row, col).
        q = 2 * math.pi * np.arange(steps) / steps
        a1, a2 = q[:, None], q[:, None] + q[None, :]
        x = self.links[0] * np.cos(a1) + self.links[1] * np.cos(a2)
        y = self.links[0] * np.sin(a1) + self.links[1] * np.sin(a2)
        centre = (size - 1) / 2
        self.cells = np.stack(
            [np.rint(centre - y), np.rint(centre + np.broadcast_to(x, y.shape))], axis=-1
        ).astype(np.int64)
        self.q = np.zeros(2, np.int64)
        self.target = np.zeros(2, np.int64)
        self.t = 0

    def _obs(self) -> dict[str, np.ndarray]:
        image = np.zeros((self.size, self.size, 1), np.uint8)
        image[self.target[0], self.target[1], 0] = 1
        angles = 2 * math.pi * self.q / self.steps
        joints = np.array(
            [math.cos(angles[0]), math.sin(angles[0]), math.cos(angles[1]), math.sin(angles[1])],
            np.float32,
        )
        return {"target": image, "joints": joints}

    def render(self) -> np.ndarray:
        """The grid as an RGB frame [size * CELL, size * CELL, 3] uint8."""
        grid = np.zeros((self.size, self.size, 3), np.uint8)
        centre = (self.size - 1) // 2
        a1 = 2 * math.pi * self.q[0] / self.steps
        elbow = (round(centre - self.links[0] * math.sin(a1)),
                 round(centre + self.links[0] * math.cos(a1)))  # fmt: skip
        grid[self.target[0], self.target[1]] = self.COLORS["target"]
        grid[centre, centre] = self.COLORS["base"]
        grid[elbow] = self.COLORS["elbow"]
        tip = self.cells[self.q[0], self.q[1]]
        grid[tip[0], tip[1]] = self.COLORS["tip"]
        return np.repeat(np.repeat(grid, self.CELL, axis=0), self.CELL, axis=1)

    def _reached(self) -> bool:
        return bool((self.cells[self.q[0], self.q[1]] == self.target).all())

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        goal = self.np_random.integers(self.steps, size=2)
        self.target = self.cells[goal[0], goal[1]].copy()
        while True:
            self.q = self.np_random.integers(self.steps, size=2).astype(np.int64)
            if not self._reached():
                break
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        move = np.asarray(action, np.int64).reshape(2) - 1
        if not self.action_space.contains(move + 1):
            raise ValueError(f"action: expected two choices in [0, 3), got {action!r}")
        self.q = (self.q + move) % self.steps
        self.t += 1
        if self._reached():
            return self._obs(), 1.0, True, False, {}
        return self._obs(), -0.1, False, self.t >= self.max_steps, {}
