"""Which problems a sweep tunes, and the names of their studies."""

from __future__ import annotations

import functools
import itertools
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from spectune.identity import DeviceIdentity
from spectune.space import DTYPES, Problem

__all__ = ["SweepItem", "as_looked_up", "parse_int_list", "study_name", "sweep_items"]


@dataclass(frozen=True)
class SweepItem:
    """One study of a sweep: a kernel family and a problem."""

    kernel: str
    problem: Problem


def parse_int_list(text: str, *, name: str) -> list[int]:
    """Parse ``"1-8"``, ``"1,8,64"`` or ``"1-4,8"`` into sorted unique positive ints.

    Raises:
        ValueError: naming ``name`` on anything else.
    """
    values: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        match = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if not match:
            raise ValueError(f"{name}: expected numbers like 1-8 or 1,8,64, got {text!r}")
        low = int(match.group(1))
        high = int(match.group(2) or low)
        if low < 1 or high < low:
            raise ValueError(f"{name}: {part!r} is not a positive range")
        values.update(range(low, high + 1))
    return sorted(values)


def sweep_items(
    *,
    kernels: Sequence[str],
    spec_lens: Iterable[int],
    batches: Iterable[int],
    vocabs: Iterable[int],
    dtypes: Iterable[str],
    draft_probs: Iterable[bool] = (True,),
) -> list[SweepItem]:
    """Every (kernel, k, batch, vocab, dtype, draft probs) combination, in a fixed order."""
    dtypes = list(dtypes)
    for dtype in dtypes:
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    return [
        SweepItem(kernel, Problem(spec_len=k, batch=b, vocab=v, dtype=d, draft_probs=dp))
        for kernel, k, b, v, d, dp in itertools.product(
            kernels, list(spec_lens), list(batches), list(vocabs), dtypes, list(draft_probs)
        )
    ]


def as_looked_up(items: Sequence[SweepItem]) -> list[SweepItem]:
    """Each item's problem as the plugin will look it up: its family's ``problem_of`` of
    inputs made for it, duplicates dropped (order kept).

    A family whose launches ignore a dimension (sampling has no k and no drafter) is so
    tuned once per shape, keyed as its launches are looked up, not once per ``--spec-lens``
    value under keys nothing asks for.
    """
    from spectune.kernels import get_family

    seen: set[SweepItem] = set()
    out: list[SweepItem] = []
    for item in items:
        looked_up = SweepItem(item.kernel, _looked_up(get_family(item.kernel), item.problem))
        if looked_up not in seen:
            seen.add(looked_up)
            out.append(looked_up)
    return out


@functools.lru_cache(maxsize=4096)
def _looked_up(family: Any, problem: Problem) -> Problem:
    # Making inputs costs a second for large shapes; a process planning the same shapes
    # again (a nightly dry run per shard, a sweep after its plan) asks once. Keyed by the
    # family object: a family registered anew under the same name is asked again.
    return family.problem_of(family.make_inputs(problem, seed=0))


def study_name(device: DeviceIdentity, item: SweepItem, kernel_hash: str) -> str:
    """A study's name: device identity + kernel (and its source hash) + problem.

    The same problem on the same device and kernel source resumes the same study.
    """
    p = item.problem
    return (
        f"{item.kernel}@{kernel_hash}/{device.backend}-{device.arch}-{device.device_name}"
        f"-cu{device.cu_count}-w{device.warp_size}/k{p.spec_len}-b{p.batch}-v{p.vocab}"
        f"-{p.dtype}-{'dp' if p.draft_probs else 'nodp'}"
    )
