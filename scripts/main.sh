#!/usr/bin/env bash
# The main job: set up, run a short sweep on small shapes into the embedded SQLite
# default (the user database, or SPECTUNE_DB), and show the tuned table. Without a GPU
# the kernels run on CPU under Triton's interpreter: its timings are CPU wall time.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# shellcheck disable=SC1091
. .venv/bin/activate
if ! python -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    export TRITON_INTERPRET=1
fi
# Tables are wide: when the output is not a terminal (a log, a pipe), rich would wrap
# them at 80 columns.
[ -t 1 ] || export COLUMNS="${COLUMNS:-200}"
# The verification family GPUs run: Model Runner V2's (vLLM's default wherever Triton
# works; `--kernel rejection_sample` tunes the V1 runner's). Each shape's serving config
# is then measured beside vLLM's own function (the "vs vLLM" column: vLLM's p50 over
# spectune's; on CPU both sides are interpreter times). The plugin routes only the
# shapes where spectune was faster.
spectune sweep --kernel rejection_sample_mrv2 --spec-lens 1,2 --batch-sizes 1,4 \
    --vocab-sizes 32000 --trials 10 --patience 6 "$@"
spectune db show
