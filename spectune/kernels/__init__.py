"""Triton kernels for speculative-decoding verification, one module per kernel family.

Public API:
    rejection_sample: verify drafts (greedy and rejection sampling), vLLM 0.32 semantics.
    rejection_sample_reference: the plain PyTorch reference.
    FAMILIES: every registered kernel family, by name (what the tuner sees).
"""

from __future__ import annotations

from spectune.kernels._family import KernelFamily
from spectune.kernels.rejection import FAMILY as _REJECTION
from spectune.kernels.rejection import (
    NEAR_TIE_RTOL,
    ReferenceResult,
    RejectionInputs,
    decision_margins_agree,
    draw_random_inputs,
    rejection_sample,
    rejection_sample_reference,
)

__all__ = [
    "FAMILIES",
    "NEAR_TIE_RTOL",
    "KernelFamily",
    "ReferenceResult",
    "RejectionInputs",
    "decision_margins_agree",
    "draw_random_inputs",
    "get_family",
    "rejection_sample",
    "rejection_sample_reference",
]

#: Registered kernel families. Adding one is a new module and one line here.
FAMILIES: dict[str, KernelFamily] = {
    _REJECTION.name: _REJECTION,
}


def get_family(name: str) -> KernelFamily:
    """The kernel family registered as ``name``.

    Raises:
        ValueError: if no family has that name.
    """
    try:
        return FAMILIES[name]
    except KeyError:
        raise ValueError(f"unknown kernel family {name!r}; known: {sorted(FAMILIES)}") from None
