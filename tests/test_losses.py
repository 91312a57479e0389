"""The native actor-critic loss (``rlpar.actor_critic_loss``) against the slow float64 reference
in ``loss_reference.py``: metrics, every element of the gradient, properties that must hold
(on-policy V-trace is A3C, clipping, masked rows, termination vs truncation) and bad inputs.

Batches respect the runtime's invariant ``mask[t+1] = not (terminated[t] or truncated[t])``
(gymnasium NEXT_STEP autoreset, see ``rlpar/data.py``); the rewards of masked steps
are noise rather than the runtime's 0, so that a loss reading them would show.
"""

from __future__ import annotations

import dataclasses
import itertools
import re

import loss_reference as lref
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import rlpar

# Value column first (categorical) or last (gaussian), one unused column each: its dout must be 0.
CAT = {"policy": "categorical", "policy_begin": 1, "num_actions": 3, "value_col": 0}
GAUSS = dict(policy="gaussian", policy_begin=0, num_actions=2, log_std_begin=2, value_col=5)
# Three action dimensions of 2, 3 and 1 choices (a dimension of one choice has log-prob 0).
MULTI = dict(policy="multi_categorical", policy_begin=1, num_actions=6, value_col=0,
             action_dims=(2, 3, 1))  # fmt: skip
LAYOUTS = {"categorical": (CAT, 5), "gaussian": (GAUSS, 6), "multi_categorical": (MULTI, 8)}
POLICIES = list(LAYOUTS)
METRICS = (
    "loss policy_loss value_loss entropy mean_rho rho_clipped_fraction mean_advantage mean_value "
    "valid_steps"
).split()
ARRAYS = ("out", "behaviour", "actions", "rewards", "terminated", "truncated", "mask")


def make_batch(
    rng: np.random.Generator,
    T: int,
    N: int,
    policy: str,
    *,
    forced: dict[tuple[int, int], str] | None = None,
    p_term: float = 0.15,
    p_trunc: float = 0.15,
    p_reset0: float = 0.2,
    off_policy: float = 0.3,
) -> tuple[dict[str, np.ndarray], dict]:
    """Random arrays for one loss call, and the layout keywords.

    ``forced[(t, n)]`` ends column ``n``'s episode at step ``t`` ("terminated", "truncated" or
    "both"), or makes ``t = 0`` the autoreset step of an episode that ended in the previous
    unroll ("reset"). Elsewhere episodes end at random. ``behaviour`` is ``out[:T]`` plus noise
    of scale ``off_policy``; actions are sampled from the behaviour policy.
    """
    forced = forced or {}
    layout, width = LAYOUTS[policy]
    out = rng.standard_normal((T + 1, N, width)).astype(np.float32)
    A = layout["num_actions"]
    if policy == "gaussian":
        ls = layout["log_std_begin"]
        out[:, :, ls : ls + A] = rng.uniform(-1.0, 0.5, (T + 1, N, A))
    behaviour = out[:T] + off_policy * rng.standard_normal((T, N, width)).astype(np.float32)
    b = layout["policy_begin"]
    if policy == "categorical":
        gumbel = -np.log(-np.log(rng.random((T, N, A))))
        actions = np.argmax(behaviour[:, :, b : b + A] + gumbel, axis=2).astype(np.int64)
    elif policy == "multi_categorical":
        noisy = behaviour[:, :, b : b + A] - np.log(-np.log(rng.random((T, N, A))))
        cuts = np.cumsum((0, *layout["action_dims"]))
        parts = [np.argmax(noisy[:, :, lo:hi], axis=2) for lo, hi in itertools.pairwise(cuts)]
        actions = np.stack(parts, axis=2).astype(np.int64)
    else:
        std = np.exp(behaviour[:, :, ls : ls + A])
        noise = rng.standard_normal((T, N, A))
        actions = (behaviour[:, :, b : b + A] + std * noise).astype(np.float32)

    terminated = np.zeros((T, N), bool)
    truncated = np.zeros((T, N), bool)
    mask = np.zeros((T, N), bool)
    for n in range(N):
        kind0 = forced.get((0, n))
        prev_done = kind0 == "reset" or (kind0 is None and rng.random() < p_reset0)
        for t in range(T):
            mask[t, n] = not prev_done
            kind = forced.get((t, n))
            next_forced = forced.get((t + 1, n)) not in (None, "reset")
            if not mask[t, n] or next_forced:
                pass  # the env's reset step never ends an episode; a forced end needs a valid step
            elif kind in ("terminated", "truncated", "both"):
                terminated[t, n] = kind in ("terminated", "both")
                truncated[t, n] = kind in ("truncated", "both")
            else:
                u = rng.random()
                terminated[t, n] = u < p_term or u > 0.97
                truncated[t, n] = p_term <= u < p_term + p_trunc or u > 0.97
            prev_done = terminated[t, n] or truncated[t, n]
    arrays = {
        "out": out,
        "behaviour": behaviour,
        "actions": actions,
        "rewards": rng.standard_normal((T, N)).astype(np.float32),
        "terminated": terminated,
        "truncated": truncated,
        "mask": mask,
    }
    return arrays, dict(layout)


OPTIONS = {f.name for f in dataclasses.fields(rlpar.LossOptions)}


def layout_and_options(kw: dict) -> tuple[dict, rlpar.LossOptions]:
    """The layout keywords in ``kw``, and its loss options (the rest) as `rlpar.LossOptions`."""
    layout = {k: v for k, v in kw.items() if k not in OPTIONS}
    return layout, rlpar.LossOptions(**{k: v for k, v in kw.items() if k in OPTIONS})


def native(arrays: dict, **kw):
    layout, options = layout_and_options(kw)
    return rlpar.actor_critic_loss(*(arrays[k] for k in ARRAYS), **layout, options=options)


def reference(arrays: dict, **kw):
    layout, options = layout_and_options(kw)
    twin_kw = {**layout, **dataclasses.asdict(options)}
    return lref.actor_critic_loss(*(arrays[k] for k in ARRAYS), **twin_kw)


def numerical_dout(arrays: dict, tg: lref.Targets, kw: dict) -> np.ndarray:
    """Finite differences of the reference loss w.r.t. ``out``, the targets ``tg`` held fixed."""
    layout, options = layout_and_options(kw)
    return lref.numerical_dout(
        arrays["out"], arrays["actions"], arrays["mask"], tg, layout=lref.Layout(**layout),
        baseline_cost=options.baseline_cost, entropy_cost=options.entropy_cost,
    )  # fmt: skip


def assert_metrics_close(got: dict, want: dict, rtol=1e-6, atol=1e-6) -> None:
    for k in METRICS:
        np.testing.assert_allclose(got[k], want[k], rtol=rtol, atol=atol, err_msg=k)


# Episodes that end inside the unroll by every route, plus a column whose step 0 is a reset step.
EVENTS = {
    (2, 0): "terminated",
    (3, 1): "truncated",
    (1, 2): "both",
    (7, 3): "terminated",
    (7, 4): "truncated",
    (0, 5): "reset",
}
BARS = [(1.0, 1.0, 1.0), (2.0, 0.7, 1.5), (0.5, 3.0, 0.8)]


# ------------------------------------------------------------------------- metrics vs reference


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("importance_weighting", [False, True])
@pytest.mark.parametrize("bars", BARS)
@pytest.mark.parametrize("seed", [0, 1])
def test_metrics_match_reference(policy, importance_weighting, bars, seed) -> None:
    rng = np.random.default_rng(seed)
    arrays, kw = make_batch(rng, 8, 6, policy, forced=EVENTS)
    rho_bar, c_bar, pg_rho_bar = bars
    kw.update(gamma=0.9, importance_weighting=importance_weighting, baseline_cost=0.4)
    kw.update(rho_bar=rho_bar, c_bar=c_bar, pg_rho_bar=pg_rho_bar, entropy_cost=0.05)
    _, got = native(arrays, **kw)
    want, tg = reference(arrays, **kw)
    assert_metrics_close(got, want)
    if importance_weighting:  # the batch does exercise clipping, both ways
        ratios = tg.ratio_t[arrays["mask"]]
        assert (ratios > 1).any() and (ratios < 1).any()


def test_every_kind_of_episode_end_is_in_the_batch() -> None:
    arrays, _ = make_batch(np.random.default_rng(0), 8, 6, "categorical", forced=EVENTS)
    te, tr, mask = arrays["terminated"], arrays["truncated"], arrays["mask"]
    assert te[2, 0] and not tr[2, 0] and tr[3, 1] and not te[3, 1] and te[1, 2] and tr[1, 2]
    assert te[7, 3] and tr[7, 4] and not mask[0, 5]
    lref.check_runtime_invariant(te, tr, mask)


@pytest.mark.parametrize("gamma", [0.0, 1.0])
def test_metrics_match_reference_at_extreme_discounts(gamma) -> None:
    arrays, kw = make_batch(np.random.default_rng(3), 6, 4, "categorical", forced=EVENTS)
    kw.update(gamma=gamma, importance_weighting=True, rho_bar=1.2, c_bar=0.9)
    assert_metrics_close(native(arrays, **kw)[1], reference(arrays, **kw)[0])


def test_no_valid_step_gives_zeros() -> None:
    arrays, kw = make_batch(
        np.random.default_rng(0), 1, 2, "gaussian", forced={(0, 0): "reset", (0, 1): "reset"}
    )
    dout, m = native(arrays, gamma=0.99, importance_weighting=True, **kw)
    assert m["valid_steps"] == 0 and m["loss"] == 0.0
    assert not dout.any()


# ------------------------------------------------------------------------ gradient vs reference


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize(
    ("importance_weighting", "bars"), [(False, BARS[0]), (True, BARS[0]), (True, BARS[1])]
)
def test_dout_matches_finite_differences(policy, importance_weighting, bars) -> None:
    """Every element of ``dout [T+1, N, O]``, with the targets held at their unperturbed values."""
    rng = np.random.default_rng(7)
    events = {(0, 0): "terminated", (1, 1): "truncated", (0, 2): "reset"}
    arrays, kw = make_batch(rng, 3, 3, policy, forced=events)
    rho_bar, c_bar, pg_rho_bar = bars
    kw.update(gamma=0.95, importance_weighting=importance_weighting, baseline_cost=0.7)
    kw.update(rho_bar=rho_bar, c_bar=c_bar, pg_rho_bar=pg_rho_bar, entropy_cost=0.2)
    dout, _ = native(arrays, **kw)
    numeric = numerical_dout(arrays, reference(arrays, **kw)[1], kw)
    assert dout.dtype == np.float32 and dout.shape == arrays["out"].shape
    np.testing.assert_allclose(dout, numeric, rtol=1e-5, atol=1e-7)


# ---------------------------------------------------------------------------------- properties

batches = st.fixed_dictionaries(
    {
        "seed": st.integers(0, 2**32 - 1),
        "T": st.integers(1, 6),
        "N": st.integers(1, 4),
        "policy": st.sampled_from(POLICIES),
        "gamma": st.one_of(st.just(1.0), st.floats(0.0, 1.0)),
        "p_end": st.floats(0.0, 0.5),
    }
)


def draw_batch(b: dict, **kwargs):
    rng = np.random.default_rng(b["seed"])
    p = b["p_end"] / 2
    arrays, kw = make_batch(rng, b["T"], b["N"], b["policy"], p_term=p, p_trunc=p, **kwargs)
    return arrays, kw


bar = st.floats(0.1, 5.0)


@settings(max_examples=60, deadline=None)
@given(b=batches, importance_weighting=st.booleans(), rho_bar=bar, c_bar=bar, pg_rho_bar=bar)
def test_random_batches_match_reference(b, importance_weighting, rho_bar, c_bar, pg_rho_bar):
    arrays, kw = draw_batch(b)
    kw.update(gamma=b["gamma"], importance_weighting=importance_weighting, entropy_cost=0.1)
    kw.update(rho_bar=rho_bar, c_bar=c_bar, pg_rho_bar=pg_rho_bar)
    assert_metrics_close(native(arrays, **kw)[1], reference(arrays, **kw)[0])


@settings(max_examples=25, deadline=None)
@given(b=batches, importance_weighting=st.booleans(), rho_bar=bar, c_bar=bar)
def test_random_small_dout_matches_finite_differences(b, importance_weighting, rho_bar, c_bar):
    arrays, kw = draw_batch({**b, "T": min(b["T"], 3), "N": min(b["N"], 2)})
    kw.update(gamma=b["gamma"], importance_weighting=importance_weighting, rho_bar=rho_bar)
    kw.update(c_bar=c_bar, baseline_cost=0.6, entropy_cost=0.1)
    dout, _ = native(arrays, **kw)
    numeric = numerical_dout(arrays, reference(arrays, **kw)[1], kw)
    np.testing.assert_allclose(dout, numeric, rtol=1e-5, atol=1e-6)


@settings(max_examples=60, deadline=None)
@given(b=batches, pg_rho_bar=st.sampled_from([1.0, 1.5, 100.0]))
def test_on_policy_vtrace_is_nstep_return(b, pg_rho_bar) -> None:
    """rho_bar = c_bar = 1 and behaviour == out rows: every ratio is 1, V-trace is A3C."""
    arrays, kw = draw_batch(b)
    arrays["behaviour"] = arrays["out"][:-1].copy()
    kw.update(gamma=b["gamma"], entropy_cost=0.05)
    d_a3c, m_a3c = native(arrays, importance_weighting=False, **kw)
    d_vt, m_vt = native(arrays, importance_weighting=True, pg_rho_bar=pg_rho_bar, **kw)
    np.testing.assert_allclose(d_vt, d_a3c, rtol=1e-6, atol=1e-9)
    assert_metrics_close(m_vt, m_a3c, rtol=1e-9, atol=1e-12)
    # The reference's two formulations (V-trace sum, direct n-step sum) agree too.
    _, tg_vt = reference(arrays, importance_weighting=True, pg_rho_bar=pg_rho_bar, **kw)
    _, tg_a3c = reference(arrays, importance_weighting=False, **kw)
    np.testing.assert_allclose(tg_vt.vs_t, tg_a3c.vs_t, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(tg_vt.adv_t, tg_a3c.adv_t, rtol=1e-12, atol=1e-12)


def with_ratios_above_one(arrays: dict, kw: dict, rng: np.random.Generator) -> None:
    """Make ``mu(a_t|x_t) < pi(a_t|x_t)`` at every step: behaviour = out with the taken action
    made less likely (categorical: its logit lowered, in the first dimension of a
    multi-categorical; gaussian: the mean moved away from it)."""
    out, actions = arrays["out"], arrays["actions"]
    T, N = actions.shape[:2]
    beh = out[:T].copy()
    b, A = kw["policy_begin"], kw["num_actions"]
    for t in range(T):
        for n in range(N):
            if kw["policy"] == "categorical":
                beh[t, n, b + actions[t, n]] -= 0.2 + rng.random()
            elif kw["policy"] == "multi_categorical":  # dimension 0's choice, of two
                beh[t, n, b + actions[t, n, 0]] -= 0.2 + rng.random()
            else:
                a, mean = actions[t, n], beh[t, n, b : b + A]
                away = (mean - a) * (1.5 + rng.random()) + 0.1 * np.sign(mean - a)
                beh[t, n, b : b + A] = a + away
    arrays["behaviour"] = beh


@settings(max_examples=40, deadline=None)
@given(b=batches, clip=st.one_of(st.just(1.0), st.floats(0.1, 1.0)))
def test_all_ratios_clipped_makes_behaviour_irrelevant(b, clip) -> None:
    """Every ratio above 1 >= rho_bar = c_bar = pg_rho_bar: every weight is the bar, so two
    different behaviour policies give the same bits; with the bars at 1, V-trace is A3C (but for
    the clipped-fraction diagnostic, then 1)."""
    arrays, kw = draw_batch(b)
    kw.update(gamma=b["gamma"], entropy_cost=0.05)
    bars = {"rho_bar": clip, "c_bar": clip, "pg_rho_bar": clip}
    other = dict(arrays)
    with_ratios_above_one(arrays, kw, np.random.default_rng(b["seed"]))
    with_ratios_above_one(other, kw, np.random.default_rng(b["seed"] + 1))
    d_vt, m_vt = native(arrays, importance_weighting=True, **bars, **kw)
    d_other, m_other = native(other, importance_weighting=True, **bars, **kw)
    want, tg = reference(arrays, importance_weighting=True, **bars, **kw)
    assert (tg.ratio_t[arrays["mask"]] > 1).all()
    np.testing.assert_array_equal(d_vt, d_other)
    assert m_vt == m_other
    assert_metrics_close(m_vt, want)
    assert m_vt["rho_clipped_fraction"] == (1.0 if m_vt["valid_steps"] else 0.0)
    if clip == 1.0:
        d_a3c, m_a3c = native(arrays, importance_weighting=False, **kw)
        np.testing.assert_allclose(d_vt, d_a3c, rtol=1e-6, atol=1e-9)
        no_diagnostic = {"rho_clipped_fraction": 0.0}
        assert_metrics_close(m_vt | no_diagnostic, m_a3c, rtol=1e-9, atol=1e-12)


@settings(max_examples=40, deadline=None)
@given(b=batches, scale=st.floats(1.0, 1e6))
def test_bars_above_every_ratio_change_nothing(b, scale) -> None:
    """Once rho_bar, c_bar and pg_rho_bar are at or above the largest ratio, nothing is
    clipped: raising them further changes no bit of the result."""
    arrays, kw = draw_batch(b)
    kw.update(gamma=b["gamma"], importance_weighting=True)
    _, tg = reference(arrays, **kw)
    valid = arrays["mask"]
    top = 1.01 * float(tg.ratio_t[valid].max()) if valid.any() else 1.0
    high = {"rho_bar": top, "c_bar": top, "pg_rho_bar": top}
    d1, m1 = native(arrays, **kw, **high)
    d2, m2 = native(arrays, **kw, **{k: v * scale for k, v in high.items()})
    np.testing.assert_array_equal(d1, d2)
    assert m1 == m2
    assert m1["rho_clipped_fraction"] == 0.0


@settings(max_examples=40, deadline=None)
@given(b=batches, pg_rho_bar=st.floats(0.05, 5.0))
def test_pg_rho_bar_leaves_value_targets_alone(b, pg_rho_bar) -> None:
    """pg_rho_bar clips only the policy-gradient weight: vs_t, hence the value column of dout
    and the value loss, do not depend on it."""
    arrays, kw = draw_batch(b)
    kw.update(gamma=b["gamma"], importance_weighting=True, rho_bar=1.3, c_bar=0.8)
    d1, m1 = native(arrays, pg_rho_bar=1.0, **kw)
    d2, m2 = native(arrays, pg_rho_bar=pg_rho_bar, **kw)
    v = kw["value_col"]
    np.testing.assert_array_equal(d1[..., v], d2[..., v])
    assert m1["value_loss"] == m2["value_loss"]


@settings(max_examples=60, deadline=None)
@given(b=batches, importance_weighting=st.booleans())
def test_masked_rows_and_bootstrap_row_get_no_gradient(b, importance_weighting) -> None:
    arrays, kw = draw_batch(b)
    dout, m = native(arrays, gamma=b["gamma"], importance_weighting=importance_weighting, **kw)
    mask = arrays["mask"]
    assert not dout[-1].any()
    assert not dout[:-1][~mask].any()
    unused = LAYOUTS[b["policy"]][1] - 1 if b["policy"] == "multi_categorical" else 4
    assert not dout[..., unused].any()  # the one column that is neither policy nor value
    assert m["valid_steps"] == mask.sum()


@settings(max_examples=60, deadline=None)
@given(
    b=batches,
    where=st.tuples(st.integers(0, 5), st.integers(0, 3)),
    kind=st.sampled_from(["terminated", "truncated", "both"]),
    importance_weighting=st.booleans(),
    dv=st.sampled_from([-3.0, 0.5, 10.0]),
)
def test_bootstrap_after_termination_and_truncation(b, where, kind, importance_weighting, dv):
    """Changing V(x_{t+1}) after the last step t of an episode: no effect when it terminated
    (not on A_t, vs_t nor anything else); vs_t moves by gamma rho_t dV when it was truncated."""
    t, n = where[0] % b["T"], where[1] % b["N"]
    arrays, kw = draw_batch(b, forced={(t, n): kind})
    gamma = max(b["gamma"], 0.5)
    kw.update(
        gamma=gamma, importance_weighting=importance_weighting, rho_bar=1.5, baseline_cost=0.5
    )
    d1, m1 = native(arrays, **kw)
    moved = {**arrays, "out": arrays["out"].copy()}
    moved["out"][t + 1, n, kw["value_col"]] += np.float32(dv)
    d2, m2 = native(moved, **kw)
    if kind != "truncated":
        np.testing.assert_array_equal(d1, d2)
        assert m1 == m2
        return
    v, valid = kw["value_col"], m1["valid_steps"]
    # dout[t, n, v] = -baseline_cost (vs_t - V(x_t)) / valid
    dvs = -(d2[t, n, v] - d1[t, n, v]) * valid / kw["baseline_cost"]
    _, tg = reference(arrays, **kw)
    np.testing.assert_allclose(dvs, gamma * tg.rho_t[t, n] * dv, rtol=1e-4, atol=1e-5)
    policy_cols = np.arange(kw["policy_begin"], kw["policy_begin"] + kw["num_actions"])
    assert (d1[t, n, policy_cols] != d2[t, n, policy_cols]).any()  # A_t moved too
    assert_metrics_close(m2, reference(moved, **kw)[0])


# -------------------------------------------------------------------------------- the options


def test_every_option_reaches_the_native_core(monkeypatch, cat_batch) -> None:
    """The binding's own keyword defaults are never used: `LossOptions` holds the only ones."""
    arrays, kw = cat_batch
    seen: dict = {}

    def recording(*args, **kwargs):
        seen.update(kwargs)
        return None, {}

    monkeypatch.setattr(rlpar._native, "actor_critic_loss", recording)
    options = rlpar.LossOptions(0.9, True, 1.1, 1.2, 1.3, 0.4, 0.05)
    layout = {k: v for k, v in kw.items() if k not in OPTIONS}
    rlpar.actor_critic_loss(*(arrays[k] for k in ARRAYS), **layout, options=options)
    assert seen == {
        **layout, "log_std_begin": 0, "action_dims": [], "gamma": 0.9, "importance_weighting": True,
        "rho_bar": 1.1, "c_bar": 1.2, "pg_rho_bar": 1.3, "value_coef": 0.4, "entropy_coef": 0.05,
    }  # fmt: skip


def test_loss_options_check_their_types() -> None:
    with pytest.raises(rlpar.ConfigError, match="gamma: expected a number, got 'x'"):
        rlpar.LossOptions(gamma="x")  # type: ignore[arg-type]
    assert rlpar.LossOptions(gamma=1).gamma == 1.0
    assert isinstance(rlpar.LossOptions(gamma=1).gamma, float)


# ---------------------------------------------------------------------------- input handling


def test_bool_and_uint8_flags_and_non_contiguous_arrays_agree() -> None:
    arrays, kw = make_batch(np.random.default_rng(5), 5, 3, "gaussian", forced=EVENTS)
    kw.update(gamma=0.9, importance_weighting=True)
    d1, m1 = native(arrays, **kw)
    other = dict(arrays)
    for k in ("terminated", "truncated", "mask"):
        other[k] = arrays[k].astype(np.uint8)
    other["out"] = np.asfortranarray(arrays["out"])
    other["actions"] = np.asfortranarray(arrays["actions"])
    d2, m2 = native(other, **kw)
    np.testing.assert_array_equal(d1, d2)
    assert m1 == m2


def lit(text: str) -> str:
    return re.escape(text)


@pytest.fixture
def cat_batch():
    """T = 4, N = 3, O = 5, categorical over 3 actions."""
    rng = np.random.default_rng(0)
    arrays, kw = make_batch(rng, 4, 3, "categorical", forced={(0, 1): "terminated"})
    kw.update(gamma=0.99, importance_weighting=True)
    return arrays, kw


@pytest.mark.parametrize(
    ("name", "dtype", "want"),
    [
        ("out", np.float64, "float32"),
        ("behaviour", np.float64, "float32"),
        ("actions", np.int32, "int64"),
        ("rewards", np.float64, "float32"),
        ("terminated", np.int64, "uint8"),
        ("mask", np.float32, "uint8"),
    ],
)
def test_array_with_wrong_dtype(cat_batch, name, dtype, want) -> None:
    arrays, kw = cat_batch
    message = f"{name} must be {want}, got {np.dtype(dtype)}"
    with pytest.raises(TypeError, match=lit(message)):
        native({**arrays, name: arrays[name].astype(dtype)}, **kw)


@pytest.mark.parametrize(
    ("name", "shape", "want"),
    [
        ("behaviour", (4, 3, 6), "(4, 3, 5)"),
        ("behaviour", (5, 3, 5), "(4, 3, 5)"),
        ("actions", (3, 3), "(4, 3)"),
        ("rewards", (4, 2), "(4, 3)"),
        ("terminated", (4, 3, 1), "(4, 3)"),
        ("truncated", (4,), "(4, 3)"),
        ("mask", (5, 3), "(4, 3)"),
    ],
)
def test_array_with_wrong_shape(cat_batch, name, shape, want) -> None:
    arrays, kw = cat_batch
    message = f"{name} must have shape {want}, got {shape}"
    with pytest.raises(ValueError, match=lit(message)):
        native({**arrays, name: np.zeros(shape, arrays[name].dtype)}, **kw)


@pytest.mark.parametrize("shape", [(5, 15), (1, 3, 5), (5, 0, 5)])
def test_out_with_wrong_shape_says_what_came(cat_batch, shape) -> None:
    """Failed before the fix: a wrong rank said only "[T+1, N, O]", and ``out`` without steps
    was blamed on ``behaviour`` ("behaviour must have shape (0, 3, 5), got (4, 3, 5)")."""
    arrays, kw = cat_batch
    message = f"out must be a float32 array [T+1, N, O] with T, N >= 1, got {shape}"
    with pytest.raises(ValueError, match=lit(message)):
        native({**arrays, "out": np.zeros(shape, np.float32)}, **kw)


def test_gaussian_actions_with_wrong_dimension() -> None:
    arrays, kw = make_batch(np.random.default_rng(0), 4, 3, "gaussian")
    arrays["actions"] = np.zeros((4, 3, 3), np.float32)
    with pytest.raises(ValueError, match=lit("actions must have shape (4, 3, 2), got (4, 3, 3)")):
        native(arrays, gamma=0.9, importance_weighting=False, **kw)


@pytest.mark.parametrize("bad", [3, -1])
def test_out_of_range_action_names_step_and_column(cat_batch, bad) -> None:
    arrays, kw = cat_batch
    arrays["mask"][:] = True
    arrays["terminated"][:] = arrays["truncated"][:] = False
    arrays["actions"][2, 1] = bad
    with pytest.raises(
        ValueError, match=lit(f"action {bad} at step 2, column 1") + ".*" + lit("[0, 3)")
    ):
        native(arrays, **kw)


def test_unknown_policy(cat_batch) -> None:
    arrays, kw = cat_batch
    kw["policy"] = "beta"
    message = "policy must be 'categorical', 'gaussian' or 'multi_categorical', got 'beta'"
    with pytest.raises(ValueError, match=lit(message)):
        native(arrays, **kw)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"value_col": 5}, "value column outside the output"),
        ({"policy_begin": 3}, "policy columns outside the output"),
        ({"num_actions": 0}, "num_actions must be >= 1"),
        ({"gamma": 1.5}, "gamma must be in [0, 1]"),
        ({"rho_bar": 0.0}, "rho_bar, c_bar, pg_rho_bar must be > 0"),
    ],
)
def test_bad_layout_or_hyperparameter(cat_batch, change, message) -> None:
    arrays, kw = cat_batch
    with pytest.raises(ValueError, match=lit(message)):
        native(arrays, **{**kw, **change})


def test_gaussian_log_std_outside_the_output() -> None:
    arrays, kw = make_batch(np.random.default_rng(0), 2, 2, "gaussian")
    kw["log_std_begin"] = 5
    with pytest.raises(ValueError, match=lit("log_std columns outside the output")):
        native(arrays, gamma=0.9, importance_weighting=False, **kw)
