"""Frames of a policy playing: an env made to render ``rgb_array`` frames, whole episodes of
a policy on it, and the frames as an animated GIF. ``rlpar eval --video`` (`rlpar.app.video`)
and the clips during training (`rlpar.app.clips`) record with these."""

from __future__ import annotations

import io
import logging
import os
import threading
from typing import Any

import gymnasium as gym
import numpy as np

from rlpar.agent import Agent
from rlpar.config import EnvConfig
from rlpar.nn import Net
from rlpar.runtime.env_setup import run_setup
from rlpar.runtime.envs import ActionAdapter
from rlpar.runtime.evaluation import policy_actions
from rlpar.spaces import encoded

__all__ = ["encode_gif", "encode_progress", "play_episodes", "render_env", "shrink"]

log = logging.getLogger("rlpar")

#: Encodes of at least this many frames log their progress (every tenth of the frames).
LONG_ENCODE_FRAMES = 2000


def encode_progress(name: str, done: int, total: int) -> None:
    """Log ``done`` of ``total`` frames of ``name`` encoded, for long encodes only, every tenth
    of the frames (``done`` counts from 0 and reaches ``total`` once at the end)."""
    if total < LONG_ENCODE_FRAMES:
        return
    if done == total:
        log.info("encoding %s: %d frames done", name, total)
    elif done % (total // 10) == 0:
        log.info("encoding %s: %d of %d frames", name, done, total)


def render_env(env_cfg: EnvConfig, what: str = "--video") -> gym.Env:
    """One env of ``env_cfg`` made with ``render_mode="rgb_array"`` (its ``setup`` run first
    when the id is not registered yet); ValueError starting with ``what`` when it cannot
    render."""
    env_id, kwargs, vectorization = env_cfg.id, dict(env_cfg.kwargs), env_cfg.vectorization
    if vectorization in ("ale", "envpool"):
        raise ValueError(
            f'{what}: env.vectorization = "{vectorization}" steps games that do not render; '
            'record with --set env.vectorization="sync" on an env id gymnasium can render'
        )
    if env_id not in gym.registry:
        run_setup(env_cfg.setup)
    # Off-screen: pygame (classic control) needs no display or sound device for rgb_array.
    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
    os.environ.setdefault("SDL_AUDIODRIVER", "dummy")
    modes = gym.spec(env_id).kwargs.get("render_modes") or []
    try:
        env = gym.make(env_id, render_mode="rgb_array", **kwargs)
    except (TypeError, ValueError, gym.error.Error) as e:
        raise ValueError(
            f"{what}: env {env_id!r} cannot render rgb_array frames ({e}); its render modes: "
            f"{modes or 'none listed'}"
        ) from None
    if "rgb_array" not in (env.metadata.get("render_modes") or []):
        env.close()
        raise ValueError(
            f"{what}: env {env_id!r} does not render rgb_array frames (its render modes: "
            f"{env.metadata.get('render_modes') or 'none'})"
        )
    return encoded(env, env_cfg.drop_keys, env_id)  # the policy sees what it trained on


def _frame(env: gym.Env, what: str, size: int | None = None) -> np.ndarray:
    try:
        frame = np.asarray(env.render())
    except gym.error.DependencyNotInstalled as e:  # classic control renders with pygame
        raise ValueError(f'{what}: {e} (pip install "rlpar[video]" brings pygame)') from None
    if frame.ndim != 3 or frame.shape[2] not in (3, 4) or frame.dtype != np.uint8:
        raise ValueError(
            f"{what}: the env rendered {frame.dtype} {frame.shape}, expected uint8 [H, W, 3]"
        )
    return frame[..., :3] if size is None else shrink(frame[..., :3], size)


def shrink(frame: np.ndarray, size: int) -> np.ndarray:
    """``frame`` uint8 [H, W, 3] with its longer side shrunk to ``size`` pixels (area
    averaging, aspect kept; needs Pillow); unchanged when it is no larger."""
    h, w = frame.shape[:2]
    if max(h, w) <= size:
        return frame
    from PIL import Image

    scale = size / max(h, w)
    new = (max(1, round(w * scale)), max(1, round(h * scale)))
    return np.asarray(Image.fromarray(frame).resize(new, Image.Resampling.BOX))


def encode_gif(frames: list[np.ndarray], fps: int, name: str = "gif") -> bytes:
    """``frames`` (uint8 [H, W, 3] each, one size) as the bytes of an animated GIF that loops.
    The frames are quantized one by one as Pillow's GIF writer would (an adaptive palette
    each), so a long encode logs its progress (`encode_progress`, as ``name``)."""
    try:
        from PIL import Image
    except ImportError:
        raise ValueError('--video: .gif needs Pillow: pip install "rlpar[video]"') from None
    images = []
    for i, f in enumerate(frames):
        encode_progress(name, i, len(frames))
        images.append(Image.fromarray(f).convert("P", palette=Image.Palette.ADAPTIVE))
    buf = io.BytesIO()
    images[0].save(
        buf, format="GIF", save_all=True, append_images=images[1:],
        duration=round(1000 / fps), loop=0,
    )  # fmt: skip
    encode_progress(name, len(frames), len(frames))
    return buf.getvalue()


def play_episodes(
    env: gym.Env,
    agent: Agent,
    net: Net,
    params: np.ndarray,
    episodes: int,
    greedy: bool,
    seed: int,
    max_frames: int | None = None,
    stop: threading.Event | None = None,
    what: str = "--video",
    frame_size: int | None = None,
) -> tuple[list[np.ndarray], list[float], str]:
    """Play ``episodes`` whole episodes of the policy with ``params`` float32 [num_params] on
    ``env`` (made by `render_env`), episode ``i`` from ``reset(seed=seed + i)``; returns the
    frames (uint8 [H, W, 3] each: the reset's, then each step's), the episodes' returns and
    the policy played ("greedy" falls back to "sampled" for an agent without one). With
    ``max_frames`` the recording, and the episode, end at that many frames; a set ``stop``
    ends it at the next step. With ``frame_size`` each frame is kept `shrink`-ed to it."""
    adapter = ActionAdapter(env.action_space)
    dtype = np.uint8 if net.spec.input_dtype == "uint8" else np.float32
    rng = np.random.default_rng(np.random.SeedSequence([seed, 1 << 22]))
    policy = "greedy" if greedy else "sampled"
    frames: list[np.ndarray] = []
    returns: list[float] = []
    for episode in range(episodes):
        obs, _ = env.reset(seed=seed + episode)
        frames.append(_frame(env, what, frame_size))
        # A recurrent net starts each episode from a fresh state and carries it step to step.
        core: dict[str, Any] = (
            {"state": net.initial_state(1), "resets": np.zeros(1, bool)} if net.recurrent else {}
        )
        total, done = 0.0, False
        while not done:
            if (max_frames is not None and len(frames) >= max_frames) or (
                stop is not None and stop.is_set()
            ):
                break
            out = net.forward(params, np.asarray(obs, dtype)[None], **core)
            action, policy = policy_actions(agent, net, out, policy, rng)
            action = adapter.checked(action, 1, agent, "greedy" if policy == "greedy" else "act")
            obs, reward, terminated, truncated, _ = env.step(adapter.to_env(action)[0])
            frames.append(_frame(env, what, frame_size))
            total += float(reward)
            done = bool(terminated or truncated)
        returns.append(total)
        if not done:
            break
    return frames, returns, policy
