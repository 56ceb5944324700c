"""vLLM as the incumbent: the config that serves a shape, measured beside vLLM's own function.

A tuned config is worth serving only where it beats the function it replaces in the
installed vLLM, on this device. After a study has decided which config serves its shape
(the database's row, else the family's default), :func:`compare_with_vllm` runs vLLM's
own function on the same inputs (:func:`spectune.vllm.vllm_incumbent`), checks that both
return the same tokens, and measures the two side by side in alternating rounds under the
promotion rule (:func:`spectune.promotion.decide_side_by_side`): the verdict is "faster"
only when spectune's config wins by the rule, "not faster" otherwise. Where vLLM cannot
be measured (not installed, no vLLM function for the family, vLLM's function raised or
returned other tokens) the verdict is "not measured", with the reason; nothing here ever
stops a sweep.

Under the CPU interpreter both sides are interpreter times: a verdict measured there says
which runs faster under the interpreter, nothing about a GPU, and is labelled by the
row's device (``cpu-interpreter``).

Memory beside time: on a GPU the comparison also records the peak device memory of one
call of each side (:func:`peak_memory_mib`): a config faster than vLLM's function that
needs much more scratch memory is a finding too. Under the CPU interpreter there is no
device memory to measure; the figures are ``None``.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from spectune.messages import one_line
from spectune.promotion import Timing, decide_side_by_side

if TYPE_CHECKING:
    from spectune.db import VllmComparison
    from spectune.kernels import KernelFamily

__all__ = ["VsVllm", "compare_with_vllm", "peak_memory_mib", "vllm_unavailable"]

logger = logging.getLogger("spectune.tuning")


@dataclass(frozen=True)
class VsVllm:
    """One side-by-side measurement of a config against vLLM's own function.

    Attributes:
        comparison: What the row records (verdict, vLLM's p50, its version, the reason).
        ours: The config's timing over the rounds (``None`` when not measured).
    """

    comparison: VllmComparison
    ours: Timing | None = None


def peak_memory_mib(fn: Callable[[], Any], *, device: Any) -> float | None:
    """The device memory one call of ``fn`` allocates at its peak, MiB.

    What the caching allocator held at the call's peak beyond what was allocated before
    it (its outputs and scratch, not the inputs); ``fn``'s result is kept until the peak
    is read, so outputs count. Measured only on a CUDA or HIP device (PyTorch names
    both ``cuda``); ``None`` elsewhere (the CPU interpreter has no device memory).
    Resets the device's peak statistics.

    Args:
        fn: One call (already warmed up: a first call may compile).
        device: Where ``fn`` runs: a ``torch.device``, its name, or ``None``.

    Returns:
        MiB, or ``None`` where not measured.
    """
    if device is None:
        return None
    import torch

    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    torch.cuda.synchronize(device)
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    result = fn()
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device)
    del result
    return max(peak - before, 0) / float(1 << 20)


def inputs_device(inputs: Any) -> Any:
    """The device of a family's inputs: that of the first tensor among its launch
    arguments (``None`` when it has none)."""
    import torch

    args = getattr(inputs, "args", None)
    for value in args() if callable(args) else ():
        if isinstance(value, torch.Tensor):
            return value.device
    return None


def _installed() -> str | None:
    from spectune.vllm import installed_vllm_version

    return installed_vllm_version()


@functools.cache
def vllm_unavailable() -> str | None:
    """Why no vLLM function can be measured in this process (``None``: vLLM imports).

    Read once per process: a sweep says it once, not once per shape.
    """
    if _installed() is None:
        return "vLLM is not installed"
    return None


def compare_with_vllm(
    *,
    family: KernelFamily,
    inputs: Any,
    config: dict[str, int],
    timer: Callable[[Callable[[], Any]], Timing],
) -> VsVllm:
    """Measure ``config`` of ``family`` beside the installed vLLM's own function.

    Args:
        family: The kernel family.
        inputs: The family's inputs (the study's), on the device.
        config: The config that serves the shape.
        timer: Times a callable (the study's: wall time under the interpreter, do_bench
            on a GPU).

    Returns:
        The comparison to record; never raises for what vLLM does.
    """
    from spectune.db import VllmComparison
    from spectune.vllm import IncumbentUnavailable, vllm_incumbent

    missing = vllm_unavailable()
    if missing is not None:
        return VsVllm(VllmComparison(verdict="not measured", reason=missing))
    try:
        incumbent = vllm_incumbent(family.name, inputs)
    except IncumbentUnavailable as exc:
        # Tried under this vLLM (so a nightly run does not try again until it changes).
        return VsVllm(VllmComparison(verdict="not measured", version=_installed(),
                                     reason=one_line(exc)))

    def not_measured(reason: str) -> VsVllm:
        return VsVllm(VllmComparison(verdict="not measured", version=incumbent.vllm_version,
                                     reason=reason))

    try:
        theirs = incumbent.run()
    except Exception as exc:  # vLLM's own function failing is a finding, not a crash
        logger.warning("spectune: vLLM's %s raised on %s: %s", incumbent.function,
                       family.name, one_line(exc))
        return not_measured(f"vLLM's function raised: {one_line(exc)}")
    ours = family.launch(inputs, config)
    if not incumbent.agrees(ours, theirs):
        return not_measured("vLLM returned different tokens")
    try:
        decision = decide_side_by_side(lambda: timer(lambda: family.launch(inputs, config)),
                                       lambda: timer(incumbent.run))
        # Both sides ran (and compiled) above: one more call each, for its peak memory.
        device = inputs_device(inputs)
        tuned_peak = peak_memory_mib(lambda: family.launch(inputs, config), device=device)
        vllm_peak = peak_memory_mib(incumbent.run, device=device)
    except Exception as exc:
        return not_measured(f"vLLM's function raised: {one_line(exc)}")
    return VsVllm(
        VllmComparison(verdict="faster" if decision.faster else "not faster",
                       p50_us=decision.incumbent.p50, version=incumbent.vllm_version,
                       peak_mib=vllm_peak, tuned_peak_mib=tuned_peak),
        ours=decision.candidate,
    )
