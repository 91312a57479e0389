"""Progress of a run for the person watching: a live bar on a terminal, a plain log line every
few seconds elsewhere (CI, pipes, files), nothing when quiet.

::

    display = make_display(total_env_steps, quiet=False, log_interval_s=5.0)
    runner.run(on_progress=display.update)
    display.close()
"""

from __future__ import annotations

import logging
import sys
import time
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from rlpar.runtime import Progress

__all__ = ["BarDisplay", "LogDisplay", "NoDisplay", "make_display", "status_line"]

log = logging.getLogger("rlpar")


def _si(x: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.1f}{unit}"
    return f"{x:.0f}"


def _duration(seconds: float) -> str:
    s = round(seconds)
    return (
        f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"
    )


def _return_text(p: Progress) -> str:
    if p.mean_return is None:
        return "return -"
    return f"return {p.mean_return:.1f} [{p.min_return:.0f}, {p.max_return:.0f}]"


class _Rate:
    """Env steps per second over the interval since the previous call."""

    def __init__(self) -> None:
        self._prev: tuple[float, int] | None = None

    def __call__(self, p: Progress) -> float:
        prev, self._prev = self._prev, (p.wall_s, p.env_steps)
        if prev is None or p.wall_s <= prev[0]:
            return p.env_steps_per_s
        return (p.env_steps - prev[1]) / (p.wall_s - prev[0])


def status_line(p: Progress, total_env_steps: int, rate: float, done: bool = False) -> str:
    """One line: env steps / total, steps/s, mean return, policy lag, learner steps, and the ETA
    (or, once the run has ended, its wall time)."""
    if done:
        when = f"ended after {_duration(p.wall_s)}"
    else:
        left = max(0, total_env_steps - p.env_steps)
        when = f"ETA {_duration(left / rate) if rate > 0 else '?'}"
    pct = 100.0 * min(1.0, p.env_steps / total_env_steps)
    return (
        f"env steps {p.env_steps:,}/{total_env_steps:,} ({pct:.0f}%) | {_si(rate)} steps/s | "
        f"{_return_text(p)} | lag {p.policy_lag_mean:.1f}/{p.policy_lag_max} | "
        f"learner steps {p.learner_steps:,} | {when}"
    )


class NoDisplay:
    """--quiet: shows nothing."""

    def update(self, p: Progress) -> None:
        pass

    def close(self) -> None:
        pass

    def redirect_logging(self) -> AbstractContextManager:
        return nullcontext()


class LogDisplay(NoDisplay):
    """Not a terminal: `status_line` through `logging` every ``interval_s``, and at the end."""

    def __init__(self, total_env_steps: int, interval_s: float) -> None:
        self.total, self.interval_s = total_env_steps, interval_s
        self._rate = _Rate()
        self._next = time.perf_counter() + interval_s
        self._last: Progress | None = None

    def update(self, p: Progress) -> None:
        self._last = p
        now = time.perf_counter()
        if now >= self._next:
            self._next = now + self.interval_s
            self._log(p)

    def close(self) -> None:
        # The last line sums the run up, even when the last update was logged already: its
        # steps/s is the whole run's (the last interval's may be 0: a run that stops on its
        # target ends in evaluation episodes, with no env steps), and it ends with the run's
        # wall time, not an ETA to the step budget the run did not need.
        if self._last is not None:
            self._log(self._last, self._last.env_steps_per_s, done=True)

    def _log(self, p: Progress, rate: float | None = None, done: bool = False) -> None:
        rate = self._rate(p) if rate is None else rate
        log.info("%s", status_line(p, self.total, rate, done))


class BarDisplay(NoDisplay):
    """A terminal: a tqdm bar of env steps with steps/s, ETA, mean return and policy lag."""

    def __init__(self, total_env_steps: int, stream: TextIO, initial_env_steps: int = 0) -> None:
        from tqdm import tqdm

        self._bar = tqdm(
            total=total_env_steps,
            initial=min(initial_env_steps, total_env_steps),
            unit=" steps",
            unit_scale=True,
            dynamic_ncols=True,
            file=stream,
            smoothing=0.3,
            bar_format="{percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} env steps "
            "[{elapsed}<{remaining}, {rate_fmt}{postfix}]",
        )

    def update(self, p: Progress) -> None:
        bar = self._bar
        steps = min(p.env_steps, bar.total)
        bar.set_postfix_str(
            f"{_return_text(p)}, lag {p.policy_lag_mean:.1f}/{p.policy_lag_max}", refresh=False
        )
        bar.update(steps - bar.n)

    def close(self) -> None:
        self._bar.refresh()
        self._bar.close()

    def redirect_logging(self) -> AbstractContextManager:
        """Log records printed above the bar instead of through it."""
        from tqdm.contrib.logging import logging_redirect_tqdm

        return logging_redirect_tqdm(loggers=[log], tqdm_class=type(self._bar))


def make_display(
    total_env_steps: int,
    quiet: bool = False,
    log_interval_s: float = 5.0,
    stream: TextIO | None = None,
    initial_env_steps: int = 0,
) -> NoDisplay:
    """The bar when ``stream`` (default stderr) is a terminal, log lines otherwise, nothing
    when ``quiet``. ``initial_env_steps``: where a resumed run starts."""
    stream = sys.stderr if stream is None else stream
    if quiet:
        return NoDisplay()
    if stream.isatty():
        return BarDisplay(total_env_steps, stream, initial_env_steps)
    return LogDisplay(total_env_steps, log_interval_s)
