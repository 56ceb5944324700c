"""The sampling steps of Model Runner V2's sampler, one family each: ``temperature``,
``min_p``, ``top_k_top_p`` (both runners' ``apply_top_k_top_p``), ``gumbel_sample``, and
the fused ``sample`` (all of them in one kernel).

Each family's modules are named after it: ``<family>.py`` holds the ``@triton.jit``
kernels and their launcher (:func:`spectune.kernels.apply_temperature`,
:func:`~spectune.kernels.apply_min_p`, :func:`~spectune.kernels.top_k_top_p`,
:func:`~spectune.kernels.gumbel_sample`, :func:`~spectune.kernels.sample`);
``<family>_space.py``, ``<family>_inputs.py``, ``<family>_ref.py`` and
``<family>_family.py`` the search space and default config, the inputs, the PyTorch
reference and its rule, the adapter; ``top_k_top_p_versions.py`` the public
:func:`~spectune.kernels.top_k_top_p`, which takes each vLLM release's arguments.

Public (each imported at first use, with what it needs): every family's inputs,
reference, agreement rule and tolerance, and :func:`rows_problem` (the problem of a
``[rows, V]`` logits launch, every family's here).
"""

from __future__ import annotations

from spectune.kernels._lazy import lazy_names

__all__ = [
    "GUMBEL_NEAR_TIE_RTOL",
    "MIN_P_NEAR_TIE_RTOL",
    "MIN_P_RTOL",
    "TEMPERATURE_DEVICE_ULPS",
    "TOP_P_MASS_TOL",
    "GumbelInputs",
    "GumbelReference",
    "MinPInputs",
    "MinPReference",
    "SampleInputs",
    "TemperatureInputs",
    "TemperatureReference",
    "TopKTopPInputs",
    "TopKTopPReference",
    "gumbel_reference",
    "gumbel_results_agree",
    "min_p_reference",
    "min_p_results_agree",
    "rows_problem",
    "sample_reference",
    "temperature_reference",
    "temperature_results_agree",
    "top_k_top_p_reference",
    "top_k_top_p_results_agree",
]

__getattr__, __dir__ = lazy_names(__name__, {
    "TemperatureInputs": ".temperature_inputs",
    "TEMPERATURE_DEVICE_ULPS": ".temperature_ref",
    "TemperatureReference": ".temperature_ref",
    "temperature_reference": ".temperature_ref",
    "temperature_results_agree": ".temperature_ref",
    "MinPInputs": ".min_p_inputs",
    "MIN_P_NEAR_TIE_RTOL": ".min_p_ref",
    "MinPReference": ".min_p_ref",
    "min_p_reference": ".min_p_ref",
    "min_p_results_agree": ".min_p_ref",
    "TopKTopPInputs": ".top_k_top_p_inputs",
    "TOP_P_MASS_TOL": ".top_k_top_p_ref",
    "TopKTopPReference": ".top_k_top_p_ref",
    "top_k_top_p_reference": ".top_k_top_p_ref",
    "top_k_top_p_results_agree": ".top_k_top_p_ref",
    "GumbelInputs": ".gumbel_sample_inputs",
    "GUMBEL_NEAR_TIE_RTOL": ".gumbel_sample_ref",
    "GumbelReference": ".gumbel_sample_ref",
    "gumbel_reference": ".gumbel_sample_ref",
    "gumbel_results_agree": ".gumbel_sample_ref",
    "SampleInputs": ".sample_inputs",
    "MIN_P_RTOL": ".sample_ref",
    "sample_reference": ".sample_ref",
    "rows_problem": "spectune.kernels._space_parts",
})
