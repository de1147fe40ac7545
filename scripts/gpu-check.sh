#!/usr/bin/env bash
# Runs the examples and every test marked for GPU on a real CUDA machine, then prints a compact
# summary of verdicts and figures. On a machine without CUDA it says so and exits 0.
# Usage: scripts/gpu-check.sh [LOG_DIR]   (from the repository root, with the project installed;
# the logs and JSON reports are kept in LOG_DIR, a new or empty folder; a new temporary one if none is given)
set -uo pipefail
case "${1:-}" in -h | --help) sed -n '2,5s/^# //p' "$0"; exit 0 ;; esac
case "${1:-}" in "" | /*) ;; *) set -- "$PWD/$1" ;; esac  # (read before the cd below)
if [ -n "${1:-}" ] && [ -e "$1" ] && { [ ! -d "$1" ] || [ -n "$(ls -A "$1")" ]; }; then
    echo "gpu-check: $1 is not a new or empty folder: its logs go to a folder of their own, and no file is replaced" >&2
    exit 2
fi
cd "$(dirname "$0")/.."
python3 - 2>/dev/null <<'PY' || { echo "gpu-check: no CUDA device here (or no torch in this environment); nothing to check"; exit 0; }
import sys, torch
sys.exit(0 if torch.cuda.is_available() else 1)
PY
out=${1:-$(mktemp -d)}
mkdir -p "$out"
echo "gpu-check: logs in $out"
python3 -c 'import torch; print(f"gpu-check: {torch.cuda.get_device_name(0)}, {torch.cuda.device_count()} device(s), torch {torch.__version__}, CUDA {torch.version.cuda}")'
parallel=$(python3 -c 'import xdist' 2>/dev/null && echo "-n 4")
# shellcheck disable=SC2086
timeout 180 python3 -m pytest -q -p no:cacheprovider $parallel -m gpu tests --vramleak-report="$out/gpu.json" > "$out/gpu.log" 2>&1
gpu_status=$?
VRAMLEAK_EXAMPLES_DEVICE=cuda timeout 90 python3 -m pytest -q -p no:cacheprovider examples --vramleak-device=cuda --vramleak-report="$out/examples.json" > "$out/examples.log" 2>&1
echo "gpu tests: $(tail -n 1 "$out/gpu.log")"
echo "examples on cuda: $(tail -n 1 "$out/examples.log")"
python3 - "$out/examples.json" <<'PY'
import json, sys
for test in json.load(open(sys.argv[1]))["tests"]:
    figures = ", ".join(f"{k}={v}" for k, v in test.items() if k in ("leaked_bytes", "peak_bytes", "growth_bytes") and v is not None)
    print(f"  {test['outcome']:<10} {test['nodeid']}  {figures}")
PY
# What --vramleak-trace costs: the allocator's history as the plugin records it, per allocation.
python3 - <<'PY'
import time, torch
from pytest_vramleak.meters.history import MAX_ENTRIES

def allocations(n=20000):
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(n):
        torch.empty(1024, device="cuda")
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / n

allocations(2000)
plain = min(allocations() for _ in range(3))
torch.cuda.memory._record_memory_history(enabled="all", context="alloc", stacks="python", max_entries=MAX_ENTRIES)
traced = min(allocations() for _ in range(3))
torch.cuda.memory._record_memory_history(enabled=None)
print(f"--vramleak-trace cost: {plain * 1e6:.2f} us per allocation plain, {traced * 1e6:.2f} us traced ({traced / plain:.2f}x)")
PY
if [ "$gpu_status" -ne 0 ]; then
    echo "gpu tests failed; their log:"
    tail -n 60 "$out/gpu.log"
fi
exit "$gpu_status"
