#!/usr/bin/env bash
# The main job: set up, then run the verification kernels on CPU (Triton interpreter)
# on a realistic case, side by side with the PyTorch reference.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# shellcheck disable=SC1091
. .venv/bin/activate
export TRITON_INTERPRET=1
exec spectune demo "$@"
