"""Triton kernels for speculative-decoding verification, and the registry of their families.

A kernel family is a few modules named after it: ``<family>.py`` holds the Triton
kernels and their launcher (with ``<family>_constants.py``, the numbers kernels and host
code share: together, what the family's source hash covers); ``<family>_space.py`` the
search space and default config; ``<family>_inputs.py`` and ``<family>_reference.py``
the inputs, their generator and the PyTorch reference; ``<family>_family.py`` the
:class:`KernelFamily` adapter, registered in :data:`FAMILIES` below by one line.

Public API:
    rejection_sample: verify drafts (greedy and rejection sampling), vLLM 0.32 semantics.
    rejection_sample_reference: the plain PyTorch reference.
    RejectionInputs: one launch's arguments (what the tuner and the vLLM router build).
    rejection_sample_mrv2: verify drafts with vLLM 0.32 Model Runner V2 semantics (its
        arguments, its counter-based random numbers); rejection_sample_mrv2_reference,
        Mrv2Inputs, Mrv2Reference, mrv2_results_agree: its reference, inputs and rule.
    gumbel_sample: Gumbel-max sampling with vLLM 0.32 Model Runner V2 semantics (its
        arguments, its counter-based noise); gumbel_reference, GumbelInputs,
        GumbelReference, gumbel_results_agree: its reference, inputs and rule.
    apply_temperature: temperature scaling of logits, in place, with vLLM 0.32 Model
        Runner V2 semantics; temperature_reference, TemperatureInputs,
        TemperatureReference, temperature_results_agree, TEMPERATURE_DEVICE_ULPS: its
        reference, inputs and rule.
    apply_min_p: min-p filtering of logits, in place, with vLLM 0.32 Model Runner V2
        semantics; min_p_reference, MinPInputs, MinPReference, min_p_results_agree,
        MIN_P_NEAR_TIE_RTOL: its reference, inputs and rule.
    top_k_top_p: top-k/top-p masking of logits, in place, exactly as vLLM 0.32's
        sort-based definition; top_k_top_p_reference, TopKTopPInputs, TopKTopPReference,
        top_k_top_p_results_agree, TOP_P_MASS_TOL: its reference, inputs and rule.
    sample: the fused sampler (temperature, min-p, top-k/top-p, Gumbel-max in one kernel,
        Model Runner V2's arguments and noise); sample_reference, SampleInputs: its
        reference (the unfused chain) and inputs (the rule is gumbel_results_agree).
    MAX_VOCAB, LOGITS_DTYPES: the vocabularies and logits dtypes the kernels support.
    FAMILIES: every registered kernel family, by name (what the tuner sees).
    family_hashes, family_space: the installed families as the database checks rows
        against them (source hashes; search space of a family on a backend).
"""

from __future__ import annotations

from spectune.kernels._family import KernelFamily
from spectune.kernels._tensors import LOGITS_DTYPES
from spectune.kernels.gumbel import gumbel_sample
from spectune.kernels.gumbel_family import FAMILY as _GUMBEL
from spectune.kernels.gumbel_inputs import GumbelInputs
from spectune.kernels.gumbel_reference import (
    GUMBEL_NEAR_TIE_RTOL,
    GumbelReference,
    gumbel_reference,
    gumbel_results_agree,
)
from spectune.kernels.min_p import apply_min_p
from spectune.kernels.min_p_family import FAMILY as _MIN_P
from spectune.kernels.min_p_inputs import MinPInputs
from spectune.kernels.min_p_reference import (
    MIN_P_NEAR_TIE_RTOL,
    MinPReference,
    min_p_reference,
    min_p_results_agree,
)
from spectune.kernels.rejection import rejection_sample
from spectune.kernels.rejection_constants import MAX_VOCAB
from spectune.kernels.rejection_family import FAMILY as _REJECTION
from spectune.kernels.rejection_folded_family import MRV2_FOLDED as _MRV2_FOLDED
from spectune.kernels.rejection_folded_family import V1_FOLDED as _V1_FOLDED
from spectune.kernels.rejection_folded_reference import process_mrv2, process_v1
from spectune.kernels.rejection_inputs import RejectionInputs, draw_random_inputs
from spectune.kernels.rejection_mrv2 import rejection_sample_mrv2
from spectune.kernels.rejection_mrv2_family import FAMILY as _REJECTION_MRV2
from spectune.kernels.rejection_mrv2_inputs import Mrv2Inputs
from spectune.kernels.rejection_mrv2_reference import (
    MRV2_NEAR_TIE_RTOL,
    Mrv2Reference,
    mrv2_results_agree,
    rejection_sample_mrv2_reference,
)
from spectune.kernels.rejection_reference import (
    NEAR_TIE_RTOL,
    ReferenceResult,
    decision_margins_agree,
    rejection_sample_reference,
)
from spectune.kernels.sampling import sample
from spectune.kernels.sampling_family import FAMILY as _SAMPLE
from spectune.kernels.sampling_inputs import SampleInputs
from spectune.kernels.sampling_reference import sample_reference
from spectune.kernels.temperature import apply_temperature
from spectune.kernels.temperature_family import FAMILY as _TEMPERATURE
from spectune.kernels.temperature_inputs import TemperatureInputs
from spectune.kernels.temperature_reference import (
    TEMPERATURE_DEVICE_ULPS,
    TemperatureReference,
    temperature_reference,
    temperature_results_agree,
)
from spectune.kernels.topk_topp import top_k_top_p
from spectune.kernels.topk_topp_family import FAMILY as _TOP_K_TOP_P
from spectune.kernels.topk_topp_inputs import TopKTopPInputs
from spectune.kernels.topk_topp_reference import (
    TOP_P_MASS_TOL,
    TopKTopPReference,
    top_k_top_p_reference,
    top_k_top_p_results_agree,
)
from spectune.space import SearchSpace

__all__ = [
    "FAMILIES",
    "GUMBEL_NEAR_TIE_RTOL",
    "LOGITS_DTYPES",
    "MAX_VOCAB",
    "MIN_P_NEAR_TIE_RTOL",
    "MRV2_NEAR_TIE_RTOL",
    "NEAR_TIE_RTOL",
    "TEMPERATURE_DEVICE_ULPS",
    "TOP_P_MASS_TOL",
    "GumbelInputs",
    "GumbelReference",
    "KernelFamily",
    "MinPInputs",
    "MinPReference",
    "Mrv2Inputs",
    "Mrv2Reference",
    "ReferenceResult",
    "RejectionInputs",
    "SampleInputs",
    "TemperatureInputs",
    "TemperatureReference",
    "TopKTopPInputs",
    "TopKTopPReference",
    "apply_min_p",
    "apply_temperature",
    "decision_margins_agree",
    "draw_random_inputs",
    "family_hashes",
    "family_space",
    "get_family",
    "gumbel_reference",
    "gumbel_results_agree",
    "gumbel_sample",
    "min_p_reference",
    "min_p_results_agree",
    "mrv2_results_agree",
    "process_mrv2",
    "process_v1",
    "rejection_sample",
    "rejection_sample_mrv2",
    "rejection_sample_mrv2_reference",
    "rejection_sample_reference",
    "sample",
    "sample_reference",
    "temperature_reference",
    "temperature_results_agree",
    "top_k_top_p",
    "top_k_top_p_reference",
    "top_k_top_p_results_agree",
]

#: Registered kernel families. Adding one is its modules and one line here.
FAMILIES: dict[str, KernelFamily] = {
    _REJECTION.name: _REJECTION,
    _REJECTION_MRV2.name: _REJECTION_MRV2,
    _V1_FOLDED.name: _V1_FOLDED,
    _MRV2_FOLDED.name: _MRV2_FOLDED,
    _GUMBEL.name: _GUMBEL,
    _TEMPERATURE.name: _TEMPERATURE,
    _MIN_P.name: _MIN_P,
    _TOP_K_TOP_P.name: _TOP_K_TOP_P,
    _SAMPLE.name: _SAMPLE,
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


def family_hashes() -> dict[str, str]:
    """Source hash of every registered kernel family, by name (what tuned rows must match)."""
    return {name: family.source_hash for name, family in FAMILIES.items()}


def family_space(kernel: str, backend: str) -> SearchSpace | None:
    """The declared search space of ``kernel`` on ``backend``; ``None`` for an unknown family.

    The signature of the ``(kernel, backend) -> space`` lookups :mod:`spectune.db` takes.
    """
    family = FAMILIES.get(kernel)
    return None if family is None else family.search_space(backend)
