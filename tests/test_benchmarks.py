"""The sampling benchmark runs (``--quick``: tiny shapes under the interpreter, its
figures meaningless on CPU): what keeps benchmarks/bench_sampling.py from rotting between
the GPU sessions that run it for real (scripts/gpu_check.sh)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def test_sampling_benchmark_quick_run_checks_every_kernel(tmp_path: Path) -> None:
    if not os.environ.get("CI"):  # in CI a missing vllm is a failure, not a skip
        pytest.importorskip("vllm")
    out = tmp_path / "bench.json"
    done = subprocess.run(
        [sys.executable, "benchmarks/bench_sampling.py", "--quick", "--json", str(out)],
        cwd=ROOT, env={**os.environ, "TRITON_INTERPRET": "1"}, capture_output=True,
        text=True, timeout=600,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    records = json.loads(out.read_text())
    kernels = {r["kernel"] for r in records}
    assert kernels == {"top_k_top_p", "temperature", "min_p", "gumbel", "chain vs fused"}
    assert len(records) == 2 * len(kernels)  # two shapes in --quick
    assert all(r["vllm_us"] > 0 and r["ours_us"] > 0 for r in records)
    assert "geometric-mean speedup" in done.stdout
