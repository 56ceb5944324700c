"""Session set-up: ``SPECTUNE_VLLM_TREE`` (an unpacked vLLM wheel) first on ``sys.path``."""

import os
import sys

if os.environ.get("SPECTUNE_VLLM_TREE"):
    sys.path.insert(0, os.environ["SPECTUNE_VLLM_TREE"])
