"""rlpar installed as ``pip install .`` lays it out (not editable), run from a source checkout:
every process rlpar starts (a seed's ``rlpar train``, its "async" env workers, Ray workers)
imports the installed rlpar, never the checkout's ``rlpar/`` folder beside it.

The install is made without a build: a virtual environment whose site-packages holds a copy
of what the wheel holds (``rlpar/``, ``agents/`` and ``envs/`` as ``rlpar.agents`` and
``rlpar.envs``, and the compiled core of the rlpar under test) and reaches this environment's
packages through a ``.pth`` line, which, unlike an editable install's import hook, does not
outrank the working directory. The checkout is a folder whose ``rlpar/__init__.py`` raises.
"""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
from pathlib import Path

import pytest
from test_seeds import CONFIG, PLUGIN

import rlpar
from rlpar import _native

ROOT = Path(__file__).resolve().parent.parent
SOURCE_TREE = "the checkout's rlpar folder was imported"
TINY = [
    "--set", "runtime.num_actors=1", "--set", "runtime.envs_per_actor=4",
    "--set", "runtime.total_env_steps=2000", "--set", "runtime.target_return=none",
    "--set", "eval.episodes=2", "--set", "eval.check_return=none",
]  # fmt: skip
LOOPBACK = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The ``rlpar`` console script of a non-editable install of the rlpar under test."""
    venv = tmp_path_factory.mktemp("installed")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    (purelib,) = venv.glob("lib/python*/site-packages")
    skip = shutil.ignore_patterns("__pycache__", "*.so")
    shutil.copytree(ROOT / "rlpar", purelib / "rlpar", ignore=skip)
    shutil.copytree(ROOT / "agents", purelib / "rlpar" / "agents", ignore=skip)
    shutil.copytree(ROOT / "envs", purelib / "rlpar" / "envs", ignore=skip)
    shutil.copy2(_native.__file__, purelib / "rlpar")
    folders = [
        *site.getsitepackages(),
        *([site.getusersitepackages()] if site.ENABLE_USER_SITE else []),
    ]
    (purelib / "dependencies.pth").write_text("\n".join(folders) + "\n")
    script = venv / "bin" / "rlpar"
    main = "import sys\nfrom rlpar.app.cli import main\nsys.exit(main())\n"
    script.write_text(f"#!{venv / 'bin' / 'python'}\n{main}")  # as pip writes it
    script.chmod(0o755)
    return script


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """A source checkout: an ``rlpar/`` folder that cannot be imported, and an experiment."""
    folder = tmp_path / "checkout"
    (folder / "rlpar").mkdir(parents=True)
    (folder / "rlpar" / "__init__.py").write_text(f"raise ImportError({SOURCE_TREE!r})\n")
    (folder / "exp").mkdir()
    (folder / "exp" / "seeds.toml").write_text(CONFIG)
    (folder / "exp" / "breaks_on_seed.py").write_text(PLUGIN)
    return folder


def run(script: Path, cwd: Path, *args: str, env: dict[str, str] | None = None) -> dict:
    """``rlpar ARGS --json`` in ``cwd``, without PYTHONPATH; its JSON line."""
    environ = {
        k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "RLPAR_TEST_SEED_MARK")
    }
    proc = subprocess.run(
        [str(script), *args, "--json"],
        cwd=cwd, env={**environ, **(env or {})}, capture_output=True, text=True, timeout=300,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert SOURCE_TREE not in proc.stdout + proc.stderr
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_install_is_the_rlpar_under_test(installed: Path, tmp_path: Path) -> None:
    proc = subprocess.run(
        [installed.with_name("python"), "-c", "import rlpar; print(rlpar.__file__)"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert Path(proc.stdout.strip()).is_relative_to(installed.parent.parent)
    assert Path(rlpar.__file__).read_text() == Path(proc.stdout.strip()).read_text()


def test_seeds_and_their_env_workers_import_the_installed_rlpar(
    installed: Path, checkout: Path
) -> None:
    report = run(
        installed, checkout, "train", "exp/seeds.toml", "--seeds", "0-1", "--parallel", "2",
        "--set", "env.vectorization=async", "--logdir", str(checkout.parent / "runs"),
    )  # fmt: skip
    assert report["crashed"] == [] and report["finished"] == 2, report["rows"]


def test_seeds_as_ray_tasks_import_the_installed_rlpar(installed: Path, checkout: Path) -> None:
    """A built-in env and agent: no plug-in folder for Ray's workers to add to their path,
    which would import rlpar before Ray puts the driver's working directory first."""
    pytest.importorskip("ray")
    shutil.copytree(ROOT / "experiments", checkout / "experiments")
    report = run(
        installed, checkout, "train", "experiments/cartpole_impala.toml", "--seeds", "0",
        "--ray", "--logdir", str(checkout.parent / "runs"), *TINY, env=LOOPBACK,
    )  # fmt: skip
    assert report["crashed"] == [] and report["finished"] == 1, report["rows"]
