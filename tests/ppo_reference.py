"""A slow, obviously-correct float64 reference of PPO's loss on asynchronous rollouts
(``rlpar.ppo_loss``), written like the papers' formulas and with no attention to speed:

- the ratio against the behaviour policy that acted, ``r_t = pi(a_t|x_t) / mu(a_t|x_t)``;
- V-trace targets (Espeholt et al. 2018, eq. 1, with the lambda of its section 4.2) as the
  paper's *sum*::

      vs_t = V(x_t) + sum_{s=t}^{e-1} gamma^{s-t} (prod_{i=t}^{s-1} lambda c_i) rho_s delta_s
      delta_s = r_s + gb_s V(x_{s+1}) - V(x_s),  rho_s = min(rho_bar, r_s), c_i = min(c_bar, r_i)

- the advantage: "vtrace" ``A_t = r_t + gb_t vnext_t - V(x_t)`` (``vnext_t = vs_{t+1}`` inside
  the episode and the unroll, else ``V(x_{t+1})``); "gae" ``A_t = vs_t - V(x_t)``;
- PPO's clipped surrogate (Schulman et al. 2017, eq. 7) on the normalised advantages, PPO2's
  clipped value loss, and the entropy bonus, as means over the valid steps.

Episode rules as in ``loss_reference.py`` (gymnasium NEXT_STEP autoreset).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from loss_reference import (
    Layout,
    check_runtime_invariant,
    episode_end,
    importance_ratios,
    log_prob_and_entropy,
)
from reference import numerical_grad


@dataclass(frozen=True)
class PpoTargets:
    """What the loss treats as constants (stop-gradient), float64 [T, N]."""

    vs_t: np.ndarray
    adv_t: np.ndarray
    norm_adv_t: np.ndarray
    ratio_t: np.ndarray


def ppo_targets(
    out, behaviour, actions, rewards, terminated, truncated, mask, *, layout: Layout, o,
    value_mean=0.0, value_std=1.0,
) -> PpoTargets:  # fmt: skip
    """``o``: an `rlpar.PpoOptions`."""
    out = np.asarray(out, np.float64)
    behaviour = np.asarray(behaviour, np.float64)
    terminated, truncated, mask = (np.asarray(x, bool) for x in (terminated, truncated, mask))
    check_runtime_invariant(terminated, truncated, mask)
    r_t = np.asarray(rewards, np.float64)
    T, N = mask.shape
    done = terminated | truncated
    v = value_mean + value_std * out[:, :, layout.value_col]  # V(x_0..x_T)

    ratio_t = importance_ratios(out, behaviour, actions, mask, layout)

    vs_t = np.full((T, N), np.nan)
    for n in range(N):
        for t in range(T):
            if not mask[t, n]:
                continue
            total = v[t, n]
            for s in range(t, episode_end(t, n, done, mask)):
                trace = math.prod(o.gae_lambda * min(o.c_bar, ratio_t[i, n]) for i in range(t, s))
                gb = 0.0 if terminated[s, n] else o.gamma
                delta = r_t[s, n] + gb * v[s + 1, n] - v[s, n]
                total += o.gamma ** (s - t) * trace * min(o.rho_bar, ratio_t[s, n]) * delta
            vs_t[t, n] = total

    adv_t = np.full((T, N), np.nan)
    for n in range(N):
        for t in range(T):
            if not mask[t, n]:
                continue
            if o.advantage == "gae":
                adv_t[t, n] = vs_t[t, n] - v[t, n]
                continue
            vnext = v[t + 1, n] if done[t, n] or t == T - 1 else vs_t[t + 1, n]
            gb = 0.0 if terminated[t, n] else o.gamma
            adv_t[t, n] = r_t[t, n] + gb * vnext - v[t, n]

    valid = adv_t[mask]
    norm = adv_t.copy()
    if o.normalize_advantages and valid.size:
        norm = (adv_t - valid.mean()) / (valid.std() + 1e-8)
    return PpoTargets(vs_t, adv_t, norm, ratio_t)


def ppo_loss_given_targets(
    out, behaviour, actions, mask, tg: PpoTargets, *, layout: Layout, o, value_mean=0.0,
    value_std=1.0,
) -> dict[str, float]:  # fmt: skip
    """The loss and its metrics with ``tg``'s targets constant: a function of ``out`` whose
    gradient is the kernel's ``dout`` (the ratio is recomputed from ``out``)."""
    out = np.asarray(out, np.float64)
    mask = np.asarray(mask, bool)
    T, N = mask.shape
    hi = 1 + o.clip_eps
    lo = 1 - o.clip_eps if o.ratio_clip == "symmetric" else 1 / (1 + o.clip_eps)
    sums = dict.fromkeys(
        "policy_loss value_loss entropy approx_kl clip_fraction value_clip_fraction "
        "ratio_mean".split(),
        0.0,
    )
    ratios, valid = [], 0
    for t in range(T):
        for n in range(N):
            if not mask[t, n]:
                continue
            log_pi, h_t = log_prob_and_entropy(out[t, n], actions[t, n], layout)
            log_mu, _ = log_prob_and_entropy(behaviour[t, n], actions[t, n], layout)
            r = math.exp(log_pi - log_mu)
            a = tg.norm_adv_t[t, n]
            sums["policy_loss"] += -min(r * a, min(hi, max(lo, r)) * a)
            y = (tg.vs_t[t, n] - value_mean) / value_std
            pred = out[t, n, layout.value_col]
            lv = 0.5 * (pred - y) ** 2
            if o.value_clip > 0:
                old = behaviour[t, n, layout.value_col]
                clipped = old + min(o.value_clip, max(-o.value_clip, pred - old))
                lc = 0.5 * (clipped - y) ** 2
                sums["value_clip_fraction"] += lc > lv
                lv = max(lv, lc)
            sums["value_loss"] += lv
            sums["entropy"] += h_t
            sums["approx_kl"] += (r - 1) - math.log(r)
            sums["clip_fraction"] += r < lo or r > hi
            sums["ratio_mean"] += r
            ratios.append(r)
            valid += 1
    m = {k: x / valid if valid else 0.0 for k, x in sums.items()}
    m["loss"] = m["policy_loss"] + o.baseline_cost * m["value_loss"] - o.entropy_cost * m["entropy"]
    m["ratio_min"] = min(ratios, default=1.0)
    m["ratio_max"] = max(ratios, default=1.0)
    m["valid_steps"] = valid
    vs = tg.vs_t[mask]
    v = value_mean + value_std * out[:-1, :, layout.value_col][mask]
    m["mean_advantage"] = float(tg.adv_t[mask].mean()) if valid else 0.0
    m["advantage_std"] = float(tg.adv_t[mask].std()) if valid else 0.0
    m["mean_value"] = float(v.mean()) if valid else 0.0
    m["target_mean"] = float(vs.mean()) if valid else 0.0
    m["target_sq_mean"] = float((vs**2).mean()) if valid else 0.0
    var_y = float(vs.var()) if valid else 0.0
    m["explained_variance"] = 1 - float((vs - v).var()) / var_y if var_y > 1e-12 else 0.0
    return m


def ppo_loss(out, behaviour, actions, rewards, terminated, truncated, mask, *, layout, o, **stats):
    """(metrics, targets) of ``rlpar.ppo_loss`` with options ``o`` and value statistics."""
    tg = ppo_targets(
        out, behaviour, actions, rewards, terminated, truncated, mask, layout=layout, o=o, **stats
    )
    return ppo_loss_given_targets(
        out, behaviour, actions, mask, tg, layout=layout, o=o, **stats
    ), tg


def numerical_dout(out, behaviour, actions, mask, tg, *, layout, o, eps=1e-6, **stats):
    """Central differences of `ppo_loss_given_targets` w.r.t. every element of ``out``."""

    def loss(x):
        m = ppo_loss_given_targets(x, behaviour, actions, mask, tg, layout=layout, o=o, **stats)
        return m["loss"]

    return numerical_grad(loss, out, eps=eps)
