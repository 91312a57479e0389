"""The Ray backend (``runtime.backend = "ray"``) on a two-node Ray cluster simulated on this
machine, on 127.0.0.1 only: learning, a killed actor process, versions and policy lag, errors,
resume, and no socket off loopback. Tests that need Ray skip when it is not installed; every
one runs under a timeout, and the cluster is shut down at the end whatever happens."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from test_seeds import CONFIG as SEEDS_TEST_CONFIG
from test_seeds import WALK_ENV

import rlpar
from rlpar.checkpoint import latest_checkpoint
from rlpar.config import ConfigError, EnvConfig, RuntimeConfig
from rlpar.runtime import Runner

# Ray reads these when it is imported: every Ray process then binds to 127.0.0.1 only.
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"

# While Ray starts its processes (they inherit these): its dashboard process probes cloud
# metadata servers (169.254.169.254, metadata.google.internal) even with usage stats off, and a
# cluster not started by ray.init reports "usage stats disabled" to usage-stats.ray.io. Both
# go to a closed port on loopback instead.
OFFLINE_ENV = {
    "RAY_USAGE_STATS_REPORT_URL": "http://127.0.0.1:9/",
    **{k: "http://127.0.0.1:9" for k in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY")},
    **{k: "127.0.0.1,localhost" for k in ("no_proxy", "NO_PROXY")},
}
NODE = {"num_cpus": 1, "include_dashboard": False, "object_store_memory": 80 << 20}
IMPALA = {"entropy_cost": 0.01, "optim": {"name": "adam", "lr": 0.003}}  # cartpole_impala.toml


# --------------------------------------------------------------------------------- helpers


@contextlib.contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Raise TimeoutError in the main thread after ``seconds`` (fixtures then clean up)."""

    def expire(signum: int, frame: object) -> None:
        raise TimeoutError(f"test took longer than {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@contextlib.contextmanager
def offline_env() -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in OFFLINE_ENV}
    os.environ.update(OFFLINE_ENV)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture(scope="module")
def cluster() -> Iterator[object]:
    """Two Ray nodes (1 CPU each) on this machine, 127.0.0.1 only; shut down at the end."""
    pytest.importorskip("ray")
    import ray
    from ray.cluster_utils import Cluster

    c = None
    try:
        with deadline(120), offline_env():
            c = Cluster(initialize_head=True, connect=False, head_node_args=NODE)
            c.add_node(**NODE)
            c.wait_for_nodes()
        yield c
    finally:
        with deadline(60):
            if ray.is_initialized():
                ray.shutdown()
            if c is not None:
                c.shutdown()


def ray_runtime(address: str | None, **kw: object) -> RuntimeConfig:
    base = dict(
        num_actors=2, envs_per_actor=16, unroll_length=8, batch_rollouts=1,
        total_env_steps=300_000, seed=0, checkpoint_interval_s=None,
        backend="ray", ray_address=address,
    )  # fmt: skip
    return RuntimeConfig(**(base | kw))


def impala() -> rlpar.Agent:
    return rlpar.make_agent("impala", IMPALA)


def process_tree(root: int) -> set[int]:
    """``root`` and every process below it (Ray's node processes are this test's children)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    tree, todo = set(), [root]
    while todo:
        pid = todo.pop()
        tree.add(pid)
        todo += children.get(pid, [])
    return tree


def sockets_of(pids: set[int]) -> list[tuple[str, str, str, int]]:
    """(state, local address, peer address, pid) of every TCP/UDP socket those processes own."""
    out = subprocess.run(["ss", "-H", "-tunap"], capture_output=True, text=True, check=True)
    found = []
    for line in out.stdout.splitlines():
        cols = line.split()
        owners = {int(p) for p in re.findall(r"pid=(\d+)", line)}
        if len(cols) >= 6 and owners & pids:
            found.append((cols[1], cols[4], cols[5], min(owners & pids)))
    return found


def is_loopback(address: str) -> bool:
    host = address.rsplit(":", 1)[0].strip("[]")
    host = host.removeprefix("::ffff:")
    return host.startswith("127.") or host == "::1"


def check_loopback_only(snapshots: list[list[tuple[str, str, str, int]]]) -> None:
    sockets = [s for snap in snapshots for s in snap]
    listeners = {(local, pid) for state, local, _, pid in sockets if state in ("LISTEN", "UNCONN")}
    assert len(listeners) >= 5 and len({pid for _, pid in listeners}) >= 3, sockets
    bad = [
        s
        for s in sockets
        if not is_loopback(s[1]) or (s[0] not in ("LISTEN", "UNCONN") and not is_loopback(s[2]))
    ]
    assert not bad, f"sockets off loopback: {bad}"


# --------------------------------------------------------------------- config (no Ray needed)


def test_backend_keys_are_validated() -> None:
    assert RuntimeConfig().backend == "threads"
    RuntimeConfig(backend="ray", ray_address="auto")
    RuntimeConfig(backend="ray", ray_address="10.0.0.7:6379", num_actors=4, ray_actor_threads=2)
    for kw, key in [
        ({"backend": "processes"}, "backend"),
        ({"ray_address": "nonsense"}, "ray_address"),
        ({"ray_address": "ray://10.0.0.7:10001"}, "ray_address"),
        ({"ray_address": "host:99999"}, "ray_address"),
        ({"ray_actor_threads": 0}, "ray_actor_threads"),
        ({"num_actors": 3, "ray_actor_threads": 2}, "ray_actor_threads"),
        ({"backend": "ray", "deterministic": True, "num_actors": 1}, "deterministic"),
    ]:
        with pytest.raises(ConfigError, match=key):
            RuntimeConfig(**kw)


def test_rlpar_works_without_ray_and_says_how_to_get_it() -> None:
    code = (
        "import sys; sys.modules['ray'] = None\n"  # as if Ray were not installed
        "import rlpar\n"
        "rt = rlpar.RuntimeConfig(backend='ray', num_actors=1, envs_per_actor=2)\n"
        "try:\n"
        "    rlpar.Runner(rlpar.make_agent('impala'), rlpar.EnvConfig('CartPole-v1'), rt)\n"
        "except ImportError as e:\n"
        "    print('ImportError:', e)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd="/"
    )
    assert "ImportError:" in out.stdout and "rlpar[ray]" in out.stdout, out.stdout + out.stderr


# ----------------------------------------------------------------------------------- on Ray


def test_ray_backend_learns_cartpole_within_a_step_budget(cluster) -> None:
    budget = 300_000
    with deadline(150):
        runner = Runner(impala(), EnvConfig("CartPole-v1"), ray_runtime(cluster.address,
                        total_env_steps=budget, target_return=150.0))  # fmt: skip
        nodes = list(runner.ray.nodes)
        result = runner.run()
    assert len(set(nodes)) == 2, "one actor process on each of the two nodes"
    assert result.stopped_by == "target_return", result
    assert result.mean_return is not None and result.mean_return >= 150, result
    assert result.env_steps <= budget + 2 * 8 * 16 * 4  # a few rollouts in flight at the stop


def test_appo_learns_cartpole_on_ray(cluster) -> None:
    """APPO's epochs x minibatches run on the learner as with threads; the actor processes
    only act. Its committed CartPole settings, within the same step budget as IMPALA's."""
    budget = 300_000
    agent = rlpar.make_agent("appo", {"epochs": 6, "minibatches": 4, "optim": {"lr": 0.002}})
    with deadline(150):
        runner = Runner(agent, EnvConfig("CartPole-v1"), ray_runtime(cluster.address,
                        unroll_length=32, buffers_per_actor=1, total_env_steps=budget,
                        target_return=150.0))  # fmt: skip
        result = runner.run()
    assert result.stopped_by == "target_return", result
    assert result.mean_return is not None and result.mean_return >= 150, result


def test_every_ray_socket_is_on_loopback(cluster) -> None:
    if shutil.which("ss") is None:
        pytest.skip("needs ss (iproute2)")
    snapshots = []

    def look(_: rlpar.Progress) -> None:
        snapshots.append(sockets_of(process_tree(os.getpid())))

    with deadline(90):
        runner = Runner(impala(), EnvConfig("CartPole-v1"), ray_runtime(cluster.address,
                        max_wall_s=3.0))  # fmt: skip
        runner.run(on_progress=look, progress_interval_s=0.5)
    check_loopback_only(snapshots)


def local_instance_run() -> dict[str, list]:
    """A short experiment on a local Ray instance (``ray_address`` None), its two actor threads
    in one actor process; the sockets of this process and its children while it runs."""
    snapshots = []

    def look(_: rlpar.Progress) -> None:
        snapshots.append(sockets_of(process_tree(os.getpid())))

    with offline_env():
        runtime = ray_runtime(None, ray_actor_threads=2, max_wall_s=2.0)
        runner = Runner(impala(), EnvConfig("CartPole-v1"), runtime)
        runner.run(on_progress=look, progress_interval_s=0.5)
    return {
        "snapshots": snapshots,
        "pids": [a.pid for a in runner.actors],
        "rollouts": [a.stats.rollouts for a in runner.actors],
    }


def test_a_local_ray_instance_runs_threads_in_one_process_on_loopback() -> None:
    pytest.importorskip("ray")
    if shutil.which("ss") is None:
        pytest.skip("needs ss (iproute2)")
    # In a process of its own: a driver that joined a cluster, then ran a local instance, then
    # joins the cluster again cannot create actors there (seen with Ray 2.60).
    code = (
        f"import json, sys; sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "import test_ray\n"
        "print('RESULT', json.dumps(test_ray.local_instance_run()))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd="/"
    )
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    assert out.returncode == 0 and lines, out.stdout[-3000:] + out.stderr[-3000:]
    run = json.loads(lines[-1].removeprefix("RESULT "))
    assert len(set(run["pids"])) == 1, "both actor threads in one process"
    assert min(run["rollouts"]) > 0, "both threads act (on the one net of their process)"
    check_loopback_only([[tuple(s) for s in snap] for snap in run["snapshots"]])


def test_a_killed_actor_process_is_restarted_and_the_run_goes_on(cluster, caplog) -> None:
    events: dict[str, object] = {}

    def on_progress(p: rlpar.Progress) -> None:
        actor = runner.actors[0]
        if "killed" not in events and p.env_steps > 20_000:
            events["killed"] = runner.ray.pids()[0]
            events["at"] = (p.learner_steps, actor.stats.rollouts)
            os.kill(runner.ray.pids()[0], signal.SIGKILL)
        elif "killed" in events and actor.pid != events["killed"]:
            # the new process of actor 0 delivers: let it make a few more, then stop
            events.setdefault("back", actor.stats.rollouts)
            if actor.stats.rollouts >= events["back"] + 20:
                runner.stop.set()

    with deadline(120):
        runner = Runner(impala(), EnvConfig("CartPole-v1"), ray_runtime(cluster.address,
                        total_env_steps=10**9, max_wall_s=60.0))  # fmt: skip
        result = runner.run(on_progress=on_progress, progress_interval_s=0.1)
    assert result.stopped_by == "stop", (result, events)
    assert runner.ray.restarts == 1
    assert runner.ray.lost_rollouts >= 1
    assert runner.ray.pids()[0] != events["killed"]
    learner_steps, rollouts = events["at"]
    assert result.learner_steps > learner_steps + 20
    assert runner.actors[0].stats.rollouts >= rollouts + 20
    assert "died" in caplog.text and "rollout(s) lost" in caplog.text


class _Recorder:
    """Wraps the driver's agent: keeps the parameters of every version and checks each batch."""

    def __init__(self, agent: rlpar.Agent, net: rlpar.Net) -> None:
        self.agent, self.net = agent, net
        self.params: dict[int, np.ndarray] = {}
        self.lags: list[int] = []
        self.checked = 0

    def learn(self, net, state, batch) -> dict[str, float]:
        version = state.steps + 1  # what the learner holds, and what it publishes after a step
        self.params[version] = state.params.copy()
        assert batch.learner_version == version
        np.testing.assert_array_equal(batch.policy_lag, version - batch.versions)
        k = batch.num_columns // len(batch.versions)
        for i, v in enumerate(batch.versions):
            assert 1 <= v <= version
            cols = slice(i * k, (i + 1) * k)
            for t in range(batch.unroll_length):  # the behaviour outputs are version v's
                out = self.net.forward(self.params[int(v)], batch.obs[t, cols])
                np.testing.assert_allclose(batch.behaviour[t, cols], out, rtol=1e-5, atol=1e-5)
            self.checked += 1
        self.lags += batch.policy_lag.tolist()
        return self.agent.learn(net, state, batch)


def test_rollouts_carry_the_version_that_acted_them(cluster) -> None:
    with deadline(90):
        runner = Runner(impala(), EnvConfig("CartPole-v1"), ray_runtime(cluster.address,
                        batch_rollouts=2, total_env_steps=40_000))  # fmt: skip
        recorder = _Recorder(runner.agent, runner.net)
        runner.learner.agent = recorder  # the actor processes keep the real agent
        result = runner.run()
    assert result.learner_steps > 50 and recorder.checked >= 2 * result.learner_steps - 2
    assert max(recorder.lags) > 0  # the actors act on older versions, as they do with threads
    assert len(set(recorder.lags)) > 1


def test_a_recurrent_agent_remembers_on_ray(cluster) -> None:
    """The actor processes carry the LSTM state and ship it with each rollout: the memory task
    (chance: 0) is learned, and every batch holds start states."""
    agent = rlpar.make_agent("impala", {**IMPALA, "net": {"hidden": [32], "lstm": 32}})
    with deadline(120):
        runner = Runner(agent, EnvConfig("rlpar/MemoryChain-v0"), ray_runtime(
            cluster.address, unroll_length=20, batch_rollouts=2, total_env_steps=200_000,
            target_return=0.8, return_window=100))  # fmt: skip
        seen: list[np.ndarray] = []
        learn = runner.learner.agent.learn

        def recording_learn(net, state, batch):
            seen.append(batch.core_state.copy())
            return learn(net, state, batch)

        runner.learner.agent.learn = recording_learn
        result = runner.run()
    assert result.stopped_by == "target_return", result
    assert all(s.shape == (32, 64) for s in seen)
    assert any(np.abs(s).sum() > 0 for s in seen)


def test_a_dict_observation_and_a_multidiscrete_action_train_on_ray(cluster) -> None:
    """JointReach (a Dict of an image and a vector; MultiDiscrete([3, 3]) actions) in actor
    processes: the encoded space reaches the driver with its leaves, the image leaf gets its
    own conv (`encoders = "per_leaf"`), and the factorized policy reaches the target more often
    than not (random play: -1.14; experiments/joint_reach_impala.toml's net and optimizer, which
    pass 0.5 by 350k steps on threads)."""
    net = {"encoders": "per_leaf", "hidden": [128, 128], "activation": "relu"}
    options = {"entropy_cost": 0.01, "optim": {"name": "adam", "lr": 0.001}, "net": net}
    with deadline(240):
        runner = Runner(rlpar.make_agent("impala", options), EnvConfig("rlpar/JointReach-v0"),
                        ray_runtime(cluster.address, unroll_length=20, total_env_steps=600_000,
                                    target_return=0.5, return_window=100))  # fmt: skip
        assert isinstance(runner.net.spec.layers[0], rlpar.Concat)
        assert runner.spaces["action"].startswith("MultiDiscrete")
        result = runner.run()
    assert result.mean_return is not None and result.mean_return > 0.0, result


class ExplodingEnv(gym.Env):
    """Registered in this process only: the actor processes get it with the env's spec."""

    observation_space = gym.spaces.Box(-1, 1, (3,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self) -> None:
        self.calls = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(3, np.float32), {}

    def step(self, action):
        self.calls += 1
        if self.calls > 200:
            raise KeyError("exploding env exploded")
        return np.zeros(3, np.float32), 1.0, self.calls % 10 == 0, False, {}


def test_an_error_in_an_actor_process_stops_the_run_with_the_original_exception(
    cluster,
) -> None:
    import ray

    # This module is not importable in the actor processes: send its classes by value.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    gym.register("rlpar-test/Exploding-v0", ExplodingEnv)
    try:
        with deadline(90):
            runner = Runner(impala(), EnvConfig("rlpar-test/Exploding-v0"), ray_runtime(
                cluster.address, envs_per_actor=2, max_wall_s=60.0))  # fmt: skip
            with pytest.raises(KeyError, match="exploding env exploded") as info:
                runner.run()
    finally:
        gym.registry.pop("rlpar-test/Exploding-v0", None)
        ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
    assert "actor-" in str(info.value.__notes__)


def test_resume_continues_the_counters_on_ray(cluster, tmp_path) -> None:
    with deadline(120):
        first = Runner(impala(), EnvConfig("CartPole-v1"), ray_runtime(cluster.address,
                       total_env_steps=30_000), checkpoint_dir=tmp_path)  # fmt: skip
        r1 = first.run()
        ckpt = latest_checkpoint(tmp_path)
        second = Runner(impala(), EnvConfig("CartPole-v1"), ray_runtime(cluster.address,
                        total_env_steps=60_000), checkpoint_dir=tmp_path, resume=ckpt)  # fmt: skip
        assert second.state.steps == r1.learner_steps
        r2 = second.run()
    assert r2.env_steps >= 60_000 and r2.learner_steps > r1.learner_steps
    assert r2.episodes > r1.episodes


def test_resume_continues_the_episodes_of_native_envs_on_ray(cluster, tmp_path, caplog) -> None:
    """Native envs and an LSTM core in the actor processes: each reply carries the actor's
    `checkpoint_state`, the checkpoint holds every actor's episodes, and the resumed processes
    load them when their actor threads start (with another envs_per_actor they are skipped,
    loudly, and new episodes start)."""
    from rlpar.checkpoint import load_checkpoint

    agent = {**IMPALA, "net": {"hidden": [16], "lstm": 8}}
    env = EnvConfig("rlpar/CartPole-v1")
    with deadline(150):
        runtime = ray_runtime(cluster.address, envs_per_actor=4, total_env_steps=20_000)
        first = Runner(rlpar.make_agent("impala", agent), env, runtime, checkpoint_dir=tmp_path)
        first.run()
        path = latest_checkpoint(tmp_path)
        arrays = load_checkpoint(path).arrays
        for i in range(2):
            assert arrays[f"actors/{i}/core/state"].shape == (4, 16)
            assert arrays[f"actors/{i}/env/game"].shape == (4, 4)
        assert load_checkpoint(path).rng_states["samplers"][0] is not None
        second = Runner(rlpar.make_agent("impala", agent), env, ray_runtime(cluster.address,
                        envs_per_actor=4, total_env_steps=40_000), resume=path)  # fmt: skip
        assert second.run().env_steps >= 40_000
        assert [a.resumed for a in second.actors] == [True, True]  # type: ignore[attr-defined]
        with caplog.at_level("WARNING", logger="rlpar"):
            third = Runner(rlpar.make_agent("impala", agent), env, ray_runtime(cluster.address,
                           envs_per_actor=5, total_env_steps=40_000), resume=path)  # fmt: skip
            third.run()
    assert [a.resumed for a in third.actors] == [False, False]  # type: ignore[attr-defined]
    # Without checkpoints too, the driver's copy of the generators follows the replies.
    assert all(a.rng_state()["sampler"] is not None for a in third.actors)
    assert "saved 'env/game' has shape (4, 4), this actor's is (5, 4)" in caplog.text


def test_a_bad_ray_address_is_a_clear_error(cluster) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    server = socket.create_server(("127.0.0.1", 0))  # something that is not Ray
    threading.Thread(target=lambda: server.accept()[0].close(), daemon=True).start()
    try:
        for address in (f"127.0.0.1:{closed}", f"127.0.0.1:{server.getsockname()[1]}"):
            t0 = time.monotonic()
            with deadline(30), pytest.raises(ConnectionError, match=r"runtime\.ray_address"):
                Runner(impala(), EnvConfig("CartPole-v1"), ray_runtime(address))
            assert time.monotonic() - t0 < 10
    finally:
        server.close()


def test_more_actors_than_the_cluster_has_cpus_is_a_clear_error(cluster) -> None:
    with deadline(60):
        with pytest.raises(ValueError, match="num_actors"):
            Runner(impala(), EnvConfig("CartPole-v1"), ray_runtime(cluster.address, num_actors=4))
        with pytest.raises(ValueError, match="ray_actor_threads"):  # two CPUs on one node
            Runner(impala(), EnvConfig("CartPole-v1"), ray_runtime(cluster.address,
                   ray_actor_threads=2))  # fmt: skip


def test_bench_ray_prints_both_backends() -> None:
    pytest.importorskip("ray")
    code = "import json; from rlpar.bench.ray import bench_ray; print(json.dumps(bench_ray(True)))"
    out = subprocess.run(  # its own process: it starts (and stops) a local Ray instance
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        cwd="/",
        env=os.environ | OFFLINE_ENV,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    for key in ("env_steps_per_s", "policy_lag_mean"):
        assert set(result[key]) == {"threads", "ray"}
    assert min(result["env_steps_per_s"].values()) > 0


@pytest.mark.parametrize("lstm", [False, True], ids=["ff", "lstm"])
def test_the_env_mode_matrix_cell_on_ray(cluster, tmp_path, lstm) -> None:
    """tests/test_env_mode_matrix.py's cell on the Ray backend: train with an evaluation
    during the run, `rlpar eval RUN_DIR`, `rlpar train --resume RUN_DIR`."""
    from test_env_mode_matrix import train_evaluate_resume, write_config

    ray_keys = f'backend = "ray"\nray_address = "{cluster.address}"'
    config = write_config(tmp_path, "sync", lstm, steps=2000, runtime=ray_keys)
    with deadline(180):
        train_evaluate_resume(config)


# tests/test_seeds.py's config, on the env below.
SEEDS_CONFIG = SEEDS_TEST_CONFIG.replace("breaks_on_seed", "walk").replace("BreaksOnSeed", "Walk")

# The env of SEEDS_CONFIG (tests/test_seeds.py's Walk). Its registration fails in the first
# process that finds the file "crash-once" beside this module (the rename lets exactly one
# take it): one seed crashes.
SEEDS_PLUGIN = (
    "from pathlib import Path\n"
    + WALK_ENV
    + """

def register():
    if "Walk-v0" not in gym.registry:
        gym.register("Walk-v0", entry_point=Walk)
    marker = Path(__file__).with_name("crash-once")
    try:
        marker.rename(marker.with_name("crash-taken"))
    except FileNotFoundError:
        return
    raise RuntimeError("this seed breaks on purpose")
"""
)


def test_seeds_train_as_ray_tasks_on_the_cluster(cluster, tmp_path) -> None:
    """``rlpar train CONFIG --seeds 0-2 --ray ADDRESS``: one Ray task per seed on the two
    nodes; a seed that crashes is reported with its error, the others finish and aggregate."""
    folder = tmp_path / "exp"
    folder.mkdir()
    (folder / "walk.toml").write_text(SEEDS_CONFIG)
    (folder / "walk.py").write_text(SEEDS_PLUGIN)
    (folder / "crash-once").touch()
    with deadline(240):
        proc = subprocess.run(
            [sys.executable, "-m", "rlpar", "train", str(folder / "walk.toml"), "--seeds", "0-2",
             "--ray", cluster.address, "--logdir", str(tmp_path / "runs"), "--json"],
            cwd=tmp_path, capture_output=True, text=True, timeout=220, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    assert proc.returncode == 1, proc.stderr  # a seed crashed
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["seeds"] == [0, 1, 2] and len(report["crashed"]) == 1
    by_seed = {r["seed"]: r for r in report["rows"]}
    (crashed,) = report["crashed"]
    assert by_seed[crashed]["error"] == "RuntimeError: this seed breaks on purpose"
    parent = Path(report["parent"])
    for seed in sorted(set(by_seed) - {crashed}):
        row = by_seed[seed]
        assert row["status"] == "ok" and row["env_steps"] >= 2000
        assert Path(row["run_dir"]) == parent / f"seed-{seed}"
        assert f"seed = {seed}\n" in (Path(row["run_dir"]) / "config.toml").read_text()
        saved = json.loads((parent / f"seed-{seed}.json").read_text())
        assert saved["run_dir"] == row["run_dir"]
    aggregate = json.loads((parent / "aggregate.json").read_text())
    assert aggregate["eval_return"]["n"] == 2 and aggregate["crashed"] == [crashed]


def test_bad_ray_seed_options_are_one_line_errors(tmp_path) -> None:
    pytest.importorskip("ray")
    config = str(Path(__file__).resolve().parent.parent / "experiments" / "cartpole_impala.toml")
    with socket.socket() as s:  # a port nothing listens on once the socket is closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for args, code, said in [
        (["--ray"], 2, "--ray: expected --seeds with it"),
        (["--seeds", "0-1", "--ray", "nowhere"], 2, '--ray: expected "local", "auto" or host'),
        (["--seeds", "0-1", "--ray", "--cpus-per-seed", "0"], 2,
         "--cpus-per-seed: expected a number > 0, got 0.0"),
        (["--seeds", "0-1", "--ray", f"127.0.0.1:{port}"], 1, f"--ray = '127.0.0.1:{port}'"),
    ]:  # fmt: skip
        proc = subprocess.run(
            [sys.executable, "-m", "rlpar", "train", config, *args, "--logdir", str(tmp_path)],
            cwd=tmp_path, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        assert proc.returncode == code, proc.stderr
        assert said in proc.stderr and "Traceback" not in proc.stderr
    assert not list(tmp_path.glob("cartpole_impala/seeds-*"))
