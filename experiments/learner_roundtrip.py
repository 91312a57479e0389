"""What a learner thread that only wants the GIL now and then costs one actor on a Python env.

    python experiments/learner_roundtrip.py [ROUNDS]

One rlpar actor (the step loop of `rlpar.runtime.actor`, gymnasium's CartPole vector env, 16
envs, T = 16, the IMPALA agent's mlp) fills rollouts in a loop, with no runner around it:

- ``main``: in the main thread, each rollout handed straight back to its own free queue;
- ``thread``: the same in a thread of its own (the main thread waits in ``join``);
- ``busy_process``: as ``thread``, with another process spinning in Python (the other vCPU
  busy, no GIL shared): does a busy neighbour alone slow the actor?
- ``idle_learner``: as ``thread``, but each rollout goes to a learner thread through a
  `HandOff`, which only hands it back to the actor's free queue (no batch, no training): the
  learner takes the GIL once per rollout, and nothing else;
- ``env_only``: one thread that only steps the same vector env with actions drawn beforehand
  (`rlpar.bench.runtime.env_only_rate`).

For each, in rounds that take turns, medians: env steps/s, and per rollout the actor thread's
CPU time split into user and kernel time (``/proc/self/task/TID/stat``) and its voluntary
context switches. Prints JSON.
"""

from __future__ import annotations

import json
import queue
import statistics
import subprocess
import sys
import threading
import time
from typing import Any

from rlpar.bench.runtime import env_only_rate
from rlpar.config import EnvConfig, RuntimeConfig
from rlpar.nn import Net
from rlpar.registry import make_agent
from rlpar.runtime.actor import Actor, LocalActors
from rlpar.runtime.common import EpisodeLog
from rlpar.runtime.handoff import HandOff
from rlpar.snapshot import SnapshotStore

K, T = 16, 16
SECONDS = 2.0
TICK_S = 0.01  # /proc's utime and stime are in clock ticks (USER_HZ = 100 on Linux)


def thread_times() -> tuple[float, float, int]:
    """The calling thread's user and kernel CPU seconds and voluntary context switches."""
    tid = threading.get_native_id()
    fields = open(f"/proc/self/task/{tid}/stat").read().rsplit(")", 1)[1].split()
    status = open(f"/proc/self/task/{tid}/status").read()
    switches = next(
        int(line.split()[1]) for line in status.splitlines()
        if line.startswith("voluntary_ctxt_switches")
    )  # fmt: skip
    return int(fields[11]) * TICK_S, int(fields[12]) * TICK_S, switches


def make_actor() -> Actor:
    agent = make_agent("impala", {"optim": {"lr": 0.003}})
    cfg = RuntimeConfig(
        num_actors=1, envs_per_actor=K, unroll_length=T, batch_rollouts=1,
        total_env_steps=10**12,
    )  # fmt: skip
    actors = LocalActors(EnvConfig("CartPole-v1"), cfg)
    net = Net(agent.net_spec(*actors.spaces))
    state = agent.init_state(net, net.init_params(seed=0))
    store = SnapshotStore(net.num_params, num_slots=8)
    store.publish(state.params, version=1)
    return actors.start(agent, net, store, generation=0)[0]


def actor_loop(actor: Actor, out: HandOff | None, result: dict[str, float]) -> None:
    """Unroll for SECONDS; each rollout to ``out`` (None: straight back to the free queue)."""
    log = EpisodeLog()
    user0, sys0, sw0 = thread_times()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < SECONDS:
        r = actor.free.get()
        actor.unroll(r, log)
        (out if out is not None else actor.free).put(r)
        n += 1
    wall = time.perf_counter() - t0
    user1, sys1, sw1 = thread_times()
    result.update(
        rate=n * T * K / wall,
        user_us_per_rollout=(user1 - user0) / n * 1e6,
        sys_us_per_rollout=(sys1 - sys0) / n * 1e6,
        switches_per_rollout=(sw1 - sw0) / n,
    )


def idle_learner(actor: Actor, inbox: HandOff, stop: threading.Event) -> None:
    while not stop.is_set():
        try:
            r = inbox.get(timeout=0.05)
        except queue.Empty:
            continue
        actor.free.put(r)


def measure(actor: Actor, mode: str) -> dict[str, float]:
    result: dict[str, float] = {}
    if mode == "env_only":
        return {"rate": env_only_rate(SECONDS, K)}
    if mode == "main":
        actor_loop(actor, None, result)
        return result
    spinner = learner = None
    inbox: HandOff | None = None
    stop = threading.Event()
    if mode == "busy_process":
        spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        time.sleep(0.2)
    if mode == "idle_learner":
        inbox = HandOff()
        learner = threading.Thread(target=idle_learner, args=(actor, inbox, stop))
        learner.start()
    th = threading.Thread(target=actor_loop, args=(actor, inbox, result))
    th.start()
    th.join()
    stop.set()
    if learner is not None:
        learner.join()
    if spinner is not None:
        spinner.kill()
        spinner.wait()
    while inbox is not None and inbox.qsize():  # the rollouts still queued go back
        actor.free.put(inbox.get())
    return result


def main(rounds: int) -> dict[str, Any]:
    actor = make_actor()
    modes = ["main", "thread", "busy_process", "idle_learner", "env_only"]
    runs: dict[str, list[dict[str, float]]] = {m: [] for m in modes}
    for _ in range(rounds):
        for m in modes:
            runs[m].append(measure(actor, m))
    out: dict[str, Any] = {
        m: {k: round(statistics.median(r[k] for r in rs), 3) for k in rs[0]}
        for m, rs in runs.items()
    }
    env_only = out["env_only"]["rate"]
    out["vs_env_only"] = {m: round(out[m]["rate"] / env_only, 3) for m in modes[:-1]}
    actor.envs.close()
    return out


if __name__ == "__main__":
    print(json.dumps(main(int(sys.argv[1]) if len(sys.argv) > 1 else 3), indent=1))
