"""The learner's whole loop in native calls (`NativeLoop`, `rlpar._native.learn_loop`): the same
parameters, optimizer state, metrics and published versions as `agent.learn` on the same batches,
a step whose gradient is not finite counted as `learn` counts it, the runtime's choice of loop,
and bad input."""

from __future__ import annotations

import dataclasses
import threading

import gymnasium as gym
import numpy as np
import pytest
from rlpar.agents.impala import Impala

import rlpar
from rlpar import _native
from rlpar.config import EnvConfig, RuntimeConfig
from rlpar.data import Batch, Rollout
from rlpar.runtime.handoff import HandOff
from rlpar.runtime.learner import Learner, NativeInbox, NativeLoop, VersionClock

T, K, B = 5, 3, 2  # unroll, envs an actor, rollouts a batch
OBS, ACTIONS = gym.spaces.Box(-1, 1, (4,), np.float32), gym.spaces.Discrete(2)


class FakeActor:
    """Rollout buffers of random steps (valid actions, behaviour logits from ``net``), their
    free queue, and stamps that say they were acted with version 1."""

    def __init__(self, seed: int, net: rlpar.Net, n: int = 2) -> None:
        rng = np.random.default_rng(seed)
        self.free: HandOff[Rollout] = HandOff()
        self.buffers = []
        for i in range(n):
            r = Rollout.allocate(T, K, (4,), np.float32, (), np.int64, net.output_size,
                                 state_size=net.state_size)  # fmt: skip
            r.obs[...] = rng.uniform(-1, 1, r.obs.shape)
            r.actions[...] = rng.integers(0, 2, r.actions.shape)
            r.rewards[...] = rng.normal(size=r.rewards.shape)
            r.terminated[...] = rng.random(r.terminated.shape) < 0.1
            r.mask[...] = rng.random(r.mask.shape) < 0.9
            r.behaviour[...] = rng.normal(size=r.behaviour.shape)
            r.core_state[...] = rng.normal(size=r.core_state.shape)
            r.stamp = np.array([1, i], np.int64)
            r.version, r.seq = 1, i
            self.buffers.append(r)
            self.free.reserve(r)


def setup(config: dict, actors: int = 3):
    """Two learners of the same agent config from the same parameters: one that runs
    ``agent.learn`` on stacked batches, and one with a native inbox and loop."""
    made = []
    for _ in range(2):
        agent = rlpar.make_agent("impala", {"optim": {"lr": 0.01}, **config})
        net = rlpar.Net(agent.net_spec(OBS, ACTIONS))
        state = agent.init_state(net, net.init_params(seed=0))
        store = rlpar.SnapshotStore(net.num_params, num_slots=4)
        store.publish(state.params, version=1)
        made.append((agent, net, state, store))
    fakes = [FakeActor(seed, made[1][1]) for seed in range(actors)]
    q: HandOff[Rollout] = HandOff(maxsize=16)
    agent, net, state, store = made[1]
    learner = Learner(agent=agent, net=net, state=state, store=store, actors=fakes,
                      batch_rollouts=B, max_policy_lag=None, deterministic=False,
                      clock=VersionClock(1))  # fmt: skip
    inbox = NativeInbox(q, fakes, release_gil=True)
    plan = NativeLoop.plan_for(learner, inbox)
    assert plan is not None
    return made[0], learner, NativeLoop(inbox, plan, learner), q, fakes


def run_until(loop: NativeLoop, steps: int) -> None:
    done = 0
    for _ in range(1000):
        done += loop.run()
        if done >= steps:
            break
    assert done == steps


@pytest.mark.parametrize("config", [{}, {"passes": 2}, {"net": {"lstm": 8}}, {"entropy_cost": 0.0}])
def test_the_loop_takes_the_steps_learn_takes(config: dict) -> None:
    (agent, net, state, store), learner, loop, q, fakes = setup(config)
    order = [fakes[1].buffers[0], fakes[0].buffers[1], fakes[2].buffers[0],
             fakes[0].buffers[0], fakes[2].buffers[1], fakes[1].buffers[1]]  # fmt: skip
    batches = [Batch.stack(order[i : i + B], 1 + i // B) for i in range(0, len(order), B)]
    for r in order:
        q.put(r)
    run_until(loop, len(batches))
    for batch in batches:
        metrics = agent.learn(net, state, batch)
        state.steps += 1
        store.publish(state.params, version=state.steps + 1)
    lstate = learner.state
    np.testing.assert_array_equal(lstate.params, state.params)  # bit for bit
    assert lstate.steps == state.steps == 3 and learner.stats.steps == 3
    assert lstate.optimizer.steps == state.optimizer.steps
    for key, value in state.optimizer.state_dict().items():
        np.testing.assert_array_equal(lstate.optimizer.state_dict()[key], value, err_msg=key)
    assert learner.stats.metrics == metrics
    assert learner.store.latest_version == store.latest_version == 4
    with learner.store.pin() as snap:  # the published parameters are the learner's
        np.testing.assert_array_equal(np.asarray(snap), lstate.params)
    assert learner.stats.samples == 3 * B * T * K
    assert learner.stats.lag_mean == 2 and learner.stats.lag_max == 2  # version 3 against 1
    actions, mask = learner.stats.last_batch
    np.testing.assert_array_equal(actions, batches[-1].actions)
    np.testing.assert_array_equal(mask, batches[-1].mask)
    assert sum(f.free.qsize() for f in fakes) == len(order)  # every buffer went back
    assert loop.run() == 0 and loop.filled == 0  # nothing queued: the budget runs out


def test_no_passes_takes_and_publishes_without_a_step() -> None:
    """`NativeLearn.passes` = 0 (`rlpar bench runtime`'s idle learner): each batch is taken and
    its buffers handed back, the parameters are published unchanged as the next version, and
    no optimizer step is taken."""
    _, learner, _loop, q, fakes = setup({})
    plan = rlpar.NativeLearn(learner.agent.native_learn(learner.net, learner.state).loss, 0)
    loop = NativeLoop(_loop.inbox, plan, learner)
    before = learner.state.params.copy()
    for f in fakes[:2]:
        for r in f.buffers:
            q.put(r)
    run_until(loop, 2)
    state = learner.state
    np.testing.assert_array_equal(state.params, before)
    assert state.steps == learner.stats.steps == 2 and state.optimizer.steps == 0
    assert learner.store.latest_version == 3
    with learner.store.pin() as snap:
        np.testing.assert_array_equal(np.asarray(snap), before)
    assert learner.stats.metrics == {"learning_rate": state.optimizer.lr}
    assert learner.stats.samples == 2 * B * T * K
    assert sum(f.free.qsize() for f in fakes) == 4  # every buffer went back


def test_a_batch_left_part_taken_is_finished_by_the_next_call() -> None:
    (agent, net, state, _store), learner, loop, q, fakes = setup({})
    first, second = fakes[0].buffers[0], fakes[1].buffers[0]
    q.put(first)
    assert loop.run() == 0 and loop.filled == 1
    q.put(second)
    run_until(loop, 1)
    agent.learn(net, state, Batch.stack([first, second], 1))
    np.testing.assert_array_equal(learner.state.params, state.params)


def test_a_step_that_is_not_finite_is_skipped_and_counted_as_learn_does() -> None:
    (agent, net, state, _store), learner, loop, q, fakes = setup({"passes": 2})
    order = [fakes[0].buffers[0], fakes[1].buffers[0], fakes[2].buffers[0], fakes[0].buffers[1]]
    order[2].rewards[0, 0] = np.nan  # the second batch's gradient is NaN
    order[2].mask[0, 0] = True
    batches = [Batch.stack(order[:2], 1), Batch.stack(order[2:], 2)]
    for r in order:
        q.put(r)
    run_until(loop, 2)
    for batch in batches:
        metrics = agent.learn(net, state, batch)
        state.steps += 1
    lstate = learner.state
    assert state.extra["nonfinite_grad_steps"] == 2  # both passes of the second batch
    assert lstate.extra == state.extra and lstate.steps == state.steps
    assert lstate.optimizer.steps == state.optimizer.steps == 2
    np.testing.assert_array_equal(lstate.params, state.params)
    assert learner.stats.metrics["nonfinite_grad_steps"] == metrics["nonfinite_grad_steps"] == 2
    assert np.isnan(learner.stats.metrics["grad_norm"])


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The learner steps at which `Impala.learn` was called."""
    got: list[int] = []
    learn = Impala.learn

    def counted(self, net, state, batch):
        got.append(state.steps)
        return learn(self, net, state, batch)

    monkeypatch.setattr(Impala, "learn", counted)
    return got


def test_the_runtime_runs_the_native_loop_where_the_agent_says_what_learn_does(
    calls: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Native envs and IMPALA: the loop, and `learn` is never called; a learning-rate schedule,
    clipped rewards, APPO, a Python-env run: `learn` as before."""
    runtime = RuntimeConfig(num_actors=2, envs_per_actor=4, unroll_length=5, batch_rollouts=2,
                            total_env_steps=6_000, checkpoint_interval_s=None)  # fmt: skip
    runner = rlpar.Runner(rlpar.make_agent("impala"), EnvConfig("rlpar/CartPole-v1"), runtime)
    result = runner.run()
    assert result.learner_steps > 0 and calls == []
    assert runner.store.latest_version == runner.state.steps + 1
    assert runner.learner.stats.steps == runner.state.steps == result.learner_steps
    assert runner.state.optimizer.steps == runner.state.steps
    assert {"loss", "grad_norm", "learning_rate"} <= set(runner.learner.stats.metrics)
    for config in ({"optim": {"lr_decay_env_steps": 10_000}}, {"reward_clip": 1.0}):
        calls.clear()
        runner = rlpar.Runner(
            rlpar.make_agent("impala", config), EnvConfig("rlpar/CartPole-v1"), runtime
        )
        result = runner.run()
        assert len(calls) == result.learner_steps > 0, config
    # Two learner threads: a conv net splits its rows inside the loop's calls; an MLP's step
    # is cut into column shards, which the loop does not run.
    two = RuntimeConfig(**{**runtime.__dict__, "learner_threads": 2, "envs_per_actor": 16,
                           "unroll_length": 20, "total_env_steps": 20_000})  # fmt: skip
    made: list[NativeLoop] = []
    make = NativeLoop.__init__

    def recorded(self, *args):
        make(self, *args)
        made.append(self)

    monkeypatch.setattr(NativeLoop, "__init__", recorded)
    for env, config, split in (("rlpar/Catch-v0", {"net": {"conv": [[4, 3, 1]]}}, "rows"),
                               ("rlpar/CartPole-v1", {}, "shards")):  # fmt: skip
        calls.clear()
        made.clear()
        runner = rlpar.Runner(rlpar.make_agent("impala", config), EnvConfig(env), two)
        result = runner.run()
        # the plan leaves a step cut into column shards to agent.learn (the native take stays)
        assert [loop.split for loop in made] == ([split] if split == "rows" else []), env
        want = "native_learn" if split == "rows" else "native_inbox"
        assert runner.plan.learner.loop == want, env
        assert result.learner_steps > 0 and (calls == []) == (split == "rows"), env
    appo = rlpar.make_agent("appo", {"minibatches": 2})
    assert appo.native_learn(None, None) is None  # type: ignore[arg-type]


def test_learn_loop_refuses_bad_input() -> None:
    _, learner, loop, q, _fakes = setup({})
    state, net = learner.state, learner.net
    grad = np.empty(net.num_params, np.float32)

    def call(**kw):
        args = dict(inbox=loop.inbox._inbox, batch=loop.batch, names=loop.names,
                    versions=loop.versions, start=0, learner_version=1, max_lag=None, net=net,
                    params=state.params, grad=grad, loss=loop.plan.loss.native, passes=1,
                    max_grad_norm=40.0, optimizer=state.optimizer.native_step(),
                    store=learner.store, pool=None, budget_s=0.0,
                    done=np.zeros(2, np.int64))  # fmt: skip
        args.update(kw)
        return _native.learn_loop(**args)

    r = call()
    assert isinstance(r, _native.LearnLoopResult)
    assert (r.batches, r.filled, r.applied, r.passes, r.metrics) == (0, 0, 0, (), None)  # no take
    with pytest.raises(AttributeError):
        r.batches = 1  # type: ignore[misc]
    with pytest.raises(ValueError, match="passes: expected an integer >= 0, got -1"):
        call(passes=-1)
    with pytest.raises(ValueError, match="budget_s: expected a finite number"):
        call(budget_s=-1.0)
    with pytest.raises(ValueError, match="max_lag: expected None or an integer >= 0, got -2"):
        call(max_lag=-2)
    with pytest.raises(ValueError, match=r"names: expected each of obs, .* once, got 'reward'"):
        call(names=[n if n != "mask" else "reward" for n in loop.names])
    with pytest.raises(TypeError, match=r"names\[0\]: expected a field name \(str\), got int"):
        call(names=[0, *loop.names[1:]])
    with pytest.raises(ValueError, match="names: 'core_state' is missing"):
        call(names=loop.names[:-1])
    with pytest.raises(ValueError, match="max_grad_norm: expected a number > 0, got 0"):
        call(max_grad_norm=0.0)
    with pytest.raises(ValueError, match="budget_s: expected a finite number"):
        call(budget_s=float("inf"))
    with pytest.raises(ValueError, match=r"done must have shape \(2,\)"):
        call(done=np.zeros(1, np.int64))
    with pytest.raises(TypeError, match="versions must be int64"):
        call(versions=np.zeros(B, np.int32))
    with pytest.raises(ValueError, match="start: expected an integer in \\[0, 2\\], got 3"):
        call(start=3)
    with pytest.raises(ValueError, match="learner_version: the next publish"):
        call(learner_version=0)
    with pytest.raises(ValueError, match="store: expected a SnapshotStore of the net's"):
        call(store=rlpar.SnapshotStore(3, num_slots=3))
    with pytest.raises(TypeError, match=r"inbox must be an rlpar\._native\.RolloutInbox"):
        call(inbox=q.tickets)
    wrong = dataclasses.replace(loop.batch, rewards=np.empty((T, B * K), np.float64))
    with pytest.raises(TypeError, match=r"batch\.rewards must be float32, got float64"):
        call(batch=wrong)
    with pytest.raises(TypeError, match=r"batch: expected an rlpar\.Batch, got dict without"):
        call(batch=loop.arrays)
    ppo = rlpar.NativeLoss.for_net(net, rlpar.PpoOptions())
    with pytest.raises(ValueError, match="learn_loop runs the actor-critic losses"):
        call(loss=ppo.native)
    with pytest.raises(TypeError, match=r"expected an actor-critic rlpar\.NativeLoss"):
        rlpar.NativeLearn(ppo)
    with pytest.raises(ValueError, match=r"NativeLearn\.passes: expected an integer >= 0"):
        rlpar.NativeLearn(loop.plan.loss, passes=-1)
    with pytest.raises(ValueError, match=r"NativeLearn\.max_grad_norm: expected a number > 0"):
        rlpar.NativeLearn(loop.plan.loss, max_grad_norm=0.0)


def test_one_thread_at_a_time_uses_the_inbox() -> None:
    """The loop holds the inbox for its call: a take from another thread meanwhile is refused."""
    _, _learner, loop, _q, _fakes = setup({})
    refused: list[BaseException] = []
    entered = threading.Event()

    def probe() -> None:
        entered.wait(5)
        for _ in range(2000):
            try:
                dst = [np.empty_like(a) for a in loop.arrays.values()]
                loop.inbox._inbox.take(dst, np.empty(B, np.int64), 0, 1, timeout=0)
            except RuntimeError as e:
                refused.append(e)
                return
            threading.Event().wait(0.0005)

    prober = threading.Thread(target=probe)
    prober.start()
    for _ in range(200):  # each call holds the inbox for its whole 10 ms budget
        entered.set()
        loop.run()
        if refused:
            break
    prober.join(timeout=30)
    assert refused and "another thread is using this inbox" in str(refused[0])


def test_beside_python_env_actors_the_loop_runs_and_the_episodes_are_logged(
    calls: list[int],
) -> None:
    """gymnasium's CartPole (actors step Python envs): the learner's native loop takes their
    rollouts, the episodes are the actors' own; with column shards the Python take and learn."""
    runtime = RuntimeConfig(num_actors=2, envs_per_actor=4, unroll_length=8, batch_rollouts=2,
                            total_env_steps=8_000, checkpoint_interval_s=None)  # fmt: skip
    runner = rlpar.Runner(rlpar.make_agent("impala"), EnvConfig("CartPole-v1"), runtime)
    result = runner.run()
    assert result.learner_steps > 0 and calls == []
    assert result.episodes > 0 and np.isfinite(result.mean_return)
    assert runner.store.latest_version == runner.state.steps + 1
    assert runner.learner.stats.samples == result.learner_steps * 2 * 4 * 8
    shards = RuntimeConfig(**{**runtime.__dict__, "learner_threads": 2})
    runner = rlpar.Runner(rlpar.make_agent("impala"), EnvConfig("CartPole-v1"), shards)
    result = runner.run()
    assert len(calls) == result.learner_steps > 0


@pytest.mark.parametrize("env", ["rlpar/CartPole-v1", "CartPole-v1"])
def test_an_error_in_the_loop_stops_the_run_and_is_reraised(
    env: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A learner that diverges inside the native loop (here: the non-finite count raising on
    its 5th step) stops the actors, native or Python, and the run re-raises its error."""
    from rlpar import state as state_module

    seen: list[float] = []

    def diverged(state, norm):
        seen.append(norm)
        if len(seen) >= 5:
            raise FloatingPointError("the gradient was not finite")
        return False

    monkeypatch.setattr(state_module, "skip_nonfinite_step", diverged)
    runtime = RuntimeConfig(num_actors=2, envs_per_actor=4, unroll_length=5, batch_rollouts=1,
                            total_env_steps=10**9, checkpoint_interval_s=None)  # fmt: skip
    runner = rlpar.Runner(rlpar.make_agent("impala"), EnvConfig(env), runtime)
    with pytest.raises(FloatingPointError, match="not finite") as info:
        runner.run()
    assert any("learner" in note for note in getattr(info.value, "__notes__", []))
    assert not [t for t in threading.enumerate() if t.name.startswith("rlpar-")]
