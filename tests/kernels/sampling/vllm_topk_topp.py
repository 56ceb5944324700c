"""The installed vLLM's Triton top-k/top-p kernel (0.32's or 0.33's), run by Triton (or
its interpreter).

The oracle of tests/kernels/sampling/test_top_k_top_p.py beside vLLM's sort-based PyTorch
definition: ``apply_top_k_top_p_triton`` from ``vllm/v1/sample/ops/topk_topp_triton.py``,
source untouched, launched through vLLM's own dispatcher. On a host without a usable
Triton, ``vllm.triton_utils`` hands out placeholders, so the module is imported afresh
with ``tl``/``triton`` pointing at the real Triton, then ``sys.modules`` is put back:
spectune's own binding (``spectune.vllm._vllm_binding.vllm_modules``), as for the MRV2
kernels (tests/kernels/vllm_mrv2.py).

Under an unpacked wheel (vLLM 0.33's in the second CI session: no compiled ops) vLLM
finds no platform, and ``num_compute_units`` raises; the oracle then counts one compute
unit (:func:`_one_compute_unit`). That count only sets how many programs share the rows
(each program loops over its rows) and, on CUDA alone, the split top-p pipeline's
slices, which never run on CPU tensors: the mask does not depend on it.

One interpreter gap is bridged: vLLM's kernel loops ``for row_id in tl.range(pid, ...)``
and calls ``row_id.to(tl.int64)``; Triton's interpreter runs ``tl.range`` as Python's
``range``, whose ints have no ``.to``. Under ``TRITON_INTERPRET=1`` the module therefore
sees a ``tl`` that is Triton's own in every name except ``range``, which yields the same
values as int32 scalar tensors (what compiled Triton's loop variable is). On a GPU the
real ``triton.language`` is used as is.

Raises :class:`VllmTopkToppLayoutError` when the module moved or changed what this oracle
calls, so a vLLM upgrade fails loudly.
"""

from __future__ import annotations

import ast
import functools
import importlib
import inspect
import types
from collections.abc import Callable

import torch
from triton.runtime.interpreter import InterpretedFunction
from triton.runtime.jit import JITFunction

from spectune.vllm._vllm_binding import BindingError, vllm_modules

__all__ = ["TOPK_TOPP_MODULE", "VllmTopkToppLayoutError", "load_vllm_top_k_top_p_triton"]

TOPK_TOPP_MODULE = "vllm.v1.sample.ops.topk_topp_triton"
_KERNEL = "_topk_topp_kernel"
_ENTRY = "apply_top_k_top_p_triton"


class VllmTopkToppLayoutError(RuntimeError):
    """vLLM's Triton top-k/top-p module is not where, or not what, this oracle expects."""


def _one_compute_unit(*_: object) -> int:
    """Stand-in for ``num_compute_units`` where vLLM knows no platform (see module doc)."""
    return 1


def _uses_libdevice(module: types.ModuleType) -> bool:
    tree = ast.parse(inspect.getsource(module))
    return any(isinstance(node, ast.Name) and node.id == "tldevice" for node in ast.walk(tree))


@functools.cache
def load_vllm_top_k_top_p_triton() -> Callable[..., torch.Tensor]:
    """vLLM's ``apply_top_k_top_p_triton(logits, k, p)``, its kernel on the real Triton.

    Loaded once per session. Raises :class:`ModuleNotFoundError` without vllm,
    :class:`VllmTopkToppLayoutError` if the module changed.
    """
    try:
        normal = importlib.import_module(TOPK_TOPP_MODULE)
    except ModuleNotFoundError as exc:
        if exc.name is not None and exc.name.startswith("vllm."):
            raise VllmTopkToppLayoutError(f"vLLM's top-k/top-p module moved: {exc}") from exc
        raise
    if _uses_libdevice(normal):
        raise VllmTopkToppLayoutError(f"{TOPK_TOPP_MODULE} now calls libdevice functions")
    # The binding is spectune's own (the one a sweep measures vLLM's functions with):
    # a fresh copy on the real Triton, its ``tl.range`` yielding int32 scalar tensors
    # under the interpreter (module doc), sys.modules restored and checked.
    try:
        fresh = vllm_modules((TOPK_TOPP_MODULE,), int32_range=True)[TOPK_TOPP_MODULE]
    except BindingError as exc:
        raise VllmTopkToppLayoutError(f"{TOPK_TOPP_MODULE}: {exc}") from exc
    kernel = getattr(fresh, _KERNEL, None)
    if not isinstance(kernel, JITFunction | InterpretedFunction):
        raise VllmTopkToppLayoutError(f"{TOPK_TOPP_MODULE}.{_KERNEL} is not a Triton kernel")
    entry = getattr(fresh, _ENTRY, None)
    if entry is None or list(inspect.signature(entry).parameters)[:3] != ["logits", "k", "p"]:
        raise VllmTopkToppLayoutError(f"{TOPK_TOPP_MODULE}.{_ENTRY}(logits, k, p) changed")
    units = getattr(fresh, "num_compute_units", None)
    if units is not None:
        try:
            units()
        except NotImplementedError:
            fresh.num_compute_units = _one_compute_unit
    return entry
