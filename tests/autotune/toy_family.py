"""A small, real Triton kernel family for tuner tests: integer row sums.

Its space holds a tile that cannot compile (3, not a power of two), a knob that gives
a wrong result (``BUG=1``), and tiles whose interpreter cost differs by a wide margin
(the default, 16, is the slowest valid one), so promotion is certain.
"""

from __future__ import annotations

from collections.abc import Mapping

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


class ToySumFamily:
    name = "toy_sum"
    source_hash = "0123456789abcdef"

    def search_space(self, backend: str) -> SearchSpace:
        return SearchSpace(params=(
            Param("BLOCK", (3, 16, 64, 256, 1024)),
            Param("BUG", (0, 1)),
        )).for_backend(backend)

    def default_config(self, problem: Problem, backend: str) -> dict[str, int]:
        return {"BLOCK": 16, "BUG": 0}

    def make_inputs(self, problem: Problem, *, seed: int, device: str = "cpu") -> torch.Tensor:
        gen = torch.Generator().manual_seed(seed)
        return torch.randint(-100, 100, (problem.batch, problem.vocab), generator=gen,
                             dtype=torch.int32).to(device)

    def launch(self, inputs: torch.Tensor, config: Mapping[str, int]) -> torch.Tensor:
        out = torch.empty(inputs.shape[0], dtype=torch.int64, device=inputs.device)
        _row_sum[(inputs.shape[0],)](inputs, out, inputs.shape[1], BLOCK=config["BLOCK"],
                                     BUG=config["BUG"])
        return out

    def reference(self, inputs: torch.Tensor) -> torch.Tensor:
        return inputs.to(torch.int64).sum(dim=1)

    def same(self, expected: torch.Tensor, actual: torch.Tensor) -> bool:
        return torch.equal(expected.cpu(), actual.cpu())
