"""What an actor carries from one unroll to the next, written once for every unroll path: the
next step's observations, the episodes in progress, the recurrent core state; and the copy of it
(with the sampling generators' states) that a checkpoint keeps and a resume puts back."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
from gymnasium.vector import VectorEnv

from rlpar import _native
from rlpar.data import Rollout
from rlpar.nn import Net
from rlpar.runtime.recurrent import CoreState
from rlpar.snapshot import Snapshot

__all__ = ["Carry"]

log = logging.getLogger("rlpar")


class Carry:
    """Actor ``index``'s state between unrolls, for its K envs (its own thread's only).

    ``obs`` [K, *obs_shape]: the next step's input; ``prev_done`` bool [K]: whether each env's
    last step ended an episode (its next step is the reset step); ``ep_return`` float64 [K] and
    ``ep_length`` int64 [K]: the episodes so far; ``core``: a recurrent net's state (None for
    a feed-forward net). ``rng`` and ``sampler`` are the actor's generators (shared, not
    copied). With ``keep_resume_state`` and envs that can save their state (`ResumableEnvs`),
    `checkpoint_state` also holds the arrays that continue the episodes."""

    def __init__(
        self,
        index: int,
        envs: VectorEnv,
        net: Net,
        obs: np.ndarray,
        rng: np.random.Generator,
        sampler: _native.CategoricalSampler | None,
        keep_resume_state: bool,
    ) -> None:
        self.index, self.envs, self.rng, self.sampler = index, envs, rng, sampler
        k = envs.num_envs
        self.obs = obs
        self.prev_done = np.zeros(k, bool)
        self.ep_return = np.zeros(k, np.float64)
        self.ep_length = np.zeros(k, np.int64)
        self.core = CoreState(net, k) if net.recurrent else None
        self.resumable = callable(getattr(envs, "save_state", None)) and callable(
            getattr(envs, "load_state", None)
        )
        self._keep = keep_resume_state and self.resumable
        self._saved = self._read()

    def begin(self, loop: _native.StepLoop, params: Snapshot, r: Rollout) -> int:
        """Bind ``loop`` to ``r`` and these episodes for one unroll on ``params``; the version."""
        core = () if self.core is None else (self.core.state, self.core.starts)
        return loop.begin(params, r, self.prev_done, self.ep_return, self.ep_length, *core)

    def unroll_done(self, r: Rollout | None, obs: np.ndarray | None = None) -> None:
        """After an unroll into ``r``: the next observations (``obs``, or ``r``'s last, copied;
        with neither, a native loop wrote them into ``self.obs``) and a fresh copy of what a
        checkpoint keeps."""
        if obs is not None:
            self.obs = obs
        elif r is not None:
            self.obs = r.obs[-1].copy()
        self._saved = self._read()

    # ------------------------------------------------------------------ checkpoints, resume

    def checkpoint_state(self) -> tuple[dict, dict[str, np.ndarray] | None]:
        """(the generators' states, the arrays that continue the episodes or None), both copied
        at the end of the same unroll (one reference: never a mix of two). The arrays:
        ``env/<name>`` (the envs' `save_state`), ``obs``, ``prev_done``, ``ep_return``,
        ``ep_length``, and for a recurrent net ``core/state`` float32 [K, state_size] and
        ``core/starts`` bool [K]."""
        return self._saved

    def load(self, arrays: dict[str, np.ndarray]) -> None:
        """Continue the episodes ``arrays`` (`checkpoint_state`'s) describe. ValueError (naming
        the array, nothing changed) if they do not fit: other envs, another K, another core."""
        if not self.resumable:
            raise ValueError(
                f"actor {self.index}: its envs ({type(self.envs).__name__}) cannot load a saved "
                "state (they have no save_state/load_state)"
            )
        _check_fit(self.index, arrays, self._arrays())
        env_state = {k.removeprefix("env/"): v for k, v in arrays.items() if k.startswith("env/")}
        try:
            obs = self.envs.load_state(env_state)  # type: ignore[attr-defined]
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"actor {self.index}: saved env state refused: {e}") from e
        self.obs = arrays["obs"].copy()
        if not np.array_equal(obs, self.obs):
            log.warning(
                "actor %d: the envs' restored observations differ from the saved ones", self.index
            )
        self.prev_done = arrays["prev_done"].copy()
        self.ep_return = arrays["ep_return"].copy()
        self.ep_length = arrays["ep_length"].copy()
        if self.core is not None:
            self.core.state[...] = arrays["core/state"]
            self.core.starts[...] = arrays["core/starts"]
        self._saved = self._read()

    def set_rng_state(self, numpy_state: dict | None, sampler_state: list | None) -> None:
        """Restore the generators' states (None leaves that generator as it is)."""
        if numpy_state is not None:
            self.rng.bit_generator.state = numpy_state
        if sampler_state is not None and self.sampler is not None:
            self.sampler.state = tuple(sampler_state)
        self._saved = self._read()

    def _read(self) -> tuple[dict, dict[str, np.ndarray] | None]:
        sampler = list(self.sampler.state) if self.sampler is not None else None
        rng = {"numpy": self.rng.bit_generator.state, "sampler": sampler}
        return rng, self._arrays() if self._keep else None

    def _arrays(self) -> dict[str, np.ndarray]:
        """New copies of everything `checkpoint_state`'s arrays hold (resumable envs only)."""
        out = {f"env/{k}": v for k, v in self.envs.save_state().items()}  # type: ignore[attr-defined]
        out["obs"] = np.array(self.obs)
        out["prev_done"] = self.prev_done.copy()
        out["ep_return"] = self.ep_return.copy()
        out["ep_length"] = self.ep_length.copy()
        if self.core is not None:
            out["core/state"] = self.core.state.copy()
            out["core/starts"] = self.core.starts.copy()
        return out


def _check_fit(index: int, saved: dict[str, Any], current: dict[str, np.ndarray]) -> None:
    """ValueError unless ``saved`` holds the arrays ``current`` does, each of its dtype and
    shape (the message names the first that does not fit)."""
    if set(saved) != set(current):
        raise ValueError(
            f"actor {index}: saved state holds {sorted(saved)}, this actor needs {sorted(current)}"
        )
    for name, mine in current.items():
        array = saved[name]
        if not isinstance(array, np.ndarray) or array.dtype != mine.dtype:
            what = getattr(array, "dtype", type(array).__name__)
            raise ValueError(f"actor {index}: saved '{name}' is {what}, needs {mine.dtype}")
        if array.shape != mine.shape:
            raise ValueError(
                f"actor {index}: saved '{name}' has shape {array.shape}, this actor's is "
                f"{mine.shape} (same env and runtime.envs_per_actor needed)"
            )
