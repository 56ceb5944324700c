"""Numbers the MRV2 verification kernels and host code must agree on, defined once.

The random streams MRV2 shares with MRV2's sampling kernels are in
:mod:`spectune.kernels._counter_rng`. Kernels read a module global only if it is a
``tl.constexpr``; host code reads those with ``.value``. Part of the family's source hash
(see :mod:`spectune.kernels.rejection_mrv2.rejection_sample_mrv2_family`).
"""

from __future__ import annotations

import triton.language as tl

__all__ = ["GROUP", "PLACEHOLDER_TOKEN_ID"]

#: Output slots past a request's sampled tokens (vLLM leaves them unwritten).
PLACEHOLDER_TOKEN_ID = tl.constexpr(-1)

#: Logits per group of the softmax statistics. A group's max and fixed-point sum are
#: exact whatever the launch config, so the vocabulary tile must be a multiple of it.
GROUP = tl.constexpr(256)
