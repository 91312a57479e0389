"""`HandOff` (rlpar/runtime/handoff.py) and the native `TicketQueue` under it: a FIFO with
queue.Queue's interface for what the runtime uses; many threads hand every object over once, in
order per producer; a blocked ``get`` or ``put`` lets other Python threads run and is woken by
the other side; a wait counts as neither held GIL time nor native work in the GIL meter."""

from __future__ import annotations

import queue
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from rlpar import _native
from rlpar.runtime.gil_meter import ThreadMeter
from rlpar.runtime.handoff import HandOff


def test_fifo_bounds_and_timeouts() -> None:
    q: HandOff[object] = HandOff(maxsize=2)
    a, b = object(), None  # None is an item like any other
    q.put(a)
    q.put_nowait(b)
    assert q.qsize() == 2 and not q.empty() and q.maxsize == 2
    with pytest.raises(queue.Full):
        q.put_nowait(1)
    t0 = time.perf_counter()
    with pytest.raises(queue.Full):
        q.put(1, timeout=0.02)
    assert time.perf_counter() - t0 >= 0.015
    assert q.get() is a and q.get(timeout=0.5) is None
    assert q.empty()
    with pytest.raises(queue.Empty):
        q.get_nowait()
    with pytest.raises(queue.Empty):
        q.get(timeout=0.02)
    for i in range(5):  # slots are reused: a failed put gave its slot back
        q.put(i)
        assert q.get() == i
    assert len(q._slots) <= 3


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="maxsize: expected an int >= 0"):
        HandOff(maxsize=-1)
    t = _native.TicketQueue(0)
    with pytest.raises(ValueError, match="timeout: expected None or a finite number"):
        t.get(-1.0)
    with pytest.raises(ValueError, match="got inf"):
        t.put(0, float("inf"))
    with pytest.raises(ValueError, match="maxsize must be >= 0"):
        _native.TicketQueue(-2)


@pytest.mark.parametrize("maxsize", [1, 3, 0])
def test_many_threads_hand_over_everything(maxsize: int) -> None:
    producers, consumers, per_producer = 3, 3, 3000
    q: HandOff[tuple[int, int]] = HandOff(maxsize=maxsize)
    got: list[list[tuple[int, int]]] = [[] for _ in range(consumers)]
    done = threading.Event()

    def produce(p: int) -> None:
        for i in range(per_producer):
            q.put((p, i), timeout=10.0)

    def consume(c: int) -> None:
        while not done.is_set():
            try:
                got[c].append(q.get(timeout=0.01))
            except queue.Empty:
                continue

    threads = [threading.Thread(target=produce, args=(p,)) for p in range(producers)]
    threads += [threading.Thread(target=consume, args=(c,)) for c in range(consumers)]
    for t in threads:
        t.start()
    for t in threads[:producers]:
        t.join(timeout=60)
    deadline = time.monotonic() + 30
    while sum(map(len, got)) < producers * per_producer and time.monotonic() < deadline:
        time.sleep(0.005)
    done.set()
    for t in threads[producers:]:
        t.join(timeout=10)
    items = [x for g in got for x in g]
    assert sorted(items) == [(p, i) for p in range(producers) for i in range(per_producer)]
    for g in got:  # each consumer sees each producer's items in the order they were put
        for p in range(producers):
            mine = [i for (pp, i) in g if pp == p]
            assert mine == sorted(mine)
    assert q.empty()


def test_a_blocked_get_lets_python_run_and_wakes_on_put() -> None:
    q: HandOff[str] = HandOff()
    out: list[tuple[str, float, float]] = []

    def getter() -> None:
        meter = ThreadMeter()
        item = q.get(timeout=30.0)
        gil = meter.read()
        out.append((item, gil.held_s, gil.native_s))

    t = threading.Thread(target=getter)
    t.start()
    # While the getter blocks, this thread keeps running Python (it would not, had the getter
    # kept the GIL), then wakes it.
    end = time.perf_counter() + 0.3
    spins = 0
    while time.perf_counter() < end:
        spins += 1
    assert spins > 1000
    q.put("x")
    t.join(timeout=10)
    assert not t.is_alive()
    item, held_s, native_s = out[0]
    assert item == "x"
    # The wait took ~0.3 s of wall time: none of it is native work, and nearly none is held
    # (the CPU it took, blocking and waking, counts as outside the GIL).
    assert native_s == 0.0
    assert held_s < 0.05


def test_a_blocked_put_wakes_when_room_is_made() -> None:
    q: HandOff[int] = HandOff(maxsize=1)
    q.put(1)
    put_done = threading.Event()

    def putter() -> None:
        q.put(2, timeout=30.0)
        put_done.set()

    t = threading.Thread(target=putter)
    t.start()
    assert not put_done.wait(0.05)  # no room: it waits
    assert q.get(timeout=1.0) == 1
    assert put_done.wait(10.0)
    t.join(timeout=10)
    assert q.get(timeout=1.0) == 2


def test_a_wait_after_the_exit_hook_gives_up_instead_of_hanging(tmp_path: Path) -> None:
    # An atexit handler registered before rlpar's own runs after it: by then the GIL is no
    # longer released, so a wait would hold it forever; it must give up at once.
    code = """
import atexit, queue, sys

def late():
    from rlpar.runtime.handoff import HandOff
    q = HandOff(maxsize=1)
    try:
        q.get()
    except queue.Empty:
        print("get gave up", flush=True)
    q.put(1)
    try:
        q.put(2)
    except queue.Full:
        print("put gave up", flush=True)

atexit.register(late)
import rlpar.runtime.handoff  # rlpar's exit hook: registered after, so it runs first
"""
    out = subprocess.run(  # not from the checkout, whose rlpar/ has no compiled core
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["get", "gave", "up", "put", "gave", "up"]
