"""spectune's vLLM plugin: vLLM's verification routed to spectune's tuned kernels.

vLLM discovers the entry point ``spectune = "spectune.vllm:register"`` (group
``vllm.general_plugins``) and calls :func:`register` in every process it starts; each
worker then loads the tuned configs usable on its device and routes its verification
(see ``docs/vllm_plugin.md``): Model Runner V2's (vLLM's default wherever Triton runs)
or the V1 runner's. :func:`routed_calls` says how many verification calls of this process
went through spectune's kernels (:func:`routed_by_seam`: those and the sampling steps
routed with them, by vLLM function), :func:`passed_calls` how many went to vLLM's own
function, by reason (modes spectune does not implement).

Controls (environment, read when each worker starts): ``SPECTUNE_DISABLE=1`` does
nothing; ``SPECTUNE_DB`` names the database read first (see :mod:`spectune.db`);
``SPECTUNE_FORCE=1`` routes even with no tuned configs (default configs);
``SPECTUNE_RNG=fused`` draws the random inputs inside the kernels (default ``vllm``:
drawn as vLLM draws them, so seeded requests give vLLM's tokens); ``SPECTUNE_SAMPLING=0``
routes the verification only (vLLM keeps its top-k/top-p, temperature, min-p and Gumbel
sampling steps).

The package holds the controls (``_settings``), the worker hook (``_hook``), the seam to
the databases and the kernel registry (``_configs``), the routers (``_router``: what they
share; ``_v1_router``, ``_mrv2_router``; ``_sampling_routers``: the sampling steps) and
``spectune doctor``'s checks (:mod:`spectune.vllm.doctor`), which use the plugin and are
never imported by it. :func:`vllm_incumbent` (``_incumbents``, with ``_vllm_binding``)
runs the installed vLLM's own function that a family replaces on that family's inputs,
for the tuner to measure beside spectune's kernel. :mod:`spectune.vllm.seams` lists the
vLLM functions the routers depend on, per supported vLLM release, and decides at engine
start which families the installed vLLM admits. Importing this package imports nothing heavy.
"""

from __future__ import annotations

from spectune.vllm._hook import passed_calls, register, routed_by_seam, routed_calls
from spectune.vllm._incumbents import (
    Incumbent,
    IncumbentUnavailable,
    incumbent_modules,
    installed_vllm_version,
    vllm_incumbent,
)

__all__ = [
    "Incumbent",
    "IncumbentUnavailable",
    "incumbent_modules",
    "installed_vllm_version",
    "passed_calls",
    "register",
    "routed_by_seam",
    "routed_calls",
    "vllm_incumbent",
]
