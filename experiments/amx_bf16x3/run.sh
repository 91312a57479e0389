#!/usr/bin/env bash
# Builds and runs the bf16x3 AMX probe (see probe.cc), from the repository root:
#   bash experiments/amx_bf16x3/run.sh
# PYTHON: an interpreter with cmeel-eigen (the dev install's venv; default .venv/bin/python).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
python="${PYTHON:-$root/.venv/bin/python}"
eigen="$("$python" -m cmeel cmake 2>/dev/null)/include/eigen3"
out="$(mktemp -d)"
g++ -O3 -march=native -std=c++17 -DEIGEN_DONT_PARALLELIZE -I"$root/native/include" -I"$eigen" \
  "$root/experiments/amx_bf16x3/probe.cc" "$root/native/src/amx.cc" "$root/native/src/layers.cc" \
  "$root/native/src/thread_pool.cc" -lpthread -o "$out/probe"
"$out/probe"
rm -rf "$out"
