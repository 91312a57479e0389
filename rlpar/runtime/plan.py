"""How a run executes, chosen once (`ExecutionPlan`): the loop every actor runs, the loop the
learner runs, and why each. The Runner computes it (`plan_run`) before any thread starts, from
what the envs, the agent, the net and the config can do (each asked through its capability
methods: `FusedEnvs`, `NativeLoopEnvs`, `HalvedEnvs`, `rlpar.Agent.native_sampling`,
`rlpar.Agent.native_learn`, `rlpar.Optimizer.native_step`), then hands each piece its part as
an argument; the run's summary keeps it (`rlpar.runtime.reports.RunResult.plan`).

Actor loops (the unrollers in `rlpar.runtime.unrollers`, the native loop in
`rlpar.runtime.handoff.run_native_actor_loop`):

- ``native_loop``: rlpar's native envs, native sampling, threads outside deterministic mode:
  the actor's whole loop in native calls (take a free buffer, pin, fused unroll, hand over).
- ``fused``: the same envs elsewhere: one GIL-free native call per unroll.
- ``stepped``: envs that step in Python: one native call between two env steps.
- ``split``: double buffering (`HalvedEnvs`): each half's forward while the other half steps.
- ``split_side``: double buffering over "sync" halves with native sampling: each half's act on
  the step loop's side thread, or in turn, whichever measured faster (`SideProbe`).

Learner loops (`rlpar.runtime.learner`):

- ``python``: the batch gathered in Python (`Batch.stack`), ``agent.learn``.
- ``native_inbox``: the batch taken in native calls (`NativeInbox`), ``agent.learn``.
- ``native_learn``: take, optimizer steps and publish in native calls (`NativeLoop`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlpar import _native
from rlpar.agent import Agent, LearnerState
from rlpar.config import RuntimeConfig
from rlpar.learner_step import splits_into_shards
from rlpar.nn import Net
from rlpar.runtime.common import FusedEnvs, HalvedEnvs, NativeLoopEnvs

__all__ = [
    "ACTOR_LOOPS",
    "LEARNER_LOOPS",
    "Choice",
    "ExecutionPlan",
    "choose_actor_loop",
    "choose_learner_loop",
    "native_sampler",
    "plan_run",
    "python_sampling_reason",
]

#: The actors' loops (the module docstring); "remote": Ray actor processes, which each choose
#: "fused", "stepped", "split" or "split_side" in their process.
ACTOR_LOOPS = ("native_loop", "fused", "stepped", "split", "split_side", "remote")
#: The learner's loops.
LEARNER_LOOPS = ("python", "native_inbox", "native_learn")


@dataclass(frozen=True)
class Choice:
    """One piece's loop (one of `ACTOR_LOOPS` or `LEARNER_LOOPS`) and a short reason for it."""

    loop: str
    reason: str


@dataclass(frozen=True)
class ExecutionPlan:
    """The loop the actors run and the loop the learner runs, each with its reason: what the
    Runner hands each piece and records in the run's summary."""

    actor: Choice
    learner: Choice

    def __post_init__(self) -> None:
        if self.actor.loop not in ACTOR_LOOPS or self.learner.loop not in LEARNER_LOOPS:
            raise ValueError(f"no such loops: {self.actor.loop!r}, {self.learner.loop!r}")

    def to_dict(self) -> dict[str, dict[str, str]]:
        """{"actor": {"loop", "reason"}, "learner": {"loop", "reason"}} (summary.json's
        ``plan``)."""
        return dataclasses.asdict(self)

    def describe(self) -> str:
        """The plan in one line, for a log or the end of ``rlpar train``."""
        a, ln = self.actor, self.learner
        return f"actors {a.loop} ({a.reason}); learner {ln.loop} ({ln.reason})"


def python_sampling_reason(agent: Agent, net: Net) -> str | None:
    """Why the actors sample with ``agent.act`` in Python; None when they draw natively (an
    agent that promises `rlpar.Agent.native_sampling`, a net with one Categorical head)."""
    if not agent.native_sampling:
        return "the agent samples in Python (Agent.act)"
    if sum(name == "logits" for name, *_ in net.outputs) != 1:
        return "the net has no single Categorical head (Agent.act samples)"
    return None


def native_sampler(
    index: int, agent: Agent, net: Net, seed: int
) -> _native.CategoricalSampler | None:
    """Actor ``index``'s native sampler where it draws natively (`python_sampling_reason`);
    else None (`Agent.act`)."""
    if python_sampling_reason(agent, net) is not None:
        return None
    key = np.random.SeedSequence([seed, index, 1 << 21]).generate_state(1)[0]
    return _native.CategoricalSampler(int(key))


def choose_actor_loop(envs: Any, agent: Agent, net: Net, no_whole_loop: str | None) -> Choice:
    """The loop of an actor over ``envs`` (one of `ACTOR_LOOPS`). ``no_whole_loop``: why its
    whole loop may not run natively here (deterministic mode, Ray processes, ...), None where
    it may."""
    python = python_sampling_reason(agent, net)
    fused_no = python
    if python is None:
        if not isinstance(envs, FusedEnvs):
            fused_no = "the envs step in Python"
        else:
            try:
                envs.check_fused(net)
            except ValueError as e:
                fused_no = str(e)
            else:
                if no_whole_loop is None and isinstance(envs, NativeLoopEnvs):
                    return Choice(
                        "native_loop",
                        "native envs, native sampling: the whole actor loop in native calls",
                    )
                why = no_whole_loop or "the envs have no native actor loop"
                return Choice("fused", f"native envs, native sampling; one call an unroll: {why}")
    if isinstance(envs, HalvedEnvs):
        if python is None and not net.has_python_layers and envs.sync_halves() is not None:
            return Choice(
                "split_side",
                "double buffering on sync halves: acts on the side thread or in turn, "
                "whichever measures faster",
            )
        return Choice("split", f"double buffering, a half steps while the other acts: {fused_no}")
    return Choice("stepped", f"one native call between two env steps: {fused_no}")


def choose_learner_loop(
    cfg: RuntimeConfig,
    agent: Agent,
    net: Net,
    state: LearnerState,
    actor_loops: Sequence[str],
    local: bool,
) -> Choice:
    """The learner's loop (one of `LEARNER_LOOPS`) beside actors running ``actor_loops`` (``local``:
    threads of this process). The native take pays where the Python take costs the actors:
    beside native actor loops, or for the learner's native loop beside actors that step
    Python envs; beside those, with ``learn`` in Python, the Python take measured no slower
    (docs/performance.md, "The actor loop and the learner's take in native calls")."""
    if cfg.deterministic:
        return Choice("python", "deterministic mode orders each batch by actor")
    if not local or not actor_loops:
        return Choice("python", "the actors are Ray processes")
    native_actors = all(loop == "native_loop" for loop in actor_loops)
    learn_no = _native_learn_reason(cfg, agent, net, state)
    if learn_no is None:
        return Choice("native_learn", "the agent's learn is a NativeLearn: steps in native calls")
    if native_actors:
        return Choice("native_inbox", f"native actor loops; agent.learn in Python: {learn_no}")
    return Choice("python", f"actors that step in Python, and {learn_no}")


def _native_learn_reason(
    cfg: RuntimeConfig, agent: Agent, net: Net, state: LearnerState
) -> str | None:
    """Why the learner's native loop cannot run the agent's step; None where it can."""
    if agent.native_learn(net, state) is None:
        return "the agent's learn is not a NativeLearn"
    if state.optimizer.native_step() is None:
        return "the optimizer has no native step"
    columns = cfg.batch_rollouts * cfg.envs_per_actor
    if splits_into_shards(net, cfg.learner_threads, cfg.learner_split, columns):
        return "the step is split into column shards"
    return None


def plan_run(
    cfg: RuntimeConfig,
    agent: Agent,
    net: Net,
    state: LearnerState,
    actor_envs: Sequence[Any] | None,
) -> ExecutionPlan:
    """The run's plan: ``actor_envs``, each local actor's envs (None: Ray actor processes,
    which choose their unroller in their process from the same rules, without the whole
    native loop)."""
    if actor_envs is None:
        actor = Choice("remote", "Ray actor processes: each picks its unroller in its process")
        loops: list[str] = []
    else:
        no_whole = "deterministic mode waits for versions" if cfg.deterministic else None
        choices = [choose_actor_loop(envs, agent, net, no_whole) for envs in actor_envs]
        actor = choices[0]
        if any(c.loop != actor.loop for c in choices):
            raise RuntimeError(f"the actors' envs differ in what they can do: {choices}")
        loops = [c.loop for c in choices]
    learner = choose_learner_loop(cfg, agent, net, state, loops, actor_envs is not None)
    return ExecutionPlan(actor, learner)
