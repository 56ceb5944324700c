"""A small, real Triton kernel family for tuner tests: integer row sums.

Its space holds a tile that cannot compile (3, not a power of two), a knob that gives
a wrong result (``BUG=1``), and tiles whose interpreter cost differs by a wide margin
(the default, 16, is the slowest valid one), so promotion is certain.

Its inputs are one int32 row per request, ``vocab`` long; the row sums do not depend on
the speculation length, dtype or draft probabilities of the problem, so the inputs carry
them for :meth:`ToySumFamily.problem_of`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from spectune.space import Param, Problem, SearchSpace


@triton.jit
def _row_sum(x_ptr, out_ptr, n, BLOCK: tl.constexpr, BUG: tl.constexpr):
    row = tl.program_id(0)
    acc = tl.zeros((), tl.int64)
    for start in range(0, n, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        acc += tl.sum(tl.load(x_ptr + row * n + offs, mask=offs < n, other=0).to(tl.int64))
    if BUG:
        acc += 1
    tl.store(out_ptr + row, acc)


@dataclass(frozen=True)
class ToyInputs:
    """Rows to sum, and what the rows do not say of their problem."""

    rows: torch.Tensor
    spec_len: int
    dtype: str
    draft_probs: bool


class ToySumFamily:
    """Integer row sums, as a :class:`~spectune.kernels.KernelFamily`."""

    name = "toy_sum"
    source_hash = "0123456789abcdef"

    def search_space(self, backend: str) -> SearchSpace:
        return SearchSpace(params=(
            Param("BLOCK", (3, 16, 64, 256, 1024)),
            Param("BUG", (0, 1)),
        )).for_backend(backend)

    def default_config(self, problem: Problem, backend: str) -> dict[str, int]:
        return {"BLOCK": 16, "BUG": 0}

    def make_inputs(self, problem: Problem, *, seed: int, device: str = "cpu") -> ToyInputs:
        gen = torch.Generator().manual_seed(seed)
        rows = torch.randint(-100, 100, (problem.batch, problem.vocab), generator=gen,
                             dtype=torch.int32).to(device)
        return ToyInputs(rows=rows, spec_len=problem.spec_len, dtype=problem.dtype,
                         draft_probs=problem.draft_probs)

    def problem_of(self, inputs: ToyInputs) -> Problem:
        """The problem ``inputs`` were made for: the shape of the rows, and the rest."""
        batch, vocab = inputs.rows.shape
        return Problem(spec_len=inputs.spec_len, batch=batch, vocab=vocab, dtype=inputs.dtype,
                       draft_probs=inputs.draft_probs)

    def launch(self, inputs: ToyInputs, config: Mapping[str, int]) -> torch.Tensor:
        rows = inputs.rows
        out = torch.empty(rows.shape[0], dtype=torch.int64, device=rows.device)
        _row_sum[(rows.shape[0],)](rows, out, rows.shape[1], BLOCK=config["BLOCK"],
                                   BUG=config["BUG"])
        return out

    def reference(self, inputs: ToyInputs) -> torch.Tensor:
        return inputs.rows.to(torch.int64).sum(dim=1)

    def same(self, expected: torch.Tensor, actual: torch.Tensor) -> bool:
        return torch.equal(expected.cpu(), actual.cpu())
