"""``rlpar eval RUN_DIR --video``: the frames in the file are the env's own renders, episode
after episode, and bad input is a one-line error that leaves nothing behind."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

PLUGIN = '''import gymnasium as gym
import gymnasium as gym
import numpy as np


CLOSED = []  # the render_mode of each env closed


class Slide(gym.Env):
    """A dot slides right one cell a step; the episode ends after 5 steps. Its frame shows the
    dot's cell, so a frame says which step it is."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 4}
    observation_space = gym.spaces.Box(0.0, 1.0, (6,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, render_mode=None):
        self.render_mode = render_mode

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.eye(6, dtype=np.float32)[0], {}

    def step(self, action):
        self.t += 1
        return np.eye(6, dtype=np.float32)[self.t], float(action), self.t >= 5, False, {}

    def render(self):
        frame = np.zeros((8, 48, 3), np.uint8)
        frame[:, 8 * self.t : 8 * self.t + 8] = (255, 64, 0)
        return frame

    def close(self):
        CLOSED.append(self.render_mode)


class Blind(Slide):
    metadata = {"render_modes": []}


class Stuck(Slide):
    """Steps forever once rendered for a clip (training envs do not render)."""

    def step(self, action):
        if self.render_mode == "rgb_array":
            import time
            while True:
                time.sleep(0.05)
        return super().step(action)


class Flaky(Slide):
    """Renders one episode's frames, then fails."""

    renders = 0

    def render(self):
        Flaky.renders += 1
        if Flaky.renders > 6:
            raise RuntimeError("the flaky renderer broke")
        return super().render()


def register():
    gym.register("Slide-v0", entry_point=Slide)
    gym.register("Blind-v0", entry_point=Blind)
    gym.register("Flaky-v0", entry_point=Flaky)
    gym.register("Stuck-v0", entry_point=Stuck)
'''

CONFIG = """name = "slide"
plugins = ["slide"]

[env]
id = "{env_id}"
setup = "slide:register"

[agent]
name = "impala"

[runtime]
num_actors = 1
envs_per_actor = 2
unroll_length = 5
batch_rollouts = 1
total_env_steps = 200

[eval]
episodes = 1
"""


def cli(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rlpar", *args],
        cwd=cwd, capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL,
    )  # fmt: skip


def train(tmp_path: Path, env_id: str, *sets: str) -> tuple[subprocess.CompletedProcess, Path]:
    """``rlpar train`` on ``env_id`` (the Slide plug-in beside the config); (the process, the
    logdir it trains into)."""
    folder = tmp_path / "exp"
    folder.mkdir(exist_ok=True)
    (folder / "slide.py").write_text(PLUGIN)
    config = folder / f"{env_id.replace('/', '_')}.toml"
    config.write_text(CONFIG.format(env_id=env_id))
    logdir = tmp_path / "runs" / env_id.replace("/", "_")
    args = [a for s in sets for a in ("--set", s)]
    return cli(tmp_path, "train", str(config), "--quiet", "--logdir", str(logdir), *args), logdir


def trained(tmp_path: Path, env_id: str, *sets: str) -> Path:
    proc, logdir = train(tmp_path, env_id, *sets)
    assert proc.returncode == 0, proc.stderr
    (run_dir,) = (logdir / "slide").iterdir()
    return run_dir


def expected_frames(episodes: int) -> list[np.ndarray]:
    frames = []
    for _ in range(episodes):
        for t in range(6):
            f = np.zeros((8, 48, 3), np.uint8)
            f[:, 8 * t : 8 * t + 8] = (255, 64, 0)
            frames.append(f)
    return frames


def recorded_gif(tmp_path: Path, env_id: str, episodes: int, frames: int) -> list[np.ndarray]:
    """Train on ``env_id``, record ``episodes`` greedy episodes as a GIF; its decoded frames."""
    from PIL import Image, ImageSequence

    run_dir = trained(tmp_path, env_id)
    out = tmp_path / "video.gif"
    proc = cli(tmp_path, "eval", str(run_dir), "--video", str(out), "--episodes", str(episodes))
    assert proc.returncode == 0, proc.stderr
    assert f"{out}: {frames} frames, {episodes} greedy episodes" in proc.stdout
    with Image.open(out) as gif:
        return [np.asarray(f.convert("RGB")) for f in ImageSequence.Iterator(gif)]


def test_a_gif_holds_the_envs_renders_of_every_episode(tmp_path: Path) -> None:
    frames = recorded_gif(tmp_path, "Slide-v0", 2, 12)
    want = expected_frames(2)
    assert len(frames) == len(want)
    for got, expected in zip(frames, want, strict=True):
        np.testing.assert_array_equal(got, expected)
    assert not list(tmp_path.glob(".video.*.tmp*"))


def test_an_mp4_is_written_and_decodes_to_the_frames(tmp_path: Path) -> None:
    pytest.importorskip("imageio_ffmpeg")
    import imageio.v2 as imageio

    run_dir = trained(tmp_path, "Slide-v0")
    out = tmp_path / "slide.mp4"
    proc = cli(tmp_path, "eval", str(run_dir), "--video", str(out), "--sample", "--fps", "4")
    assert proc.returncode == 0, proc.stderr
    frames = [f for f in imageio.get_reader(out, format="FFMPEG")]  # not list(): its len is inf
    want = expected_frames(1)
    assert len(frames) == len(want)
    for got, expected in zip(frames, want, strict=True):  # lossy: compare the dot's place
        assert got.shape == expected.shape
        assert np.argmax(got[..., 0].mean(axis=0)) // 8 == np.argmax(expected[..., 0].mean(0)) // 8


def test_bad_video_requests_are_one_line_errors_and_write_nothing(tmp_path: Path) -> None:
    run_dir = trained(tmp_path, "Slide-v0")
    blind = trained(tmp_path, "Blind-v0")
    for run, out, said in [
        (run_dir, tmp_path / "x.avi", "expected a file ending in .gif or .mp4"),
        (run_dir, tmp_path / "missing" / "x.gif", "expected a file in an existing folder"),
        (blind, tmp_path / "x.gif", "does not render rgb_array frames"),
    ]:
        proc = cli(tmp_path, "eval", str(run), "--video", str(out))
        assert proc.returncode == 1, proc.stderr
        assert said in proc.stderr and "Traceback" not in proc.stderr
    assert not list(tmp_path.glob("*.gif")) and not list(tmp_path.glob(".*tmp*"))


def test_a_bad_frame_rate_is_refused_before_anything_plays(tmp_path: Path) -> None:
    run_dir = trained(tmp_path, "Slide-v0")
    proc = cli(tmp_path, "eval", str(run_dir), "--video", str(tmp_path / "x.gif"), "--fps", "0")
    assert proc.returncode == 2 and "--fps: expected an integer >= 1, got 0" in proc.stderr
    assert not list(tmp_path.glob("*.gif"))


def test_a_native_env_is_recorded_with_its_own_render(tmp_path: Path) -> None:
    """rlpar's native envs render rgb_array frames: a Catch policy's GIF starts each episode
    with the frame the env renders after ``reset(seed=episode)`` and shows the ball falling one
    row per frame."""
    import gymnasium as gym
    import rlpar.envs

    frames = recorded_gif(tmp_path, "rlpar/Catch-v0", 2, 20)
    assert len(frames) == 20
    cell = rlpar.envs.native._Renderer.CATCH_CELL
    ball = rlpar.envs.native._Renderer.CATCH_COLORS["ball"]
    for episode in range(2):
        env = gym.make("rlpar/Catch-v0", render_mode="rgb_array")
        env.reset(seed=episode)
        np.testing.assert_array_equal(frames[10 * episode], env.render())
        env.close()
        for t in range(9):  # the bottom row's ball may sit on the paddle
            board = frames[10 * episode + t][::cell, ::cell]
            rows = np.flatnonzero((board == ball).all(axis=-1).any(axis=1))
            assert list(rows) == [t]


def test_a_dict_env_with_a_conv_per_leaf_is_recorded(tmp_path: Path) -> None:
    """JointReach (a Dict observation, MultiDiscrete actions) trained with a conv on its image
    leaf: `rlpar eval --video` rebuilds that net from the run and records the env's renders,
    each episode starting with the frame of ``reset(seed=episode)``."""
    import rlpar.envs  # registers rlpar/JointReach-v0 in this process too
    from PIL import Image, ImageSequence

    run_dir = trained(tmp_path, "rlpar/JointReach-v0", "agent.net.encoders=per_leaf")
    out = tmp_path / "reach.gif"
    proc = cli(tmp_path, "eval", str(run_dir), "--video", str(out), "--episodes", "2")
    assert proc.returncode == 0, proc.stderr
    with Image.open(out) as gif:
        frames = [np.asarray(f.convert("RGB")) for f in ImageSequence.Iterator(gif)]
    assert 4 <= len(frames) <= 2 * 21  # a reset frame and 1 to 20 steps an episode
    env = gym.make("rlpar/JointReach-v0", render_mode="rgb_array")
    env.reset(seed=0)
    np.testing.assert_array_equal(frames[0], env.render())
    env.close()
    assert rlpar.envs.JointReachEnv.metadata["render_modes"] == ["rgb_array"]


def gif_frames(data: bytes) -> list[np.ndarray]:
    import io

    from PIL import Image, ImageSequence

    with Image.open(io.BytesIO(data)) as gif:
        return [np.asarray(f.convert("RGB")) for f in ImageSequence.Iterator(gif)]


def test_clips_during_training_land_in_the_run_dir_and_tensorboard(tmp_path: Path) -> None:
    """``eval.video_interval_env_steps``: a clip of the policy at the start, one per interval
    the clip thread reaches, one of the final parameters; each GIF holds the env's renders of
    a whole episode, and TensorBoard has the same GIF at the same env steps."""
    pytest.importorskip("PIL")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir = trained(tmp_path, "Slide-v0", "eval.video_interval_env_steps=50")
    summary = json.loads((run_dir / "summary.json").read_text())
    gifs = sorted((run_dir / "videos").glob("*.gif"), key=lambda p: int(p.stem))
    steps = [int(p.stem) for p in gifs]
    assert steps[0] == 0 and steps[-1] == summary["env_steps"] and len(set(steps)) == len(steps)
    assert not list((run_dir / "videos").glob(".*"))
    for path in gifs:
        frames = gif_frames(path.read_bytes())
        assert len(frames) == 6
        for got, want in zip(frames, expected_frames(1), strict=True):
            np.testing.assert_array_equal(got, want)
    acc = EventAccumulator(str(run_dir), size_guidance={"images": 0})
    acc.Reload()
    images = acc.Images("video/greedy")
    assert [e.step for e in images] == steps
    for event, path in zip(images, gifs, strict=True):
        assert event.encoded_image_string == path.read_bytes()
        assert (event.height, event.width) == (8, 48)


def test_clips_shrink_large_renders_and_stop_at_max_frames() -> None:
    from rlpar.app.frames import shrink

    frame = np.zeros((400, 600, 3), np.uint8)
    assert shrink(frame, 256).shape == (171, 256, 3)
    assert shrink(frame, 600) is frame


def test_clips_need_an_env_that_renders_and_leave_no_run_dir(tmp_path: Path) -> None:
    proc, logdir = train(tmp_path, "Blind-v0", "eval.video_interval_env_steps=50")
    assert proc.returncode == 2, proc.stderr
    assert "eval.video_interval_env_steps: env 'Blind-v0' does not render rgb_array" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (logdir / "slide").exists() or not list((logdir / "slide").iterdir())


def test_a_clip_that_fails_mid_run_stops_the_run_and_says_why(tmp_path: Path) -> None:
    pytest.importorskip("PIL")
    # No step budget the run could reach before the second clip fails (how far it gets in the
    # meantime is the machine's luck); the wall-time bound only keeps a broken stop from
    # hanging the test, and would show as stopped_by "max_wall_s".
    proc, logdir = train(
        tmp_path, "Flaky-v0", "eval.video_interval_env_steps=20",
        "runtime.total_env_steps=1000000000", "runtime.max_wall_s=120",
    )  # fmt: skip
    assert proc.returncode == 1
    assert "rlpar thread 'clips' failed: the flaky renderer broke" in proc.stderr
    (run_dir,) = (logdir / "slide").iterdir()
    assert [p.name for p in (run_dir / "videos").glob("*.gif")] == ["0.gif"]
    assert list((run_dir / "checkpoints").glob("ckpt-*.rlpar"))  # the stop saved the run
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["stopped_by"] == "stop" and "the flaky renderer broke" in summary["error"]


def test_a_last_clip_that_fails_after_the_run_keeps_the_summary(tmp_path: Path) -> None:
    """The clip of the final parameters is recorded after the run ended: when it fails, the
    run's summary and final checkpoint are there all the same, and the error is raised."""
    pytest.importorskip("PIL")
    proc, logdir = train(tmp_path, "Flaky-v0", "eval.video_interval_env_steps=1000000")
    assert proc.returncode == 1
    assert "rlpar clips: the last clip failed: the flaky renderer broke" in proc.stderr
    (run_dir,) = (logdir / "slide").iterdir()
    assert [p.name for p in (run_dir / "videos").glob("*.gif")] == ["0.gif"]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["stopped_by"] == "total_env_steps"
    assert "the last clip failed" in summary["error"]
    assert Path(summary["checkpoint"]).is_file()


def test_a_training_built_and_never_run_closes_its_envs(tmp_path: Path, monkeypatch) -> None:
    """`Training.close` (or leaving its ``with`` block) closes the actors' envs and the clips'
    rendering env of a run that never ran."""
    pytest.importorskip("PIL")
    import importlib

    from rlpar.app.experiment import load_experiment
    from rlpar.app.train import Training

    folder = tmp_path / "exp"
    folder.mkdir()
    (folder / "slide_closing.py").write_text(PLUGIN)
    config = folder / "slide.toml"
    config.write_text(CONFIG.format(env_id="Slide-v0").replace('"slide"]', '"slide_closing"]')
                      .replace("slide:register", "slide_closing:register"))  # fmt: skip
    monkeypatch.syspath_prepend(str(folder))
    exp = load_experiment(config, ["eval.video_interval_env_steps=50"])
    closed = importlib.import_module("slide_closing").CLOSED
    with Training(exp, run_dir=tmp_path / "run") as training:
        assert training.clips is not None
        before = len(closed)  # (building may probe an env and close it)
    # the 2 actor envs and the clips' one
    assert sorted(closed[before:], key=str) == [None, None, "rgb_array"]
    training.close()  # idempotent
    assert len(closed) == before + 3


def test_a_long_gif_encode_logs_its_progress(caplog: pytest.LogCaptureFixture) -> None:
    pytest.importorskip("PIL")
    from rlpar.app.frames import LONG_ENCODE_FRAMES, encode_gif

    frames = expected_frames(1) * (LONG_ENCODE_FRAMES // 6 + 1)
    with caplog.at_level("INFO", logger="rlpar"):
        data = encode_gif(frames, 30, "long.gif")
    said = [r.getMessage() for r in caplog.records]
    n = len(frames)
    assert said[0] == f"encoding long.gif: 0 of {n} frames"
    assert said[-1] == f"encoding long.gif: {n} frames done"
    assert 10 <= len(said) <= 12
    decoded = gif_frames(data)
    assert len(decoded) == n
    np.testing.assert_array_equal(decoded[7], frames[7])


@pytest.mark.parametrize(
    ("key", "value", "said"),
    [
        ("video_interval_env_steps", 0, "None or an integer >= 1"),
        ("video_max_frames", 1, "an integer >= 2"),
        ("video_size", 8, "an integer >= 16"),
    ],
)
def test_bad_clip_settings_are_config_errors_naming_the_key(
    key: str, value: int, said: str
) -> None:
    from rlpar.config import ConfigError, EvalConfig

    with pytest.raises(ConfigError, match=f"{key}.*{said}"):
        EvalConfig(**{key: value})


def test_a_clip_thread_stuck_in_the_env_does_not_hang_the_run(tmp_path: Path) -> None:
    """An env whose step never returns in the clip thread: the run still ends (the thread is
    left behind after runtime.join_timeout_s, with a warning) and its summary is written."""
    pytest.importorskip("PIL")
    proc, logdir = train(
        tmp_path, "Stuck-v0", "eval.video_interval_env_steps=1000000",
        "runtime.join_timeout_s=1",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "the clip thread did not stop within 1 s" in proc.stderr
    (run_dir,) = (logdir / "slide").iterdir()
    assert (run_dir / "summary.json").is_file()
