"""The runtime's fused path (native envs + a natively sampled categorical policy) is the Python
actor loop done in one native call: same rollouts, same learning, bit for bit."""

from __future__ import annotations

import numpy as np

import rlpar
import rlpar.checkpoint
from rlpar import _native
from rlpar.config import EnvConfig, RuntimeConfig


class PythonLoopImpala:
    """IMPALA that keeps the Python actor loop but draws exactly what the fused path draws: the
    same native sampler, seeded as the runtime seeds actor 0's."""

    def __new__(cls, seed: int):
        base = type(rlpar.make_agent("impala"))

        class Agent(base):
            def init_state(self, net, params):
                state = super().init_state(net, params)
                self.native_sampling = False  # force the Python loop
                key = np.random.SeedSequence([seed, 0, 1 << 21]).generate_state(1)[0]
                self.sampler = _native.CategoricalSampler(int(key))
                return state

            def act(self, net, out, rng):
                b, n = self.layout.begin, self.layout.num_actions
                return self.sampler.sample(np.ascontiguousarray(out[:, b : b + n]))

        return Agent(base.Config(optim=base.Config().optim.__class__(lr=0.003)))


def run(agent, seed: int = 3) -> rlpar.Runner:
    runtime = RuntimeConfig(
        num_actors=1, envs_per_actor=8, unroll_length=8, batch_rollouts=1, seed=seed,
        deterministic=True, total_env_steps=20_000, checkpoint_interval_s=None,
    )  # fmt: skip
    runner = rlpar.Runner(agent, EnvConfig("rlpar/CartPole-v1"), runtime)
    runner.run()
    return runner


def test_fused_and_python_paths_learn_the_same_bits() -> None:
    fused = run(rlpar.make_agent("impala", {"optim": {"lr": 0.003}}))
    assert fused.actors[0].sampler is not None, "native envs + IMPALA must take the fused path"
    python = run(PythonLoopImpala(seed=3))
    assert python.actors[0].sampler is None
    assert fused.state.steps == python.state.steps > 0
    np.testing.assert_array_equal(fused.state.params, python.state.params)
    assert fused.episodes.count == python.episodes.count > 0


def test_gymnasium_envs_take_the_step_loop_with_the_native_sampler() -> None:
    runner = rlpar.Runner(
        rlpar.make_agent("impala"), EnvConfig("CartPole-v1"), RuntimeConfig(num_actors=1)
    )
    actor = runner.actors[0]
    assert not actor.fused and actor.loop is not None and actor.sampler is not None
    runner.close()


def test_checkpoints_keep_and_resume_restores_the_native_sampler(tmp_path) -> None:
    runtime = RuntimeConfig(num_actors=1, envs_per_actor=8, unroll_length=8, batch_rollouts=1,
                            total_env_steps=5_000, checkpoint_interval_s=None)  # fmt: skip
    env = EnvConfig("rlpar/CartPole-v1")
    first = rlpar.Runner(rlpar.make_agent("impala"), env, runtime, checkpoint_dir=tmp_path)
    result = first.run()
    saved = rlpar.checkpoint.load_checkpoint(result.checkpoint).rng_states["samplers"][0]
    assert saved == list(first.actors[0].sampler.state)
    second = rlpar.Runner(rlpar.make_agent("impala"), env, runtime, resume=result.checkpoint)
    assert list(second.actors[0].sampler.state) == saved
    second.close()
