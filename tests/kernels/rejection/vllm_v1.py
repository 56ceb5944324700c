"""vLLM's V1 rejection sampling (``vllm.v1.sample.rejection_sampler``, and 0.33's FLy
kernels in ``vllm.v1.spec_decode.fly``), its Triton kernels run by Triton (or its
interpreter).

The oracle of tests/kernels/rejection/test_rejection_vs_vllm.py where vLLM's C++ CPU ops
are not there (an unpacked vLLM wheel, such as 0.33's in the second CI session, has no
``vllm._C``): the modules are imported afresh with ``vllm.triton_utils.tl``/``triton``
pointing at the real Triton (where vLLM finds no usable Triton they are placeholders
whose ``jit`` leaves kernels as plain functions), then ``sys.modules``, the parent
packages' attributes and the placeholders are put back, by spectune's own binding
(``spectune.vllm._vllm_binding.vllm_modules``), as
tests/kernels/sampling/vllm_topk_topp.py does for the top-k/top-p kernel. The fresh
module's ``rejection_sample`` (source untouched) launches vLLM's kernels through vLLM's
own dispatchers.

Raises :class:`VllmV1LayoutError` when the modules moved or changed what this oracle
calls, so a vLLM upgrade fails loudly.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import inspect
import types

from triton.runtime.interpreter import InterpretedFunction
from triton.runtime.jit import JITFunction

from spectune.vllm._vllm_binding import BindingError, vllm_modules

__all__ = ["FLY_MODULE", "REJECTION_MODULE", "VllmV1LayoutError", "load_vllm_v1"]

REJECTION_MODULE = "vllm.v1.sample.rejection_sampler"
#: vLLM 0.33's FLy kernels (absent before 0.33).
FLY_MODULE = "vllm.v1.spec_decode.fly"
#: The leading parameters of vLLM's ``rejection_sample`` the tests pass, in order.
REJECTION_SAMPLE_PARAMS = (
    "draft_token_ids", "num_draft_tokens", "max_spec_len", "cu_num_draft_tokens",
    "draft_probs", "target_logits", "bonus_token_ids", "sampling_metadata",
)
#: The kernels ``rejection_sample`` launches.
KERNELS = {
    REJECTION_MODULE: ("rejection_greedy_sample_kernel", "rejection_random_sample_kernel",
                       "sample_recovered_tokens_kernel"),
    FLY_MODULE: ("apply_fly_greedy_acceptance_kernel", "apply_fly_random_acceptance_kernel"),
}


class VllmV1LayoutError(RuntimeError):
    """vLLM's V1 rejection sampling is not where, or not what, this oracle expects."""


def _has_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


@functools.cache
def load_vllm_v1() -> types.ModuleType:
    """A fresh ``vllm.v1.sample.rejection_sampler`` whose kernels are real Triton ones
    (with, where vLLM has it, a fresh ``vllm.v1.spec_decode.fly`` it uses). Loaded once
    per session.

    Raises:
        ModuleNotFoundError: without vllm.
        VllmV1LayoutError: if the modules changed.
    """
    names = [FLY_MODULE] if _has_module(FLY_MODULE) else []
    names.append(REJECTION_MODULE)
    try:
        for name in names:
            importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and exc.name.startswith("vllm."):
            raise VllmV1LayoutError(f"vLLM's V1 rejection sampler moved: {exc}") from exc
        raise
    # The binding is spectune's own (the one a sweep measures vLLM's functions with):
    # fresh copies on the real Triton, sys.modules restored and checked.
    try:
        fresh = vllm_modules(tuple(names))
    except BindingError as exc:
        raise VllmV1LayoutError(f"vLLM's V1 rejection sampler: {exc}") from exc
    for name, module in fresh.items():
        for kernel in KERNELS[name]:
            if not isinstance(getattr(module, kernel, None), JITFunction | InterpretedFunction):
                raise VllmV1LayoutError(f"{name}.{kernel} is not a Triton kernel")
    module = fresh[REJECTION_MODULE]
    if FLY_MODULE in fresh:
        for kernel in KERNELS[FLY_MODULE]:
            if getattr(module, kernel, None) is not getattr(fresh[FLY_MODULE], kernel):
                raise VllmV1LayoutError(f"{REJECTION_MODULE} does not launch the fresh {kernel}")
    params = tuple(inspect.signature(module.rejection_sample).parameters)
    if params[: len(REJECTION_SAMPLE_PARAMS)] != REJECTION_SAMPLE_PARAMS:
        raise VllmV1LayoutError(f"rejection_sample's parameters changed: {params}")
    return module
