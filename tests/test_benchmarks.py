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


def test_folded_benchmark_quick_run_counts_fewer_bytes_folded(tmp_path: Path) -> None:
    out = tmp_path / "bench-folded.json"
    done = subprocess.run(
        [sys.executable, "benchmarks/bench_folded.py", "--quick", "--json", str(out)],
        cwd=ROOT, env={**os.environ, "TRITON_INTERPRET": "1"}, capture_output=True,
        text=True, timeout=600,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    report = json.loads(out.read_text())
    assert report["mode"] == "count"
    # The counter on a copy-like kernel: exactly 2*N*V*4 bytes of logits, plus each
    # program's int32 request state and float32 temperature.
    check = report["counter_check"]
    assert check["ok"]
    assert check["logit_bytes"] == 2 * check["rows"] * check["vocab"] * 4
    assert check["counted_bytes"] == check["logit_bytes"] + 8 * check["programs"]
    records = report["records"]
    assert {r["runner"] for r in records} == {"mrv2", "v1"}
    for r in records:
        assert r["tokens_equal"], r
        assert 0 < r["folded_bytes"] < r["unfolded_bytes"], r
        assert r["unfolded_bytes"] == sum(r["unfolded_steps"].values())
        assert r["folded_steps"]["pre-pass"] > 0 and r["folded_steps"]["verify"] > 0
    mrv2 = next(r for r in records if r["runner"] == "mrv2")
    assert mrv2["unfolded_chain"] == ["copy", "temperature", "min-p", "top-k/top-p", "verify"]
    assert mrv2["buffer_bytes"] == mrv2["rows"] * mrv2["vocab"] * 4
    assert report["mismatches"] == 0
    assert "| runner |" in done.stdout
