"""Benchmark: verification with the sampling parameters folded in vs applied first.

vLLM applies each request's sampling parameters to the target logits, writing processed
``[N, V]`` float32 rows, then verifies the drafts against them. spectune folds the
parameters into the verification kernels instead: they read the raw logits and process
each value as they load it, after a small per-row pre-pass that finds the min-p and
top-k/top-p thresholds. For both runners, on the folded families' realistic inputs
(``FAMILIES['rejection_sample_mrv2_folded']`` and ``['rejection_sample_folded']``: peaked
logits, per-request temperature in [0.5, 1.5), top-k and top-p, ngram drafts unless
``--draft-probs``), one verification step is run both ways:

* **MRV2** (Model Runner V2), from the raw logits in the model's dtype (``--dtype``) as
  the sampler receives them. Unfolded: the fp32 copy (``torch.empty_like(logits,
  dtype=float32).copy_(logits)``), ``apply_temperature``, ``apply_min_p``,
  ``top_k_top_p`` (each in place) and ``rejection_sample_mrv2`` on the processed rows.
  Folded: ``rejection_sample_mrv2(..., apply_sampling_params=True, min_p=, top_k=,
  top_p=)`` (pre-pass + verification). The family draws no min-p: every other request
  state gets ``--min-p`` (0.05; 0 leaves min-p off, as vLLM then skips it).
* **V1**, from the float32 rows vLLM's rejection sampler has made by then (its
  ``.to(float32)`` and ``.clone()`` run upstream, in both paths). Unfolded: ``div_`` by
  the temperature (PyTorch), ``top_k_top_p`` (in place) and ``rejection_sample`` on the
  processed rows. Folded: ``rejection_sample(..., temperature=, top_k=, top_p=)``. V1
  has no min-p.

As vLLM does, a step is left out when no request of the batch uses it (top-k, top-p,
min-p); the per-row parameter gathers and other ``[N]``-sized PyTorch ops are not counted.
A family's inputs are drawn once per vocabulary, ``k`` and runner at the sweep's largest
batch (drawing is slow at large shapes); a smaller batch is its first requests.

Two modes:

* **count** (CPU, ``TRITON_INTERPRET=1``; set automatically without a GPU): the bytes
  every Triton kernel loads and stores, counted in the interpreter (masked-in elements
  times their size, per kernel), plus the PyTorch ``[N, V]`` ops of the unfolded chain
  computed from shapes and dtypes (MRV2's fp32 copy: ``N*V*size`` read, ``N*V*4``
  written; V1's ``div_``: ``N*V*4`` read and written). Reports, per verification step,
  the total bytes unfolded vs folded and their ratio, the ``[N, V]`` fp32 buffer folding
  never allocates (MRV2's copy; V1 processes its upstream clone in place, so none), and
  for V1 the upstream ``.to(float32)`` + ``.clone()`` bytes, common to both paths and in
  neither total. The top-k/top-p threshold searches (unfolded kernel and folded pre-pass)
  make data-dependent passes: the figures hold for the families' realistic inputs.
  First checks the counter on a copy-like kernel (``apply_temperature``, every
  temperature off 1): exactly ``2*N*V*4`` bytes of logits plus its per-program
  parameter loads, or the run fails.
* **time** (GPU): both paths side by side in one run, interleaved (``--rounds`` rounds of
  ``triton.testing.do_bench`` medians, the order alternating), the median of the rounds.
  V1's timed paths both include the upstream ``.to(float32)`` + ``.clone()`` (the
  unfolded chain works in place). Bytes cannot be counted natively: the effective
  bandwidth is the step's compulsory bytes (its raw logits, and draft logits/probs when
  given, read once) over the measured time, and ``floor %`` compares that time with the
  same bytes at the copy bandwidth measured in the run. ``--mode time`` on CPU only
  proves the path works: its figures mean nothing.

In both modes the folded tokens must equal the unfolded chain's (``torch.equal``);
mismatches are printed and fail the run. Prints Markdown tables; ``--json`` writes the
records (rewritten after every shape, so a run stopped early keeps what it measured).

Usage:
    python benchmarks/bench_folded.py [--quick] [--mode auto|count|time]
        [--batch 1 8] [--k 1 2] [--vocab 32000] [--dtype bfloat16] [--draft-probs]
        [--min-p 0.05] [--rounds 3] [--max-seconds S] [--json OUT]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

if not torch.cuda.is_available():
    # Triton reads this when the kernels are defined (importing spectune.kernels).
    os.environ.setdefault("TRITON_INTERPRET", "1")

from spectune.identity import CPU_BACKEND, detect_device, torch_device  # noqa: E402
from spectune.kernels import (  # noqa: E402
    FAMILIES,
    apply_min_p,
    apply_temperature,
    rejection_sample,
    rejection_sample_mrv2,
    top_k_top_p,
)
from spectune.kernels.rejection import RejectionInputs  # noqa: E402
from spectune.kernels.rejection_mrv2 import Mrv2Inputs  # noqa: E402
from spectune.space import DTYPES, Problem  # noqa: E402

#: Shapes per mode: time (GPU), count (CPU interpreter, minutes), quick (CPU, seconds).
GRIDS = {
    "time": {"batch": (1, 8, 32, 64), "k": (1, 2, 4, 8), "vocab": (32000, 128256, 151936)},
    "count": {"batch": (1, 4), "k": (1, 2), "vocab": (32000, 128256)},
    "quick": {"batch": (2,), "k": (2,), "vocab": (4096,)},
}
RUNNERS = ("mrv2", "v1")
PRE_PASS_KERNEL = "_fold_rows_kernel"  # spectune.kernels._folding's threshold pre-pass
MB = 1e6


# --------------------------------------------------------------------------------------
# Counting bytes in the Triton interpreter
# --------------------------------------------------------------------------------------


@dataclass
class ByteCount:
    """Bytes the Triton kernels of one measured call loaded and stored.

    Attributes:
        loads: Bytes loaded, per kernel (its Python function's name).
        stores: Bytes stored, per kernel.
        programs: Programs run, per kernel.
        watched: ``name -> [loaded, stored]`` bytes that fell inside a watched tensor.
    """

    loads: Counter[str] = field(default_factory=Counter)
    stores: Counter[str] = field(default_factory=Counter)
    programs: Counter[str] = field(default_factory=Counter)
    watched: dict[str, list[int]] = field(default_factory=dict)

    @property
    def total(self) -> int:
        """Bytes loaded and stored by every kernel."""
        return sum(self.loads.values()) + sum(self.stores.values())

    def of(self, kernels: Callable[[str], bool]) -> int:
        """Bytes loaded and stored by the kernels whose name ``kernels`` accepts."""
        return sum(n for c in (self.loads, self.stores) for k, n in c.items() if kernels(k))

    def per_kernel(self) -> dict[str, int]:
        """Bytes loaded and stored, per kernel."""
        return dict(self.loads + self.stores)


@contextmanager
def count_bytes(watch: Mapping[str, torch.Tensor] | None = None) -> Iterator[ByteCount]:
    """Count what every Triton kernel launched inside the block loads and stores.

    Wraps the interpreter's memory operations (``InterpreterBuilder.create_masked_load``
    and ``create_masked_store``, which its unmasked ``create_load``/``create_store`` call
    too): each adds the elements its mask lets through times the pointee's size. The
    launch (``GridExecutor.__call__``) is wrapped to name the kernel, ``set_grid_idx``
    to count programs. Everything is restored on leaving the block.

    Args:
        watch: Tensors whose bytes are also tallied apart, by address (on CPU the
            interpreter works on the tensors' own memory).

    Raises:
        RuntimeError: Triton is not interpreting (``TRITON_INTERPRET=1`` must be set
            before the kernels are defined).
    """
    if os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError("counting bytes needs the Triton interpreter (TRITON_INTERPRET=1)")
    from triton.runtime import interpreter

    builder, executor = interpreter.InterpreterBuilder, interpreter.GridExecutor
    count = ByteCount(watched={name: [0, 0] for name in watch or {}})
    ranges = [
        (name, t.data_ptr(), t.data_ptr() + t.numel() * t.element_size())
        for name, t in (watch or {}).items()
    ]
    kernel = ["<no kernel>"]
    saved = {
        (builder, "create_masked_load"): builder.create_masked_load,
        (builder, "create_masked_store"): builder.create_masked_store,
        (builder, "set_grid_idx"): builder.set_grid_idx,
        (executor, "__call__"): executor.__call__,
    }

    def tally(ptrs: Any, mask: Any, into: Counter[str], slot: int) -> None:
        shape = np.shape(ptrs.data)
        live = np.broadcast_to(np.asarray(mask.data, dtype=bool), shape)
        size = (ptrs.get_element_ty().primitive_bitwidth + 7) // 8
        into[kernel[0]] += int(np.count_nonzero(live)) * size
        if ranges:
            addresses = np.broadcast_to(np.asarray(ptrs.data, dtype=np.uint64), shape)[live]
            for name, lo, hi in ranges:
                inside = np.count_nonzero((addresses >= lo) & (addresses < hi))
                count.watched[name][slot] += int(inside) * size

    def load(self: Any, ptrs: Any, mask: Any, other: Any, cache_policy: Any,
             is_volatile: Any) -> Any:
        tally(ptrs, mask, count.loads, 0)
        return saved[builder, "create_masked_load"](self, ptrs, mask, other, cache_policy,
                                                    is_volatile)

    def store(self: Any, ptrs: Any, value: Any, mask: Any, cache_policy: Any) -> Any:
        tally(ptrs, mask, count.stores, 1)
        return saved[builder, "create_masked_store"](self, ptrs, value, mask, cache_policy)

    def set_grid_idx(self: Any, x: int, y: int, z: int) -> Any:
        count.programs[kernel[0]] += 1
        return saved[builder, "set_grid_idx"](self, x, y, z)

    def launch(self: Any, *args: Any, **kwargs: Any) -> Any:
        outer, kernel[0] = kernel[0], self.fn.__name__
        try:
            return saved[executor, "__call__"](self, *args, **kwargs)
        finally:
            kernel[0] = outer

    patches = {
        (builder, "create_masked_load"): load,
        (builder, "create_masked_store"): store,
        (builder, "set_grid_idx"): set_grid_idx,
        (executor, "__call__"): launch,
    }
    try:
        for (owner, name), fn in patches.items():
            setattr(owner, name, fn)
        yield count
    finally:
        for (owner, name), fn in saved.items():
            setattr(owner, name, fn)


def counted(fn: Callable[[], object], what: str) -> ByteCount:
    """Run ``fn`` under :func:`count_bytes`; it must launch at least one kernel."""
    with count_bytes() as count:
        fn()
    if not count.programs:
        raise RuntimeError(f"{what}: no Triton kernel ran under the counter")
    return count


def counter_check() -> dict[str, Any]:
    """The counter on a copy-like kernel: ``apply_temperature`` on ``[N, V]`` float32,
    every temperature off 0 and 1, must load and store exactly ``N*V*4`` bytes of
    logits each, plus 8 bytes of parameters per program (its row's int32 request state
    and float32 temperature), and store nothing else."""
    rows, vocab = 3, 5000  # not a power of two: the last tile is masked
    logits = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(0))
    mapping = torch.arange(rows, dtype=torch.int32)
    temperature = torch.tensor([0.7, 1.3, 0.5], dtype=torch.float32)
    with count_bytes(watch={"logits": logits}) as count:
        apply_temperature(logits, mapping, temperature, validate=False)
    programs = sum(count.programs.values())
    logit_loads, logit_stores = count.watched["logits"]
    param_bytes = programs * (mapping.element_size() + temperature.element_size())
    expected = 2 * rows * vocab * 4 + param_bytes
    ok = (logit_loads == logit_stores == rows * vocab * 4
          and sum(count.loads.values()) == logit_loads + param_bytes
          and sum(count.stores.values()) == logit_stores and count.total == expected)
    return {
        "kernel": "apply_temperature", "rows": rows, "vocab": vocab, "programs": programs,
        "counted_bytes": count.total, "logit_bytes": logit_loads + logit_stores,
        "param_bytes": count.total - logit_loads - logit_stores,
        "expected_bytes": expected, "expected_logit_bytes": 2 * rows * vocab * 4, "ok": ok,
    }


# --------------------------------------------------------------------------------------
# One verification step, both ways
# --------------------------------------------------------------------------------------


@dataclass
class Step:
    """One shape's verification step of one runner, unfolded and folded.

    Attributes:
        runner: ``mrv2`` or ``v1``.
        raw: The logits the step starts from (MRV2: raw, model dtype; V1: the model's
            logits before vLLM's upstream ``.to(float32)``).
        prepare: The unfolded chain's steps before verification, in order: ``name ->
            fn(x)`` returning the rows the next step takes (``x`` first: what
            :meth:`fresh_seam` gives).
        verify: The unfolded verification, ``fn(processed rows)`` returning the tokens.
        folded: The folded verification, ``fn(fresh_seam())`` returning the tokens.
        compulsory_bytes: The raw logits (and draft logits/probs) read once.
        buffer_bytes: The ``[N, V]`` float32 buffer the unfolded chain allocates and
            folding never does (V1: none; it works in the upstream clone).
        upstream_bytes: V1's ``.to(float32)`` + ``.clone()`` (both paths; 0 for MRV2).
    """

    runner: str
    raw: torch.Tensor
    prepare: dict[str, Callable[[torch.Tensor], torch.Tensor]]
    verify: Callable[[torch.Tensor], Any]
    folded: Callable[[torch.Tensor], Any]
    compulsory_bytes: int
    buffer_bytes: int
    upstream_bytes: int

    def fresh_seam(self) -> torch.Tensor:
        """What both paths start from: MRV2's raw logits, V1's fresh float32 clone."""
        if self.runner == "mrv2":
            return self.raw
        return self.raw.to(torch.float32).clone()

    def run_unfolded(self) -> Any:
        """The whole unfolded chain from a fresh seam."""
        x = self.fresh_seam()
        for fn in self.prepare.values():
            x = fn(x)
        return self.verify(x)

    def run_folded(self) -> Any:
        """The folded verification from a fresh seam."""
        return self.folded(self.fresh_seam())


def _used(values: torch.Tensor | None, keep: float | int, states: torch.Tensor) -> bool:
    """Whether any of the batch's request states departs from ``keep`` (vLLM skips a
    sampling step no request uses)."""
    return values is not None and bool((values[states.long()] != keep).any())


def first_requests(inputs: Mrv2Inputs | RejectionInputs,
                   batch: int) -> Mrv2Inputs | RejectionInputs:
    """The first ``batch`` requests of a family's inputs (their rows come first): the
    family's inputs of a smaller batch, drawn once at the largest."""
    if isinstance(inputs, Mrv2Inputs):
        rows = int(inputs.cu_num_logits[batch])
        return replace(
            inputs, target_logits=inputs.target_logits[:rows],
            draft_sampled=inputs.draft_sampled[:rows],
            cu_num_logits=inputs.cu_num_logits[: batch + 1], pos=inputs.pos[:rows],
            idx_mapping=inputs.idx_mapping[:batch],
            expanded_idx_mapping=inputs.expanded_idx_mapping[:rows],
            expanded_local_pos=inputs.expanded_local_pos[:rows],
        )  # per-state tensors (temperature, seed, draft logits, ...) stay whole
    rows = int(inputs.cu_num_draft_tokens[batch - 1])

    def head(t: torch.Tensor | None, n: int) -> torch.Tensor | None:
        return None if t is None else t[:n]

    return replace(
        inputs, draft_token_ids=inputs.draft_token_ids[:rows],
        cu_num_draft_tokens=inputs.cu_num_draft_tokens[:batch],
        target_logits=inputs.target_logits[:rows],
        bonus_token_ids=inputs.bonus_token_ids[:batch],
        draft_probs=head(inputs.draft_probs, rows), is_greedy=head(inputs.is_greedy, batch),
        uniform_probs=head(inputs.uniform_probs, rows), inv_q=head(inputs.inv_q, batch),
        seeds=head(inputs.seeds, batch), temperature=head(inputs.temperature, batch),
        top_k=head(inputs.top_k, batch), top_p=head(inputs.top_p, batch),
        min_p=head(inputs.min_p, batch),
    )


def mrv2_step(inputs: Mrv2Inputs, *, min_p: float) -> Step:
    """MRV2 on the folded family's inputs, ``min_p`` on every other request state."""
    states = inputs.temperature.shape[0]
    device = inputs.temperature.device
    min_ps = torch.where(torch.arange(states) % 2 == 0, min_p, 0.0).to(device)
    vocab = inputs.target_logits.shape[1]
    batch_states = inputs.idx_mapping
    inputs = replace(
        inputs,
        min_p=min_ps if _used(min_ps, 0.0, batch_states) else None,
        top_k=inputs.top_k if _used(inputs.top_k, vocab, batch_states) else None,
        top_p=inputs.top_p if _used(inputs.top_p, 1.0, batch_states) else None,
    )
    rows_state = inputs.expanded_idx_mapping
    k_rows = None if inputs.top_k is None else inputs.top_k[rows_state.long()]
    p_rows = None if inputs.top_p is None else inputs.top_p[rows_state.long()]
    rest = inputs.args()[1:]

    def copy(raw: torch.Tensor) -> torch.Tensor:
        return torch.empty_like(raw, dtype=torch.float32).copy_(raw)

    def temperature(x: torch.Tensor) -> torch.Tensor:
        apply_temperature(x, rows_state, inputs.temperature, validate=False)
        return x

    def min_p_step(x: torch.Tensor) -> torch.Tensor:
        apply_min_p(x, rows_state, min_ps, validate=False)
        return x

    prepare: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
        "copy": copy, "temperature": temperature,
    }
    if inputs.min_p is not None:
        prepare["min-p"] = min_p_step
    if k_rows is not None or p_rows is not None:
        prepare["top-k/top-p"] = lambda x: top_k_top_p(x, k_rows, p_rows, validate=False)

    def folded(raw: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return rejection_sample_mrv2(raw, *rest, **inputs.kwargs(), validate=False)

    raw = inputs.target_logits
    draft = inputs.draft_logits
    return Step(
        runner="mrv2", raw=raw, prepare=prepare,
        verify=lambda x: rejection_sample_mrv2(x, *rest, validate=False), folded=folded,
        compulsory_bytes=_nbytes(raw) + (0 if draft is None else _draft_bytes(draft, inputs)),
        buffer_bytes=raw.numel() * 4, upstream_bytes=0,
    )


def _draft_bytes(draft: torch.Tensor, inputs: Mrv2Inputs) -> int:
    """The draft logits a step reads: its requests' ``k`` rows (of every state's)."""
    return inputs.idx_mapping.numel() * draft.shape[1] * draft.shape[2] * draft.element_size()


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def v1_step(inputs: RejectionInputs) -> Step:
    """V1 on the folded family's inputs (logits in the model's dtype, before upstream)."""
    device = inputs.target_logits.device
    vocab = inputs.target_logits.shape[1]
    batch = inputs.cu_num_draft_tokens.shape[0]
    everyone = torch.arange(batch, device=device)
    inputs = replace(
        inputs,
        top_k=inputs.top_k if _used(inputs.top_k, vocab, everyone) else None,
        top_p=inputs.top_p if _used(inputs.top_p, 1.0, everyone) else None,
    )
    rows = inputs.target_logits.shape[0]
    cu = inputs.cu_num_draft_tokens.to(torch.int64)
    row_request = torch.searchsorted(cu, torch.arange(rows, device=device), right=True)
    assert inputs.temperature is not None
    temp = inputs.temperature
    if inputs.is_greedy is not None:  # vLLM divides greedy requests' rows by 1
        temp = torch.where(inputs.is_greedy, 1.0, temp)
    temp_rows = temp[row_request].unsqueeze(-1)
    k_rows = None if inputs.top_k is None else inputs.top_k[row_request]
    p_rows = None if inputs.top_p is None else inputs.top_p[row_request]
    plain = replace(inputs, temperature=None, top_k=None, top_p=None, min_p=None)
    draft, cu32, _, bonus = inputs.args()

    prepare: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
        "temperature": lambda x: x.div_(temp_rows),
    }
    if k_rows is not None or p_rows is not None:
        prepare["top-k/top-p"] = lambda x: top_k_top_p(x, k_rows, p_rows, validate=False)

    def verify(x: torch.Tensor) -> torch.Tensor:
        return rejection_sample(draft, cu32, x, bonus, **plain.kwargs(), validate=False)

    def folded(x: torch.Tensor) -> torch.Tensor:
        return rejection_sample(draft, cu32, x, bonus, **inputs.kwargs(), validate=False)

    raw = inputs.target_logits
    n = raw.numel()
    to_fp32 = 0 if raw.dtype == torch.float32 else n * raw.element_size() + n * 4
    dp = inputs.draft_probs
    return Step(
        runner="v1", raw=raw, prepare=prepare, verify=verify, folded=folded,
        compulsory_bytes=_nbytes(raw) + (0 if dp is None else _nbytes(dp)),
        buffer_bytes=0, upstream_bytes=to_fp32 + 2 * n * 4,
    )


def same_tokens(a: Any, b: Any) -> bool:
    """Whether two verification results (a tensor, or MRV2's pair) are equal."""
    if isinstance(a, tuple):
        return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    return torch.equal(a, b)


# --------------------------------------------------------------------------------------
# Count mode
# --------------------------------------------------------------------------------------


def torch_bytes(step: Step, name: str) -> int | None:
    """The PyTorch ``[N, V]`` ops of the unfolded chain, from shapes and dtypes (``None``
    for the steps that are Triton kernels, which are counted)."""
    n = step.raw.numel()
    if step.runner == "mrv2" and name == "copy":
        return n * step.raw.element_size() + n * 4
    if step.runner == "v1" and name == "temperature":
        return 2 * n * 4  # div_ in place on the float32 rows
    return None


def count_step(step: Step) -> dict[str, Any]:
    """Bytes of each step of both paths; the tokens compared."""
    x = step.fresh_seam()
    unfolded: dict[str, int] = {}
    kernels: dict[str, dict[str, int]] = {}
    for name, fn in [*step.prepare.items(), ("verify", step.verify)]:
        analytic = torch_bytes(step, name)
        result: list[Any] = []
        if analytic is not None:
            result.append(fn(x))
            unfolded[name] = analytic
            kernels[name] = {"<torch, from shapes>": analytic}
        else:
            count = counted(lambda fn=fn, x=x, result=result: result.append(fn(x)), name)
            unfolded[name] = count.total
            kernels[name] = count.per_kernel()
        if name != "verify":
            x = result[0]
    tokens = result[0]
    seam = step.fresh_seam()
    folded_out: list[Any] = []
    count = counted(lambda: folded_out.append(step.folded(seam)), "folded")
    folded = {
        "pre-pass": count.of(lambda k: k == PRE_PASS_KERNEL),
        "verify": count.of(lambda k: k != PRE_PASS_KERNEL),
    }
    kernels["folded"] = count.per_kernel()
    return {"unfolded_steps": unfolded, "folded_steps": folded,
            "unfolded_bytes": sum(unfolded.values()), "folded_bytes": sum(folded.values()),
            "kernels": kernels, "tokens_equal": same_tokens(tokens, folded_out[0])}


# --------------------------------------------------------------------------------------
# Time mode
# --------------------------------------------------------------------------------------


def time_once(fn: Callable[[], object], *, gpu: bool) -> float:
    """One timing of ``fn`` in microseconds: on a GPU ``do_bench``'s median (CUDA events,
    the L2 cache flushed between calls), on CPU one call."""
    if gpu:
        import triton.testing

        return float(triton.testing.do_bench(fn, quantiles=[0.5], warmup=5, rep=20)) * 1e3
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e6


def bench_pair(a: Callable[[], object], b: Callable[[], object], *, rounds: int,
               gpu: bool) -> tuple[float, float]:
    """Medians in microseconds of ``a`` and ``b`` over ``rounds`` interleaved rounds of
    :func:`time_once` (the order alternating between rounds)."""
    a(), b()  # compile and warm up outside the rounds
    times: dict[int, list[float]] = {0: [], 1: []}
    for r in range(rounds):
        order = ((0, a), (1, b)) if r % 2 == 0 else ((1, b), (0, a))
        for which, fn in order:
            times[which].append(time_once(fn, gpu=gpu))
    return statistics.median(times[0]), statistics.median(times[1])


def copy_bandwidth(device: torch.device, *, gpu: bool) -> float:
    """Device copy bandwidth in bytes/s (read + write), measured now."""
    n = (512 << 20) // 4 if gpu else (16 << 20) // 4
    src = torch.empty(n, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    t_us = statistics.median(time_once(lambda: dst.copy_(src), gpu=gpu) for _ in range(3))
    return 2 * src.numel() * 4 / (t_us * 1e-6)


def time_step(step: Step, *, rounds: int, gpu: bool, bandwidth: float) -> dict[str, Any]:
    """Both paths timed side by side; the tokens compared."""
    equal = same_tokens(step.run_unfolded(), step.run_folded())
    t_unfolded, t_folded = bench_pair(step.run_unfolded, step.run_folded, rounds=rounds,
                                      gpu=gpu)
    floor_us = step.compulsory_bytes / (bandwidth / 2) * 1e6  # read once at copy speed
    return {
        "unfolded_us": t_unfolded, "folded_us": t_folded, "speedup": t_unfolded / t_folded,
        "floor_us": floor_us,
        "unfolded_GBps": step.compulsory_bytes / (t_unfolded * 1e-6) / 1e9,
        "folded_GBps": step.compulsory_bytes / (t_folded * 1e-6) / 1e9,
        "tokens_equal": equal,
    }


# --------------------------------------------------------------------------------------
# Driver
# --------------------------------------------------------------------------------------


FAMILY = {"mrv2": "rejection_sample_mrv2_folded", "v1": "rejection_sample_folded"}


def shape_steps(grid: Mapping[str, tuple[int, ...]], args: argparse.Namespace,
                device: torch.device) -> Iterator[tuple[int, int, int, str, Callable[[], Step]]]:
    """``(vocab, k, batch, runner, make the step)`` over the grid; a family's inputs are
    drawn once per vocabulary, ``k`` and runner, at the largest batch (drawing them is
    slow at large shapes), and every smaller batch is its first requests."""
    for vocab, k, runner in itertools.product(grid["vocab"], grid["k"], RUNNERS):
        drawn: list[Mrv2Inputs | RejectionInputs] = []

        def make(batch: int, vocab: int = vocab, k: int = k, runner: str = runner,
                 drawn: list[Mrv2Inputs | RejectionInputs] = drawn) -> Step:
            if not drawn:
                problem = Problem(spec_len=k, batch=max(grid["batch"]), vocab=vocab,
                                  dtype=args.dtype, draft_probs=args.draft_probs)
                drawn.append(FAMILIES[FAMILY[runner]].make_inputs(problem, seed=0,
                                                                  device=device))
            inputs = first_requests(drawn[0], batch)
            if isinstance(inputs, Mrv2Inputs):
                return mrv2_step(inputs, min_p=args.min_p)
            return v1_step(inputs)

        for batch in sorted(grid["batch"]):
            yield vocab, k, batch, runner, lambda make=make, batch=batch: make(batch)


COUNT_HEADER = ("| runner | B | k | V | rows | unfolded MB | folded MB | unfolded/folded "
                "| unfolded B/logit | folded B/logit | buffer not allocated MB "
                "| upstream MB (both, in neither) | tokens |")
STEP_HEADER = ("| runner | B | k | V | copy | temperature | min-p | top-k/top-p "
               "| verify (unfolded) | pre-pass | verify (folded) |")
TIME_HEADER = ("| runner | B | k | V | rows | unfolded us | folded us | speedup "
               "| unfolded GB/s | folded GB/s | floor % unfolded | floor % folded "
               "| buffer not allocated MB | tokens |")


def _header_rule(header: str) -> str:
    return "|" + "|".join("---" for _ in range(header.count("|") - 1)) + "|"


def count_line(r: dict[str, Any]) -> str:
    logits = r["rows"] * r["vocab"]
    return (f"| {r['runner']} | {r['batch']} | {r['k']} | {r['vocab']} | {r['rows']} "
            f"| {r['unfolded_bytes'] / MB:.3f} | {r['folded_bytes'] / MB:.3f} "
            f"| {r['ratio']:.2f}x | {r['unfolded_bytes'] / logits:.2f} "
            f"| {r['folded_bytes'] / logits:.2f} | {r['buffer_bytes'] / MB:.3f} "
            f"| {r['upstream_bytes'] / MB:.3f} | {'equal' if r['tokens_equal'] else 'DIFFER'} |")


def step_line(r: dict[str, Any]) -> str:
    u, f = r["unfolded_steps"], r["folded_steps"]

    def mb(steps: dict[str, int], name: str) -> str:
        return f"{steps[name] / MB:.3f}" if name in steps else "-"

    cells = [mb(u, n) for n in ("copy", "temperature", "min-p", "top-k/top-p", "verify")]
    cells += [mb(f, "pre-pass"), mb(f, "verify")]
    return f"| {r['runner']} | {r['batch']} | {r['k']} | {r['vocab']} | " + " | ".join(cells) + " |"


def time_line(r: dict[str, Any]) -> str:
    return (f"| {r['runner']} | {r['batch']} | {r['k']} | {r['vocab']} | {r['rows']} "
            f"| {r['unfolded_us']:.1f} | {r['folded_us']:.1f} | {r['speedup']:.2f}x "
            f"| {r['unfolded_GBps']:.0f} | {r['folded_GBps']:.0f} "
            f"| {100 * r['floor_us'] / r['unfolded_us']:.1f} "
            f"| {100 * r['floor_us'] / r['folded_us']:.1f} | {r['buffer_bytes'] / MB:.1f} "
            f"| {'equal' if r['tokens_equal'] else 'DIFFER'} |")


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Sweep the shapes; print the tables; return what ``--json`` writes."""
    started = time.monotonic()
    identity = detect_device()
    gpu = identity.backend != CPU_BACKEND
    device = torch.device(torch_device(identity.backend))
    mode = args.mode if args.mode != "auto" else ("time" if gpu else "count")
    if mode == "count" and os.environ.get("TRITON_INTERPRET") != "1":
        raise SystemExit("--mode count needs the Triton interpreter: run with "
                         "TRITON_INTERPRET=1 (it runs on CPU)")
    grid = dict(GRIDS["quick" if args.quick else mode])
    for name in ("batch", "k", "vocab"):
        if getattr(args, name):
            grid[name] = tuple(getattr(args, name))
    report: dict[str, Any] = {
        "mode": mode, "device": identity.as_dict(), "dtype": args.dtype,
        "draft_probs": args.draft_probs, "min_p": args.min_p, "grid": grid, "records": [],
    }
    print(f"# device: {identity.describe()}; mode: {mode}; logits {args.dtype}; "
          f"{'model' if args.draft_probs else 'ngram'} drafts; min-p {args.min_p} on every "
          f"other MRV2 request state")
    if mode == "count":
        check = counter_check()
        report["counter_check"] = check
        print(f"# counter check: apply_temperature on [{check['rows']}, {check['vocab']}] "
              f"float32 counted {check['counted_bytes']} B = {check['logit_bytes']} B of "
              f"logits (2*N*V*4 = {check['expected_logit_bytes']}) + {check['param_bytes']} "
              f"B of parameters ({check['programs']} programs x 8): "
              f"{'ok' if check['ok'] else 'FAILED'}")
        if not check["ok"]:
            raise SystemExit("the byte counter is off on a copy-like kernel")
        bandwidth = 0.0
    else:
        bandwidth = copy_bandwidth(device, gpu=gpu)
        report["copy_bandwidth_Bps"] = bandwidth
        print(f"# copy bandwidth {bandwidth / 1e9:.1f} GB/s (read + write)"
              + ("" if gpu else "; on CPU these timings mean nothing"))
    header = COUNT_HEADER if mode == "count" else TIME_HEADER
    print()
    print(header)
    print(_header_rule(header))
    skipped = 0
    for vocab, k, batch, runner, make in shape_steps(grid, args, device):
        if args.max_seconds and time.monotonic() - started > args.max_seconds:
            skipped += 1
            continue
        step = make()
        rec: dict[str, Any] = {
            "runner": runner, "batch": batch, "k": k, "vocab": vocab,
            "rows": step.raw.shape[0], "dtype": str(step.raw.dtype).removeprefix("torch."),
            "buffer_bytes": step.buffer_bytes, "upstream_bytes": step.upstream_bytes,
            "compulsory_bytes": step.compulsory_bytes,
            "unfolded_chain": [*step.prepare, "verify"],
        }
        if mode == "count":
            rec.update(count_step(step))
            rec["ratio"] = rec["unfolded_bytes"] / rec["folded_bytes"]
            print(count_line(rec), flush=True)
        else:
            rec.update(time_step(step, rounds=args.rounds, gpu=gpu, bandwidth=bandwidth))
            print(time_line(rec), flush=True)
        if not rec["tokens_equal"]:
            print(f"# MISMATCH: {runner} B={batch} k={k} V={vocab}: folded tokens differ "
                  f"from the unfolded chain's", flush=True)
        report["records"].append(rec)
        if args.json:
            args.json.write_text(json.dumps(report, indent=1))
    records = report["records"]
    if mode == "count" and records:
        print()
        print("Bytes per step (MB; '-': not run, no request of the batch uses it):")
        print()
        print(STEP_HEADER)
        print(_header_rule(STEP_HEADER))
        for rec in records:
            print(step_line(rec))
    print()
    key = "ratio" if mode == "count" else "speedup"
    what = "unfolded/folded bytes" if mode == "count" else "speedup (unfolded/folded time)"
    for runner in RUNNERS:
        values = [r[key] for r in records if r["runner"] == runner]
        if values:
            print(f"# {runner}: {what}: geometric mean {statistics.geometric_mean(values):.2f}x "
                  f"over {len(values)} shapes (min {min(values):.2f}x, max {max(values):.2f}x)")
    if mode == "count":
        print("# includes: MRV2 unfolded = fp32 copy + temperature + min-p + top-k/top-p + "
              "verify, folded = pre-pass + verify (from the raw logits); V1 unfolded = div_ + "
              "top-k/top-p + verify, folded = pre-pass + verify (from the float32 clone; "
              "the upstream .to(float32) + .clone() are in both and in neither figure). "
              "Top-k/top-p threshold searches are data-dependent: figures for the families' "
              "realistic inputs.")
    else:
        print("# measured: time of each path (MRV2 from the raw logits; V1 including the "
              "upstream .to(float32) + .clone() in both); GB/s = raw logits (+ draft "
              "logits/probs) read once / time; floor % = that read at the copy bandwidth / "
              "time.")
    mismatches = sum(not r["tokens_equal"] for r in records)
    report["mismatches"] = mismatches
    report["skipped_shapes"] = skipped
    report["seconds"] = time.monotonic() - started
    print(f"# {len(records)} shapes in {report['seconds']:.0f} s; "
          f"{mismatches} token mismatches"
          + (f"; {skipped} shapes skipped (--max-seconds {args.max_seconds})" if skipped else ""))
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="one tiny shape per runner (CPU smoke run)")
    parser.add_argument("--mode", choices=("auto", "count", "time"), default="auto",
                        help="count bytes (interpreter) or time (GPU); auto: by the device")
    parser.add_argument("--batch", type=int, nargs="+", help="batch sizes (requests)")
    parser.add_argument("--k", type=int, nargs="+", help="drafts per request")
    parser.add_argument("--vocab", type=int, nargs="+", help="vocabulary sizes")
    parser.add_argument("--dtype", default="bfloat16", choices=DTYPES,
                        help="the model's logits dtype")
    parser.add_argument("--draft-probs", action="store_true",
                        help="a model drafter (draft logits/probs) instead of ngram")
    parser.add_argument("--min-p", type=float, default=0.05,
                        help="MRV2 min-p of every other request state (0: none)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds")
    parser.add_argument("--max-seconds", type=float, default=0.0,
                        help="start no new shape after this long (0: no limit)")
    parser.add_argument("--json", type=Path, help="write the report here")
    args = parser.parse_args()
    report = run(args)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    if report["mismatches"]:
        raise SystemExit(f"{report['mismatches']} shapes: folded tokens differ from unfolded")


if __name__ == "__main__":
    main()
