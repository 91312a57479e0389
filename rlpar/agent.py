"""The agent seam: the few calls the runtime makes into an algorithm.

The whole loop, as the runtime runs it (``rlpar/runtime/``; the data it hands over,
`Rollout` and `Batch`, is in ``rlpar/data.py``)::

    net = Net(agent.net_spec(obs_space, action_space))      # once; shared by every thread
    state = agent.init_state(net, net.init_params(seed))      # params + optimizer (+ agent's own)
    store.publish(state.params)

    actor thread a = 1..num_actors, owning K envs:            # many, in parallel
        loop:
            with store.pin() as snap:                         # ONE version for the whole unroll
                for t in range(T):
                    out[t] = net.forward(snap, obs)           # [K, output_size], GIL released
                    act[t] = agent.act(net, out[t], rng)      # [K] int or [K, A] float
                    obs, reward, terminated, truncated = envs.step(act[t])
            queue.put(Rollout(obs, act, reward, ..., behaviour=out, version=snap.version))

    learner thread:                                           # exactly one
        loop:
            batch = Batch.stack(B rollouts from the queue)    # [T, N] with N = B * K
            metrics = agent.learn(net, state, batch)          # updates state.params in place
            store.publish(state.params)

`learn` is a deterministic function of (net, state, batch): everything it changes lives in
``state``, which is what a checkpoint saves, so a unit test can call it directly and a resumed
run continues exactly. ``act`` only reads ``out`` and draws from ``rng``; it runs on actor
threads, so it must not touch ``state``.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np

from rlpar.data import Batch
from rlpar.nn import Net, NetSpec
from rlpar.optim import Optimizer
from rlpar.parallel import ShardPool

__all__ = ["Agent", "LearnerState"]


@dataclass
class LearnerState:
    """Everything the learner step changes: saved by checkpoints, restored on resume.

    ``params``: float32 [num_params]; ``optimizer``: its flat state buffers; ``steps``: learner
    steps taken; ``extra``: the agent's own JSON-serialisable state (e.g. a schedule position).
    ``pool``: not saved; set by the runtime for the run when ``runtime.learner_threads`` > 1,
    a `rlpar.ShardPool` of that many threads that `Agent.learn` may use to split its step
    over column shards (`rlpar.Batch.split`); None otherwise.
    """

    params: np.ndarray
    optimizer: Optimizer
    steps: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    pool: ShardPool | None = field(default=None, repr=False, compare=False)


class Agent(abc.ABC):
    """Base class of every agent, built-in or the user's (see the module docstring)."""

    #: True when `act` draws each action from the softmax of the net's Categorical logits.
    #: The runtime may then run a whole unroll natively on native envs (``rlpar/...`` ids):
    #: forward, sampling and env steps in one GIL-free call, with a native sampler in place
    #: of `act`. Leave False if `act` does anything else.
    native_sampling: bool = False

    @abc.abstractmethod
    def net_spec(self, obs_space: gym.Space, action_space: gym.Space) -> NetSpec:
        """The net for these spaces. Raise ValueError naming the space if it is not supported."""

    @abc.abstractmethod
    def init_state(self, net: Net, params: np.ndarray) -> LearnerState:
        """The learner state around freshly initialised ``params`` (build the optimizer here)."""

    @abc.abstractmethod
    def act(self, net: Net, out: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Actions from net outputs ``out`` float32 [K, output_size].

        Returns int64 [K] for a Discrete space, float32 [K, A] for a Box space (unclipped: the
        runtime clips to the space's bounds only when sending to the env).
        """

    @abc.abstractmethod
    def learn(self, net: Net, state: LearnerState, batch: Batch) -> dict[str, float]:
        """One learner step on ``batch``; updates ``state`` in place; returns scalar metrics."""

    def greedy(self, net: Net, out: np.ndarray) -> np.ndarray:
        """The policy's most likely actions for outputs ``out`` float32 [K, output_size], in
        `act`'s format (e.g. the argmax of the logits, a Gaussian's mean): for evaluation.

        Optional, and called after `init_state`. The default raises NotImplementedError, and
        ``rlpar eval`` then samples with `act`, saying so.
        """
        raise NotImplementedError(f"{type(self).__name__} has no greedy policy")
