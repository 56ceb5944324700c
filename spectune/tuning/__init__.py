"""Tuning the kernel families on this device: problems, correctness-gated trials, the
isolated trial runner, sweeps and nightly jobs.

The search itself (studies, strategies, study storage) is :mod:`spectune.search`; this
package applies it to the kernels of :mod:`spectune.kernels` and writes the winners into
:mod:`spectune.db`. The modules :mod:`spectune.tuning.sweep` (``spectune sweep``) and
:mod:`spectune.tuning.nightly` (``spectune nightly``) are public; the names below are what
the command line and the tests use besides them. Importing this package imports neither
torch nor Triton: a trial's kernels load in the process that runs it.
"""

from __future__ import annotations

from spectune.tuning._isolated import IsolatedRunner, TrialWorkerLost, WorkerStartError
from spectune.tuning._job import JobError, NightlyJob, ShapeGroup, load_job, parse_duration
from spectune.tuning._vs_vllm import VsVllm, compare_with_vllm, peak_memory_mib

__all__ = [
    "IsolatedRunner",
    "JobError",
    "NightlyJob",
    "ShapeGroup",
    "TrialWorkerLost",
    "VsVllm",
    "WorkerStartError",
    "compare_with_vllm",
    "load_job",
    "parse_duration",
    "peak_memory_mib",
]
