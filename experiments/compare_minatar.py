"""MinAtar Breakout: rlpar IMPALA and APPO vs Stable-Baselines3 PPO (and A2C), same machine.

Both sides play ``MinAtar/Breakout-v0`` exactly as ``minatar_breakout_suite.toml`` sets it up (the
env id, setup hook and kwargs are read from that file: all 6 actions, sticky actions 0.1,
difficulty ramping) and see the same observation, the 10x10x4 boolean frame, channels last. Each
run gets a fixed wall-clock budget and is measured twice:

* time to a 20-episode training-window mean return of 10 (seconds and env steps from the start
  of training; a run that never gets there counts as not reached);
* the final policy, evaluated on fresh env seeds: 100 sampled and 100 greedy episodes (rlpar's
  run does it itself through the config's ``[eval]`` section; the SB3 child plays the same
  quotas on 16 envs the same way, outside the budget).

rlpar runs ``rlpar train experiments/minatar_breakout_suite.toml`` (IMPALA, method "impala")
or ``experiments/minatar_breakout_appo.toml`` (APPO, method "appo"; the same game settings),
each agent with its committed config, with the budget as
``runtime.max_wall_s`` (``total_env_steps`` raised so the budget, not the 5M frames, ends it;
evaluations during training off, as SB3 does none); its time to 10 is read from the run's
TensorBoard ``return/mean`` events, whose wall times count from the config event written just
before training starts.

SB3 gets a features extractor with rlpar's torso: conv 16 filters 3x3 stride 1 (no padding) +
ReLU, flatten (8x8x16), Linear 128 + ReLU, then linear policy and value heads on it (shared
torso, like rlpar's net). The frames are bool, which SB3 does not take for an image (it wants
uint8 in [0, 255]), so it neither transposes nor scales them: it hands the extractor float
``[B, 10, 10, 4]``, and the extractor transposes to torch's channels-first ``[B, 4, 10, 10]``.

Hyper-parameters. PPO: PureJaxRL's MinAtar PPO settings (its ``brax_minatar`` notebook, tuned
for gymnax's MinAtar games): 64 envs x 128 steps, 4 epochs of 8 minibatches (1024), gamma 0.99,
GAE lambda 0.95, clip 0.2, entropy 0.01, value 0.5, grad norm 0.5, Adam (eps 1e-5) with the
learning rate annealed linearly over their 10M steps (a 300 s budget ends after 3-4M of
them here, the rate still at 60-70%).
One change: the learning rate is 5e-4 (rlpar's for this game) instead of their 5e-3, which
they tuned for an MLP on flattened frames (5e-3 was not tried here with the conv torso).
A2C: rl-zoo's
Atari settings (16 envs, 5 steps, entropy 0.01, value 0.25, RMSprop lr 7e-4, eps 1e-5 as
in TF). Both sides discount with gamma 0.99.

Threads: rlpar uses both cores (2 actor threads and the learner thread). SB3 runs its envs and
its net in one Python thread (DummyVecEnv; a process per env would mean 64 processes on 2 cores);
``--torch-threads`` sets torch's intra-op threads, default 2 so torch may use both cores too
(``--probe`` measures SB3 PPO's env steps/s with 1 and 2 for a short while, to pick the faster).

SB3 and torch are optional and never rlpar dependencies::

    pip install torch==2.13.0 stable-baselines3 minatar
    python experiments/compare_minatar.py --seeds 0 1 --budget 300

Methods alternate seed by seed, each run in a fresh process, each under
``flock /tmp/rlpar-bench.lock`` (one benchmark at a time on this shared machine; so do not wrap
the script itself in it) unless ``--no-lock``. Prints a per-seed table and a table of medians
(Markdown) for RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: tomli, an rlpar dependency there
    import tomli as tomllib

HERE = Path(__file__).resolve().parent
CONFIG = HERE / "minatar_breakout_suite.toml"
RLPAR_CONFIGS = {"impala": CONFIG, "appo": HERE / "minatar_breakout_appo.toml"}
TARGET = 10.0
WINDOW = 20
LOCK = "/tmp/rlpar-bench.lock"
EVAL_ENVS = 16  # rlpar's evaluate_policy plays on min(episodes, 16) envs


def suite() -> dict[str, Any]:
    """The suite config (env id, setup hook, kwargs, eval episodes) both sides use."""
    with CONFIG.open("rb") as f:
        return tomllib.load(f)


# ------------------------------------------------------------------------------ SB3 child


def sb3_child(algo: str, seed: int, budget_s: float, torch_threads: int) -> dict[str, Any]:
    """One SB3 run in this process: train for ``budget_s`` seconds, then evaluate. torch and
    SB3 are imported here only, so the parent needs neither."""
    import importlib
    from collections import deque

    import gymnasium as gym
    import numpy as np
    import torch
    from stable_baselines3 import A2C, PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.torch_layers import BaseFeaturesExtractor
    from stable_baselines3.common.vec_env import VecEnv

    torch.set_num_threads(torch_threads)
    cfg = suite()
    module, _, func = cfg["env"]["setup"].partition(":")
    getattr(importlib.import_module(module), func)()
    env_id, env_kwargs = cfg["env"]["id"], cfg["env"].get("kwargs", {})

    class Torso(BaseFeaturesExtractor):
        """rlpar's MinAtar torso: [B, H, W, C] float -> [B, 128]."""

        def __init__(self, observation_space: gym.spaces.Box, features_dim: int = 128) -> None:
            super().__init__(observation_space, features_dim)
            h, w, c = observation_space.shape
            self.conv = torch.nn.Sequential(
                torch.nn.Conv2d(c, 16, kernel_size=3, stride=1), torch.nn.ReLU()
            )
            self.linear = torch.nn.Sequential(
                torch.nn.Flatten(), torch.nn.Linear(16 * (h - 2) * (w - 2), features_dim)
            )

        def forward(self, obs: torch.Tensor) -> torch.Tensor:
            # channels last (the env's layout) -> channels first (torch's conv)
            return torch.relu(self.linear(self.conv(obs.permute(0, 3, 1, 2))))

    policy_kwargs: dict[str, Any] = {
        "features_extractor_class": Torso,
        "net_arch": {"pi": [], "vf": []},  # linear heads on the torso, as rlpar's net
    }
    if algo == "ppo":
        n_envs, total, lr = 64, 10_000_000, 5e-4
        policy_kwargs["optimizer_kwargs"] = {"eps": 1e-5}
        env = make_vec_env(env_id, n_envs=n_envs, seed=seed, env_kwargs=env_kwargs)
        model: PPO | A2C = PPO(
            "MlpPolicy", env, n_steps=128, batch_size=1024, n_epochs=4, gamma=0.99,
            gae_lambda=0.95, clip_range=0.2, ent_coef=0.01, vf_coef=0.5, max_grad_norm=0.5,
            learning_rate=lambda progress: progress * lr, policy_kwargs=policy_kwargs,
            seed=seed, device="cpu",
        )  # fmt: skip
    else:
        from stable_baselines3.common.sb2_compat.rmsprop_tf_like import RMSpropTFLike

        n_envs, total = 16, 10_000_000
        policy_kwargs |= {"optimizer_class": RMSpropTFLike, "optimizer_kwargs": {"eps": 1e-5}}
        env = make_vec_env(env_id, n_envs=n_envs, seed=seed, env_kwargs=env_kwargs)
        model = A2C(
            "MlpPolicy", env, ent_coef=0.01, vf_coef=0.25, gamma=0.99,
            policy_kwargs=policy_kwargs, seed=seed, device="cpu",
        )  # fmt: skip

    class Watch(BaseCallback):
        """The 20-episode window, the first time it reaches the target, and the budget."""

        def __init__(self) -> None:
            super().__init__()
            self.returns: deque[float] = deque(maxlen=WINDOW)
            self.hit: tuple[float, int] | None = None
            self.start = time.perf_counter()

        def _on_step(self) -> bool:
            now = time.perf_counter() - self.start
            for info in self.locals["infos"]:
                if "episode" in info:
                    self.returns.append(float(info["episode"]["r"]))
            if self.hit is None and len(self.returns) == WINDOW:
                if sum(self.returns) / WINDOW >= TARGET:
                    self.hit = (now, self.num_timesteps)
            return now < budget_s

    watch = Watch()  # the clock starts here: envs and model are built, as rlpar's are
    model.learn(total_timesteps=total, callback=watch)
    wall = time.perf_counter() - watch.start
    episodes = int(cfg["eval"]["episodes"])

    def evaluate(greedy: bool, eval_seed: int) -> dict[str, Any]:
        """``episodes`` whole episodes on 16 new envs, each playing its quota (as rlpar's
        evaluate_policy, so short episodes do not crowd out long ones)."""
        envs: VecEnv = make_vec_env(env_id, n_envs=EVAL_ENVS, seed=eval_seed, env_kwargs=env_kwargs)
        quota = np.array(
            [episodes // EVAL_ENVS + (i < episodes % EVAL_ENVS) for i in range(EVAL_ENVS)]
        )
        done_count = np.zeros(EVAL_ENVS, np.int64)
        ep_return = np.zeros(EVAL_ENVS)
        returns: list[float] = []
        obs = envs.reset()
        while (done_count < quota).any():
            actions, _ = model.predict(obs, deterministic=greedy)
            obs, rewards, dones, _ = envs.step(actions)  # autoresets; reward is the last one
            ep_return += rewards
            for i in np.flatnonzero(dones):
                if done_count[i] < quota[i]:
                    returns.append(float(ep_return[i]))
                    done_count[i] += 1
            ep_return[dones] = 0.0
        envs.close()
        r = np.asarray(returns)
        return {
            "policy": "greedy" if greedy else "sampled",
            "episodes": len(returns),
            "mean_return": float(r.mean()),
            "std_return": float(r.std()),
        }

    # fresh seeds, apart from the training envs' (seed .. seed + n_envs - 1)
    evaluation = [evaluate(False, 1_000_000 + 1000 * seed), evaluate(True, 2_000_000 + 1000 * seed)]
    window = sum(watch.returns) / len(watch.returns) if watch.returns else None
    return {
        "time_to_target_s": watch.hit[0] if watch.hit else None,
        "steps_to_target": watch.hit[1] if watch.hit else None,
        "env_steps": model.num_timesteps,
        "wall_s": wall,
        "window_mean": window,
        "evaluation": evaluation,
        "torch_threads": torch_threads,
    }


# ------------------------------------------------------------------------------ parent


def locked(cmd: list[str], lock: bool) -> list[str]:
    return ["flock", LOCK, *cmd] if lock else cmd


def run_sb3(algo: str, seed: int, budget: float, threads: int, lock: bool) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--sb3-child", algo, "--seeds", str(seed),
           "--budget", str(budget), "--torch-threads", str(threads)]  # fmt: skip
    out = subprocess.run(locked(cmd, lock), capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def time_to_target(run_dir: Path) -> tuple[float | None, int | None]:
    """(seconds, env steps) at the first ``return/mean`` event at or above the target, from
    the run's event file; seconds count from the config event written before training."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    start = min(e.wall_time for e in events.Tensors("config"))
    for e in events.Scalars("return/mean"):
        if e.value >= TARGET:
            return e.wall_time - start, e.step
    return None, None


def run_rlpar(agent: str, seed: int, budget: float, lock: bool) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "rlpar", "train", str(RLPAR_CONFIGS[agent]), "--json", "--quiet",
           "--set", f"runtime.seed={seed}", "--set", f"runtime.max_wall_s={budget}",
           "--set", "runtime.total_env_steps=1_000_000_000", "--set", "runtime.target_return=none",
           "--set", "eval.interval_env_steps=none",
           # a return/mean point every 10k env steps (a fraction of a second) for the time to 10
           "--set", "log.scalar_points=100_000",
           "--logdir", str(HERE.parent / "runs" / "compare_minatar")]  # fmt: skip
    out = subprocess.run(locked(cmd, lock), capture_output=True, text=True, check=True)
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    seconds, steps = time_to_target(Path(summary["run_dir"]))
    return {
        "time_to_target_s": seconds,
        "steps_to_target": steps,
        "env_steps": summary["env_steps"],
        "wall_s": summary["wall_s"],
        "window_mean": summary["mean_return"],
        "evaluation": [
            {k: e[k] for k in ("policy", "episodes", "mean_return", "std_return")}
            for e in summary["evaluation"]
        ],
    }


def fmt(value: float | None, spec: str = ".1f") -> str:
    return "—" if value is None else format(value, spec)


def eval_of(result: dict[str, Any], policy: str) -> float:
    return next(e["mean_return"] for e in result["evaluation"] if e["policy"] == policy)


def tables(results: dict[str, list[tuple[int, dict[str, Any]]]], budget: float) -> str:
    """Per-seed rows, then medians over seeds (time to 10 only where every seed got there)."""
    head = (
        f"| method | seed | time to {TARGET:.0f} (s) | env steps to {TARGET:.0f} | env steps "
        f"in {budget:.0f} s | wall (s) | window mean at end | eval sampled | eval greedy |\n"
        "|---|---|---|---|---|---|---|---|---|"
    )
    lines = [head]
    for name, runs in results.items():
        for seed, r in runs:
            lines.append(
                f"| {name} | {seed} | {fmt(r['time_to_target_s'])} | "
                f"{fmt(r['steps_to_target'], ',')} | {r['env_steps']:,} | {r['wall_s']:.1f} | "
                f"{fmt(r['window_mean'], '.2f')} | {eval_of(r, 'sampled'):.2f} | "
                f"{eval_of(r, 'greedy'):.2f} |"
            )
    lines += ["", head.replace("| seed ", "| seeds ")]
    for name, runs in results.items():
        rs = [r for _, r in runs]

        def med(key: str, rs: list[dict[str, Any]] = rs) -> float | None:
            values = [r[key] for r in rs]
            return None if None in values else statistics.median(values)

        reached = sum(r["time_to_target_s"] is not None for r in rs)
        to_s = (
            fmt(med("time_to_target_s")) if reached == len(rs) else f"{reached}/{len(rs)} reached"
        )
        lines.append(
            f"| {name} | {len(rs)} | {to_s} | {fmt(med('steps_to_target'), ',.0f')} | "
            f"{statistics.median(r['env_steps'] for r in rs):,.0f} | "
            f"{statistics.median(r['wall_s'] for r in rs):.1f} | "
            f"{fmt(med('window_mean'), '.2f')} | "
            f"{statistics.median(eval_of(r, 'sampled') for r in rs):.2f} | "
            f"{statistics.median(eval_of(r, 'greedy') for r in rs):.2f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--budget", type=float, default=300.0, help="wall seconds per run")
    parser.add_argument("--methods", nargs="+", default=["impala", "appo", "ppo"],
                        choices=["impala", "appo", "rlpar", "ppo", "a2c"],
                        help='"rlpar" is "impala" (its name before APPO)')  # fmt: skip
    parser.add_argument("--torch-threads", type=int, default=2)
    parser.add_argument("--no-lock", action="store_true", help="do not wrap runs in flock")
    parser.add_argument("--out", type=Path, help="also write the raw results here (JSON)")
    parser.add_argument(
        "--probe",
        type=float,
        metavar="SECONDS",
        help="only measure SB3 PPO env steps/s with 1 and 2 torch threads",
    )
    parser.add_argument("--tables", type=Path, help="only print the tables of an --out file")
    parser.add_argument("--sb3-child", choices=["ppo", "a2c"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.tables:
        saved = json.loads(args.tables.read_text())
        print(tables({k: [(s, r) for s, r in v] for k, v in saved.items()}, args.budget))
        return
    if args.sb3_child:
        child = sb3_child(args.sb3_child, args.seeds[0], args.budget, args.torch_threads)
        print(json.dumps(child))
        return
    if args.probe:
        for threads in (1, 2):
            r = run_sb3("ppo", args.seeds[0], args.probe, threads, not args.no_lock)
            print(f"torch threads {threads}: {r['env_steps'] / r['wall_s']:,.0f} env steps/s")
        return
    names = {
        "impala": "rlpar IMPALA (suite config)",
        "appo": "rlpar APPO",
        "ppo": "SB3 PPO",
        "a2c": "SB3 A2C",
    }
    args.methods = ["impala" if m == "rlpar" else m for m in args.methods]
    results: dict[str, list[tuple[int, dict[str, Any]]]] = {names[m]: [] for m in args.methods}
    lock = not args.no_lock
    for seed in args.seeds:  # alternate: every method once per seed, in turn
        for method in args.methods:
            if method in RLPAR_CONFIGS:
                r = run_rlpar(method, seed, args.budget, lock)
            else:
                r = run_sb3(method, seed, args.budget, args.torch_threads, lock)
            results[names[method]].append((seed, r))
            print(f"seed {seed} {names[method]}: {json.dumps(r)}", file=sys.stderr, flush=True)
            if args.out:
                args.out.write_text(json.dumps(results, indent=1) + "\n")
    print(tables(results, args.budget))


if __name__ == "__main__":
    main()
