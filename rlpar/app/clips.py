"""Clips of the policy while it trains (`rlpar.EvalConfig.video_interval_env_steps`).

A thread of its own waits until the run has taken the next multiple of the interval in env
steps, copies the newest parameters out of the snapshot store, plays one episode of the first
of ``eval.policies`` on an env made with ``render_mode="rgb_array"`` and writes it as an
animated GIF, ``videos/<env steps>.gif`` in the run directory (temporary file + rename). The
TensorBoard monitor then writes each clip as the animated image ``video/<policy>``, at its env
steps. The first clip is the policy the run starts with; `finish` records the last one with the
final parameters.

Errors in the clip thread (an env that fails to render mid-run) stop the run as a stop from
outside would (its final checkpoint is written) and are raised, with their traceback, once the
run has stopped (`failure`); so is an error of the last clip, recorded after the run. The run
directory keeps its summary.json (with an ``error`` entry) either way: the run itself ended
whole.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rlpar.app.frames import encode_gif, play_episodes, render_env
from rlpar.config import ConfigError, EnvConfig, EvalConfig
from rlpar.runtime import Runner
from rlpar.runtime.common import POLL_S, RecentLog
from rlpar.runtime.evaluation import eval_seed

__all__ = ["Clip", "TrainingClips"]

log = logging.getLogger("rlpar")

_CLIP_PURPOSE = 3  # in eval_seed keys, apart from the evaluations' 0, 1, 2
_WHAT = "eval.video_interval_env_steps"


@dataclass(frozen=True)
class Clip:
    """One recorded episode."""

    env_steps: int
    """The run's env steps when its parameters were taken (its x in TensorBoard)."""
    version: int
    """The parameter version that played it."""
    policy: str
    """"greedy" or "sampled"."""
    path: Path
    """The GIF in the run directory."""
    gif: bytes
    """The GIF's bytes."""
    height: int
    width: int
    frames: int
    episode_return: float
    """Its return (up to its last frame, when `EvalConfig.video_max_frames` cut it)."""


class TrainingClips:
    """Records `Clip`\\ s of ``runner``'s policy into ``run_dir / "videos"`` as ``eval_cfg``
    says (module docstring). Made before the run: an env that cannot render, or no Pillow, is
    a `ConfigError` naming ``eval.video_interval_env_steps``."""

    def __init__(
        self, runner: Runner, env: EnvConfig, eval_cfg: EvalConfig, seed: int, run_dir: Path
    ) -> None:
        if eval_cfg.video_interval_env_steps is None:
            raise ValueError("TrainingClips: the EvalConfig has no video_interval_env_steps")
        try:
            import PIL  # noqa: F401
        except ImportError:
            raise ConfigError(
                f'{_WHAT}: clips are GIFs, which need Pillow: pip install "rlpar[video]"'
            ) from None
        self.runner, self.cfg, self.seed = runner, eval_cfg, seed
        self.every = eval_cfg.video_interval_env_steps
        self.policy = eval_cfg.policies[0]
        self.dir = Path(run_dir) / "videos"
        try:
            self.env = render_env(env, what=_WHAT)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        self.fps = int(self.env.metadata.get("render_fps") or 30)
        self.clips: RecentLog[Clip] = RecentLog()
        self.error: BaseException | None = None
        self._final_failed = False
        self._closed = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # one episode at a time on the one env
        self._last_at = -1

    def start(self) -> None:
        """Start the clip thread (the run's first clip is its policy at the start)."""
        self.dir.mkdir(exist_ok=True)
        self._thread = threading.Thread(target=self._run, name="rlpar-clips", daemon=True)
        self._thread.start()

    def failure(self) -> RuntimeError | None:
        """What went wrong, as the error to raise once the run has ended (None: nothing): the
        clip thread's error (it stopped the run), or the last clip's (`finish`)."""
        if self.error is None:
            return None
        if self._final_failed:
            msg = f"rlpar clips: the last clip failed: {self.error} (the run itself ended)"
        else:
            msg = f"rlpar thread 'clips' failed: {self.error} (the run was stopped)"
        err = RuntimeError(msg)
        err.__cause__ = self.error
        return err

    def finish(self) -> None:
        """Stop the thread (a clip being played is dropped) and record the last clip, with the
        final parameters, unless the last one already had them (or the thread is stuck or
        failed). Its error, if any, is kept for `failure`."""
        if self._join() and self.error is None and self.runner.env_steps() > self._last_at:
            try:
                self._record(self.runner.env_steps(), None)
            except Exception as e:
                self.error, self._final_failed = e, True

    def close(self) -> None:
        """Stop the thread and close the env (left open if the thread is stuck in it).
        Idempotent."""
        if not self._closed and self._join():
            self.env.close()
            self._closed = True

    def _join(self) -> bool:
        """Stop the thread; False when it is still in the env after ``runtime.join_timeout_s``
        (an env step that never returns: the run ends without it, as with a stuck actor)."""
        self._stop.set()
        if self._thread is None:
            return True
        timeout = self.runner.cfg.join_timeout_s
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.warning("clips: the clip thread did not stop within %.0f s (stuck in the env)",
                        timeout)  # fmt: skip
            return False
        return True

    def _run(self) -> None:
        next_at = self.runner.env_steps()
        try:
            while not self._stop.is_set():
                steps = self.runner.env_steps()
                if steps < next_at:
                    self._stop.wait(POLL_S)
                    continue
                self._record(steps, self._stop)
                next_at = (steps // self.every + 1) * self.every
        except BaseException as e:  # re-raised on the main thread via failure()
            self.error = e
            self.runner.stop.set()

    def _record(self, env_steps: int, stop: threading.Event | None) -> None:
        with self.runner.store.pin() as snap:  # a copy: no slot stays pinned for an episode
            params, version = np.array(snap.params, np.float32), snap.version
        with self._lock:
            frames, returns, policy = play_episodes(
                self.env, self.runner.agent, self.runner.net, params, 1,
                greedy=self.policy == "greedy",
                seed=eval_seed(self.seed, _CLIP_PURPOSE, env_steps),
                max_frames=self.cfg.video_max_frames, stop=stop, what=_WHAT,
                frame_size=self.cfg.video_size,
            )  # fmt: skip
        if stop is not None and stop.is_set():
            return
        path = self.dir / f"{env_steps}.gif"
        gif = encode_gif(frames, self.fps, f"videos/{path.name}")
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_bytes(gif)
        tmp.replace(path)
        h, w = frames[0].shape[:2]
        self._last_at = env_steps
        self.clips.append(
            Clip(env_steps, version, policy, path, gif, h, w, len(frames), returns[0])
        )
