"""A run's threads and signals: daemon threads whose exceptions stop the run and reach the main
thread, joined within a bound; SIGINT and SIGTERM turned into a clean stop."""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

__all__ = ["RunThreads", "SignalStop", "note_thread_error", "supervise"]

log = logging.getLogger("rlpar")


class RunThreads:
    """The threads of one run, all stopped by ``stop``. An exception in any of them is kept in
    ``errors`` as (the thread's name in messages, the exception) and sets ``stop``."""

    def __init__(self, stop: threading.Event) -> None:
        self.stop = stop
        self.threads: list[threading.Thread] = []
        self.errors: list[tuple[str, BaseException]] = []

    def add(self, name: str, thread_name: str, body: Callable[[], None]) -> None:
        """A daemon thread ``thread_name`` running ``body`` (started by `start`); ``name``
        names it in the note of its exception."""

        def run() -> None:
            try:
                body()
            except BaseException as exc:  # every failure stops the run and reaches the main thread
                self.errors.append((name, exc))
                self.stop.set()

        self.threads.append(threading.Thread(target=run, name=thread_name, daemon=True))

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def join(self, timeout_s: float) -> list[str]:
        """Join every thread within ``timeout_s`` seconds in all; the names of those still
        running (stuck, left as daemon threads), logged."""
        deadline = time.perf_counter() + timeout_s
        stuck = []
        for t in self.threads:
            t.join(max(0.0, deadline - time.perf_counter()))
            if t.is_alive():
                stuck.append(t.name)
        if stuck:
            log.error(
                "%s did not stop within %.1f s (stuck in an env step or the learner?); "
                "left running as daemon threads",
                ", ".join(stuck),
                timeout_s,
            )
        return stuck

    def alive(self) -> set[str]:
        """The names of the threads that run now."""
        return {t.name for t in self.threads if t.is_alive()}


class SignalStop:
    """While entered on the main thread, SIGINT and SIGTERM set ``stop`` and ``caught`` names
    the signal; the previous handlers come back on exit. On another thread it does nothing
    (signals are the caller's there)."""

    def __init__(self, stop: threading.Event) -> None:
        self.stop = stop
        self.caught: str | None = None
        self._previous: dict[signal.Signals, Any] = {}

    def __enter__(self) -> SignalStop:
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
            for s in self._previous:
                signal.signal(s, self._handle)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for s, h in self._previous.items():
            signal.signal(s, h)
        self._previous = {}

    def _handle(self, signum: int, _frame: Any) -> None:
        self.caught = signal.Signals(signum).name
        self.stop.set()


def supervise(
    threads: RunThreads,
    signals: SignalStop,
    rules: Sequence[Callable[[], None]],
    verdict: Callable[[], str | None],
    *,
    start: float,
    on_progress: Callable[[float], None] | None,
    interval_s: float,
    every_wake: Callable[[], None],
) -> str:
    """The main thread's loop: wait, look for a reason to stop (a thread's error, a signal, the
    ``verdict`` of a rule on either thread, a stop from outside), apply the main thread's stop
    ``rules`` in order, call ``on_progress(seconds since start)`` every ``interval_s`` and
    ``every_wake`` (the GIL-bound check) at each wake-up. Returns ``stopped_by``: "error", the
    signal's name, the verdict's reason, or "stop"."""
    stop = threads.stop
    next_progress = start + interval_s
    while True:
        stop.wait(0.02)
        stopping = stop.is_set()  # read first: a rule decides its verdict, then stops
        if threads.errors:
            return "error"
        if signals.caught is not None:
            return signals.caught
        if not stopping:
            for rule in rules:  # in order: the first to decide stops the run
                rule()
                if stop.is_set():
                    break
        if (reason := verdict()) is not None:
            return reason
        if stopping:
            return "stop"
        now = time.perf_counter()
        if on_progress is not None and now >= next_progress:
            on_progress(now - start)
            next_progress = now + interval_s
        every_wake()


def note_thread_error(exc: BaseException, name: str, saved: Path | None) -> BaseException:
    """``exc`` from rlpar thread ``name``, with a note saying so and naming the final
    checkpoint ``saved`` (None: none was written), ready to be raised in the main thread."""
    note = f"(raised in rlpar thread {name!r}; the run was stopped"
    note += f", its final checkpoint is {saved})" if saved is not None else ")"
    if saved is not None:
        log.error("rlpar thread %r failed; the final checkpoint is %s", name, saved)
    if hasattr(exc, "add_note"):
        exc.add_note(note)
    return exc
