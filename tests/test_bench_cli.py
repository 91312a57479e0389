"""The command line, run as ``python -m rlpar`` in a subprocess.

Each run starts in a temporary directory, so the installed package is imported. Benchmarks run
with ``--quick`` and only their structure is checked: timings on a shared machine are not facts.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlpar import _native, amx_available

HAS_TORCH = importlib.util.find_spec("torch") is not None


def rlpar(cwd: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rlpar", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def last_json(proc: subprocess.CompletedProcess) -> dict:
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def assert_load(cores: float | None) -> None:
    assert cores is None or cores >= 0


def assert_numbers(d: dict, keys: set[str]) -> None:
    """``d`` has exactly ``keys``, each a finite positive number."""
    assert set(d) == keys
    for k in keys:
        assert isinstance(d[k], (int, float)) and math.isfinite(d[k]) and d[k] > 0, (k, d[k])


@pytest.mark.parametrize(
    ("args", "mentions"),
    [
        ([], ["bench"]),
        (["bench"], ["net", "snapshot", "gil", "scaling"]),
        (["bench", "scaling"], ["--threads", "--json", "--quick"]),
        (["bench", "net"], ["--json", "--quick"]),
        (["bench", "snapshot"], ["--json", "--quick"]),
        (["bench", "gil"], ["--json", "--quick"]),
    ],
)
def test_help_exits_zero_and_lists_subcommands(tmp_path, args, mentions) -> None:
    proc = rlpar(tmp_path, *args, "--help")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: rlpar")
    for word in mentions:
        assert word in proc.stdout


@pytest.mark.parametrize("args", [["frobnicate"], ["bench", "frobnicate"], [], ["bench"]])
def test_unknown_or_missing_subcommand_fails_with_a_clear_message(tmp_path, args) -> None:
    proc = rlpar(tmp_path, *args)
    assert proc.returncode != 0
    assert proc.stdout == ""
    if args and args[-1] == "frobnicate":
        assert "invalid choice: 'frobnicate'" in proc.stderr
    else:
        assert "required" in proc.stderr
    assert "usage: rlpar" in proc.stderr


def test_bench_net_json_has_the_documented_shape(tmp_path) -> None:
    r = last_json(rlpar(tmp_path, "bench", "net", "--json", "--quick"))
    impls = {"native", "numpy"} | ({"torch"} if HAS_TORCH else set())
    assert set(r["forward_us"]) == {"mlp", "conv"}
    for net, batches in (("mlp", {"1", "32", "256"}), ("conv", {"1", "32"})):
        assert set(r["forward_us"][net]) == impls
        for impl in impls:
            assert_numbers(r["forward_us"][net][impl], batches)
    assert set(r["threads_fps"]) == {"released", "held"}
    for mode in ("released", "held"):
        assert set(r["threads_fps"][mode]) == {"32", "256"}
        for batch in ("32", "256"):
            assert_numbers(r["threads_fps"][mode][batch], {"1", "2"})
    assert_numbers(r["train_step_ms"], {"native", "torch"} if HAS_TORCH else {"native"})
    lstm_impls = {"native"} | ({"torch"} if HAS_TORCH else set())
    lstm_impls |= {"native_bf16x3"} if amx_available() else set()
    assert_numbers(r["lstm_train_ms"], lstm_impls)
    assert_numbers(r["lstm_step_us"], lstm_impls)
    assert r["gil_release_threshold_flops"] >= 0
    conv_batches = {
        "conv_forward_ms": {"nature": {"1", "32", "256"}, "impala": {"1", "32"}},
        "conv_train_ms": {
            "nature": {"32", "256"},
            "minatar": {"256", "1024"},
            "impala": {"32"},
            "impala_minatar": {"32", "256"},
        },
    }
    for key, nets in conv_batches.items():
        assert set(r[key]) == set(nets)
        for net, batches in nets.items():
            assert set(r[key][net]) == impls - {"numpy"}
            for impl in r[key][net]:
                assert_numbers(r[key][net][impl], batches)
    assert_numbers(r["conv_gflops"], {"native", "native_train", "sgemm_peak"})
    assert_numbers(r["conv_learner_threads"], {"1", "2", "2_shards"})
    assert ("torch_threads" in r) == HAS_TORCH
    ratios = r["ratios"]
    assert_numbers(ratios["native_vs_numpy_b1"], {"mlp", "conv"})
    assert_numbers(ratios["threads_2v1_released"], {"32", "256"})
    if HAS_TORCH:
        assert_numbers(ratios["native_vs_torch_b1"], {"mlp", "conv"})
        assert ratios["train_step_native_vs_torch"] > 0
        assert ratios["lstm_train_native_vs_torch"] > 0
        assert ratios["lstm_step_b16_native_vs_torch"] > 0
        assert ("lstm_train_bf16x3_vs_torch" in ratios) == amx_available()
        assert ("lstm_step_b16_bf16x3_vs_torch" in ratios) == amx_available()
        assert_numbers(ratios["conv_forward_native_vs_torch"]["nature"], {"1", "32", "256"})
        assert_numbers(ratios["conv_train_native_vs_torch"]["minatar"], {"256", "1024"})
    assert ("lstm_train_bf16x3_vs_float32" in ratios) == amx_available()
    assert ("lstm_step_b16_bf16x3_vs_float32" in ratios) == amx_available()
    assert ratios["conv_learner_threads_2v1"] > 0
    assert_load(r["background_load_cores"])
    assert r["kernels"] == r["cpu_info"]["kernels"] == _native.simd_kernels()
    assert r["amx"] == r["cpu_info"]["amx"] == amx_available()
    assert set(r["cpu_info"]) == {"model", "flags", "compiled_for", "kernels", "max_isa", "amx"}


def test_bench_snapshot_json_has_the_documented_shape(tmp_path) -> None:
    r = last_json(rlpar(tmp_path, "bench", "snapshot", "--json", "--quick"))
    keys = {"pin_unpin_ns", "publish_us_per_mb", "memcpy_us_per_mb", "publish_vs_memcpy"}
    keys |= {"n_floats", "mbytes", "python_pin_release_ns"}
    assert_load(r.pop("background_load_cores"))
    assert_numbers(r, keys)


def test_bench_gil_json_reports_every_batch(tmp_path) -> None:
    r = last_json(rlpar(tmp_path, "bench", "gil", "--json", "--quick"))
    assert list(r["batches"]) == ["1", "2", "4", "8", "16", "32", "64"]
    for row in r["batches"].values():
        assert row["flops"] > 0
        for mode in ("released", "held"):
            assert_numbers(row["fps"][mode], {"1", "2"})
            assert row["ratio_2v1"][mode] > 0
    assert r["crossover_batch"] is None or r["crossover_batch"] in (1, 2, 4, 8, 16, 32, 64)
    assert r["threshold_flops"] >= 0
    assert_load(r["background_load_cores"])


def test_bench_without_json_prints_a_table(tmp_path) -> None:
    proc = rlpar(tmp_path, "bench", "snapshot", "--quick")
    assert proc.returncode == 0, proc.stderr
    assert "publish / memcpy" in proc.stdout
    with pytest.raises(json.JSONDecodeError):
        json.loads(proc.stdout.strip().splitlines()[-1])


def test_bench_runtime_and_envs_json(tmp_path) -> None:
    # The release threshold pinned to its floor: measured at import, it rises with the hand-off
    # cost of a loaded machine (up to 16 Mflop), above the small learner steps' work, which then
    # keep the GIL and count no released call (seen once in CI's debug-build run).
    pinned = {**os.environ, "RLPAR_GIL_RELEASE_THRESHOLD": "70000"}
    r = last_json(rlpar(tmp_path, "bench", "runtime", "--json", "--quick", env=pinned))
    assert set(r["env_steps_per_s"]) == {"1", "2"} == set(r["with_learner"])
    assert all(v > 0 for v in r["env_steps_per_s"].values())
    e = last_json(rlpar(tmp_path, "bench", "envs", "--json", "--quick"))
    assert {"rlpar", "gymnasium"} <= set(e["env_only"])
    assert set(e["actor_loop"]["python_env"]) == {"1", "2"} == set(e["actor_loop"]["native_env"])
    for kind in ("python_env", "native_env", "native_fused"):
        for n in ("1", "2"):
            shares = e["actor_loop_gil"][kind][n]
            assert set(shares) == {"held", "wait", "native", "ceiling"}
            assert all(0 <= shares[k] <= 1 for k in ("held", "wait", "native")), shares
    # A Python env holds the GIL for most of an actor's time; the fused unroll hardly at all.
    assert (
        e["actor_loop_gil"]["python_env"]["1"]["held"]
        > e["actor_loop_gil"]["native_fused"]["1"]["held"]
    )
    assert r["env_only_steps_per_s"] > 0 and 0 < r["ratios"]["one_actor_vs_env_only"]
    assert r["python_take_learner"]["1"] > 0
    d = r["dict_observation"]  # a Dict of a frame and a vector beside the frame alone
    assert set(d["env_steps_per_s"]) == {"box_image", "dict_image_vector"}
    assert all(v > 0 for v in d["env_steps_per_s"].values()) and d["ratio_dict_vs_box"] > 0
    assert set(d["actor_us_per_step"]["dict_image_vector"]) == {"env", "inference"}
    assert 0 < r["ratios"]["one_actor_python_take_vs_env_only"]
    if importlib.util.find_spec("minatar") is not None:  # the MinAtar case where it is installed
        m = r["minatar_breakout"]
        assert m["env_steps_per_s"]["1"] > 0 and m["with_learner"]["1"] > 0
        assert m["env_only_steps_per_s"] > 0 and 0 < m["ratios"]["one_actor_vs_env_only"]
        assert set(m["gil"]) == {"1_actor", "1_actor_with_learner"}
        split = m["double_buffer"]
        assert split["env_steps_per_s"]["1"] > 0 and split["with_learner"]["1"] > 0
        assert all(0 <= v <= 1 for v in split["side_unroll_share"].values())
        assert split["side_unroll_share"]["1"] > 0  # the first unrolls probe the side thread
        for case in (m, split):
            assert set(case["actor_us_per_step"]) == {"env", "inference"}
            assert case["actor_us_per_step"]["env"] > 0
    else:
        assert "minatar_breakout" not in r
    cases = ("1_actor", "2_actors", "1_actor_with_learner", "2_actors_with_learner",
             "1_actor_python_take")  # fmt: skip
    for case in cases:
        assert set(r["gil"][case]) == {
            "actor_held", "actor_wait", "actor_native", "learner_held", "ceiling"
        }  # fmt: skip
    # The learner step: one released call per batch fused (IMPALA's one step, APPO's 6 x 4 in
    # one train_steps call), three per step as separate calls at most (clip and step keep the
    # GIL when small).
    steps = r["learner_step"]
    assert steps["impala"]["fused"]["released_calls"] == 1
    assert steps["appo"]["fused"]["released_calls"] == 1
    for agent in ("impala", "appo"):
        for form in ("fused", "separate"):
            m = steps[agent][form]
            assert m["learn_us"] > 0 and 0 <= m["gil_held_share"] <= 1, m
        assert steps[agent]["separate"]["released_calls"] > steps[agent]["fused"]["released_calls"]


def test_bench_scaling_json_has_a_value_per_thread_count(tmp_path) -> None:
    r = last_json(rlpar(tmp_path, "bench", "scaling", "--threads", "3,1", "--json", "--quick"))
    assert r["threads"] == [1, 3]
    assert isinstance(r["cpus"], int) and r["cpus"] >= 1
    sections = {
        "net_forward": {"mlp_b32", "mlp_b256", "conv_b8"},
        "snapshot_pins": {"pins_per_s", "publishes_per_s"},
        "actor_loop": {"python_env", "native_fused"},
        "learner_step": {
            f"{case}_{split}"
            for case in ("mlp_T20_N256", "conv_T4_N32", "nature_T20_N32")
            for split in ("rows", "shards")
        },
        "runtime": {"learner_idle", "learner_idle_k256", "learner_busy", "learner_threads"},
    }
    assert set(r["predicted_ceiling"]["actor_loop"]) == {"python_env", "native_fused"}
    assert set(r["predicted_ceiling"]["runtime"]) == set(sections["runtime"]) - {"learner_threads"}
    for section, cases in sections.items():
        assert set(r[section]) == cases == set(r["speedup"][section])
        for case in cases:
            assert_numbers(r[section][case], {"1", "3"})
            assert r["speedup"][section][case]["1"] == 1.0


def test_bench_scaling_table_and_bad_thread_counts(tmp_path) -> None:
    proc = rlpar(tmp_path, "bench", "scaling", "--threads", "1", "--quick")
    assert proc.returncode == 0, proc.stderr
    assert "thread scaling on" in proc.stdout and "native_fused" in proc.stdout
    for bad, said in [("0,2", "between 1 and 256"), ("1,x", "comma-separated integers")]:
        proc = rlpar(tmp_path, "bench", "scaling", "--threads", bad, "--quick")
        assert proc.returncode == 2
        assert said in proc.stderr and repr(bad) in proc.stderr
        assert proc.stdout == ""


def test_bench_scaling_rejects_bad_thread_counts_from_python() -> None:
    from rlpar.bench.scaling import bench_scaling

    for bad in ([], [0, 1], [257]):
        with pytest.raises(ValueError, match="expected thread counts between 1 and 256"):
            bench_scaling(bad, quick=True)


def test_bench_soak_json_reports_rss_growth_per_path(tmp_path) -> None:
    r = last_json(rlpar(tmp_path, "bench", "soak", "--quick", "--json"))
    for path in ("python_env", "native_fused"):
        report = r[path]
        assert report["env_steps"] > 0 and report["samples"] >= 5
        assert 10 < report["rss_after_warmup_mb"] <= report["rss_max_mb"]
        assert isinstance(report["growth_mb_per_million_env_steps"], float)
    proc = rlpar(tmp_path, "bench", "soak", "--seconds", "-1")
    assert proc.returncode == 2 and "--seconds: expected a number > 0, got -1" in proc.stderr


def test_rss_growth_is_the_slope_after_the_warmup_per_million_steps() -> None:
    from rlpar.bench.soak import rss_growth

    # 1 MB per second after a warm-up jump, 2M env steps in 10 s: 5 MB per million env steps.
    samples = [(0.0, 10.0), (1.0, 40.0)] + [(float(t), 40.0 + t) for t in range(3, 11)]
    assert rss_growth(samples, env_steps=2_000_000, wall_s=10.0) == pytest.approx(5.0)
    assert rss_growth(samples[:3], env_steps=10, wall_s=10.0) is None
    assert rss_growth(samples, env_steps=0, wall_s=10.0) is None
