"""The adapter of V1 verification (``rejection_sample``): what the tuner, the database and
the vLLM plugin run of it (registered in :data:`spectune.kernels.FAMILIES`, which holds
its name, source hash and space)."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from spectune.kernels.rejection.rejection_sample_fly import rejection_sample
from spectune.kernels.rejection.rejection_sample_inputs import RejectionInputs, make_inputs
from spectune.kernels.rejection.rejection_sample_ref import (
    ReferenceResult,
    decision_margins_agree,
    rejection_sample_reference,
)
from spectune.kernels.rejection.rejection_sample_space import problem_for
from spectune.space import Problem

__all__ = ["RejectionSampleFamily"]


class RejectionSampleFamily:
    """Chain verification (greedy + rejection sampling): inputs, launch, reference, rule."""

    def problem_of(self, inputs: RejectionInputs) -> Problem:
        """The problem ``inputs`` belong to (what the launcher's default config is for)."""
        return problem_for(
            max_spec_len=inputs.max_spec_len,
            batch=inputs.cu_num_draft_tokens.shape[0],
            vocab=inputs.target_logits.shape[-1],
            dtype=inputs.target_logits.dtype,
            draft_probs=inputs.draft_probs is not None,
        )

    def make_inputs(
        self, problem: Problem, *, seed: int, device: torch.device | str = "cpu"
    ) -> RejectionInputs:
        """Every request random with ``k`` drafts sampled from the drafter."""
        return make_inputs(problem, seed=seed, device=device)

    def launch(self, inputs: RejectionInputs, config: Mapping[str, int]) -> torch.Tensor:
        """The kernels with ``config``, without the checks that read tensor contents (with
        a FLy window, vLLM 0.33's semantics)."""
        # A FLy window is vLLM 0.33's semantics, whatever vLLM is installed.
        version = "0.33" if inputs.fly_window_size is not None else None
        return rejection_sample(*inputs.args(), **inputs.kwargs(), vllm_version=version,
                                config=config, validate=False)

    def reference(self, inputs: RejectionInputs) -> ReferenceResult:
        """The PyTorch reference's tokens and near-ties for ``inputs``."""
        return rejection_sample_reference(*inputs.args(), **inputs.kwargs())

    def same(self, expected: ReferenceResult | torch.Tensor, actual: torch.Tensor) -> bool:
        """Bit-identical tokens; against a reference, a near-tie apart (see NEAR_TIE_RTOL)."""
        if isinstance(expected, ReferenceResult):
            return decision_margins_agree(expected, actual)[0]
        return torch.equal(expected.cpu(), actual.cpu())
