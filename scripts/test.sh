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
export TRITON_INTERPRET=1
ruff check spectune tests scripts benchmarks
# Two workers or more (one per core), each test file on one worker: module-scoped set-up
# (vLLM engines, loaded vLLM kernels) runs once.
exec python -m pytest -q -n auto --dist loadfile "$@"
