#!/usr/bin/env bash
# One prepared check for a lent GPU (the device tool), under 8 minutes:
#   1. the kernel tests, natively on the GPU (SPECTUNE_TEST_DEVICE=cuda);
#   2. scripts/bench_verify.py: ours vs vLLM 0.32's unfused launch sequence.
# Writes logs, JUnit XML and JSON under $OUT (./out when run by hand).
# Runs with the machine's own python3, torch and triton: nothing is installed.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out}
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
unset TRITON_INTERPRET

{
    date -u
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv || true
    python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
    python3 -c 'from spectune.identity import detect_device; print(detect_device())'
} 2>&1 | tee "$OUT/device.txt"

status=0
SPECTUNE_TEST_DEVICE=cuda timeout 270 python3 -m pytest tests/kernels/test_rejection.py -q \
    -p no:cacheprovider --junitxml="$OUT/kernel-tests.xml" 2>&1 | tee "$OUT/kernel-tests.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

timeout 170 python3 scripts/bench_verify.py --json "$OUT/bench.json" 2>&1 | tee "$OUT/bench.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
exit $status
