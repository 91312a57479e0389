"""Time to a mean return of 475 on CartPole-v1: rlpar vs Stable-Baselines3, side by side.

Runs SB3 PPO and A2C with the rl-zoo hyper-parameters and rlpar's CartPole configs alternately
on the same seeds, each in a fresh subprocess, and prints a Markdown table (medians and ratios)
for experiments/RESULTS.md. SB3 and torch are optional and never rlpar dependencies:

    pip install torch==2.13.0 stable-baselines3
    python experiments/compare_sb3.py --seeds 0 1 2 3 4
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import textwrap
from pathlib import Path

HERE = Path(__file__).resolve().parent
TARGET = 475.0
WINDOW = 20

SB3 = textwrap.dedent(
    """
    import json, sys, time
    from collections import deque
    import torch
    from stable_baselines3 import A2C, PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env

    algo, seed, target = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    window, budget = int(sys.argv[4]), int(sys.argv[5])
    torch.set_num_threads(1)

    def lin(v):
        return lambda progress: progress * v

    class Stop(BaseCallback):
        def __init__(self):
            super().__init__()
            self.returns, self.hit = deque(maxlen=window), None
        def _on_step(self):
            for info in self.locals["infos"]:
                if "episode" in info:
                    self.returns.append(info["episode"]["r"])
            if len(self.returns) == window and sum(self.returns) / window >= target:
                self.hit = self.num_timesteps
                return False
            return True

    start = time.perf_counter()
    env = make_vec_env("CartPole-v1", n_envs=8, seed=seed)
    if algo == "ppo":   # rl-zoo hyperparams/ppo.yml, CartPole-v1
        model = PPO("MlpPolicy", env, n_steps=32, batch_size=256, gae_lambda=0.8, gamma=0.98,
                    n_epochs=20, ent_coef=0.0, learning_rate=lin(0.001), clip_range=lin(0.2),
                    seed=seed, device="cpu")
    else:               # rl-zoo hyperparams/a2c.yml, CartPole-v1
        model = A2C("MlpPolicy", env, ent_coef=0.0, seed=seed, device="cpu")
    cb = Stop()
    model.learn(total_timesteps=budget, callback=cb)
    wall = time.perf_counter() - start
    hit = wall if cb.hit else None
    print(json.dumps({"time_to_target_s": hit, "env_steps": cb.hit or budget, "wall_s": wall}))
    """
)


def run_sb3(algo: str, seed: int, budget: int) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", SB3, algo, str(seed), str(TARGET), str(WINDOW), str(budget)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_rlpar(config: str, seed: int) -> dict:
    out = subprocess.run(
        [sys.executable, "-m", "rlpar", "train", str(HERE / f"{config}.toml"), "--json", "--quiet",
         "--set", f"runtime.seed={seed}", "--logdir", str(HERE.parent / "runs" / "compare")],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--budget", type=int, default=500_000, help="SB3 env-step budget")
    args = parser.parse_args()
    runners = {
        "rlpar cartpole_impala": lambda s: run_rlpar("cartpole_impala", s),
        "rlpar cartpole_a3c": lambda s: run_rlpar("cartpole_a3c", s),
        "SB3 PPO (rl-zoo)": lambda s: run_sb3("ppo", s, args.budget),
        "SB3 A2C (rl-zoo)": lambda s: run_sb3("a2c", s, args.budget),
    }
    times: dict[str, list[float | None]] = {name: [] for name in runners}
    for seed in args.seeds:  # alternate: every method once per seed, in turn
        for name, run in runners.items():
            result = run(seed)
            times[name].append(result["time_to_target_s"])
            print(f"seed {seed} {name}: {result['time_to_target_s']}", file=sys.stderr)

    def median(values: list[float | None]) -> float | None:
        solved = [v for v in values if v is not None]
        return statistics.median(solved) if len(solved) == len(values) else None

    best = min(
        (m for m in (median(times[n]) for n in runners if n.startswith("rlpar")) if m),
        default=None,
    )
    print(f"| method | time to {TARGET:.0f} per seed (s) | median (s) | vs best rlpar |")
    print("|---|---|---|---|")
    for name, values in times.items():
        med = median(values)
        cells = ", ".join("—" if v is None else f"{v:.2f}" for v in values)
        ratio = f"{med / best:.1f}×" if med and best else "—"
        print(f"| {name} | {cells} | {'—' if med is None else f'{med:.2f}'} | {ratio} |")


if __name__ == "__main__":
    main()
