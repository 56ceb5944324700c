"""Inputs of the MRV2 verification kernels: one launch's arguments, and how to make them.

:class:`Mrv2Inputs` bundles one launch's arguments (what the tuner passes around and the
vLLM router builds); :func:`make_mrv2_inputs` builds realistic ones for a tuning
problem. Not part of the family's source hash.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from spectune.kernels._synthetic_inputs import peaked_logits
from spectune.kernels._tensors import DTYPE_BY_NAME
from spectune.space import Problem

__all__ = ["Mrv2Inputs", "make_mrv2_inputs"]

# Request states in a synthetic batch: vLLM keeps more slots than it schedules, and a
# batch's requests sit in no particular order among them.
_SPARE_STATES = 3
# Positions of a synthetic batch: where a decode step of a long-running request sits.
_FIRST_POSITION = 1000


# Not frozen, as RejectionInputs: the router builds one per call.
@dataclass
class Mrv2Inputs:
    """Arguments of one :func:`~spectune.kernels.rejection_sample_mrv2` call.

    The fields are the launcher's arguments of the same names.
    """

    target_logits: torch.Tensor
    draft_logits: torch.Tensor | None
    draft_sampled: torch.Tensor
    cu_num_logits: torch.Tensor
    pos: torch.Tensor
    idx_mapping: torch.Tensor
    expanded_idx_mapping: torch.Tensor
    expanded_local_pos: torch.Tensor
    temperature: torch.Tensor
    seed: torch.Tensor
    num_speculative_steps: int
    use_fp64: bool = False
    apply_sampling_params: bool = False
    min_p: torch.Tensor | None = None
    top_k: torch.Tensor | None = None
    top_p: torch.Tensor | None = None
    fly_window_size: int = 0
    fly_entropy_threshold: float = 0.3
    fly_entropy_top_k: int = 3
    vllm_version: str | None = None

    def kwargs(self) -> dict[str, Any]:
        """The launcher's keyword arguments (the folded sampling parameters, FLy's window
        and the vLLM release whose semantics apply)."""
        return {
            "apply_sampling_params": self.apply_sampling_params,
            "min_p": self.min_p,
            "top_k": self.top_k,
            "top_p": self.top_p,
            **self.fly_kwargs(),
        }

    def fly_kwargs(self) -> dict[str, Any]:
        """The keywords the launcher and the reference share (FLy, the release)."""
        return {
            "fly_window_size": self.fly_window_size,
            "fly_entropy_threshold": self.fly_entropy_threshold,
            "fly_entropy_top_k": self.fly_entropy_top_k,
            "vllm_version": self.vllm_version,
        }

    def args(self) -> tuple[object, ...]:
        """The launcher's positional arguments, in vLLM's order."""
        return (
            self.target_logits, self.draft_logits, self.draft_sampled, self.cu_num_logits,
            self.pos, self.idx_mapping, self.expanded_idx_mapping, self.expanded_local_pos,
            self.temperature, self.seed, self.num_speculative_steps, self.use_fp64,
        )


def make_mrv2_inputs(
    problem: Problem, *, seed: int, device: torch.device | str = "cpu"
) -> Mrv2Inputs:
    """Realistic inputs for ``problem``: every request random (temperature 1), ``k`` drafts.

    Drafts are sampled from a drafter close to the target; with ``problem.draft_probs``
    the drafter's logits are passed (else it is an ngram-like drafter without logits).

    Args:
        problem: Shape (``spec_len`` = k, ``batch`` requests), logits dtype and whether
            the drafter gives logits.
        seed: Seed of every random draw (the same seed gives the same inputs).
        device: Where the tensors go.
    """
    gen = torch.Generator().manual_seed(seed)
    num_reqs, k, vocab = problem.batch, problem.spec_len, problem.vocab
    per_req = k + 1
    rows = num_reqs * per_req
    logits, drafter = peaked_logits(rows, vocab, generator=gen)
    drafts = torch.multinomial(torch.softmax(drafter, dim=-1), 1, generator=gen).flatten()
    # Row r verifies draft_sampled[r + 1]: shift the drafts by one within each request;
    # a request's first slot holds its last accepted token.
    draft_sampled = drafts.reshape(num_reqs, per_req).roll(1, dims=1).flatten()
    states = num_reqs + _SPARE_STATES
    idx_mapping = torch.randperm(states, generator=gen)[:num_reqs]
    draft_logits = None
    if problem.draft_probs:
        draft_logits = torch.zeros(states, k, vocab)
        draft_logits[idx_mapping] = drafter.reshape(num_reqs, per_req, vocab)[:, :k]
    dtype = DTYPE_BY_NAME[problem.dtype]
    positions = _FIRST_POSITION + torch.arange(per_req).repeat(num_reqs)
    return Mrv2Inputs(
        target_logits=logits.to(dtype).to(device),
        draft_logits=None if draft_logits is None else draft_logits.to(dtype).to(device),
        draft_sampled=draft_sampled.to(torch.int64).to(device),
        cu_num_logits=(torch.arange(num_reqs + 1, dtype=torch.int32) * per_req).to(device),
        pos=positions.to(torch.int64).to(device),
        idx_mapping=idx_mapping.to(torch.int32).to(device),
        expanded_idx_mapping=idx_mapping.repeat_interleave(per_req).to(torch.int32).to(device),
        expanded_local_pos=torch.arange(per_req).repeat(num_reqs).to(torch.int32).to(device),
        temperature=torch.ones(states, dtype=torch.float32, device=device),
        seed=torch.randint(0, 2**62, (states,), generator=gen).to(device),
        num_speculative_steps=k,
    )
