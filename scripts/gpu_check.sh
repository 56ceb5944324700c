#!/usr/bin/env bash
# One prepared check for a lent GPU (the device tool), under 9 minutes:
#   1. the kernel tests of both families, natively on the GPU (SPECTUNE_TEST_DEVICE=cuda);
#   2. scripts/bench_verify.py: ours vs vLLM's unfused V1 launch sequence;
#   3. when vLLM is importable (0.32 or 0.33): `spectune doctor --vllm-seams`,
#      scripts/bench_verify_mrv2.py (ours vs vLLM's Model Runner
#      V2 kernels themselves), benchmarks/bench_sampling.py (the sampling kernels and the
#      fused sampler vs vLLM's) and scripts/mrv2_engine_check.py (an MRV2 engine with
#      ngram speculation, greedy tokens with and without spectune): these need vLLM
#      installed with its compiled ops, which the lent machines lack;
#   4. when .gpu-check/ was carried (python scripts/prepare_gpu_check.py, here, first):
#      scripts/gpu_check_vs_vllm.sh, every kernel family against each carried vLLM
#      release's own function (scripts/bench_vs_vllm.py), with no vLLM installed.
# Writes logs, JUnit XML and JSON under $OUT (./out when run by hand); where more than the
# 8 files a device call brings back, all of them also in $OUT/gpu-check.tar.gz.
# Runs with the machine's own python3, torch and triton; only the carried wheels are
# installed, into a scratch folder.
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
SPECTUNE_TEST_DEVICE=cuda timeout 150 python3 -m pytest tests/kernels/rejection/test_rejection.py \
    tests/kernels/rejection_mrv2/test_rejection_mrv2.py -q -p no:cacheprovider \
    --junitxml="$OUT/kernel-tests.xml" 2>&1 | tee "$OUT/kernel-tests.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

timeout 100 python3 scripts/bench_verify.py --json "$OUT/bench.json" 2>&1 | tee "$OUT/bench.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
timeout 50 python3 benchmarks/bench_folded.py --max-seconds 35 --vocab 128256 --batch 1 32 \
    --k 1 4 --json "$OUT/bench-folded.json" 2>&1 | tee "$OUT/bench-folded.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

if python3 -c 'import vllm._C' 2>/dev/null; then
    # Whichever vLLM release is installed: its seams against the registry first (the
    # plugin steps aside on a release or a seam it does not know).
    python3 -c 'from spectune.cli import main; main()' doctor --vllm-seams 2>&1 \
        | tee "$OUT/vllm-seams.txt"
    timeout 120 python3 scripts/bench_verify_mrv2.py --json "$OUT/bench-mrv2.json" 2>&1 \
        | tee "$OUT/bench-mrv2.log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
    timeout 90 python3 benchmarks/bench_sampling.py --json "$OUT/bench-sampling.json" 2>&1 \
        | tee "$OUT/bench-sampling.log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
    timeout 90 python3 scripts/mrv2_engine_check.py --json "$OUT/engine-mrv2.json" 2>&1 \
        | tee "$OUT/engine-mrv2.log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
else
    echo "vLLM with its compiled ops is not importable here: seams, MRV2 and sampling" \
        "benchmarks and the engine check skipped" | tee "$OUT/mrv2-skipped.txt"
fi

if [ -d "${SPECTUNE_GPU_CHECK:-.gpu-check}" ]; then
    bash scripts/gpu_check_vs_vllm.sh || status=1
else
    echo "no .gpu-check folder carried: the comparison with vLLM's own functions skipped" \
        "(python scripts/prepare_gpu_check.py, then carry .gpu-check)" \
        | tee -a "$OUT/mrv2-skipped.txt"
fi

# A device call brings back 8 files of $OUT: past that, one archive holds them all.
if [ "$(find "$OUT" -type f | wc -l)" -gt 8 ]; then
    tar czf "/tmp/gpu-check.tar.gz" -C "$OUT" . && find "$OUT" -type f \
        ! -name 'vs-vllm-*.log' ! -name 'device.txt' -delete && mv /tmp/gpu-check.tar.gz "$OUT/"
fi
exit $status
