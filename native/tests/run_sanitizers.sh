#!/usr/bin/env bash
# Builds the native core and its C++ tests twice — ThreadSanitizer, then AddressSanitizer with
# UndefinedBehaviorSanitizer — and runs them with ctest. Exits non-zero on the first failure.
#
#   PYTHON=.venv/bin/python native/tests/run_sanitizers.sh [extra cmake -D options...]
#
# PYTHON must be able to run `python -m cmeel cmake` (the cmeel-eigen wheel provides Eigen).
# JOBS sets the build parallelism (default: all cores).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
# Absolute, but with symlinks kept: a venv's bin/python is a symlink, and resolving it would lose
# the venv's site-packages (and cmeel-eigen with them).
python="$(command -v "${PYTHON:-python3}")"
python="$(cd "$(dirname "$python")" && pwd)/$(basename "$python")"
jobs="${JOBS:-$(nproc)}"

# halt_on_error: the first report fails the test, instead of a summary at exit.
export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1"
export ASAN_OPTIONS="halt_on_error=1 print_stacktrace=1 detect_leaks=1"
export UBSAN_OPTIONS="halt_on_error=1 print_stacktrace=1"

run_suite() {
  local sanitizer="$1" build="$2"
  shift 2
  echo "=== ${sanitizer} sanitizer: ${build}"
  local t0=$SECONDS
  cmake -S "$root/native/tests" -B "$build" \
    -DRLPAR_SANITIZER="$sanitizer" -DPython_EXECUTABLE="$python" "$@"
  cmake --build "$build" -j "$jobs"
  ctest --test-dir "$build" --output-on-failure -V
  echo "=== ${sanitizer} sanitizer: passed in $((SECONDS - t0)) s"
}

run_suite thread "$root/native/build-tsan" "$@"
run_suite address "$root/native/build-asan" "$@"
