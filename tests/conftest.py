"""Session set-up shared by every test: which vLLM ``import vllm`` gives.

``SPECTUNE_VLLM_TREE`` (an unpacked vLLM wheel, ``python scripts/vllm_tree.py 0.33.0``)
goes first on ``sys.path`` before anything imports vllm, so that the comparison tests
(``-m vllm_kernels``) run against that release's kernels.
"""

import os
import sys

_TREE = os.environ.get("SPECTUNE_VLLM_TREE")
if _TREE and _TREE not in sys.path:
    sys.path.insert(0, _TREE)
