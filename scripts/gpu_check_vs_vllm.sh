#!/usr/bin/env bash
# The vs-vLLM part of scripts/gpu_check.sh: every kernel family against each carried vLLM
# release's own function (scripts/bench_vs_vllm.py), on a machine without vLLM.
# Needs the folder scripts/prepare_gpu_check.py made ($SPECTUNE_GPU_CHECK, default
# .gpu-check): its wheels are installed into a scratch folder, then each vllm-<version>
# tree goes first on PYTHONPATH for one run. Writes vs-vllm-<version>.log/.json under $OUT.
# VS_VLLM_ARGS: the bench's arguments (default: the whole grid within VS_VLLM_SECONDS).
# Rehearsed on CPU, under the interpreter, by `prepare_gpu_check.py --rehearse`.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out}
CHECK=${SPECTUNE_GPU_CHECK:-.gpu-check}
SECONDS_EACH=${VS_VLLM_SECONDS:-80}
mkdir -p "$OUT"
if ! compgen -G "$CHECK/vllm-*/vllm/__init__.py" >/dev/null; then
    echo "no vLLM trees in $CHECK: run python scripts/prepare_gpu_check.py here first" \
        | tee "$OUT/vs-vllm-skipped.txt"
    exit 1
fi
site=$(mktemp -d)
trap 'rm -rf "$site"' EXIT
if compgen -G "$CHECK/wheels/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
        --target "$site" "$CHECK"/wheels/*.whl || exit 1
fi
status=0
for tree in "$CHECK"/vllm-*/; do
    tree=${tree%/}
    version=${tree##*/vllm-}
    # The tree first: its vllm, whatever else is installed; then spectune, then the wheels.
    PYTHONPATH="$(cd "$tree" && pwd):$PWD:$site${PYTHONPATH:+:$PYTHONPATH}" \
        timeout $((SECONDS_EACH + 45)) python3 scripts/bench_vs_vllm.py \
        ${VS_VLLM_ARGS:---max-seconds "$SECONDS_EACH"} --json "$OUT/vs-vllm-$version.json" \
        2>&1 | tee "$OUT/vs-vllm-$version.log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
done
exit $status
