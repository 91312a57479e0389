"""``rlpar eval RUN_DIR --video out.gif``: watch a trained policy play.

Plays whole episodes of a checkpoint's policy (greedy, or sampled with ``--sample``) on one
env made with ``render_mode="rgb_array"``, keeps every frame the env renders (the reset's and
each step's), and writes them as an animated GIF (Pillow) or an MP4 (imageio with the ffmpeg
binary its ``imageio-ffmpeg`` wheel ships): ``pip install "rlpar[video]"``. The file is
written under a temporary name and renamed, so a failed or interrupted encode leaves nothing
half-written. Envs stepped in the actor thread or in worker processes ("sync", "async") are
recorded as the policy saw them; "ale" and "envpool" step games that do not render, and are
refused with the key to change.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import gymnasium as gym
import numpy as np

from rlpar.app.evaluate import load_policy
from rlpar.runtime.env_setup import run_setup
from rlpar.runtime.envs import ActionAdapter
from rlpar.runtime.evaluation import policy_actions

__all__ = ["FORMATS", "VideoResult", "record_video", "write_frames"]

log = logging.getLogger("rlpar")

FORMATS = (".gif", ".mp4")


@dataclass
class VideoResult:
    """What `record_video` wrote."""

    path: str
    frames: int
    episodes: int
    returns: list[float]
    policy: str


def _check_out(out: Path) -> None:
    if out.suffix.lower() not in FORMATS:
        raise ValueError(f"--video: expected a file ending in .gif or .mp4, got {str(out)!r}")
    if not out.parent.is_dir():
        raise ValueError(f"--video: expected a file in an existing folder, got {str(out)!r}")
    if not os.access(out.parent, os.W_OK):
        raise ValueError(f"--video: the folder of {str(out)!r} is not writable")


def _render_env(env_id: str, kwargs: dict[str, Any], vectorization: str) -> gym.Env:
    if vectorization in ("ale", "envpool"):
        raise ValueError(
            f'--video: env.vectorization = "{vectorization}" steps games that do not render; '
            'record with --set env.vectorization="sync" on an env id gymnasium can render'
        )
    # Off-screen: pygame (classic control) needs no display or sound device for rgb_array.
    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
    os.environ.setdefault("SDL_AUDIODRIVER", "dummy")
    modes = gym.spec(env_id).kwargs.get("render_modes") or []
    try:
        env = gym.make(env_id, render_mode="rgb_array", **kwargs)
    except (TypeError, ValueError, gym.error.Error) as e:
        raise ValueError(
            f"--video: env {env_id!r} cannot render rgb_array frames ({e}); its render modes: "
            f"{modes or 'none listed'}"
        ) from None
    if "rgb_array" not in (env.metadata.get("render_modes") or []):
        env.close()
        raise ValueError(
            f"--video: env {env_id!r} does not render rgb_array frames (its render modes: "
            f"{env.metadata.get('render_modes') or 'none'})"
        )
    return env


def _frame(env: gym.Env) -> np.ndarray:
    try:
        frame = np.asarray(env.render())
    except gym.error.DependencyNotInstalled as e:  # classic control renders with pygame
        raise ValueError(f'--video: {e} (pip install "rlpar[video]" brings pygame)') from None
    if frame.ndim != 3 or frame.shape[2] not in (3, 4) or frame.dtype != np.uint8:
        raise ValueError(
            f"--video: the env rendered {frame.dtype} {frame.shape}, expected uint8 [H, W, 3]"
        )
    return frame[..., :3]


def write_frames(frames: list[np.ndarray], out: Path, fps: int) -> None:
    """Encode ``frames`` (uint8 [H, W, 3] each) into ``out`` (.gif or .mp4), atomically."""
    tmp = out.with_name(f".{out.stem}.tmp-{os.getpid()}{out.suffix}")
    try:
        if out.suffix.lower() == ".gif":
            try:
                from PIL import Image
            except ImportError:
                raise ValueError('--video: .gif needs Pillow: pip install "rlpar[video]"') from None
            images = [Image.fromarray(f) for f in frames]
            images[0].save(
                tmp, save_all=True, append_images=images[1:], duration=round(1000 / fps), loop=0
            )
        else:
            try:
                import imageio.v2 as imageio
            except ImportError:
                raise ValueError(
                    '--video: .mp4 needs imageio and imageio-ffmpeg: pip install "rlpar[video]"'
                ) from None
            # The ffmpeg plugin's writer (imageio types get_writer as its base class).
            with cast(Any, imageio.get_writer(tmp, fps=fps, macro_block_size=1)) as writer:
                for i, f in enumerate(frames):
                    writer.append_data(f)
                    if len(frames) >= 2000 and i % (len(frames) // 10) == 0:
                        log.info("encoding %s: %d of %d frames", out.name, i, len(frames))
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)


def record_video(
    checkpoint: str | Path,
    out: str | Path,
    episodes: int = 1,
    greedy: bool = True,
    overrides: Iterable[str] = (),
    seed: int = 0,
    trust_setup: bool = False,
    fps: int = 30,
) -> VideoResult:
    """Record ``episodes`` whole episodes of ``checkpoint``'s policy into ``out`` (see the
    module docstring). ValueError (one line, nothing written) for an output path that will not
    do or an env that cannot render; `CheckpointError` as for `rlpar.app.evaluate.evaluate`."""
    out = Path(out)
    _check_out(out)
    if episodes < 1:
        raise ValueError(f"--episodes: expected an integer >= 1, got {episodes}")
    p = load_policy(checkpoint, overrides, trust_setup)
    env_cfg = p.experiment.env
    if env_cfg.id not in gym.registry:
        run_setup(env_cfg.setup)
    env = _render_env(env_cfg.id, dict(env_cfg.kwargs), env_cfg.vectorization)
    try:
        frames, returns, policy = _play(env, p, episodes, greedy, seed)
    finally:
        env.close()
    write_frames(frames, out, fps)
    return VideoResult(str(out), len(frames), episodes, returns, policy)


def _play(
    env: gym.Env, p: Any, episodes: int, greedy: bool, seed: int
) -> tuple[list[np.ndarray], list[float], str]:
    """Frames [F] of ``episodes`` episodes on ``env``, their returns, and the policy played."""
    net, agent = p.net, p.agent
    adapter = ActionAdapter(env.action_space)
    dtype = np.uint8 if net.spec.input_dtype == "uint8" else np.float32
    rng = np.random.default_rng(np.random.SeedSequence([seed, 1 << 22]))
    policy = "greedy" if greedy else "sampled"
    frames: list[np.ndarray] = []
    returns: list[float] = []
    for episode in range(episodes):
        obs, _ = env.reset(seed=seed + episode)
        frames.append(_frame(env))
        # A recurrent net starts each episode from a fresh state and carries it step to step.
        core = {"state": net.initial_state(1), "resets": np.zeros(1, bool)} if net.recurrent else {}
        total, done = 0.0, False
        while not done:
            out = net.forward(p.params, np.asarray(obs, dtype)[None], **core)
            action, policy = policy_actions(agent, net, out, policy, rng)
            obs, reward, terminated, truncated, _ = env.step(adapter.to_env(action)[0])
            frames.append(_frame(env))
            total += float(reward)
            done = bool(terminated or truncated)
        returns.append(total)
    return frames, returns, policy
