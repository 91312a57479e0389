"""Stable-Baselines3 PPO on a gymnasium env for a wall-clock budget, then evaluated: the peer
beside rlpar's rows for envs whose observations are not a Box (Taxi, DoorKey).

SB3 sees what rlpar's net sees: a Discrete observation one-hot (SB3's own preprocessing), a
Dict observation with ``--drop-keys`` left out and the rest flattened by gymnasium's
``FlattenObservation`` (rlpar's `rlpar.spaces` encoding: the same values, in the same order).
PPO runs with SB3's defaults (2048 steps per env, 10 epochs of minibatches of 64, lr 3e-4,
GAE 0.95, clip 0.2) on ``--envs`` envs in one process, with ``--ent-coef`` (0 by default, as
SB3's). After the budget, the policy plays ``--episodes`` episodes on fresh seeds, greedy and
sampled. Prints one JSON object.

SB3 and torch are optional and never rlpar dependencies::

    pip install torch==2.13.0 stable-baselines3
    python experiments/sb3_ppo_budget.py Taxi-v4 --budget 300 --seed 0
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Train for ``args.budget`` seconds, then evaluate; the figures as a dict."""
    import gymnasium as gym
    import numpy as np
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env

    torch.set_num_threads(args.torch_threads)
    if args.setup:
        __import__(args.setup)

    def wrap(env: gym.Env) -> gym.Env:
        if isinstance(env.observation_space, gym.spaces.Dict):
            if args.drop_keys:
                env = gym.wrappers.FilterObservation(
                    env, [k for k in env.observation_space.spaces if k not in args.drop_keys]
                )
            env = gym.wrappers.FlattenObservation(env)
        return env

    env = make_vec_env(args.env, n_envs=args.envs, seed=args.seed, wrapper_class=wrap)
    model = PPO("MlpPolicy", env, ent_coef=args.ent_coef, seed=args.seed, device="cpu")

    class Budget(BaseCallback):
        def __init__(self) -> None:
            super().__init__()
            self.start = time.perf_counter()

        def _on_step(self) -> bool:
            return time.perf_counter() - self.start < args.budget

    start = time.perf_counter()
    model.learn(total_timesteps=10**9, callback=Budget())
    wall = time.perf_counter() - start
    out: dict[str, Any] = {
        "env": args.env, "seed": args.seed, "wall_s": round(wall, 1),
        "env_steps": int(model.num_timesteps),
    }  # fmt: skip
    for policy, deterministic in (("greedy", True), ("sampled", False)):
        returns = []
        single = wrap(gym.make(args.env))
        for i in range(args.episodes):
            obs, _ = single.reset(seed=10_000 + args.seed * args.episodes + i)
            total, done = 0.0, False
            while not done:
                action, _ = model.predict(obs, deterministic=deterministic)
                action = action.item() if action.shape == () else action
                obs, reward, terminated, truncated, _ = single.step(action)
                total += float(reward)
                done = terminated or truncated
            returns.append(total)
        out[policy] = round(float(np.mean(returns)), 3)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("env", help="gymnasium env id, e.g. Taxi-v4")
    parser.add_argument("--budget", type=float, default=300.0, help="training seconds")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--envs", type=int, default=8, help="envs (DummyVecEnv)")
    parser.add_argument("--ent-coef", type=float, default=0.0)
    parser.add_argument("--episodes", type=int, default=1000, help="evaluation episodes")
    parser.add_argument("--drop-keys", nargs="*", default=[], help="Dict keys to leave out")
    parser.add_argument("--setup", default="", help="module to import first (e.g. minigrid)")
    parser.add_argument("--torch-threads", type=int, default=1)
    print(json.dumps(run(parser.parse_args())))


if __name__ == "__main__":
    main()
