"""The installed vLLM's Triton top-k/top-p kernel (0.32's or 0.33's), run by Triton (or
its interpreter).

The oracle of tests/kernels/sampling/test_top_k_top_p.py beside vLLM's sort-based PyTorch
definition: ``apply_top_k_top_p_triton`` from ``vllm/v1/sample/ops/topk_topp_triton.py``,
source untouched, launched through vLLM's own dispatcher. On a host without a usable
Triton, ``vllm.triton_utils`` hands out placeholders, so the module is imported afresh
with ``tl``/``triton`` pointing at the real Triton, then ``sys.modules`` is put back
(as tests/kernels/vllm_mrv2.py does for the MRV2 kernels).

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
import os
import sys
import types
from collections.abc import Callable, Iterator

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction
from triton.runtime.jit import JITFunction

__all__ = ["TOPK_TOPP_MODULE", "VllmTopkToppLayoutError", "load_vllm_top_k_top_p_triton"]

TOPK_TOPP_MODULE = "vllm.v1.sample.ops.topk_topp_triton"
_KERNEL = "_topk_topp_kernel"
_ENTRY = "apply_top_k_top_p_triton"


class VllmTopkToppLayoutError(RuntimeError):
    """vLLM's Triton top-k/top-p module is not where, or not what, this oracle expects."""


class _InterpreterLanguage(types.ModuleType):
    """``triton.language`` whose ``range`` yields int32 scalar tensors (see module doc)."""

    def __getattr__(self, name: str) -> object:
        return getattr(tl, name)

    def range(self, *args: object, **kwargs: object) -> Iterator[object]:
        for value in tl.range(*args, **kwargs):
            yield tl.full((), value, tl.int32)


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


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
    import vllm.triton_utils as tu

    try:
        normal = importlib.import_module(TOPK_TOPP_MODULE)
    except ModuleNotFoundError as exc:
        if exc.name is not None and exc.name.startswith("vllm."):
            raise VllmTopkToppLayoutError(f"vLLM's top-k/top-p module moved: {exc}") from exc
        raise
    if _uses_libdevice(normal):
        raise VllmTopkToppLayoutError(f"{TOPK_TOPP_MODULE} now calls libdevice functions")
    lang: types.ModuleType = _InterpreterLanguage("triton.language") if _interpreting() else tl
    modules_before = dict(sys.modules)
    saved = (tu.tl, tu.triton)
    del sys.modules[TOPK_TOPP_MODULE]
    tu.tl, tu.triton = lang, triton
    try:
        fresh = importlib.import_module(TOPK_TOPP_MODULE)
    finally:
        tu.tl, tu.triton = saved
        for name in set(sys.modules) - set(modules_before):
            del sys.modules[name]
        sys.modules[TOPK_TOPP_MODULE] = normal
        parent = sys.modules.get(TOPK_TOPP_MODULE.rpartition(".")[0])
        if parent is not None:
            setattr(parent, TOPK_TOPP_MODULE.rpartition(".")[2], normal)
    if set(sys.modules) != set(modules_before):
        raise VllmTopkToppLayoutError("loading vLLM's top-k/top-p module left sys.modules changed")
    # The interpreter patches the language module it finds among a kernel's globals; the
    # stand-in is not it, so the real one is made visible beside it.
    fresh.__dict__.setdefault("_triton_language", tl)
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
