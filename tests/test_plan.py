"""The run's execution plan (`rlpar.runtime.plan`): chosen once from what the envs, the agent
and the config can do, handed to the actors and the learner, and kept in the run's summary."""

from __future__ import annotations

import pytest

import rlpar
from rlpar import EnvConfig, RuntimeConfig
from rlpar.app.cli import _train_text
from rlpar.app.summary import TrainingSummary
from rlpar.runtime.plan import Choice, ExecutionPlan

RUNTIME = dict(num_actors=2, envs_per_actor=4, unroll_length=5, batch_rollouts=2,
               total_env_steps=400, checkpoint_interval_s=None)  # fmt: skip
ASYNC_HALVES = EnvConfig("CartPole-v1", vectorization="async", workers_per_actor=2,
                         double_buffer=True)  # fmt: skip


@pytest.mark.parametrize(
    ("env", "agent", "runtime", "actor", "learner"),
    [
        (EnvConfig("rlpar/CartPole-v1"), "impala", {}, "native_loop", "native_learn"),
        (EnvConfig("rlpar/CartPole-v1"), "appo", {}, "native_loop", "native_inbox"),
        (EnvConfig("rlpar/CartPole-v1"), "impala", {"learner_threads": 2}, "native_loop",
         "native_inbox"),  # an MLP's step cut into column shards: agent.learn
        (EnvConfig("rlpar/CartPole-v1"), "impala", {"deterministic": True}, "fused", "python"),
        (EnvConfig("CartPole-v1"), "impala", {}, "stepped", "native_learn"),
        (EnvConfig("CartPole-v1"), "appo", {}, "stepped", "python"),
        (EnvConfig("CartPole-v1", double_buffer=True), "impala", {}, "split_side",
         "native_learn"),
        (EnvConfig("CartPole-v1", double_buffer=True), "appo", {"deterministic": True},
         "split_side", "python"),
        (ASYNC_HALVES, "impala", {}, "split", "native_learn"),
    ],
)  # fmt: skip
def test_the_plan_follows_what_the_pieces_can_do(
    env: EnvConfig, agent: str, runtime: dict, actor: str, learner: str
) -> None:
    config = {"minibatches": 2} if agent == "appo" else {}
    runner = rlpar.Runner(
        rlpar.make_agent(agent, config), env, RuntimeConfig(**{**RUNTIME, **runtime})
    )
    try:
        plan = runner.plan
        assert (plan.actor.loop, plan.learner.loop) == (actor, learner), plan.describe()
        assert plan.actor.reason and plan.learner.reason
        assert all(a.path == actor for a in runner.actors)  # each actor got its part
        assert runner.learner.loop == learner
        assert (runner.learner.inbox is None) == (learner == "python")
    finally:
        runner.close()


def test_the_summary_keeps_the_plan() -> None:
    runner = rlpar.Runner(rlpar.make_agent("impala"), EnvConfig("rlpar/CartPole-v1"),
                          RuntimeConfig(**RUNTIME))  # fmt: skip
    result = runner.run()
    assert result.to_dict()["plan"] == {
        "actor": {"loop": "native_loop", "reason": runner.plan.actor.reason},
        "learner": {"loop": "native_learn", "reason": runner.plan.learner.reason},
    }
    summary = TrainingSummary(name="x", result=result, target_return=None, run_dir="runs/x")
    text = _train_text(summary).splitlines()
    assert text[-1] == "plan:          actors native_loop, learner native_learn"


def test_a_plan_names_known_loops() -> None:
    with pytest.raises(ValueError, match="no such loops"):
        ExecutionPlan(Choice("fused", "why"), Choice("fast", "why"))
