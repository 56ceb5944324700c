"""V1 verification (``rejection_sample``) and its folded family (``rejection_sample_folded``).

Modules, named after the family they serve:

* ``rejection_sample``: the ``@triton.jit`` kernels and their launcher, vLLM 0.32's
  semantics; with ``rejection_sample_constants`` (the
  numbers the kernels share with host code, their fixed-point width and vocabulary bound
  shared with other families) what the families' source hash covers;
* ``rejection_sample_fly``: vLLM 0.33's FLy windows (its kernels) and the public launcher
  (:func:`spectune.kernels.rejection_sample`), either release's semantics;
* ``rejection_sample_space``: the search space and default config (and ``FOLDED``, the
  folded family's); ``rejection_sample_inputs``: the launch's arguments and how to draw
  them; ``rejection_sample_ref``: the PyTorch reference and its exactness rule;
  ``rejection_sample_family``: the adapter;
* ``rejection_sample_folded_ref`` and ``rejection_sample_folded_family``: the folded
  family's reference (the sampling parameters applied first) and adapter.

Public (each imported at first use, with what it needs): the inputs
(:class:`RejectionInputs`, :func:`draw_random_inputs`, :func:`draw_sampling_params`),
the reference and its rule (:func:`rejection_sample_reference`,
:class:`ReferenceResult`, :func:`decision_margins_agree`, :data:`NEAR_TIE_RTOL`, and
:func:`fly_entropy`, vLLM 0.33's FLy entropy) and the
folded family's (:func:`process_v1`, :func:`unfolded_v1`).
"""

from __future__ import annotations

from spectune.kernels._lazy import lazy_names

__all__ = [
    "NEAR_TIE_RTOL",
    "ReferenceResult",
    "RejectionInputs",
    "decision_margins_agree",
    "draw_random_inputs",
    "draw_sampling_params",
    "fly_entropy",
    "process_v1",
    "rejection_sample_reference",
    "unfolded_v1",
]

__getattr__, __dir__ = lazy_names(__name__, {
    "RejectionInputs": ".rejection_sample_inputs",
    "draw_random_inputs": ".rejection_sample_inputs",
    "draw_sampling_params": "spectune.kernels._synthetic_inputs",
    "NEAR_TIE_RTOL": ".rejection_sample_ref",
    "ReferenceResult": ".rejection_sample_ref",
    "decision_margins_agree": ".rejection_sample_ref",
    "fly_entropy": ".rejection_sample_ref",
    "rejection_sample_reference": ".rejection_sample_ref",
    "process_v1": ".rejection_sample_folded_ref",
    "unfolded_v1": ".rejection_sample_folded_ref",
})
