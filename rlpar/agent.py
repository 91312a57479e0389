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

Plugging an agent in: register it with its config dataclass (`rlpar.register_agent`, an entry
point of the group ``"rlpar.agents"``, or a module an experiment file names in
``plugins = [...]``; see `rlpar.registry`). The docstring under each field of the config
dataclass (a string literal on the line after the field) is that key's description in
``rlpar agents`` and the config reference; the first line of the agent class's docstring is
its summary there.

What `learn` returns lands in TensorBoard (`rlpar.app.monitor`), the x-axis being env steps.
These keys have tags of their own::

    "loss"           -> loss/total        the loss the optimizer minimised
    "policy_loss"    -> loss/policy       its policy-gradient term
    "value_loss"     -> loss/value        its value (baseline) term
    "entropy"        -> loss/entropy      the policy's mean entropy
    "grad_norm"      -> optim/grad_norm   the gradient norm before clipping
    "learning_rate"  -> optim/learning_rate

Every other key ``k`` is written as ``learner/k`` as it is (a returned ``"loss/policy"`` lands
under ``learner/loss/policy``, not ``loss/policy``). Return Python numbers (``float(x)``): a
value that is not an int or float (a numpy float32 is not), or not finite, is left out.

The runtime counts the steps: it adds 1 to `LearnerState.steps` after each `learn` returns, so
`learn` never changes it (read it for a schedule: the steps taken before this one).
"""

from __future__ import annotations

import abc
from typing import TYPE_CHECKING

import gymnasium as gym
import numpy as np

from rlpar.config import RuntimeConfig
from rlpar.data import Batch
from rlpar.nn import Net, NetSpec
from rlpar.state import LearnerState

if TYPE_CHECKING:
    from rlpar.learner_step import NativeLearn

__all__ = ["Agent", "LearnerState"]


class Agent(abc.ABC):
    """Base class of every agent, built-in or the user's (see the module docstring)."""

    #: A promise about `act`: True when it does nothing but draw each env's action from the
    #: softmax of the net's Categorical logits (no temperature, epsilon or masking). With a net
    #: of exactly one Categorical head (one logit per action; a value head beside it is fine),
    #: the actors then skip `act` and draw natively (their own generator, seeded per actor):
    #: on rlpar's native envs (``rlpar/...`` ids) a whole unroll runs in one GIL-free call,
    #: elsewhere the step loop samples inside its one call per env step. Leave it False if
    #: `act` does anything else: the actors would sample differently without a word. A
    #: property or a per-instance attribute works too (the built-in agents set it when the
    #: action space is Discrete). `act` still serves evaluation with ``--sample``.
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
        runtime clips to the space's bounds only when sending to the env). Another shape (such
        as [K, 1]) or dtype kind is a ValueError naming the agent, what was expected and what
        came.
        """

    @abc.abstractmethod
    def learn(self, net: Net, state: LearnerState, batch: Batch) -> dict[str, float]:
        """One learner step on ``batch``; updates ``state`` in place (not ``state.steps``: the
        runtime counts steps); returns scalar metrics (Python or numpy numbers, or 0-d arrays),
        named as the module docstring says for TensorBoard (``loss``, ``policy_loss``,
        ``value_loss``, ``entropy``, ``grad_norm``)."""

    def check_runtime(self, runtime: RuntimeConfig) -> None:  # noqa: B027 (optional hook)
        """Optional: raise `rlpar.ConfigError` (naming the key, what was expected and what
        came) if the agent cannot learn from the batches this runtime makes, e.g. minibatches
        that do not divide its ``runtime.batch_columns`` columns. Called once, before any env
        is built; the default accepts every runtime."""

    def native_learn(self, net: Net, state: LearnerState) -> NativeLearn | None:
        """Optional: a promise that `learn` is exactly the `rlpar.NativeLearn` returned (its
        passes of an actor-critic `rlpar.NativeLoss` on each whole batch, at the optimizer's
        learning rate as it stands), so that the runtime may run the learner's whole loop
        natively: with actor threads outside deterministic mode (on rlpar's native envs or on
        Python envs) it takes each batch, steps and publishes without the GIL, many learner
        steps a call, and `learn` is not called. Return None whenever `learn` would do
        anything else on the next batches (a learning-rate schedule, rewards changed before the
        loss, a Python loss, a subclass's own `learn`). Called after `init_state`, before the
        run's threads start and again on the learner thread before its first step, so it
        must give the same answer each time; the default returns None."""
        return None

    def greedy(self, net: Net, out: np.ndarray) -> np.ndarray:
        """The policy's most likely actions for outputs ``out`` float32 [K, output_size], in
        `act`'s format (e.g. the argmax of the logits, a Gaussian's mean): for evaluation.

        Optional, and called after `init_state`. The default raises NotImplementedError, and
        ``rlpar eval`` then samples with `act`, saying so.
        """
        raise NotImplementedError(f"{type(self).__name__} has no greedy policy")
