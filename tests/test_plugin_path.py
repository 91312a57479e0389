"""The plug-in path a newcomer walks: their own agent module and env module beside their own
experiment file, ``rlpar train`` / ``rlpar eval`` / ``rlpar agents`` run from another folder
with the ``rlpar`` command, tiny runs. Nothing is installed or put on PYTHONPATH."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from rlpar.app.experiment import load_experiment
from rlpar.config import ConfigError
from rlpar.runtime.observations import check_observation

ROOT = Path(__file__).resolve().parent.parent
IMPALA = ROOT / "experiments" / "cartpole_impala.toml"

AGENT_MODULE = '''"""A user's agent, beside their experiment file."""
from dataclasses import dataclass

import numpy as np

import rlpar


@dataclass(frozen=True)
class VpgConfig:
    lr: float = 0.01
    """Step size of plain SGD."""


class Vpg(rlpar.Agent):
    """Vanilla policy gradient that only reports (the plumbing's agent)."""

    def __init__(self, config: VpgConfig) -> None:
        self.config = config

    def net_spec(self, obs_space, action_space):
        heads = [rlpar.Categorical(int(action_space.n)), rlpar.Value()]
        return rlpar.mlp_spec(int(np.prod(obs_space.shape)), heads, hidden=(8,))

    def init_state(self, net, params):
        optimizer = rlpar.SGD(net.num_params, lr=self.config.lr)
        return rlpar.LearnerState(params=params, optimizer=optimizer)

    def act(self, net, out, rng):
        logits = out[:, :-1]
        return np.argmax(logits - np.log(-np.log(rng.random(logits.shape))), axis=1)

    def greedy(self, net, out):
        return np.argmax(out[:, :-1], axis=1)

    def learn(self, net, state, batch):
        return {"policy_loss": 0.5, "loss/policy": 0.25}


rlpar.register_agent("vpg", Vpg, VpgConfig)
'''

ENV_MODULE = '''"""A user's env, beside their experiment file; its observations are float64
(np.eye's default) while its space says float32."""
import gymnasium as gym
import numpy as np


class Corridor(gym.Env):
    def __init__(self, n=4):
        self.n, self.cell, self.steps = n, 0, 0
        self.observation_space = gym.spaces.Box(0.0, 1.0, (n,), np.float32)
        self.action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.cell = self.steps = 0
        return np.eye(self.n)[self.cell], {}

    def step(self, action):
        self.cell = min(max(self.cell + (1 if action == 1 else -1), 0), self.n - 1)
        self.steps += 1
        done = self.cell == self.n - 1
        return np.eye(self.n)[self.cell], 1.0 if done else -0.01, done, self.steps >= 16, {}


def register():
    if "Corridor-v0" not in gym.registry:
        gym.register("Corridor-v0", entry_point="corridor:Corridor")
'''


def experiment(logdir: Path, agent: str = "vpg", setup: str = "corridor:register", **env) -> str:
    env_lines = "".join(f"{k} = {json.dumps(v)}\n" for k, v in env.items())
    return f"""plugins = ["vpg"]

[env]
id = "Corridor-v0"
setup = "{setup}"
{env_lines}
[agent]
name = "{agent}"

[runtime]
num_actors = 1
envs_per_actor = 4
unroll_length = 8
batch_rollouts = 1
total_env_steps = 512
checkpoint_interval_s = "none"

[eval]
episodes = 4

[log]
logdir = "{logdir}"
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A user's folder: their agent, their env and their experiment file."""
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "vpg.py").write_text(AGENT_MODULE)
    (folder / "corridor.py").write_text(ENV_MODULE)
    (folder / "corridor_vpg.toml").write_text(experiment(tmp_path / "runs"))
    (tmp_path / "elsewhere").mkdir()
    return folder


def rlpar_command(
    cwd: Path, *args: str, timeout: float = 240, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """The ``rlpar`` command as a user types it (the console script beside this Python), in
    ``cwd``, without PYTHONPATH (plus ``env``); ``python -m rlpar`` where there is no script."""
    script = Path(sys.executable).with_name("rlpar")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "rlpar"]
    env = {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, **(env or {})}
    return subprocess.run(
        [*command, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        env=env,
    )


def summary_of(proc: subprocess.CompletedProcess) -> dict:
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_train_finds_the_agent_and_env_modules_beside_the_config(project: Path) -> None:
    proc = rlpar_command(
        project.parent / "elsewhere", "train", str(project / "corridor_vpg.toml"), "--json"
    )
    summary = summary_of(proc)
    assert summary["env_steps"] >= 512 and summary["learner_steps"] > 0
    # float64 observations for a float32 space: one warning from rlpar, no terminal colours
    assert proc.stderr.count("returned float64 observations for its float32") == 1, proc.stderr
    assert "rlpar casts them to float32" in proc.stderr
    assert "\x1b[" not in proc.stderr
    # the run directory's config finds the same modules, wherever it is read from
    run_dir = Path(summary["run_dir"])
    if not run_dir.is_absolute():
        run_dir = project.parent / "elsewhere" / run_dir
    resolved = load_experiment(run_dir / "config.toml")
    assert resolved.plugins == ("vpg",)
    assert resolved.plugin_path == (str(project.resolve()),)
    # what learn() returned, under the tags agent.py documents
    tags = _scalar_tags(run_dir)
    assert {"loss/policy", "learner/loss/policy"} <= tags, sorted(tags)


def _scalar_tags(run_dir: Path) -> set[str]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir))
    events.Reload()
    return set(events.Tags()["scalars"])


def test_eval_and_agents_of_a_plug_in_run(project: Path) -> None:
    elsewhere = project.parent / "elsewhere"
    summary = summary_of(
        rlpar_command(elsewhere, "train", str(project / "corridor_vpg.toml"), "--json")
    )
    run_dir = str(Path(summary["run_dir"]))
    result = summary_of(rlpar_command(elsewhere, "eval", run_dir, "--episodes", "2", "--json"))
    assert result["agent"] == "vpg" and result["episodes"] == 2
    listing = rlpar_command(elsewhere, "agents", str(project / "corridor_vpg.toml"))
    assert listing.returncode == 0, listing.stderr
    assert "vpg  (register_agent: vpg.Vpg)" in listing.stdout
    assert "Vanilla policy gradient that only reports" in listing.stdout
    assert "Step size of plain SGD." in listing.stdout


def test_eval_of_a_plug_in_checkpoint_file(project: Path) -> None:
    """A checkpoint file is data: its run's plugins are imported on the user's word, ``--set
    plugins=[...]``, looked for in the working directory (the plug-in's folder) or in
    ``--set plugin_path``; a run directory's config.toml is that word already."""
    elsewhere = project.parent / "elsewhere"
    summary = summary_of(
        rlpar_command(elsewhere, "train", str(project / "corridor_vpg.toml"), "--json")
    )
    ckpt = str(elsewhere / summary["checkpoint"])  # relative to where it ran, or absolute
    hook = ("--set", "env.setup=corridor:register")  # the env's hook: also the user's word
    refused = rlpar_command(project, "eval", ckpt, *hook)
    assert refused.returncode == 1, refused.stderr
    assert "agent.name: unknown agent 'vpg'" in refused.stderr
    assert """with --set 'plugins=["vpg"]'""" in refused.stderr, refused.stderr
    assert "Traceback" not in refused.stderr
    plugins = ("--set", 'plugins=["vpg"]')
    result = summary_of(
        rlpar_command(project, "eval", ckpt, *hook, *plugins, "--episodes", "2", "--json")
    )
    assert result["agent"] == "vpg" and result["episodes"] == 2
    folder = ("--set", f"plugin_path={json.dumps([str(project)])}")
    result = summary_of(rlpar_command(elsewhere, "eval", ckpt, *hook, *plugins, *folder,
                                      "--episodes", "2", "--json"))  # fmt: skip
    assert result["agent"] == "vpg"
    missing = rlpar_command(elsewhere, "eval", ckpt, *hook, *plugins)
    assert missing.returncode == 1, missing.stderr
    assert "--set plugins: no module named 'vpg'" in missing.stderr, missing.stderr


def test_async_worker_processes_find_the_env_module_too(project: Path) -> None:
    (project / "async.toml").write_text(
        experiment(project.parent / "runs", vectorization="async", workers_per_actor=2)
    )
    proc = rlpar_command(project.parent / "elsewhere", "train", str(project / "async.toml"))
    assert proc.returncode == 0, proc.stderr


def test_an_unknown_agent_says_how_to_register_one(project: Path) -> None:
    (project / "typo.toml").write_text(experiment(project.parent / "runs", agent="vpgg"))
    proc = rlpar_command(project.parent / "elsewhere", "train", str(project / "typo.toml"))
    assert proc.returncode == 2, proc.stderr
    for said in (
        "agent.name: unknown agent 'vpgg' (did you mean 'vpg'?)",
        "registered agents: a3c, appo, impala, vpg",
        "register one with rlpar.register_agent('vpgg', YourAgent, YourConfig) in a module the "
        'experiment file names, plugins = ["my_agent"] for my_agent.py beside the file; this '
        "file's plugins: vpg, or with an entry point in the group 'rlpar.agents'",
    ):
        assert said in proc.stderr, (said, proc.stderr)
    assert "Traceback" not in proc.stderr


def test_a_plugin_that_is_not_there_says_where_it_looked(project: Path) -> None:
    (project / "vpg.py").unlink()
    proc = rlpar_command(project.parent / "elsewhere", "train", str(project / "corridor_vpg.toml"))
    assert proc.returncode == 2, proc.stderr
    assert "plugins: no module named 'vpg'" in proc.stderr
    assert str(project.resolve()) in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    ("setup", "said"),
    [
        ("corridorr:register", "env.setup 'corridorr:register': no module named 'corridorr'"),
        ("corridor:registr", "module 'corridor' ({project}/corridor.py) has no function 'registr'"),
    ],
)
def test_an_env_setup_that_fails_says_where_it_looked(project: Path, setup: str, said: str) -> None:
    (project / "bad.toml").write_text(experiment(project.parent / "runs", setup=setup))
    proc = rlpar_command(project.parent / "elsewhere", "train", str(project / "bad.toml"))
    assert proc.returncode == 2, proc.stderr
    assert said.format(project=project.resolve()) in proc.stderr, proc.stderr
    if "no module" in said:
        assert f"({project.resolve()})" in proc.stderr  # the folder it looked in
    assert "Traceback" not in proc.stderr


# ------------------------------------------------------------------------------- --set typos


def test_a_set_typo_blames_the_override_not_the_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as e:
        load_experiment(IMPALA, ["runtime.seed=1", "agent.entropy_cot=0.1"])
    assert str(e.value).startswith("--set agent.entropy_cot=0.1: unknown key 'agent.entropy_cot'")
    assert "cartpole_impala.toml" not in str(e.value)
    with pytest.raises(ConfigError, match=r"^--set seed=3: unknown key 'seed'.*runtime\.seed"):
        load_experiment(IMPALA, ["seed=3"])
    with pytest.raises(ConfigError, match=r"^--set runtime.num_actors=0: runtime.num_actors"):
        load_experiment(IMPALA, ["runtime.num_actors=0"])
    bad = tmp_path / "bad.toml"
    bad.write_text(IMPALA.read_text().replace("[runtime]", "[runtime]\nnum_actrs = 2"))
    with pytest.raises(ConfigError, match=r"bad\.toml: unknown key 'runtime\.num_actrs'"):
        load_experiment(bad, ["runtime.seed=1"])  # the file's own typo, with an override
    proc = rlpar_command(tmp_path, "train", str(IMPALA), "--set", "agent.lrr=0.1")
    assert proc.returncode == 2
    assert "rlpar train: error: --set agent.lrr=0.1: unknown key 'agent.lrr'" in proc.stderr


# ---------------------------------------------------------------------- observation contract


BOX = gym.spaces.Box(0.0, 1.0, (3,), np.float32)
FRAMES = gym.spaces.Box(0, 255, (2, 2, 1), np.uint8)


@pytest.mark.parametrize(
    ("space", "obs", "cast_to"),
    [
        (BOX, np.zeros(3, np.float64), "float32"),
        (BOX, np.zeros(3, np.int64), "float32"),
        (BOX, np.zeros(3, bool), "float32"),
        (FRAMES, np.zeros((2, 2, 1), np.int32), "uint8"),
        (FRAMES, np.zeros((2, 2, 1), bool), "uint8"),
    ],
)
def test_observations_of_another_real_dtype_are_cast_with_a_warning(space, obs, cast_to) -> None:
    said = check_observation("My-v0", space, obs, "step()")
    assert said is not None
    assert f"env 'My-v0': step() returned {obs.dtype} observations for its {space.dtype}" in said
    assert f"rlpar casts them to {cast_to}" in said
    assert check_observation("My-v0", space, obs.astype(space.dtype), "step()") is None


@pytest.mark.parametrize(
    ("space", "obs", "said"),
    [
        (FRAMES, np.zeros((2, 2, 1), np.float32), "returned float32 observations for its uint8"),
        (BOX, np.zeros(3, np.complex64), "expected a real number dtype"),
        (BOX, np.array(["a", "b", "c"]), "returned <U1 observations for its float32"),
    ],
)
def test_observations_rlpar_cannot_use_are_errors_naming_both(space, obs, said) -> None:
    with pytest.raises(ValueError) as e:
        check_observation("My-v0", space, obs, "reset()")
    assert said in str(e.value) and "env 'My-v0': reset()" in str(e.value)
    assert f"np.asarray(obs, np.{space.dtype})" in str(e.value)


def test_the_runtime_checks_a_new_env_once(caplog, monkeypatch, tmp_path: Path) -> None:
    import rlpar
    from rlpar.runtime import observations
    from rlpar.runtime.envs import make_actor_envs

    monkeypatch.setattr(observations, "_CHECKED", {})
    module = tmp_path / "float_corridor_env.py"
    module.write_text(ENV_MODULE.replace('"corridor:Corridor"', '"float_corridor_env:Corridor"'))
    sys.path.insert(0, str(tmp_path))
    try:
        import float_corridor_env

        if "Corridor-v0" in gym.registry:  # another test's registration
            del gym.registry["Corridor-v0"]
        float_corridor_env.register()
        with caplog.at_level(logging.WARNING, logger="rlpar"):
            for _ in range(2):
                make_actor_envs(rlpar.EnvConfig("Corridor-v0"), 2).close()
    finally:
        sys.path.remove(str(tmp_path))
        gym.registry.pop("Corridor-v0", None)
        sys.modules.pop("float_corridor_env", None)
    warned = [r for r in caplog.records if "float64 observations" in r.getMessage()]
    assert len(warned) == 1


def test_ray_workers_find_the_agent_and_env_modules_too(project: Path) -> None:
    pytest.importorskip("ray")
    ray_run = experiment(project.parent / "runs").replace(
        "[runtime]\n", '[runtime]\nbackend = "ray"\n'
    )
    (project / "ray.toml").write_text(ray_run)
    loopback = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}
    proc = rlpar_command(project.parent / "elsewhere", "train", str(project / "ray.toml"),
                         "--json", env=loopback)  # fmt: skip
    summary = summary_of(proc)
    assert summary["env_steps"] >= 512
