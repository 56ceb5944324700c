"""vLLM's Model Runner V2 verification, routed to spectune's MRV2 kernel family.

:class:`Mrv2Router` replaces ``rejection_sample`` in
``vllm.v1.worker.gpu.spec_decode.rejection_sampler``: the name ``RejectionSampler._verify``
calls (imported there from ``rejection_sampler_utils``), once per verification chunk,
after vLLM has applied the sampling parameters. The drop-in takes vLLM's arguments and
returns vLLM's ``(sampled, num_sampled)``; MRV2's random numbers are counter-based
(``(seed, pos)``), so the kernels draw the very same ones and nothing is drawn on the
host. A routed call reads no tensor contents (no host synchronisation) and allocates
only buffers sized by shapes.

The drop-in takes vLLM 0.32's arguments and 0.33's (FLy windows: routed), and the
kernels verify with the installed release's semantics
(:func:`spectune.kernels.vllm_semantics_version`, read once at the first call).

Calls the family does not implement go to vLLM's function, counted with the reason:
block verification, synthetic acceptance rates, watermarking, a draft vocabulary
narrower than the target's, other dtypes, vocabularies past the kernels' limit.
"""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING, Any

from spectune.vllm._router import SeamRouter

if TYPE_CHECKING:
    import torch

    from spectune.kernels.rejection_mrv2 import Mrv2Inputs

__all__ = ["MRV2_KERNEL", "MRV2_MODULE", "Mrv2Router"]

#: The kernel family that verifies Model Runner V2's drafts.
MRV2_KERNEL = "rejection_sample_mrv2"
#: The module whose ``rejection_sample`` MRV2's ``RejectionSampler`` calls.
MRV2_MODULE = "vllm.v1.worker.gpu.spec_decode.rejection_sampler"


class Mrv2Router(SeamRouter):
    """Routes Model Runner V2's ``rejection_sample`` to one spectune kernel family.

    Args:
        module: ``vllm.v1.worker.gpu.spec_decode.rejection_sampler``.
        kernel: Name of the kernel family that runs the verification.
    """

    runner = "vLLM Model Runner V2 verification"

    def __init__(self, module: ModuleType, *, kernel: str = MRV2_KERNEL) -> None:
        super().__init__(module, kernel=kernel)
        self._max_vocab = 0
        self._logits_dtypes: tuple[torch.dtype, ...] = ()
        self._inputs_type: type[Mrv2Inputs] | None = None
        self._vllm_version: str | None = None

    def _configure_kernels(self) -> None:
        from spectune.kernels import LOGITS_DTYPES, MAX_VOCAB, vllm_semantics_version
        from spectune.kernels.rejection_mrv2 import Mrv2Inputs

        self._inputs_type = Mrv2Inputs
        self._vllm_version = vllm_semantics_version()
        self._max_vocab = MAX_VOCAB
        self._logits_dtypes = tuple(LOGITS_DTYPES)

    def _details(self) -> str:
        return f"family {self.kernel}; random numbers: vLLM's (seed, position) streams"

    def rejection_sample(
        self,
        target_logits: torch.Tensor,
        draft_logits: torch.Tensor | None,
        draft_sampled: torch.Tensor,
        cu_num_logits: torch.Tensor,
        pos: torch.Tensor,
        idx_mapping: torch.Tensor,
        expanded_idx_mapping: torch.Tensor,
        expanded_local_pos: torch.Tensor,
        temperature: torch.Tensor,
        seed: torch.Tensor,
        num_speculative_steps: int,
        synthetic_conditional_rates: torch.Tensor | None = None,
        use_fp64: bool = False,
        use_block_verification: bool = False,
        contexts: torch.Tensor | None = None,
        watermarking: torch.Tensor | None = None,
        watermarking_skip_mask: torch.Tensor | None = None,
        watermark_key: int | None = None,
        fly_window_size: int | None = None,
        fly_entropy_threshold: float | None = None,
        fly_entropy_top_k: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Drop-in for vLLM's MRV2 ``rejection_sample``, 0.32's or 0.33's (same arguments,
        same output)."""
        args = (
            target_logits, draft_logits, draft_sampled, cu_num_logits, pos, idx_mapping,
            expanded_idx_mapping, expanded_local_pos, temperature, seed, num_speculative_steps,
        )
        kwargs: dict[str, Any] = {
            "synthetic_conditional_rates": synthetic_conditional_rates,
            "use_fp64": use_fp64,
            "use_block_verification": use_block_verification,
            "contexts": contexts,
            "watermarking": watermarking,
            "watermarking_skip_mask": watermarking_skip_mask,
            "watermark_key": watermark_key,
        }
        # vLLM 0.33's; passed on only when given (0.32's function has no such arguments).
        fly = {name: value for name, value in (
            ("fly_window_size", fly_window_size),
            ("fly_entropy_threshold", fly_entropy_threshold),
            ("fly_entropy_top_k", fly_entropy_top_k),
        ) if value is not None}
        kwargs.update(fly)
        return self._route(
            target_logits.device, args, kwargs,
            lambda: self._unsupported(*args, **kwargs),
            lambda: self.prepare(*args, use_fp64=use_fp64, **fly),
        )

    def _unsupported(
        self,
        target_logits: torch.Tensor,
        draft_logits: torch.Tensor | None,
        *args: Any,
        synthetic_conditional_rates: torch.Tensor | None,
        use_fp64: bool,
        use_block_verification: bool,
        contexts: torch.Tensor | None,
        watermarking: torch.Tensor | None,
        watermarking_skip_mask: torch.Tensor | None,
        watermark_key: int | None,
        **fly: Any,
    ) -> str:
        """Why a call is not routed (empty when it is); reads shapes and dtypes only (FLy
        windows are routed)."""
        import torch

        if use_block_verification:
            return "block verification"
        if synthetic_conditional_rates is not None:
            return "synthetic acceptance"
        if contexts is not None or watermarking is not None or watermark_key is not None:
            return "watermarking"
        vocab = target_logits.shape[-1]
        if vocab > self._max_vocab:
            return "vocabulary over the kernels' limit"
        if target_logits.dtype not in self._logits_dtypes:
            return f"{target_logits.dtype} target logits"
        if draft_logits is not None:
            if draft_logits.shape[-1] < vocab:
                return "draft vocabulary narrower than the target's"
            if draft_logits.dtype not in self._logits_dtypes:
                return f"{draft_logits.dtype} draft logits"
        temperature, seed = args[6], args[7]
        if temperature.dtype != torch.float32 or seed.dtype != torch.int64:
            return "temperature or seed dtype"
        return ""

    def prepare(
        self,
        target_logits: torch.Tensor,
        draft_logits: torch.Tensor | None,
        draft_sampled: torch.Tensor,
        cu_num_logits: torch.Tensor,
        pos: torch.Tensor,
        idx_mapping: torch.Tensor,
        expanded_idx_mapping: torch.Tensor,
        expanded_local_pos: torch.Tensor,
        temperature: torch.Tensor,
        seed: torch.Tensor,
        num_speculative_steps: int,
        *,
        use_fp64: bool = False,
        fly_window_size: int = 0,
        fly_entropy_threshold: float = 0.3,
        fly_entropy_top_k: int = 3,
    ) -> tuple[Mrv2Inputs, dict[str, int]]:
        """The kernel family's inputs for one call (the installed release's semantics),
        and its launch config (cached per shape: k, requests, vocabulary, logits dtype,
        draft logits given; FLy windows or not, the same kernels' config)."""
        if not self._live:  # activated, not yet called: take what this needs
            self._take_kernels()
        make_inputs = self._inputs_type
        family = self._family
        assert make_inputs is not None and family is not None
        inputs = make_inputs(
            target_logits=target_logits,
            draft_logits=draft_logits,
            draft_sampled=draft_sampled,
            cu_num_logits=cu_num_logits,
            pos=pos,
            idx_mapping=idx_mapping,
            expanded_idx_mapping=expanded_idx_mapping,
            expanded_local_pos=expanded_local_pos,
            temperature=temperature,
            seed=seed,
            num_speculative_steps=num_speculative_steps,
            use_fp64=use_fp64,
            fly_window_size=fly_window_size,
            fly_entropy_threshold=fly_entropy_threshold,
            fly_entropy_top_k=fly_entropy_top_k,
            vllm_version=self._vllm_version,
        )
        key = (num_speculative_steps, cu_num_logits.shape[0], target_logits.shape[-1],
               target_logits.dtype, draft_logits is not None)
        return inputs, self.config_of(key, lambda: family.problem_of(inputs))
