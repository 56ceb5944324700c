#!/usr/bin/env bash
# Set up, start the services the tests need, and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# shellcheck disable=SC1091
. .venv/bin/activate
# The benchmark-only peers (Kernel Tuner, the autotuning-methodology score) that
# tests/test_benchmarks.py runs; never needed by the main job, so installed here rather
# than by setup.sh.
python -c "import kernel_tuner, autotuning_methodology" 2>/dev/null || python -m pip install -q -e ".[bench]"
if [ -f scripts/postgres.sh ]; then
    # Installs (Debian package) and starts a throwaway PostgreSQL on loopback;
    # prints the URL the tests use.
    SPECTUNE_TEST_PG_URL=$(bash scripts/postgres.sh)
    export SPECTUNE_TEST_PG_URL
fi
# vLLM 0.33 has no CPU build: its wheel's Python and Triton sources, unpacked into a
# cache outside the repository (once per machine), are what its comparisons run against.
vllm_next_tree=$(python scripts/vllm_tree.py 0.33.0)
export TRITON_INTERPRET=1
ruff check spectune tests scripts benchmarks
# Two workers or more (one per core), each test file on one worker: module-scoped set-up
# (vLLM engines, loaded vLLM kernels) runs once.
python -m pytest -q -n auto --dist loadfile "$@"
# The comparisons with vLLM's own kernels again, against vLLM 0.33 (one process sees one
# vLLM): only the files that hold such tests are collected.
mapfile -t comparison_files < <(grep -rl --include='test_*.py' "pytest.mark.vllm_kernels" tests)
SPECTUNE_VLLM_TREE=$vllm_next_tree exec python -m pytest -q -n auto --dist loadfile \
    -m vllm_kernels "${comparison_files[@]}"
