"""A real Triton kernel family whose configurations can take their process down.

For the isolated-trial tests (``test_isolation.py``): integer row sums like
``toy_family``, plus a ``FAULT`` knob that picks what a launch does besides the sum:

* ``none`` (0): nothing; ``wrong`` (1): the kernel adds one (an invalid result);
* ``abort`` (2): ``os.abort()``, as a failed device assertion does (SIGABRT);
* ``hang`` (3): blocks every signal and sleeps, as a blocked device sync does: a
  SIGALRM-based limit in the same process cannot stop it, only a kill from outside;
* ``segfault`` (4): reads address 0 (SIGSEGV), as an illegal memory access does;
* ``exit`` (5): ``os._exit(3)``, as a library that exits on a fatal error does;
* ``slow`` (6): sleeps interruptibly, so the trial's own SIGALRM limit stops it.

Faults only come with ``BLOCK=16`` (a constraint of the space); ``BLOCK=3`` cannot
compile (not a power of two), and the largest tile, 256, is the fastest valid config
under the interpreter by a wide margin (the fewest loop iterations).

A family can also refuse to start: when ``start_failure_file`` names a file that exists,
:meth:`CrashFamily.make_inputs` raises with the file's text, as making inputs that do
not fit on the device does.
"""

from __future__ import annotations

import ctypes
import os
import signal
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
import triton
import triton.language as tl

from spectune.space import Constraint, Param, Problem, SearchSpace

#: Fault name -> its ``FAULT`` value.
FAULTS = {"none": 0, "wrong": 1, "abort": 2, "hang": 3, "segfault": 4, "exit": 5, "slow": 6}
#: The tile every fault comes with.
FAULT_BLOCK = 16
#: The fastest valid config (the search's expected best).
FASTEST = {"BLOCK": 256, "FAULT": 0}
# How long ``hang`` and ``slow`` last when nothing stops them: long past any test's time
# limit, short enough that a stray process does not linger for ever.
_STUCK_SECONDS = 120.0


@triton.jit
def _row_sum(x_ptr, out_ptr, n, BLOCK: tl.constexpr, WRONG: tl.constexpr):
    row = tl.program_id(0)
    acc = tl.zeros((), tl.int64)
    for start in range(0, n, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        acc += tl.sum(tl.load(x_ptr + row * n + offs, mask=offs < n, other=0).to(tl.int64))
    if WRONG:
        acc += 1
    tl.store(out_ptr + row, acc)


@dataclass(frozen=True)
class CrashInputs:
    """Rows to sum, and what the rows do not say of their problem."""

    rows: torch.Tensor
    spec_len: int
    dtype: str
    draft_probs: bool


class CrashFamily:
    """Integer row sums with faulty configurations, as a
    :class:`~spectune.kernels.KernelFamily`.

    Args:
        faults: The fault names the search space declares (``none`` is always there).
        start_failure_file: When this file exists, making inputs fails with its text.
    """

    name = "crash_probe"
    source_hash = "fedcba9876543210"

    def __init__(
        self, *, faults: tuple[str, ...] = tuple(FAULTS), start_failure_file: str | None = None
    ) -> None:
        unknown = set(faults) - set(FAULTS)
        if unknown:
            raise ValueError(f"unknown faults {sorted(unknown)}; known: {sorted(FAULTS)}")
        self.faults = tuple(f for f in FAULTS if f in faults or f == "none")
        self.start_failure_file = start_failure_file

    def search_space(self, backend: str) -> SearchSpace:
        return SearchSpace(
            params=(
                Param("BLOCK", (3, FAULT_BLOCK, 256)),
                Param("FAULT", tuple(FAULTS[f] for f in self.faults)),
            ),
            constraints=(
                Constraint(
                    f"faults only with BLOCK={FAULT_BLOCK}",
                    lambda c: c["FAULT"] == 0 or c["BLOCK"] == FAULT_BLOCK,
                ),
            ),
        ).for_backend(backend)

    def default_config(self, problem: Problem, backend: str) -> dict[str, int]:
        return {"BLOCK": FAULT_BLOCK, "FAULT": 0}

    def make_inputs(self, problem: Problem, *, seed: int, device: str = "cpu") -> CrashInputs:
        if self.start_failure_file and os.path.exists(self.start_failure_file):
            text = Path(self.start_failure_file).read_text().strip()
            raise RuntimeError(text or "inputs refused")
        gen = torch.Generator().manual_seed(seed)
        rows = torch.randint(-100, 100, (problem.batch, problem.vocab), generator=gen,
                             dtype=torch.int32).to(device)
        return CrashInputs(rows=rows, spec_len=problem.spec_len, dtype=problem.dtype,
                           draft_probs=problem.draft_probs)

    def problem_of(self, inputs: CrashInputs) -> Problem:
        batch, vocab = inputs.rows.shape
        return Problem(spec_len=inputs.spec_len, batch=batch, vocab=vocab, dtype=inputs.dtype,
                       draft_probs=inputs.draft_probs)

    def launch(self, inputs: CrashInputs, config: Mapping[str, int]) -> torch.Tensor:
        _fault(config["FAULT"])
        rows = inputs.rows
        out = torch.empty(rows.shape[0], dtype=torch.int64, device=rows.device)
        _row_sum[(rows.shape[0],)](rows, out, rows.shape[1], BLOCK=config["BLOCK"],
                                   WRONG=config["FAULT"] == FAULTS["wrong"])
        return out

    def reference(self, inputs: CrashInputs) -> torch.Tensor:
        return inputs.rows.to(torch.int64).sum(dim=1)

    def same(self, expected: torch.Tensor, actual: torch.Tensor) -> bool:
        return torch.equal(expected.cpu(), actual.cpu())


def _fault(fault: int) -> None:
    """Do what ``fault`` says before the launch (nothing for ``none`` and ``wrong``)."""
    if fault in (FAULTS["abort"], FAULTS["segfault"]):
        _no_core_dump()
    if fault == FAULTS["abort"]:
        os.abort()
    elif fault == FAULTS["segfault"]:
        ctypes.string_at(0)
    elif fault == FAULTS["exit"]:
        os._exit(3)
    elif fault == FAULTS["hang"]:
        # A blocked device sync: one call that does not return to the interpreter, with
        # signals blocked, so no Python signal handler runs (the SIGALRM of a time limit
        # in this process included); only SIGKILL, which cannot be blocked, ends it.
        signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
        time.sleep(_STUCK_SECONDS)
    elif fault == FAULTS["slow"]:
        _sleep(_STUCK_SECONDS)  # interruptible: the trial's SIGALRM handler raises in it


def _sleep(seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        time.sleep(min(left, 1.0))


def _no_core_dump() -> None:
    # A crash on purpose is not worth a core file (some hosts pipe cores to a slow
    # collector); the process dies right after, so its limits do not matter.
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    except (ImportError, ValueError, OSError):
        pass
