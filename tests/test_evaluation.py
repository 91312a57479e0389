"""Evaluation: `evaluate_policy` plays exactly what it reports; a run evaluates its final policy,
during training on the evaluator thread (pinned snapshots), and before it stops at a target
(`eval.check_target`); a failing evaluator stops the run; bad `[eval]` keys fail clearly."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from test_runtime import rlpar_threads, small_runtime
from tiny_agent import TinyAgent

import rlpar
from rlpar.app.experiment import experiment_from_dict, load_experiment
from rlpar.app.summary import TrainingSummary
from rlpar.checkpoint import load_checkpoint
from rlpar.config import ConfigError, EnvConfig, EvalConfig
from rlpar.runtime import Runner
from rlpar.runtime import evaluator as evaluator_module
from rlpar.runtime import runner as runner_module
from rlpar.runtime.common import RecentLog
from rlpar.runtime.evaluation import EvaluationError, evaluation_env


class GreedyTiny(TinyAgent):
    """TinyAgent with a greedy policy that always plays action 0."""

    def greedy(self, net: rlpar.Net, out: np.ndarray) -> np.ndarray:
        return np.zeros(out.shape[0], np.int64)


def built(agent: TinyAgent, env: EnvConfig) -> tuple[rlpar.Net, np.ndarray]:
    probe = gym.make(env.id)
    net = rlpar.Net(agent.net_spec(probe.observation_space, probe.action_space))
    probe.close()
    params = net.init_params(seed=0)
    agent.init_state(net, params)
    return net, params


def test_evaluate_policy_counts_whole_episodes_and_reports_their_returns() -> None:
    # Counter env: action 0 earns 1 a step, an episode lasts 3..6 steps: return == length.
    env = EnvConfig("rlpar-test/Counter-v0")
    agent = GreedyTiny()
    net, params = built(agent, env)
    e = rlpar.evaluate_policy(agent, net, params, env, episodes=23, max_envs=4, seed=7)
    assert e.policy == "greedy" and e.episodes == 23 and len(e.returns) == 23
    assert e.returns == [float(n) for n in e.lengths]
    assert all(3 <= n <= 6 for n in e.lengths)
    assert e.mean_return == pytest.approx(np.mean(e.returns))
    assert e.std_return == pytest.approx(np.std(e.returns))
    assert (e.min_return, e.max_return) == (min(e.returns), max(e.returns))
    again = rlpar.evaluate_policy(agent, net, params, env, episodes=23, max_envs=4, seed=7)
    assert again.returns == e.returns
    sampled = rlpar.evaluate_policy(agent, net, params, env, episodes=5, greedy=False)
    assert sampled.policy == "sampled" and sampled.episodes == 5


def test_evaluate_policy_stops_when_asked_and_rejects_bad_arguments() -> None:
    env = EnvConfig("CartPole-v1")
    agent = GreedyTiny()
    net, params = built(agent, env)
    stop = threading.Event()
    stop.set()
    assert rlpar.evaluate_policy(agent, net, params, env, episodes=3, stop=stop) is None
    with pytest.raises(ValueError, match="episodes: expected an integer >= 1, got 0"):
        rlpar.evaluate_policy(agent, net, params, env, episodes=0)
    with pytest.raises(ValueError, match="max_envs"):
        rlpar.evaluate_policy(agent, net, params, env, max_envs=0)
    with pytest.raises(TypeError, match=r"env: expected an rlpar\.EnvConfig, got str"):
        rlpar.evaluate_policy(agent, net, params, "CartPole-v1")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"agent: expected an rlpar\.Agent"):
        rlpar.evaluate_policy(None, net, params, env)  # type: ignore[arg-type]


class Lingers(gym.Env):
    """Each episode, drawn at reset: ends after 4 steps, or never (a policy that stands still
    in an env without a time limit). Reward 1 a step, so a return is the steps it counted."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, p_forever: float = 0.5) -> None:
        self.p_forever = p_forever

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t, self.forever = 0, bool(self.np_random.random() < self.p_forever)
        return np.zeros(2, np.float32), {}

    def step(self, action):
        self.t += 1
        obs = np.array([self.forever, self.t], np.float32)
        return obs, 1.0, not self.forever and self.t == 4, False, {}


gym.register("rlpar-test/Lingers-v0", Lingers)  # no TimeLimit


def test_an_episode_that_never_ends_is_cut_at_the_step_cap_and_counted() -> None:
    env = EnvConfig("rlpar-test/Lingers-v0", kwargs={"p_forever": 1.0})
    agent = GreedyTiny()
    net, params = built(agent, env)
    # 5 episodes on 2 envs: quotas 3 and 2, so the envs are reset twice after their cuts.
    e = rlpar.evaluate_policy(agent, net, params, env, episodes=5, max_envs=2, max_episode_steps=7)
    assert (e.episodes, e.truncated) == (5, 5)
    assert e.returns == [7.0] * 5 and e.lengths == [7] * 5


def test_cut_and_whole_episodes_mix_and_repeat_with_the_seed() -> None:
    env = EnvConfig("rlpar-test/Lingers-v0")
    agent = GreedyTiny()
    net, params = built(agent, env)
    e = rlpar.evaluate_policy(agent, net, params, env, episodes=40, max_envs=8, seed=3,
                              max_episode_steps=9)  # fmt: skip
    assert e.episodes == 40 and sorted(set(e.lengths)) == [4, 9]
    assert e.returns == [float(n) for n in e.lengths]
    assert e.truncated == e.lengths.count(9) and 5 < e.truncated < 35
    again = rlpar.evaluate_policy(agent, net, params, env, episodes=40, max_envs=8, seed=3,
                                  max_episode_steps=9)  # fmt: skip
    assert again.returns == e.returns
    # With no cap the same evaluation of an env that always ends counts no cut.
    ends = EnvConfig("rlpar-test/Lingers-v0", kwargs={"p_forever": 0.0})
    whole = rlpar.evaluate_policy(agent, net, params, ends, episodes=6, max_episode_steps=None)
    assert whole.truncated == 0 and whole.lengths == [4] * 6
    with pytest.raises(ValueError, match="max_episode_steps: expected None or an integer >= 1"):
        rlpar.evaluate_policy(agent, net, params, env, max_episode_steps=0)


def test_a_run_on_an_env_that_never_ends_finishes_its_final_evaluation(tmp_path) -> None:
    from rlpar.app.train import Training

    exp = experiment_from_dict(
        {
            "agent": {"name": "impala"},
            "env": {"id": "rlpar-test/Lingers-v0", "kwargs": {"p_forever": 1.0}},
            "runtime": {"num_actors": 1, "envs_per_actor": 4, "unroll_length": 8,
                        "batch_rollouts": 1, "total_env_steps": 256},
            "eval": {"episodes": 3, "max_episode_steps": 50},
            "log": {"logdir": str(tmp_path)},
        }
    )  # fmt: skip
    summary = Training(exp).run(quiet=True)
    (final,) = summary.evaluation
    assert (final["episodes"], final["truncated"], final["mean_length"]) == (3, 3, 50.0)


def test_a_run_evaluates_during_training_and_its_final_parameters() -> None:
    ev = EvalConfig(episodes=6, policies=["sampled"], interval_env_steps=600, interval_episodes=2)
    runner = Runner(
        TinyAgent(),
        EnvConfig("CartPole-v1"),
        small_runtime(total_env_steps=6000),
        evaluation=ev,
    )
    result = runner.run()
    assert result.stopped_by == "total_env_steps"
    (final,) = result.evaluation
    assert final["policy"] == "sampled" and final["episodes"] == 6
    assert "returns" not in final  # the summary keeps the statistics, not every episode
    points = runner.evaluations
    assert len(points) >= 2, "the evaluator thread did not keep up at all"
    assert [p.env_steps for p in points] == sorted(p.env_steps for p in points)
    assert [p.version for p in points] == sorted(p.version for p in points)
    assert all(len(p.results) == 1 and p.results[0].episodes == 2 for p in points)
    seeds = [p.results[0].seed for p in points] + [final["seed"]]
    assert len(set(seeds)) == len(seeds), "every evaluation plays fresh env seeds"
    assert not any(t.name == "rlpar-evaluator" for t in rlpar_threads())
    # The final parameters, from Python: the evaluated ones.
    np.testing.assert_array_equal(runner.params, runner.state.params)
    assert runner.params is not runner.state.params


def test_check_target_stops_only_on_an_evaluated_policy_whose_parameters_are_final() -> None:
    def run() -> tuple:
        cfg = small_runtime(
            deterministic=True,
            seed=3,
            total_env_steps=40_000,
            buffers_per_actor=2,
            batch_rollouts=4,
            target_return=25.0,
        )
        ev = EvalConfig(episodes=8, policies=["sampled"])
        runner = Runner(TinyAgent(), EnvConfig("CartPole-v1"), cfg, evaluation=ev)
        return runner, runner.run()

    runner, res = run()
    checks = res.target_checks
    assert checks, "the window never reached the target"
    assert all(c["window_mean"] >= 25.0 for c in checks)
    assert [c["passed"] for c in checks[:-1]] == [False] * (len(checks) - 1)
    if res.stopped_by == "target_return":
        assert checks[-1]["passed"] and checks[-1]["eval_mean"] >= 25.0
        assert checks[-1]["learner_steps"] == res.learner_steps  # no step after the check
    else:
        assert res.stopped_by == "total_env_steps" and not checks[-1]["passed"]
    # Deterministic mode stays reproducible with the checks.
    runner2, res2 = run()
    assert res2.target_checks == checks and res2.learner_steps == res.learner_steps
    np.testing.assert_array_equal(runner.params, runner2.params)


def test_an_evaluator_failure_stops_the_run_and_is_reraised(monkeypatch) -> None:
    calls = []

    def failing(*args, **kwargs):
        calls.append(threading.current_thread().name)
        raise KeyError("evaluation exploded")

    monkeypatch.setattr(evaluator_module, "evaluate_policy", failing)
    before = len(rlpar_threads())
    ev = EvalConfig(episodes=0, check_target=False, interval_env_steps=300)
    runner = Runner(
        TinyAgent(),
        EnvConfig("rlpar-test/Counter-v0"),
        small_runtime(total_env_steps=10**9),
        evaluation=ev,
    )
    t0 = time.perf_counter()
    with pytest.raises(KeyError, match="evaluation exploded") as info:
        runner.run()
    assert time.perf_counter() - t0 < 10
    assert calls == ["rlpar-evaluator"]
    assert any("evaluator" in note for note in getattr(info.value, "__notes__", []))
    assert len(rlpar_threads()) == before


class BreaksInEvaluation(gym.Env):
    """Plays like a one-step env, except that the copies made on the evaluator thread fail to
    reset (what an env mode's evaluation-only bug looks like)."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self) -> None:
        self.broken = threading.current_thread().name == "rlpar-evaluator"

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if self.broken:
            raise OSError("the evaluation env broke")
        return np.zeros(2, np.float32), {}

    def step(self, action):
        return np.zeros(2, np.float32), 1.0, True, False, {}


gym.register("rlpar-test/BreaksInEvaluation-v0", BreaksInEvaluation)


def test_an_env_failing_in_evaluation_names_the_mode_and_call_and_keeps_the_training(
    tmp_path,
) -> None:
    ev = EvalConfig(episodes=0, check_target=False, interval_env_steps=1)
    runner = Runner(
        TinyAgent(),
        EnvConfig("rlpar-test/BreaksInEvaluation-v0"),
        small_runtime(total_env_steps=10**9, max_wall_s=60.0),
        checkpoint_dir=tmp_path,
        evaluation=ev,
    )
    with pytest.raises(EvaluationError) as info:
        runner.run()
    message = str(info.value)
    assert "'rlpar-test/BreaksInEvaluation-v0'" in message
    assert "env.vectorization = 'sync'" in message
    assert "in envs.reset(seed=" in message and "the evaluation env broke" in message
    assert isinstance(info.value.__cause__, OSError)
    (saved,) = tmp_path.glob("ckpt-*.rlpar")
    assert any(str(saved) in note for note in info.value.__notes__)
    assert load_checkpoint(saved).counters["learner_steps"] == runner.state.steps


@pytest.mark.parametrize(
    ("table", "match"),
    [
        ({"episode": 10}, r"unknown key 'eval.episode' \(did you mean 'eval.episodes'\?\)"),
        ({"episodes": -1}, r"eval.episodes: expected an integer >= 0, got -1"),
        ({"episodes": 0}, r"eval.episodes: expected an integer >= 1 while check_target"),
        ({"policies": ["argmax"]}, r"eval.policies: expected a list of distinct policies"),
        ({"policies": []}, r"eval.policies: expected a list of distinct policies"),
        ({"policies": "greedy"}, r"eval.policies: expected a list, got 'greedy'"),
        ({"interval_env_steps": 0}, r"eval.interval_env_steps: expected None or an integer"),
        ({"interval_episodes": 0}, r"eval.interval_episodes: expected an integer >= 1"),
        ({"max_episode_steps": 0}, r"eval.max_episode_steps: expected None or an integer >= 1"),
        ({"check_target": "yes"}, r"eval.check_target: expected true or false, got 'yes'"),
    ],
)
def test_bad_eval_keys_fail_clearly(table: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        experiment_from_dict({"agent": {"name": "impala"}, "eval": table})


def test_eval_section_defaults_and_none(tmp_path) -> None:
    path = tmp_path / "x.toml"
    path.write_text('[agent]\nname = "impala"\n[eval]\ninterval_env_steps = "none"\n')
    exp = load_experiment(path, ['eval.policies=["greedy", "sampled"]'])
    assert exp.eval == EvalConfig(policies=["greedy", "sampled"])
    assert exp.to_dict()["eval"]["episodes"] == 100


def test_training_writes_the_final_evaluation_to_the_summary(tmp_path) -> None:
    from rlpar.app.train import Training

    exp = load_experiment(
        Path(__file__).resolve().parent.parent / "experiments" / "cartpole_impala.toml",
        [
            f"log.logdir={json.dumps(str(tmp_path))}",
            "runtime.total_env_steps=3000",
            "eval.episodes=3",
            'eval.policies=["greedy", "sampled"]',
        ],
    )
    training = Training(exp)
    summary = training.run(quiet=True)
    assert [e["policy"] for e in summary.evaluation] == ["greedy", "sampled"]
    assert all(e["episodes"] == 3 for e in summary.evaluation)
    on_disk = json.loads((training.run_dir / "summary.json").read_text())
    assert on_disk == summary.to_dict()
    assert TrainingSummary.from_dict(on_disk) == summary


def test_deterministic_runs_with_evaluation_still_stop_at_their_step_budget() -> None:
    # max_wall_s: a run that ignored its budget would stop there and fail the asserts, not hang.
    cfg = small_runtime(deterministic=True, total_env_steps=600, batch_rollouts=2, max_wall_s=60)
    ev = EvalConfig(episodes=2, policies=["sampled"], interval_env_steps=200, interval_episodes=1)
    runner = Runner(TinyAgent(), EnvConfig("CartPole-v1"), cfg, evaluation=ev)
    result = runner.run()
    assert result.stopped_by == "total_env_steps"
    assert result.learner_steps == -(-600 // (2 * 5 * 3))
    assert result.evaluation is not None and result.evaluation[0]["episodes"] == 2


@pytest.mark.parametrize(
    ("train", "num_envs", "want"),
    [
        (EnvConfig(vectorization="async", workers_per_actor=2), 1, (None, False)),
        (EnvConfig(vectorization="async", workers_per_actor=2), 4, (2, False)),
        (EnvConfig(vectorization="async", workers_per_actor=2, double_buffer=True), 4, (2, False)),
        (EnvConfig(vectorization="ale", double_buffer=True), 3, (None, False)),
    ],
)
def test_evaluation_envs_do_not_inherit_the_training_layout(train, num_envs, want) -> None:
    env = evaluation_env(train, num_envs)
    assert (env.workers_per_actor, env.double_buffer) == want
    assert (env.id, env.vectorization, env.kwargs) == (train.id, train.vectorization, train.kwargs)


def test_recent_log_keeps_the_newest_and_numbers_every_item() -> None:
    log = RecentLog[int](keep=3)
    assert log.since(0) == ([], 0) and not log
    for i in range(5):
        log.append(i)
    assert list(log) == [2, 3, 4] and len(log) == 3 and log.count == 5 and log[-1] == 4
    assert log.since(0) == ([2, 3, 4], 5)  # items 0 and 1 are gone
    assert log.since(3) == ([3, 4], 5)
    assert log.since(5) == ([], 5)


def test_a_long_run_keeps_a_bounded_number_of_evaluation_points(monkeypatch, tmp_path) -> None:
    """The evaluator's points were kept for the whole run (a slow rise of RSS over hours);
    now the newest `KEEP_POINTS`, while TensorBoard still gets every point."""
    from rlpar.app.monitor import TensorBoardMonitor

    monkeypatch.setattr(runner_module, "KEEP_POINTS", 2)
    ev = EvalConfig(episodes=0, check_target=False, interval_env_steps=50, interval_episodes=1)
    runtime = small_runtime(total_env_steps=10**12, max_wall_s=120.0)
    runner = Runner(GreedyTiny(), EnvConfig("CartPole-v1"), runtime, evaluation=ev)
    written: list[int] = []
    monitor = TensorBoardMonitor(tmp_path, runner, {}, 10**9, 3600.0, 0)
    monkeypatch.setattr(
        monitor.writer, "scalars", lambda values, step: written.append(step) if any(
            k.startswith("eval/") for k in values) else None
    )  # fmt: skip

    def on_progress(p) -> None:
        monitor.update(p)
        assert len(runner.evaluations) <= 2
        if runner.evaluations.count >= 5:  # however slow the evaluator is on a busy machine
            runner.stop.set()

    monitor.start()
    monitor.finish(runner.run(on_progress=on_progress, progress_interval_s=0.01))
    monitor.close()
    assert runner.evaluations.count > 2 and len(runner.evaluations) == 2
    # More points than are kept reached TensorBoard, each once, in order. (All of them only when
    # the progress callback runs between every two evaluations, which a busy machine does not
    # promise: points older than the newest KEEP_POINTS are then dropped unwritten.)
    assert 2 < len(written) <= runner.evaluations.count
    assert written == sorted(set(written))
