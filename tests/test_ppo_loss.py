"""The native PPO loss (``rlpar.ppo_loss``) against its float64 twin in ``ppo_reference.py``:
metrics and every element of the gradient (finite differences through the twin, with the
targets held), the properties that must hold (on-policy ratios of 1, clipping, GAE's
recursion, value statistics) and bad inputs."""

from __future__ import annotations

import dataclasses

import numpy as np
import ppo_reference as pref
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from loss_reference import Layout
from test_losses import ARRAYS, EVENTS, POLICIES, make_batch

import rlpar
from rlpar import _native

PPO_METRICS = (
    "loss policy_loss value_loss entropy approx_kl clip_fraction value_clip_fraction ratio_mean "
    "ratio_min ratio_max explained_variance mean_advantage advantage_std mean_value target_mean "
    "target_sq_mean valid_steps"
).split()

OPTION_SETS = {
    "defaults": rlpar.PpoOptions(),
    "gae": rlpar.PpoOptions(advantage="gae", gae_lambda=0.95, gamma=0.97, c_bar=0.9),
    "reciprocal": rlpar.PpoOptions(ratio_clip="reciprocal", clip_eps=0.1, rho_bar=0.8),
    "value_clip": rlpar.PpoOptions(value_clip=0.2, baseline_cost=0.7, entropy_cost=0.1),
    "raw_advantages": rlpar.PpoOptions(normalize_advantages=False, gae_lambda=0.5),
}


def native(arrays, kw, o, **stats):
    return rlpar.ppo_loss(*(arrays[k] for k in ARRAYS), **kw, options=o, **stats)


def reference(arrays, kw, o, **stats):
    return pref.ppo_loss(*(arrays[k] for k in ARRAYS), layout=Layout(**kw), o=o, **stats)


def assert_metrics_close(got, want, rtol=1e-5, atol=1e-6):
    for k in PPO_METRICS:
        np.testing.assert_allclose(got[k], want[k], rtol=rtol, atol=atol, err_msg=k)


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("options", list(OPTION_SETS))
@pytest.mark.parametrize("stats", [{}, {"value_mean": 0.7, "value_std": 2.5}])
def test_metrics_and_dout_match_reference(policy, options, stats) -> None:
    """Every metric against the twin, and every element of ``dout [T+1, N, O]`` against central
    differences of the twin's loss (targets and normalised advantages held), on a batch whose
    episodes end by every route."""
    rng = np.random.default_rng(3)
    arrays, kw = make_batch(rng, 8, 6, policy, forced=EVENTS, off_policy=0.4)
    o = OPTION_SETS[options]
    dout, m = native(arrays, kw, o, **stats)
    want, tg = reference(arrays, kw, o, **stats)
    assert_metrics_close(m, want)
    assert 0 < m["clip_fraction"] < 1, "the batch must exercise both sides of the clip"
    small, small_kw = make_batch(np.random.default_rng(5), 3, 3, policy, off_policy=0.4)
    dout, _ = native(small, small_kw, o, **stats)
    _, tg = reference(small, small_kw, o, **stats)
    numeric = pref.numerical_dout(
        small["out"], small["behaviour"], small["actions"], small["mask"], tg,
        layout=Layout(**small_kw), o=o, **stats,
    )  # fmt: skip
    assert dout.dtype == np.float32 and dout.shape == small["out"].shape
    np.testing.assert_allclose(dout, numeric, rtol=1e-4, atol=1e-6)


batches = st.fixed_dictionaries(
    {
        "seed": st.integers(0, 2**32 - 1),
        "T": st.integers(1, 6),
        "N": st.integers(1, 4),
        "policy": st.sampled_from(POLICIES),
        "p_end": st.floats(0.0, 0.5),
        "options": st.builds(
            rlpar.PpoOptions,
            gamma=st.floats(0.0, 1.0),
            clip_eps=st.floats(0.05, 0.5),
            ratio_clip=st.sampled_from(["symmetric", "reciprocal"]),
            advantage=st.sampled_from(["vtrace", "gae"]),
            gae_lambda=st.floats(0.0, 1.0),
            rho_bar=st.floats(0.2, 3.0),
            c_bar=st.floats(0.2, 3.0),
            normalize_advantages=st.booleans(),
            value_clip=st.sampled_from([0.0, 0.1, 1.0]),
        ),
    }
)


@settings(max_examples=60, deadline=None)
@given(b=batches)
def test_random_batches_match_reference(b) -> None:
    rng = np.random.default_rng(b["seed"])
    p = b["p_end"] / 2
    arrays, kw = make_batch(rng, b["T"], b["N"], b["policy"], p_term=p, p_trunc=p)
    got = native(arrays, kw, b["options"])[1]
    want = reference(arrays, kw, b["options"])[0]
    # Normalised advantages of a few nearly equal values amplify rounding: compare loosely.
    assert_metrics_close(got, want, rtol=1e-4, atol=1e-5)


def test_on_policy_ratios_are_one_and_vtrace_advantages_are_impalas() -> None:
    """With mu = pi every ratio is 1, nothing is clipped, the approximate KL is 0, and the
    raw V-trace advantages and targets are IMPALA's (actor_critic_loss's)."""
    rng = np.random.default_rng(11)
    arrays, kw = make_batch(rng, 6, 5, "categorical", forced=EVENTS)
    arrays["behaviour"] = arrays["out"][:-1].copy()
    _, m = native(arrays, kw, rlpar.PpoOptions(normalize_advantages=False))
    assert m["ratio_min"] == pytest.approx(1.0) and m["ratio_max"] == pytest.approx(1.0)
    assert m["clip_fraction"] == 0.0 and m["approx_kl"] == pytest.approx(0.0, abs=1e-12)
    _, impala = rlpar.actor_critic_loss(
        *(arrays[k] for k in ARRAYS), **kw, options=rlpar.LossOptions(importance_weighting=True)
    )
    assert m["mean_advantage"] == pytest.approx(impala["mean_advantage"], rel=1e-6)
    assert m["value_loss"] == pytest.approx(impala["value_loss"], rel=1e-6)
    # Unnormalised and unclipped on-policy, PPO's policy loss is -mean A (r = 1).
    assert m["policy_loss"] == pytest.approx(-impala["mean_advantage"], rel=1e-6)


def test_on_policy_gae_is_the_textbook_recursion() -> None:
    """On-policy with c_bar >= 1, "gae" is GAE(lambda): A_t = delta_t + gamma lambda A_{t+1}
    inside an episode, written here as CleanRL writes it."""
    rng = np.random.default_rng(2)
    arrays, kw = make_batch(rng, 7, 1, "categorical", p_term=0.0, p_trunc=0.0, p_reset0=0.0)
    arrays["behaviour"] = arrays["out"][:-1].copy()
    lam, gamma = 0.9, 0.95
    o = rlpar.PpoOptions(advantage="gae", gae_lambda=lam, gamma=gamma, normalize_advantages=False)
    _, m = native(arrays, kw, o)
    v = arrays["out"][:, 0, kw["value_col"]].astype(np.float64)
    r = arrays["rewards"][:, 0].astype(np.float64)
    adv, last = np.zeros(7), 0.0
    for t in reversed(range(7)):
        last = r[t] + gamma * v[t + 1] - v[t] + gamma * lam * last
        adv[t] = last
    assert m["mean_advantage"] == pytest.approx(adv.mean(), rel=1e-6)
    assert m["target_mean"] == pytest.approx((adv + v[:-1]).mean(), rel=1e-6)


def test_clipped_steps_carry_no_policy_gradient() -> None:
    """A ratio far outside the clip on the side the advantage pushes it: no policy gradient
    (only entropy, which is off here); the value gradient is still there."""
    rng = np.random.default_rng(4)
    arrays, kw = make_batch(rng, 4, 3, "categorical", p_term=0.0, p_trunc=0.0, p_reset0=0.0)
    b, n = kw["policy_begin"], kw["num_actions"]
    arrays["behaviour"] = arrays["out"][:-1].copy()
    o = rlpar.PpoOptions(normalize_advantages=False, entropy_cost=0.0, clip_eps=0.1)
    _, m0 = native(arrays, kw, o)
    # Make pi(a_t) much larger than mu(a_t) wherever the advantage is positive.
    logits = arrays["out"][:-1, :, b : b + n]
    onehot = np.eye(n, dtype=bool)[arrays["actions"]]
    _, tg = reference(arrays, kw, o)
    pushed = np.where((tg.adv_t > 0)[..., None] & onehot, 5.0, 0.0).astype(np.float32)
    arrays["out"][:-1, :, b : b + n] = logits + pushed
    dout, m = native(arrays, kw, o)
    positive = tg.adv_t > 0  # the targets do not depend on the logits when rho, c bars clip
    assert positive.any() and (~positive).any()
    assert np.all(dout[:-1, :, b : b + n][positive] == 0.0)
    assert np.any(dout[:-1, :, b : b + n][~positive] != 0.0)
    assert np.all(dout[:-1, :, kw["value_col"]][arrays["mask"]] != 0.0)
    assert m["clip_fraction"] > 0 and m0["clip_fraction"] == 0


def test_value_statistics_normalise_the_value_loss() -> None:
    """With value_mean/value_std the value head's units are normalised ones: scaling the
    rewards and the statistics together leaves the value loss and the policy's gradient as
    they were (advantage normalisation absorbs the scale)."""
    rng = np.random.default_rng(8)
    arrays, kw = make_batch(rng, 6, 4, "categorical", forced=EVENTS)
    o = rlpar.PpoOptions()
    d1, m1 = native(arrays, kw, o)
    scaled = dict(arrays, rewards=arrays["rewards"] * np.float32(100.0))
    d2, m2 = native(scaled, kw, o, value_mean=0.0, value_std=100.0)
    assert m2["value_loss"] == pytest.approx(m1["value_loss"], rel=1e-4)
    np.testing.assert_allclose(d2, d1, rtol=1e-3, atol=1e-6)
    assert m2["target_mean"] == pytest.approx(100.0 * m1["target_mean"], rel=1e-4)


def test_no_valid_step_gives_zeros() -> None:
    arrays, kw = make_batch(np.random.default_rng(0), 3, 2, "categorical")
    arrays["mask"][:] = False
    dout, m = native(arrays, kw, rlpar.PpoOptions())
    assert m["valid_steps"] == 0 and m["loss"] == 0.0 and not dout.any()


def test_the_loss_runs_with_the_gil_released() -> None:
    """The calling thread's GIL meter counts one released call per loss call."""
    arrays, kw = make_batch(np.random.default_rng(0), 3, 2, "categorical")
    calls = _native.gil_meter()[2]
    native(arrays, kw, rlpar.PpoOptions())
    assert _native.gil_meter()[2] == calls + 1


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"clip_eps": 0.0}, "clip_eps must be > 0"),
        ({"gae_lambda": 1.5}, r"lambda must be in \[0, 1\]"),
        ({"gamma": -0.1}, r"gamma must be in \[0, 1\]"),
        ({"value_clip": -1.0}, "value_clip must be >= 0"),
        ({"rho_bar": 0.0}, "must be > 0"),
        ({"ratio_clip": "box"}, "ratio_clip must be 'symmetric' or 'reciprocal', got 'box'"),
        ({"advantage": "td"}, "advantage must be 'vtrace' or 'gae', got 'td'"),
    ],
)
def test_bad_options(change, message) -> None:
    arrays, kw = make_batch(np.random.default_rng(0), 3, 2, "categorical")
    with pytest.raises(ValueError, match=message):
        native(arrays, kw, dataclasses.replace(rlpar.PpoOptions(), **change))


def test_bad_value_statistics_and_arrays() -> None:
    arrays, kw = make_batch(np.random.default_rng(0), 3, 2, "categorical")
    with pytest.raises(ValueError, match="value_std must be a finite number > 0"):
        native(arrays, kw, rlpar.PpoOptions(), value_std=0.0)
    bad = dict(arrays, behaviour=arrays["behaviour"][:, :1])
    with pytest.raises(ValueError, match="behaviour"):
        native(bad, kw, rlpar.PpoOptions())
    with pytest.raises(rlpar.ConfigError, match="clip_eps"):
        rlpar.PpoOptions(clip_eps="wide")  # type: ignore[arg-type]
