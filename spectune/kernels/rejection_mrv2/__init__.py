"""Model Runner V2 verification (``rejection_sample_mrv2``) and its folded family
(``rejection_sample_mrv2_folded``).

Modules, named after the family they serve:

* ``rejection_sample_mrv2``: the ``@triton.jit`` kernels and their launcher (vLLM 0.32's
  semantics, and 0.33's without FLy windows); with ``rejection_sample_mrv2_constants``
  what the families' source hash covers (besides the shared modules of
  :mod:`spectune.kernels`);
* ``rejection_sample_mrv2_fly``: vLLM 0.33's FLy windows (their kernels, and FLy's
  entropy) and the public launcher of both releases
  (:func:`spectune.kernels.rejection_sample_mrv2`, ``vllm_version=``);
* ``rejection_sample_mrv2_space`` (and ``FOLDED``, the folded family's),
  ``rejection_sample_mrv2_inputs``, ``rejection_sample_mrv2_ref``,
  ``rejection_sample_mrv2_family``: the search space and default config, the launch's
  arguments, the PyTorch reference and its rule, the adapter;
* ``rejection_sample_mrv2_folded_ref`` and ``rejection_sample_mrv2_folded_family``:
  the folded family's reference (the sampling parameters applied first) and adapter.

Public (each imported at first use, with what it needs): :class:`Mrv2Inputs`, the
reference and its rule (:func:`rejection_sample_mrv2_reference`, :class:`Mrv2Reference`,
:func:`mrv2_results_agree`, :data:`MRV2_NEAR_TIE_RTOL`) and the folded family's
(:func:`process_mrv2`, :func:`unfolded_mrv2`).
"""

from __future__ import annotations

from spectune.kernels._lazy import lazy_names

__all__ = [
    "MRV2_NEAR_TIE_RTOL",
    "Mrv2Inputs",
    "Mrv2Reference",
    "mrv2_results_agree",
    "process_mrv2",
    "rejection_sample_mrv2_reference",
    "unfolded_mrv2",
]

__getattr__, __dir__ = lazy_names(__name__, {
    "Mrv2Inputs": ".rejection_sample_mrv2_inputs",
    "MRV2_NEAR_TIE_RTOL": ".rejection_sample_mrv2_ref",
    "Mrv2Reference": ".rejection_sample_mrv2_ref",
    "mrv2_results_agree": ".rejection_sample_mrv2_ref",
    "rejection_sample_mrv2_reference": ".rejection_sample_mrv2_ref",
    "process_mrv2": ".rejection_sample_mrv2_folded_ref",
    "unfolded_mrv2": ".rejection_sample_mrv2_folded_ref",
})
