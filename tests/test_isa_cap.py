"""``RLPAR_MAX_ISA`` caps the kernel set, and `rlpar.cpu_info` reports what runs.

The core reads the variable once per process, so each capped case runs in a child process. The
child runs checks of the other test files, unchanged: conv and Linear forwards against the
float64 reference (`reference.py`) and their gradients against finite differences
(test_net_numerics.py), and the LSTM core's (test_lstm.py), each on the kernels the cap leaves.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import rlpar
from rlpar import _native

TESTS = Path(__file__).resolve().parent

# What simd_kernels() reports under each cap on a build and CPU with at least that kernel set.
CAPS = {"avx2": "avx2", "none": ""}

# Forward and backward checks of the net test files, called in the child under the cap.
CHILD_CHECKS = """
import json, rlpar
import test_lstm as lstm
import test_net_numerics as nn

nn.test_conv_forward_matches_reference("wide", "uint8", 7)
nn.test_conv_forward_matches_reference("odd_tails", "float32", 64)
nn.test_conv_forward_matches_reference("k8s4", "uint8", 1)
nn.test_wide_linear_forward_matches_reference(64)
nn.test_linear_tails_match_reference("k3_w17_w23_w33", 13)
nn.test_backward_big_conv_net_sampled_coordinates()
nn.test_backward_conv_tails_sampled_coordinates()
nn.test_backward_wide_layers_sampled_coordinates()
nn.test_backward_wide_linear_many_rows_sampled_coordinates()
lstm.test_sequence_forward_matches_reference()
lstm.test_backward_through_time_matches_finite_differences(lstm.TORSO)
print(json.dumps(rlpar.cpu_info()))
"""


def run_child(code: str, max_isa: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """``python -P -c code`` with RLPAR_MAX_ISA set and the tests folder importable."""
    env = {**os.environ, "RLPAR_MAX_ISA": max_isa}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TESTS), env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-P", "-c", code],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def skip_unless_runnable(cap: str) -> None:
    """Skip a cap whose kernel set this CPU or build lacks (its kernels would not run)."""
    if cap != "avx2":
        return
    flags = rlpar.cpu_info()["flags"]
    if not {"avx2", "fma"} <= set(flags):
        pytest.skip(f"this CPU lists no AVX2 + FMA in /proc/cpuinfo (flags seen: {flags})")
    if _native.simd_kernels() not in ("avx512", "avx2"):
        pytest.skip("this build (or RLPAR_MAX_ISA in this process) runs no AVX2 + FMA kernels")


@pytest.mark.parametrize("cap", sorted(CAPS))
def test_capped_kernels_match_the_reference(cap: str, tmp_path: Path) -> None:
    skip_unless_runnable(cap)
    child = run_child(CHILD_CHECKS, cap, tmp_path)
    assert child.returncode == 0, child.stderr[-4000:]
    info = json.loads(child.stdout.strip().splitlines()[-1])
    assert info["kernels"] == CAPS[cap]
    assert info["max_isa"] == cap
    assert info["amx"] is False  # below avx512: no AMX, whatever the CPU has


def test_an_unknown_cap_is_a_clear_error(tmp_path: Path) -> None:
    child = run_child("import rlpar", "avx3", tmp_path)
    assert child.returncode == 1, child.stderr
    last = child.stderr.strip().splitlines()[-1]
    assert last.startswith("ValueError: RLPAR_MAX_ISA"), child.stderr
    for part in ("'avx3'", "avx512", "avx2", "none"):
        assert part in last


def test_uncapped_cap_names_are_accepted(tmp_path: Path) -> None:
    # avx512 (and an empty value) leave the kernels as they are without a cap.
    code = "import rlpar; print(rlpar._native.simd_kernels())"
    for cap in ("avx512", ""):
        child = run_child(code, cap, tmp_path)
        assert child.returncode == 0, child.stderr
        uncapped = _native.simd_kernels() if "RLPAR_MAX_ISA" not in os.environ else None
        if uncapped is not None:
            assert child.stdout.strip() == uncapped


def test_cpu_info_has_the_documented_keys_and_types() -> None:
    info = rlpar.cpu_info()
    assert set(info) == {"model", "flags", "compiled_for", "kernels", "max_isa", "amx"}
    assert isinstance(info["model"], str)
    assert isinstance(info["flags"], list)
    assert set(info["flags"]) <= {"avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"}
    assert isinstance(info["compiled_for"], str) and info["compiled_for"]
    assert info["kernels"] == _native.simd_kernels()
    assert info["kernels"] in ("avx512", "avx2", "")
    assert info["max_isa"] == (os.environ.get("RLPAR_MAX_ISA") or None)
    assert info["amx"] is rlpar.amx_available()
    if "avx512f" not in info["flags"] and info["flags"]:
        assert info["kernels"] != "avx512"  # never a kernel set the CPU lacks
