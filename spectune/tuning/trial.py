"""One tuning trial: compile, correctness gate, timing.

A configuration is timed only after it has produced exactly the reference result on
the trial's inputs; a config that fails to compile or run is a failure with its reason,
and one that gives a different result is invalid and can never be promoted.
"""

from __future__ import annotations

import signal
import statistics
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from spectune.identity import CPU_BACKEND, torch_device
from spectune.kernels import KernelFamily
from spectune.messages import one_line
from spectune.promotion import Timing
from spectune.search import Outcome
from spectune.space import Problem

__all__ = ["TrialRunner", "gpu_time", "wall_time"]


class TrialTimeout(Exception):
    """A trial ran past its time limit."""


@contextmanager
def _time_limit(seconds: float | None) -> Iterator[None]:
    # SIGALRM interrupts a hung compile or launch; it only exists in the main thread of
    # a Unix process, so elsewhere trials run without a limit.
    if not seconds or not hasattr(signal, "setitimer"):
        yield
        return
    try:
        previous = signal.signal(signal.SIGALRM, _raise_timeout)
    except ValueError:  # not the main thread
        yield
        return
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _raise_timeout(signum: int, frame: object) -> None:
    raise TrialTimeout("trial exceeded its time limit")


class TrialRunner:
    """Runs trials of one kernel family on one problem, against one reference.

    Args:
        family: The kernel family.
        problem: The shape being tuned.
        backend: ``hip``, ``cuda`` or ``cpu-interpreter``.
        seed: Seed of the trial inputs.
        time_limit: Seconds a trial may take (compile + gate + timing).
        timer: Measures a callable; defaults to do_bench quantiles on a GPU and wall
            time under the interpreter.
    """

    def __init__(
        self,
        *,
        family: KernelFamily,
        problem: Problem,
        backend: str,
        seed: int = 0,
        time_limit: float | None = 120.0,
        timer: Callable[[Callable[[], Any]], Timing] | None = None,
    ) -> None:
        self.family = family
        self.problem = problem
        self.backend = backend
        self.time_limit = time_limit
        self.inputs = family.make_inputs(problem, seed=seed, device=torch_device(backend))
        self.expected = family.reference(self.inputs)
        self.timer = timer or (wall_time if backend == CPU_BACKEND else gpu_time)

    def __call__(self, config: Mapping[str, int]) -> Outcome:
        """Compile and run ``config``, gate it against the reference, then time it.

        Returns:
            ``Outcome.ok`` with the p50 in µs (p20/p50/p80 in its attrs), ``invalid``
            for a wrong result, or ``failed`` with the kind and reason.
        """
        try:
            with _time_limit(self.time_limit):
                out = self.family.launch(self.inputs, config)
                if not self.family.same(self.expected, out):
                    return Outcome.invalid("result differs from the reference")
                timing = self.timer(lambda: self.family.launch(self.inputs, config))
        except TrialTimeout as exc:
            return Outcome.failed("timeout", str(exc))
        except Exception as exc:  # compile errors, out of resources, launch failures
            return Outcome.failed(_failure_kind(exc), f"{type(exc).__name__}: {one_line(exc)}")
        return Outcome.ok(timing.p50, attrs=_timing_attrs(timing))


def _timing_attrs(timing: Timing) -> dict[str, float]:
    """The trial user attributes that record ``timing`` (µs quantiles)."""
    return {"p20_us": timing.p20, "p50_us": timing.p50, "p80_us": timing.p80}


def _failure_kind(exc: BaseException) -> str:
    name = type(exc).__name__
    if name == "OutOfResources" or "out of resource" in str(exc).lower():
        return "out_of_resources"
    if "Compil" in name:
        return "compile"
    return "runtime"


def wall_time(fn: Callable[[], Any], *, repeats: int = 5) -> Timing:
    """Wall-clock quantiles under the interpreter (honest CPU time, not a GPU figure)."""
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1e6)
    q = statistics.quantiles(samples, n=10, method="inclusive")
    return Timing(p20=q[1], p50=statistics.median(samples), p80=q[7])


def gpu_time(fn: Callable[[], Any]) -> Timing:
    """do_bench quantiles on a GPU: warm-up, L2 flushed between runs."""
    import triton.testing

    p20, p50, p80 = triton.testing.do_bench(fn, quantiles=[0.2, 0.5, 0.8], warmup=25, rep=100)
    return Timing(p20=p20 * 1e3, p50=p50 * 1e3, p80=p80 * 1e3)
