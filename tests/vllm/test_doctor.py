"""``spectune doctor``: device, database, vLLM version, and whether the plugin would route."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from spectune.cli import main
from spectune.vllm import passed_calls, routed_calls
from tests.vllm.conftest import needs_kernels

pytestmark = [pytest.mark.vllm]


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("SPECTUNE_DISABLE", "SPECTUNE_FORCE", "SPECTUNE_DB", "VLLM_USE_V2_MODEL_RUNNER"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SPECTUNE_USER_DB", str(tmp_path / "absent-user.db"))


def doctor(*args: str) -> str:
    result = CliRunner().invoke(main, ["doctor", *args])
    assert result.exit_code == 0, result.output
    return result.output


def doctor_json(*args: str) -> dict[str, Any]:
    """The JSON report (vLLM may log to stdout on its first import: skip those lines)."""
    output = doctor("--json", *args)
    lines = [line for line in output.splitlines() if line.startswith("{")]
    assert lines, output
    return json.loads(lines[-1])


@needs_kernels
def test_doctor_routes_when_forced_and_self_test_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECTUNE_FORCE", "1")
    before = routed_calls()  # this process's count (other tests may have routed calls)
    passed_before = passed_calls()
    report = doctor_json()
    assert report["device"].startswith("cpu (cpu-interpreter")
    assert report["vllm_version"].startswith("0.32") and report["vllm_supported"]
    assert report["usable"] == 0 and "absent-user.db (absent)" in report["database"]
    assert report["would_route"]
    # No Triton GPU driver here: vLLM would run its V1 runner.
    assert report["runner"] == "V1 (family rejection_sample)"
    v1, mrv2 = report["self_test"]
    assert (v1["runner"], mrv2["runner"]) == ("V1", "Model Runner V2")
    assert v1["ok"] and mrv2["ok"], report["self_test"]
    assert "spectune's PyTorch reference" in mrv2["detail"]  # vLLM's MRV2 needs a GPU
    assert v1["routed"] == 4 and mrv2["routed"] == 4
    assert report["routed_calls"] - before == 8
    assert report["passed_calls"] == passed_before  # the self-test passed nothing
    text = doctor("--no-self-test")
    assert "plugin would route: yes" in text
    assert "model runner here: V1 (family rejection_sample)" in text
    assert "vLLM: 0.32" in text and "(supported)" in text
    assert ("sampling parameters folded into verification at vllm.v1.sample."
            "rejection_sampler.apply_sampling_constraints (rejection_sample_folded)"
            ) in " ".join(report["reasons"])
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")
    assert "model runner here: Model Runner V2 (family rejection_sample_mrv2)" in doctor(
        "--no-self-test"
    )
    mrv2_reasons = " ".join(doctor_json("--no-self-test")["reasons"])
    assert "RejectionSampler._verify (rejection_sample_mrv2_folded)" in mrv2_reasons
    monkeypatch.setenv("SPECTUNE_FOLD", "0")
    assert "sampling parameters applied before verification (SPECTUNE_FOLD=0)" in " ".join(
        doctor_json("--no-self-test")["reasons"])


def test_doctor_says_why_not(monkeypatch: pytest.MonkeyPatch) -> None:
    text = doctor()  # no tuned configs, no SPECTUNE_FORCE
    assert "plugin would route: no" in text
    assert "no tuned configs usable here (SPECTUNE_FORCE=1 routes with defaults)" in text
    assert "self-test" not in text
    monkeypatch.setenv("SPECTUNE_DISABLE", "1")
    monkeypatch.setenv("SPECTUNE_FORCE", "1")
    report = doctor_json()
    assert not report["would_route"]
    assert "SPECTUNE_DISABLE=1: the plugin does nothing" in report["reasons"]
    assert report["self_test"] is None
