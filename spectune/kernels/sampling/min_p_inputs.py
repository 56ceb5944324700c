"""Inputs of the min-p kernels: one launch's arguments, and how to make them.

Not part of the family's source hash.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from spectune.kernels._synthetic_inputs import peaked_logits
from spectune.kernels._tensors import DTYPE_BY_NAME
from spectune.space import Problem

__all__ = ["MinPInputs", "make_min_p_inputs"]

# Request states beyond those scheduled (vLLM keeps more slots than it schedules).
_SPARE_STATES = 3
# The scheduled requests' min_p, in turn: mostly filtered rows, with rows at 0 the kernels
# skip, as in a mixed batch.
_MIN_P = (0.05, 0.0, 0.1, 0.02, 0.0, 0.2, 1e-4, 0.5)


@dataclass
class MinPInputs:
    """Arguments of one :func:`~spectune.kernels.apply_min_p` call (its parameters'
    names), and the buffer the family's launches write.

    Attributes:
        logits: ``[num_tokens, V]`` logits; the family's launches only read them.
        expanded_idx_mapping: ``[num_tokens]`` request state of each row.
        min_p: ``[max_num_reqs]`` float32 per request state.
        out: ``[num_tokens, V]`` where the family's launches write (``out=``), made as a
            copy of ``logits``: the rows the kernels skip keep the logits' values and
            the others are rewritten from the unchanged logits, so every launch (the
            tuner repeats them) gives the same result. Overwritten by each launch.
    """

    logits: torch.Tensor
    expanded_idx_mapping: torch.Tensor
    min_p: torch.Tensor
    out: torch.Tensor = field(default=None)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if self.out is None:
            self.out = self.logits.clone()

    def args(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The launcher's positional arguments, in vLLM's order."""
        return self.logits, self.expanded_idx_mapping, self.min_p


def make_min_p_inputs(
    problem: Problem, *, seed: int, device: torch.device | str = "cpu"
) -> MinPInputs:
    """Realistic inputs: ``problem.batch`` rows of peaked logits, their requests' ``min_p``
    in turn from a mix of filtered (the first row among them) and unfiltered (0) ones."""
    gen = torch.Generator().manual_seed(seed)
    rows, vocab = problem.batch, problem.vocab
    logits, _ = peaked_logits(rows, vocab, generator=gen)
    states = rows + _SPARE_STATES
    mapping = torch.randperm(states, generator=gen)[:rows]
    min_p = torch.zeros(states, dtype=torch.float32)
    min_p[mapping] = torch.tensor([_MIN_P[row % len(_MIN_P)] for row in range(rows)],
                                  dtype=torch.float32)
    return MinPInputs(
        logits=logits.to(DTYPE_BY_NAME[problem.dtype]).to(device),
        expanded_idx_mapping=mapping.to(torch.int32).to(device),
        min_p=min_p.to(device),
    )
