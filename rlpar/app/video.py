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

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np

from rlpar.app.evaluate import load_policy
from rlpar.app.frames import encode_gif, encode_progress, play_episodes, render_env
from rlpar.files import atomic_path

__all__ = ["FORMATS", "VideoResult", "record_video", "write_frames"]

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


def write_frames(frames: list[np.ndarray], out: Path, fps: int) -> None:
    """Encode ``frames`` (uint8 [H, W, 3] each) into ``out`` (.gif or .mp4), atomically."""
    with atomic_path(out) as tmp:
        if out.suffix.lower() == ".gif":
            tmp.write_bytes(encode_gif(frames, fps, out.name))
            return
        try:
            import imageio.v2 as imageio
        except ImportError:
            raise ValueError(
                '--video: .mp4 needs imageio and imageio-ffmpeg: pip install "rlpar[video]"'
            ) from None
        # The ffmpeg plugin's writer (imageio types get_writer as its base class).
        with cast(Any, imageio.get_writer(tmp, fps=fps, macro_block_size=1)) as writer:
            for i, f in enumerate(frames):
                encode_progress(out.name, i, len(frames))
                writer.append_data(f)
            encode_progress(out.name, len(frames), len(frames))


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
    env = render_env(p.experiment.env)
    try:
        frames, returns, policy = play_episodes(
            env, p.agent, p.net, p.params, episodes, greedy, seed
        )
    finally:
        env.close()
    write_frames(frames, out, fps)
    return VideoResult(str(out), len(frames), episodes, returns, policy)
