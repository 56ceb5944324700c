"""vLLM's "apply the sampling parameters, then verify" step, routed to folded verification.

Before verifying drafts, vLLM writes the target logits with each request's sampling
parameters applied: Model Runner V2's ``RejectionSampler._verify`` calls
``Sampler.apply_sampling_params`` (an fp32 ``[N, V]`` copy, tempered, min-p and
top-k/top-p masked in place) and then ``rejection_sample``; V1's
``RejectionSampler.forward`` calls ``apply_sampling_constraints`` (temperature, top-k,
top-p, in place) and then ``rejection_sample``. Where the parameters are all the step
applies, spectune's folded families verify the raw logits and apply them as they load
(:mod:`spectune.kernels._folding`): the processed rows are never written.

* :class:`Mrv2FoldRouter` replaces the method ``RejectionSampler._verify`` of Model
  Runner V2 (a companion of its verification router).
* :class:`V1FoldRouter` replaces V1's ``apply_sampling_constraints``: it returns the raw
  logits and keeps the parameters for the verification router, which launches the folded
  family on them (or, if it cannot route that call, applies them with vLLM's function
  first, so vLLM's verification gets what it always gets).

Not folded, counted with the reason, and left to vLLM's step (whose parts stay routed to
spectune's sampling kernels): logits processors at work in the batch (penalties, logit
bias, bad words, a thinking budget, any custom processor), processed logprobs, the
sampling mask, requested logprobs (V1), block verification, synthetic acceptance,
watermarking, and what the verification kernels do not take. ``SPECTUNE_FOLD=0`` turns
folding off.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any

from spectune.vllm._router import SeamRouter

if TYPE_CHECKING:
    import numpy as np
    import torch

    from spectune.kernels.rejection_mrv2 import Mrv2Inputs

__all__ = ["MRV2_FOLDED_KERNEL", "V1_FOLDED_KERNEL", "Mrv2FoldRouter", "V1FoldRouter",
           "fold_router"]

#: The kernel family that verifies V1's drafts with the parameters folded in.
V1_FOLDED_KERNEL = "rejection_sample_folded"
#: The kernel family that verifies Model Runner V2's drafts with the parameters folded in.
MRV2_FOLDED_KERNEL = "rejection_sample_mrv2_folded"

_RUNNER = "sampling parameters folded into verification"


class V1FoldRouter(SeamRouter):
    """V1's ``apply_sampling_constraints``, deferred into the verification that follows.

    Deferring is sound because vLLM 0.32 calls it in one place, ``RejectionSampler.
    forward``, whose next step passes its result to ``rejection_sample`` (the
    verification router's), which folds the kept parameters or applies them first.

    Args:
        module: ``vllm.v1.sample.rejection_sampler``.
        kernel: The folded family the verification router launches.
    """

    seam = "apply_sampling_constraints"
    runner = _RUNNER

    def __init__(self, module: ModuleType, *, kernel: str = V1_FOLDED_KERNEL) -> None:
        super().__init__(module, kernel=kernel)
        self._pending: tuple[torch.Tensor, torch.Tensor, Any] | None = None

    @property
    def family(self) -> Any:
        """The folded kernel family (once configured)."""
        return self._family

    def apply_sampling_constraints(
        self, logits: torch.Tensor, cu_num_draft_tokens: torch.Tensor, sampling_metadata: Any
    ) -> torch.Tensor:
        """Drop-in for vLLM 0.32's V1 ``apply_sampling_constraints``: the logits as they
        are, the parameters kept for the verification (or vLLM's step, when not folded)."""
        self._pending = None
        original = self.original
        if sampling_metadata.all_greedy or not self._ready(logits.device):
            return original(logits, cu_num_draft_tokens, sampling_metadata)
        reason = self._unsupported(logits, sampling_metadata)
        if reason:
            self.stats.count_passed(reason)
            return original(logits, cu_num_draft_tokens, sampling_metadata)
        self._pending = (logits, cu_num_draft_tokens, sampling_metadata)
        return logits

    def _unsupported(self, logits: torch.Tensor, sampling_metadata: Any) -> str:
        """Why the step is not folded (empty when it is); reads no tensor contents."""
        import torch

        if sampling_metadata.max_num_logprobs is not None:
            # Processed-logprobs modes read the processed rows after verification.
            return "logprobs requested"
        if logits.dim() != 2 or logits.dtype != torch.float32 or not logits.is_contiguous():
            return "target logits layout or dtype"
        for name in ("temperature", "top_p"):
            value = getattr(sampling_metadata, name)
            if value is not None and (value.dtype != torch.float32 or value.dim() != 1):
                return f"{name} tensor layout or dtype"
        top_k = sampling_metadata.top_k
        if top_k is not None and (top_k.dtype not in (torch.int32, torch.int64)
                                  or top_k.dim() != 1):
            return "top_k tensor layout or dtype"
        return ""

    def take(self, target_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, Any] | None:
        """The deferred ``(logits, cu_num_draft_tokens, sampling_metadata)`` when
        ``target_logits`` are the logits it deferred, else ``None``; forgets them."""
        pending, self._pending = self._pending, None
        if pending is None or pending[0] is not target_logits:
            return None
        return pending

    def materialize(self, pending: tuple[torch.Tensor, torch.Tensor, Any]) -> torch.Tensor:
        """vLLM's step on deferred logits: what vLLM's verification would have got."""
        return self.original(*pending)  # type: ignore[no-any-return]


class Mrv2FoldRouter(SeamRouter):
    """Model Runner V2's ``RejectionSampler._verify``, by the folded MRV2 family.

    Args:
        module: The class ``RejectionSampler`` of
            ``vllm.v1.worker.gpu.spec_decode.rejection_sampler`` (the seam is a method).
        kernel: The folded family.
    """

    seam = "_verify"
    runner = _RUNNER

    def __init__(self, module: Any, *, kernel: str = MRV2_FOLDED_KERNEL) -> None:
        super().__init__(module, kernel=kernel)
        self._inputs_type: type[Mrv2Inputs] | None = None
        self._max_vocab = 0
        self._logits_dtypes: tuple[torch.dtype, ...] = ()
        self._processed_modes: tuple[str, ...] = ()

    def _configure_kernels(self) -> None:
        import sys

        from spectune.kernels import LOGITS_DTYPES, MAX_VOCAB
        from spectune.kernels.rejection_mrv2 import Mrv2Inputs

        self._inputs_type = Mrv2Inputs
        self._max_vocab = MAX_VOCAB
        self._logits_dtypes = tuple(LOGITS_DTYPES)
        defining = sys.modules[self.module.__module__]
        self._processed_modes = tuple(getattr(defining, "PROCESSED_LOGPROBS_MODES", ()))

    def _drop_in(self) -> Callable[..., Any]:
        # A plain function, so that the class binds it to each RejectionSampler.
        router = self

        def _verify(sampler: Any, *args: Any, **kwargs: Any) -> Any:
            return router.verify(sampler, *args, **kwargs)

        _verify.__spectune_router__ = router  # type: ignore[attr-defined]
        return _verify

    @property
    def where(self) -> str:
        """The replaced method's full name."""
        return f"{self.module.__module__}.{self.module.__qualname__}.{self.seam}"

    def verify(
        self,
        sampler: Any,
        logits: torch.Tensor,
        draft_logits: torch.Tensor | None,
        draft_sampled: torch.Tensor,
        pos: torch.Tensor,
        cu_num_logits: torch.Tensor,
        idx_mapping: torch.Tensor,
        idx_mapping_np: np.ndarray,
        expanded_idx_mapping: torch.Tensor,
        expanded_local_pos: torch.Tensor,
        seq_lens_upper_bound_np: np.ndarray,
        verify_draft_sampled: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Drop-in for vLLM 0.32's ``RejectionSampler._verify``: ``(processed_logits,
        sampled, num_sampled)``; folded, the "processed" logits returned are the raw
        ones (what is folded is never written), which vLLM then does not read."""
        args = (sampler, logits, draft_logits, draft_sampled, pos, cu_num_logits, idx_mapping,
                idx_mapping_np, expanded_idx_mapping, expanded_local_pos,
                seq_lens_upper_bound_np, verify_draft_sampled)
        if not _needs_processing(sampler, idx_mapping_np):
            # vLLM verifies the raw logits: nothing to fold, and the verification router
            # takes the call (not a call spectune passes up: not counted).
            return self.original(*args)  # type: ignore[no-any-return]
        return self._route(  # type: ignore[no-any-return]
            logits.device, args, {}, lambda: self._unsupported(*args),
            lambda: self.prepare(*args),
        )

    def _unsupported(self, sampler: Any, logits: torch.Tensor,
                     draft_logits: torch.Tensor | None, *rest: Any) -> str:
        """Why a call is not folded (empty when it is); reads host state and shapes only."""
        try:
            return self._why_not(sampler, logits, draft_logits, rest[4])
        except (AttributeError, KeyError, TypeError, IndexError) as exc:
            # A vLLM whose sampler state looks different: its own step, every time.
            return f"sampler state not understood ({type(exc).__name__})"

    def _why_not(self, rejection_sampler: Any, logits: torch.Tensor,
                 draft_logits: torch.Tensor | None, idx_mapping_np: np.ndarray) -> str:
        import torch

        if rejection_sampler.watermark_key is not None:
            return "watermarking"
        if rejection_sampler.use_block_verification:
            return "block verification"
        if rejection_sampler.synthetic_conditional_rates is not None:
            return "synthetic acceptance"
        sampler = rejection_sampler.sampler
        if sampler.logprobs_mode in self._processed_modes:
            return "processed logprobs"
        if sampler.return_sampling_mask:
            return "sampling mask"
        other = _other_processing(sampler, idx_mapping_np)
        if other:
            return other
        vocab = logits.shape[-1]
        if vocab > self._max_vocab:
            return "vocabulary over the kernels' limit"
        if logits.dtype not in self._logits_dtypes or logits.stride(-1) != 1:
            return "target logits layout or dtype"
        if draft_logits is not None and (draft_logits.shape[-1] < vocab
                                         or draft_logits.dtype not in self._logits_dtypes):
            return "draft logits layout or dtype"
        states = sampler.sampling_states
        if states.temperature.gpu.dtype != torch.float32 or states.seeds.gpu.dtype != torch.int64:
            return "temperature or seed dtype"
        return ""

    def prepare(
        self,
        rejection_sampler: Any,
        logits: torch.Tensor,
        draft_logits: torch.Tensor | None,
        draft_sampled: torch.Tensor,
        pos: torch.Tensor,
        cu_num_logits: torch.Tensor,
        idx_mapping: torch.Tensor,
        idx_mapping_np: np.ndarray,
        expanded_idx_mapping: torch.Tensor,
        expanded_local_pos: torch.Tensor,
        seq_lens_upper_bound_np: np.ndarray,
        verify_draft_sampled: torch.Tensor,
    ) -> tuple[Mrv2Inputs, dict[str, int]]:
        """The folded family's inputs and launch config for one call (per shape: k,
        requests, vocabulary, logits dtype, draft logits given)."""
        import numpy as np

        if not self._live:  # activated, not yet called: take what this needs
            self._take_kernels()
        make_inputs, family = self._inputs_type, self._family
        assert make_inputs is not None and family is not None
        sampler = rejection_sampler.sampler
        states = sampler.sampling_states
        # The parameters no request of the batch uses are not passed: their passes are
        # skipped (vLLM skips their kernels alike).
        min_p = states.min_p.gpu if np.any(states.min_p.np[idx_mapping_np] != 0.0) else None
        top_k = (states.top_k.gpu
                 if np.any(states.top_k.np[idx_mapping_np] != states.vocab_size) else None)
        top_p = states.top_p.gpu if np.any(states.top_p.np[idx_mapping_np] != 1.0) else None
        steps = rejection_sampler.num_speculative_steps
        inputs = make_inputs(
            target_logits=logits, draft_logits=draft_logits,
            draft_sampled=verify_draft_sampled, cu_num_logits=cu_num_logits, pos=pos,
            idx_mapping=idx_mapping, expanded_idx_mapping=expanded_idx_mapping,
            expanded_local_pos=expanded_local_pos, temperature=states.temperature.gpu,
            seed=states.seeds.gpu, num_speculative_steps=steps,
            use_fp64=sampler.use_fp64_gumbel, apply_sampling_params=True, min_p=min_p,
            top_k=top_k, top_p=top_p, **_fly_settings(rejection_sampler),
        )
        key = (steps, cu_num_logits.shape[0], logits.shape[-1], logits.dtype,
               draft_logits is not None)
        return inputs, self.config_of(key, lambda: family.problem_of(inputs))

    def _launch(self, family: Any, inputs: Any, config: dict[str, int]) -> Any:
        sampled, num_sampled = family.launch(inputs, config)
        return inputs.target_logits, sampled, num_sampled


def _fly_settings(rejection_sampler: Any) -> dict[str, Any]:
    """vLLM 0.33's FLy window of the sampler (none on 0.32), and the installed release
    whose semantics the kernels apply."""
    from spectune.kernels import vllm_semantics_version

    return {
        "fly_window_size": getattr(rejection_sampler, "fly_window_size", 0),
        "fly_entropy_threshold": getattr(rejection_sampler, "fly_entropy_threshold", 0.3),
        "fly_entropy_top_k": getattr(rejection_sampler, "fly_entropy_top_k", 3),
        "vllm_version": vllm_semantics_version(),
    }


def _needs_processing(rejection_sampler: Any, idx_mapping_np: np.ndarray) -> bool:
    """Whether vLLM's ``apply_sampling_params`` changes this batch's logits at all (its
    own first test); ``True`` when the sampler's state is not understood."""
    import numpy as np

    try:
        needs = rejection_sampler.sampler.needs_logits_processing[idx_mapping_np]
    except (AttributeError, IndexError, TypeError):
        return True
    return bool(np.any(needs))


def _other_processing(sampler: Any, idx_mapping_np: np.ndarray) -> str:
    """What else ``Sampler.apply_sampling_params`` would do to this batch's logits
    (empty: only temperature, min-p, top-k and top-p). Mirrors each step's own test for
    skipping itself; a logits processor spectune does not know is never folded."""
    import numpy as np

    for processor in sampler.logits_processors:
        kind = type(processor).__name__
        if kind == "LogitBiasState":
            active = np.any(processor.use_logit_bias[idx_mapping_np])
        elif kind == "PenaltiesState":
            active = np.any(processor.use_penalty[idx_mapping_np])
        elif kind == "BadWordsState":
            active = int(processor.num_bad_words.np[idx_mapping_np].max()) > 0
        else:
            return f"logits processor {kind}"
        if active:
            return {"LogitBiasState": "logit bias", "PenaltiesState": "penalties",
                    "BadWordsState": "bad words"}[kind]
    budget = sampler.thinking_budget_state
    if budget.enabled and np.any(budget.use_thinking_budget[idx_mapping_np]):
        return "thinking budget"
    return ""


def fold_router(*, mrv2: bool) -> SeamRouter | None:
    """The fold router of a runner, or ``None`` where vLLM moved its seam."""
    import importlib

    try:
        if mrv2:
            from spectune.vllm._mrv2_router import MRV2_MODULE

            cls = getattr(importlib.import_module(MRV2_MODULE), "RejectionSampler", None)
            if cls is None or not callable(getattr(cls, Mrv2FoldRouter.seam, None)):
                return None
            return Mrv2FoldRouter(cls)
        module = importlib.import_module("vllm.v1.sample.rejection_sampler")
    except ImportError:
        return None
    if not callable(getattr(module, V1FoldRouter.seam, None)):
        return None
    return V1FoldRouter(module)
