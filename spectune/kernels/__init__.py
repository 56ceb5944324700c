"""Triton kernels for speculative decoding (verification and sampling), and the registry of
their families.

The kernels live in one subpackage per family group: :mod:`spectune.kernels.rejection`
(V1 verification, ``rejection_sample``, and ``rejection_sample_folded``),
:mod:`spectune.kernels.rejection_mrv2` (Model Runner V2 verification,
``rejection_sample_mrv2``, and ``rejection_sample_mrv2_folded``) and
:mod:`spectune.kernels.sampling` (``temperature``, ``min_p``, ``top_k_top_p``,
``gumbel_sample`` and the fused ``sample``). Each subpackage offers its families'
references, inputs, agreement rules and tolerances; its modules are named after the
family they serve (``<family>.py``: the ``@triton.jit`` kernels and their launcher;
``<family>_space.py``, ``_inputs.py``, ``_ref.py``, ``_family.py``: the search space,
inputs, PyTorch reference and adapter). Code several families share is in this
package's private modules.

Importing this package, reading :data:`FAMILIES`, :func:`get_family`,
:func:`family_hashes` and :func:`family_space` imports no Triton kernel (nor Triton, nor
torch): a kernel function below is imported at its first use, a family's kernels at the
first call that needs them (inputs, launches, references).

Public API:
    rejection_sample: verify drafts (greedy and rejection sampling), vLLM V1 semantics,
        0.32's or 0.33's (FLy windows); its sampling parameters folded in with
        ``temperature``, ``top_k``, ``top_p``, ``min_p``.
    rejection_sample_mrv2: verify drafts with vLLM Model Runner V2 semantics, 0.32's or
        0.33's (FLy windows; its arguments, its counter-based random numbers).
    gumbel_sample: Gumbel-max sampling with Model Runner V2 semantics.
    apply_temperature, apply_min_p: Model Runner V2's temperature and min-p, in place.
    top_k_top_p: top-k/top-p masking, in place, exactly as vLLM's sort-based definition
        (0.32's and 0.33's alike; each release's arguments).
    sample: the fused sampler (temperature, min-p, top-k/top-p, Gumbel-max in one
        kernel, Model Runner V2's arguments and noise).
    MAX_VOCAB, LOGITS_DTYPES: the vocabularies and logits dtypes the kernels support.
    KernelFamily: what the tuner, the database and the plugin need of a family.
    FAMILIES, get_family: every registered kernel family, by name.
    preload: import the named families' kernels now (the plugin, in the background).
    family_hashes, family_space: the installed families as the database checks rows
        against them (source hashes; search space of a family on a backend).
    ProblemLimits, declared_limits: the largest problem a family takes.
    vllm_semantics_version: the vLLM release whose semantics a kernel's
        ``vllm_version=None`` selects (the installed one if supported, else the newest).
"""

from __future__ import annotations

from spectune.kernels._family import (
    KernelFamily,
    ProblemLimits,
    RegisteredFamily,
    declared_limits,
)
from spectune.kernels._lazy import lazy_names
from spectune.space import SearchSpace

__all__ = [
    "FAMILIES",
    "LOGITS_DTYPES",
    "MAX_VOCAB",
    "KernelFamily",
    "ProblemLimits",
    "apply_min_p",
    "apply_temperature",
    "declared_limits",
    "family_hashes",
    "family_space",
    "get_family",
    "gumbel_sample",
    "preload",
    "rejection_sample",
    "rejection_sample_mrv2",
    "sample",
    "top_k_top_p",
    "vllm_semantics_version",
]

# Imported at first use (each with its family's kernels).
__getattr__, __dir__ = lazy_names(__name__, {
    "rejection_sample": ".rejection.rejection_sample_fly",
    "rejection_sample_mrv2": ".rejection_mrv2.rejection_sample_mrv2_fly",
    "gumbel_sample": ".sampling.gumbel_sample",
    "apply_temperature": ".sampling.temperature",
    "apply_min_p": ".sampling.min_p",
    "top_k_top_p": ".sampling.top_k_top_p_versions",
    "sample": ".sampling.sample",
    "MAX_VOCAB": ".rejection.rejection_sample_constants",
    "LOGITS_DTYPES": "._tensors",
    "vllm_semantics_version": "._vllm_version",
})

# What each family's source hash covers, in order: its kernels and launcher, the numbers
# they share with host code, the shared device code they call (reductions, counter-based
# random streams, the fold, the threshold search) and the launch options. A tuned row is
# used only while its family's hash is the one it was tuned with.
_V1_CODE = (".rejection.rejection_sample", ".rejection.rejection_sample_constants",
            "._reductions", "._launch", "._folding", "._truncation")
_MRV2_CODE = (".rejection_mrv2.rejection_sample_mrv2",
              ".rejection_mrv2.rejection_sample_mrv2_constants", "._counter_rng",
              ".rejection.rejection_sample_constants", "._reductions", "._launch",
              "._folding", "._truncation")

#: Registered kernel families, by name. Adding one is its modules and one line here. The
#: folded families launch the unfolded families' kernels (the same hash; their own
#: names, spaces and rows).
FAMILIES: dict[str, KernelFamily] = {family.name: family for family in (
    RegisteredFamily(
        "rejection_sample", source_modules=_V1_CODE,
        adapter=".rejection.rejection_sample_family:RejectionSampleFamily",
        space=".rejection.rejection_sample_space"),
    RegisteredFamily(
        "rejection_sample_mrv2", source_modules=_MRV2_CODE,
        adapter=".rejection_mrv2.rejection_sample_mrv2_family:RejectionSampleMrv2Family",
        space=".rejection_mrv2.rejection_sample_mrv2_space"),
    RegisteredFamily(
        "rejection_sample_folded", source_modules=_V1_CODE,
        adapter=".rejection.rejection_sample_folded_family:RejectionSampleFoldedFamily",
        space=".rejection.rejection_sample_space:FOLDED"),
    RegisteredFamily(
        "rejection_sample_mrv2_folded", source_modules=_MRV2_CODE,
        adapter=(".rejection_mrv2.rejection_sample_mrv2_folded_family"
                 ":RejectionSampleMrv2FoldedFamily"),
        space=".rejection_mrv2.rejection_sample_mrv2_space:FOLDED"),
    RegisteredFamily(
        "gumbel_sample",
        source_modules=(".sampling.gumbel_sample", "._counter_rng", "._reductions",
                        "._launch"),
        adapter=".sampling.gumbel_sample_family:GumbelSampleFamily",
        space=".sampling.gumbel_sample_space"),
    RegisteredFamily(
        "temperature", source_modules=(".sampling.temperature", "._launch"),
        adapter=".sampling.temperature_family:TemperatureFamily",
        space=".sampling.temperature_space"),
    RegisteredFamily(
        "min_p", source_modules=(".sampling.min_p", "._reductions", "._launch"),
        adapter=".sampling.min_p_family:MinPFamily",
        space=".sampling.min_p_space"),
    RegisteredFamily(
        "top_k_top_p",
        source_modules=(".sampling.top_k_top_p", "._truncation",
                        ".rejection.rejection_sample_constants", "._launch"),
        adapter=".sampling.top_k_top_p_family:TopKTopPFamily",
        space=".sampling.top_k_top_p_space"),
    RegisteredFamily(
        "sample",
        source_modules=(".sampling.sample", "._truncation", "._counter_rng", "._reductions",
                        ".rejection.rejection_sample_constants", "._launch"),
        adapter=".sampling.sample_family:SampleFamily",
        space=".sampling.sample_space"),
)}


def get_family(name: str) -> KernelFamily:
    """The kernel family registered as ``name``.

    Raises:
        ValueError: if no family has that name.
    """
    try:
        return FAMILIES[name]
    except KeyError:
        raise ValueError(f"unknown kernel family {name!r}; known: {sorted(FAMILIES)}") from None


def preload(*names: str) -> None:
    """Import the kernels of the families ``names`` now, so that their first call does not
    (what the vLLM plugin does in the background for the families it routes).

    Raises:
        ValueError: if no family has one of the names.
    """
    for name in names:
        family = get_family(name)
        if isinstance(family, RegisteredFamily):
            family.load()


def family_hashes() -> dict[str, str]:
    """Source hash of every registered kernel family, by name (what tuned rows must match)."""
    return {name: family.source_hash for name, family in FAMILIES.items()}


def family_space(kernel: str, backend: str) -> SearchSpace | None:
    """The declared search space of ``kernel`` on ``backend``; ``None`` for an unknown family.

    The signature of the ``(kernel, backend) -> space`` lookups :mod:`spectune.db` takes.
    """
    family = FAMILIES.get(kernel)
    return None if family is None else family.search_space(backend)
