"""Slow, obviously-correct float64 references of the actor-critic losses (``rlpar.losses``).

Written close to the papers' notation and with no attention to speed, so the native kernel has a
twin that reaches the same numbers by a different road:

- V-trace targets (Espeholt et al. 2018, eq. 1) as the paper's *sum*, not as the recursion the
  kernel uses::

      vs_t = V(x_t) + sum_{s=t}^{t+n-1} gamma^{s-t} (prod_{i=t}^{s-1} c_i) delta_s V
      delta_s V = rho_s (r_s + gamma V(x_{s+1}) - V(x_s))

- A3C n-step returns (Mnih et al. 2016) as a discounted sum of rewards to the episode's or the
  unroll's end, plus the discounted bootstrap value there.

Episode boundaries follow ``rlpar/data.py`` (gymnasium's NEXT_STEP autoreset): step
``t`` ends an episode when ``terminated_t | truncated_t``; ``x_{t+1}`` is then the episode's final
observation and step ``t + 1`` is the env's reset step, ``mask_{t+1} = 0``. So in the sum:

- the discount of a trace is ``gt_i = gamma (1 - done_i)``: the sum stops at the episode's end;
- the bootstrap in ``delta_s`` is ``gb_s = gamma (1 - terminated_s)``: a truncated episode still
  bootstraps from ``V(x_{s+1})``, a terminated one does not (termination wins if both are set);
- a step with ``mask_t = 0`` carries no loss and nothing flows through it.

Shapes: ``out [T+1, N, O]``, ``behaviour [T, N, O]``, per-step arrays ``[T, N]``, gaussian actions
``[T, N, A]``. Per-step quantities carry a ``_t`` suffix and are ``[T, N]`` float64.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from reference import numerical_grad

HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)


@dataclass(frozen=True)
class Layout:
    """Where the policy and the value live in a net output row (the columns of ``out``)."""

    policy: str
    policy_begin: int
    num_actions: int
    value_col: int
    log_std_begin: int = 0
    action_dims: tuple[int, ...] = ()
    """multi_categorical: the logits of each action dimension, side by side from policy_begin."""


@dataclass(frozen=True)
class Targets:
    """What the loss treats as constants (stop-gradient), all float64 ``[T, N]``."""

    vs_t: np.ndarray
    """Value targets: V-trace targets, or n-step returns without importance weighting."""
    adv_t: np.ndarray
    """Policy-gradient advantages A_t."""
    ratio_t: np.ndarray
    """pi(a_t|x_t) / mu(a_t|x_t), 1 without importance weighting (nan where mask_t = 0)."""
    rho_t: np.ndarray
    """min(rho_bar, ratio_t) (1 without importance weighting: A3C has no clipping)."""
    clipped_t: np.ndarray
    """ratio_t > rho_bar (never without importance weighting)."""


# ------------------------------------------------------------------------------ policies


def categorical_log_prob_and_entropy(logits: list[float], action) -> tuple[float, float]:
    """``log softmax(logits)[action]`` and the softmax's entropy."""
    top = max(logits)
    log_z = top + math.log(sum(math.exp(logit - top) for logit in logits))
    log_pi = [logit - log_z for logit in logits]
    return log_pi[int(action)], -sum(math.exp(lp) * lp for lp in log_pi)


def log_prob_and_entropy(row: np.ndarray, action, layout: Layout) -> tuple[float, float]:
    """``log pi(a|x)`` and ``H(pi(.|x))`` of the policy in one output row ``[O]``."""
    b, n = layout.policy_begin, layout.num_actions
    if layout.policy == "categorical":
        return categorical_log_prob_and_entropy([float(row[b + j]) for j in range(n)], action)
    if layout.policy == "multi_categorical":  # independent dimensions: the terms add
        log_prob, entropy = 0.0, 0.0
        for d, size in enumerate(layout.action_dims):
            logits = [float(row[b + j]) for j in range(size)]
            lp, h = categorical_log_prob_and_entropy(logits, action[d])
            log_prob, entropy, b = log_prob + lp, entropy + h, b + size
        return log_prob, entropy
    log_prob, entropy = 0.0, 0.0
    for k in range(n):
        mean = float(row[b + k])
        log_std = float(row[layout.log_std_begin + k])
        std = math.exp(log_std)
        a_k = float(action[k])
        log_prob += -((a_k - mean) ** 2) / (2 * std**2) - log_std - HALF_LOG_2PI
        entropy += log_std + 0.5 + HALF_LOG_2PI
    return log_prob, entropy


# ------------------------------------------------------------------------- episode rules


def check_runtime_invariant(terminated, truncated, mask) -> None:
    """The rollouts' invariant: the step after an episode's end is the autoreset step,
    ``mask[t+1] = not (terminated[t] or truncated[t])``."""
    T, N = mask.shape
    for n in range(N):
        for t in range(T - 1):
            done_t = bool(terminated[t, n]) or bool(truncated[t, n])
            if bool(mask[t + 1, n]) == done_t:
                raise ValueError(f"mask[{t + 1}, {n}] breaks mask[t+1] = not done[t]")


def episode_end(t: int, n: int, done, mask) -> int:
    """One past the last step of the episode segment that starts at valid step ``t``: the step
    after the first ``done`` at or after ``t``, or ``T`` (the unroll's end)."""
    T = mask.shape[0]
    s = t
    while s < T and mask[s, n]:
        if done[s, n]:
            return s + 1
        s += 1
    return s


# ---------------------------------------------------------------------------------- targets


def importance_ratios(out, behaviour, actions, mask, layout: Layout) -> np.ndarray:
    """``ratio_t = pi(a_t|x_t) / mu(a_t|x_t)`` from ``out[t]`` (pi) and ``behaviour[t]`` (mu)."""
    T, N = mask.shape
    ratio_t = np.full((T, N), np.nan)
    for t in range(T):
        for n in range(N):
            if mask[t, n]:
                log_pi, _ = log_prob_and_entropy(out[t, n], actions[t, n], layout)
                log_mu, _ = log_prob_and_entropy(behaviour[t, n], actions[t, n], layout)
                ratio_t[t, n] = math.exp(log_pi - log_mu)
    return ratio_t


def vtrace_targets(v, r_t, terminated, truncated, mask, ratio_t, gamma, rho_bar, c_bar, pg_rho_bar):
    """V-trace (Espeholt et al. 2018) in the paper's sum form. ``v [T+1, N]`` holds V(x_0..x_T).

    Returns ``vs_t`` and ``A_t = rho_pg_t (r_t + gb_t vnext_t - V(x_t))`` with
    ``vnext_t = V(x_{t+1})`` if the episode ends at ``t``, else ``vs_{t+1}`` (``vs_T = V(x_T)``).
    """
    T, N = r_t.shape
    done = np.logical_or(terminated, truncated)
    rho_t = np.minimum(rho_bar, ratio_t)
    c_t = np.minimum(c_bar, ratio_t)
    rho_pg_t = np.minimum(pg_rho_bar, ratio_t)
    gb_t = np.where(terminated, 0.0, gamma)

    delta_t = np.zeros((T, N))
    for s in range(T):
        for n in range(N):
            if mask[s, n]:
                delta_t[s, n] = rho_t[s, n] * (r_t[s, n] + gb_t[s, n] * v[s + 1, n] - v[s, n])

    vs_t = np.full((T, N), np.nan)
    for n in range(N):
        for t in range(T):
            if not mask[t, n]:
                continue
            total = v[t, n]
            for s in range(t, episode_end(t, n, done, mask)):
                trace = math.prod(c_t[i, n] for i in range(t, s))
                total += gamma ** (s - t) * trace * delta_t[s, n]
            vs_t[t, n] = total

    adv_t = np.full((T, N), np.nan)
    for n in range(N):
        for t in range(T):
            if not mask[t, n]:
                continue
            if done[t, n] or t == T - 1:
                vnext = v[t + 1, n]
            else:
                vnext = vs_t[t + 1, n]
            adv_t[t, n] = rho_pg_t[t, n] * (r_t[t, n] + gb_t[t, n] * vnext - v[t, n])
    return vs_t, adv_t


def nstep_returns(v, r_t, terminated, truncated, mask, gamma):
    """A3C returns ``R_t = sum_{s=t}^{e-1} gamma^{s-t} r_s + gamma^{e-t} B``, summed directly:
    ``e`` ends the episode segment; ``B`` is 0 after a termination, ``V(x_e)`` after a truncation
    or at the unroll's end (``e = T``)."""
    T, N = r_t.shape
    done = np.logical_or(terminated, truncated)
    R_t = np.full((T, N), np.nan)
    for n in range(N):
        for t in range(T):
            if not mask[t, n]:
                continue
            e = episode_end(t, n, done, mask)
            rewards = sum(gamma ** (s - t) * r_t[s, n] for s in range(t, e))
            bootstrap = 0.0 if terminated[e - 1, n] else v[e, n]
            R_t[t, n] = rewards + gamma ** (e - t) * bootstrap
    return R_t


def targets(
    out,
    behaviour,
    actions,
    rewards,
    terminated,
    truncated,
    mask,
    *,
    layout: Layout,
    gamma,
    importance_weighting,
    rho_bar=1.0,
    c_bar=1.0,
    pg_rho_bar=1.0,
) -> Targets:
    """Value targets and advantages from the unperturbed outputs (held constant by the loss)."""
    out = np.asarray(out, np.float64)
    terminated, truncated, mask = (np.asarray(x, bool) for x in (terminated, truncated, mask))
    r_t = np.asarray(rewards, np.float64)
    check_runtime_invariant(terminated, truncated, mask)
    v = out[:, :, layout.value_col]
    if importance_weighting:
        behaviour = np.asarray(behaviour, np.float64)
        ratio_t = importance_ratios(out, behaviour, actions, mask, layout)
        vs_t, adv_t = vtrace_targets(
            v, r_t, terminated, truncated, mask, ratio_t, gamma, rho_bar, c_bar, pg_rho_bar
        )
        rho_t = np.minimum(rho_bar, ratio_t)
        return Targets(vs_t, adv_t, ratio_t, rho_t, np.nan_to_num(ratio_t) > rho_bar)
    R_t = nstep_returns(v, r_t, terminated, truncated, mask, gamma)
    ones = np.where(mask, 1.0, np.nan)
    return Targets(R_t, R_t - v[:-1], ones, ones, np.zeros(mask.shape, bool))


# ------------------------------------------------------------------------------------- loss


def loss_given_targets(
    out, actions, mask, tg: Targets, *, layout: Layout, baseline_cost, entropy_cost
) -> dict[str, float]:
    """``L = mean_t [ -A_t log pi(a_t|x_t) + baseline_cost 0.5 (vs_t - V(x_t))^2
    - entropy_cost H_t ]`` over valid steps, with ``vs_t`` and ``A_t`` constants: a function of
    ``out`` whose gradient is the kernel's ``dout``."""
    out = np.asarray(out, np.float64)
    T, N = mask.shape
    policy_loss = value_loss = entropy = 0.0
    rho_sum = clipped = adv_sum = value_sum = 0.0
    valid = 0
    for t in range(T):
        for n in range(N):
            if not mask[t, n]:
                continue
            log_pi, H_t = log_prob_and_entropy(out[t, n], actions[t, n], layout)
            v_t = out[t, n, layout.value_col]
            policy_loss += -tg.adv_t[t, n] * log_pi
            value_loss += 0.5 * (tg.vs_t[t, n] - v_t) ** 2
            entropy += H_t
            rho_sum += tg.rho_t[t, n]
            clipped += tg.clipped_t[t, n]
            adv_sum += tg.adv_t[t, n]
            value_sum += v_t
            valid += 1
    scale = 1.0 / valid if valid else 0.0
    m = {
        "policy_loss": policy_loss * scale,
        "value_loss": value_loss * scale,
        "entropy": entropy * scale,
        "mean_rho": rho_sum * scale,
        "rho_clipped_fraction": clipped * scale,
        "mean_advantage": adv_sum * scale,
        "mean_value": value_sum * scale,
        "valid_steps": valid,
    }
    m["loss"] = m["policy_loss"] + baseline_cost * m["value_loss"] - entropy_cost * m["entropy"]
    return m


def actor_critic_loss(
    out,
    behaviour,
    actions,
    rewards,
    terminated,
    truncated,
    mask,
    *,
    policy,
    policy_begin,
    num_actions,
    value_col,
    gamma,
    importance_weighting,
    rho_bar,
    c_bar,
    pg_rho_bar,
    baseline_cost,
    entropy_cost,
    log_std_begin=0,
    action_dims=(),
) -> tuple[dict[str, float], Targets]:
    """The metrics of ``rlpar.actor_critic_loss`` (its options as keywords, every one given: the
    defaults are `rlpar.LossOptions`'s alone) and the targets behind them."""
    layout = Layout(policy, policy_begin, num_actions, value_col, log_std_begin, tuple(action_dims))
    mask = np.asarray(mask, bool)
    arrays = (out, behaviour, actions, rewards, terminated, truncated, mask)
    clipping = {"rho_bar": rho_bar, "c_bar": c_bar, "pg_rho_bar": pg_rho_bar}
    tg = targets(
        *arrays, layout=layout, gamma=gamma, importance_weighting=importance_weighting, **clipping
    )
    costs = {"baseline_cost": baseline_cost, "entropy_cost": entropy_cost}
    return loss_given_targets(out, actions, mask, tg, layout=layout, **costs), tg


def numerical_dout(
    out, actions, mask, tg: Targets, *, layout: Layout, baseline_cost, entropy_cost, eps=1e-6
) -> np.ndarray:
    """Central differences of ``loss_given_targets`` w.r.t. every element of ``out [T+1, N, O]``
    (targets held fixed)."""
    mask = np.asarray(mask, bool)
    costs = {"baseline_cost": baseline_cost, "entropy_cost": entropy_cost}

    def loss(y):
        return loss_given_targets(y, actions, mask, tg, layout=layout, **costs)["loss"]

    return numerical_grad(loss, out, eps=eps)
