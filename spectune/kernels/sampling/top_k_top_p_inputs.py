"""Inputs of the top-k/top-p masking kernel: one launch's arguments, and how to make them.

Not part of the family's source hash.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from spectune.kernels._synthetic_inputs import peaked_logits
from spectune.kernels._tensors import DTYPE_BY_NAME
from spectune.space import Problem

__all__ = ["TopKTopPInputs", "make_top_k_top_p_inputs"]

# Common request settings: (top_k, top_p); a top_k of 0 stands for "none" (the vocab).
_SETTINGS = ((50, 0.9), (0, 0.95), (20, 1.0), (0, 0.8), (100, 0.99))


@dataclass
class TopKTopPInputs:
    """Arguments of one :func:`~spectune.kernels.top_k_top_p` call."""

    logits: torch.Tensor
    k: torch.Tensor | None
    p: torch.Tensor | None

    def args(self) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """The launcher's positional arguments; the logits are a copy (masked in place)."""
        return self.logits.clone(), self.k, self.p


def make_top_k_top_p_inputs(
    problem: Problem, *, seed: int, device: torch.device | str = "cpu"
) -> TopKTopPInputs:
    """Realistic inputs: ``problem.batch`` rows of peaked logits, each with one of a few
    common (top_k, top_p) settings, so both searches run."""
    gen = torch.Generator().manual_seed(seed)
    rows, vocab = problem.batch, problem.vocab
    logits, _ = peaked_logits(rows, vocab, generator=gen)
    picks = torch.randint(0, len(_SETTINGS), (rows,), generator=gen).tolist()
    k = torch.tensor([min(_SETTINGS[i][0], vocab) or vocab for i in picks], dtype=torch.int32)
    p = torch.tensor([_SETTINGS[i][1] for i in picks], dtype=torch.float32)
    return TopKTopPInputs(
        logits=logits.to(DTYPE_BY_NAME[problem.dtype]).to(device),
        k=k.to(device),
        p=p.to(device),
    )
