#!/usr/bin/env bash
# The thread-scaling table of experiments/RESULTS.md: builds rlpar for this machine's CPU and runs
# `rlpar bench scaling` (1, 2, 4, 8, 16 threads by default), in one go, for a many-core machine.
#
#   experiments/run_scaling.sh OUTDIR [WHEELDIR] [-- bench options, e.g. --threads 1,2,4 --quick]
#
# WHEELDIR (optional) holds wheels for a machine without a package index (gymnasium,
# farama-notifications, cmeel, cmeel-eigen); numpy, pybind11, scikit-build-core, cmake, ninja,
# tensorboard and tqdm must already be importable by $PY (default python3). Everything is
# installed under a temporary directory; OUTDIR gets machine.txt, scaling.log and scaling.json.
set -euo pipefail
out=${1:?usage: run_scaling.sh OUTDIR [WHEELDIR] [-- bench options]}
shift
wheels=""
if [[ $# -gt 0 && $1 != "--" ]]; then wheels=$1; shift; fi
if [[ $# -gt 0 && $1 == "--" ]]; then shift; fi
py=${PY:-python3}
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
mkdir -p "$out"
export PYTHONUNBUFFERED=1

if [[ -n $wheels ]]; then
  "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$work/deps" \
    "$wheels"/*.whl
  export PYTHONPATH="$work/deps${PYTHONPATH:+:$PYTHONPATH}"
fi
{
  echo "date: $(date -u +%FT%TZ)"
  echo "cpus: $(nproc)"
  grep -m1 "model name" /proc/cpuinfo || true
  echo "python: $("$py" --version 2>&1)"
  echo "commit: $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)"
} | tee "$out/machine.txt"

t0=$(date +%s)
CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) "$py" -m pip install -q --no-build-isolation --no-deps \
  --no-index --no-cache-dir --target "$work/site" "$root"
echo "build: $(($(date +%s) - t0)) s" | tee -a "$out/machine.txt"
export PYTHONPATH="$work/site${PYTHONPATH:+:$PYTHONPATH}"

cd "$work"  # import the installed package, not the source tree
"$py" -m rlpar bench scaling --json "$@" | tee "$out/scaling.log"
tail -n 1 "$out/scaling.log" > "$out/scaling.json"
"$py" - "$out/scaling.json" <<'EOF'
import json, sys
from rlpar.bench.scaling import format_scaling
print(format_scaling(json.load(open(sys.argv[1]))))
EOF
