"""The vs-vLLM part of ``scripts/gpu_check.sh``, rehearsed on CPU before a lent GPU's
minutes are spent on it (issue 48).

``scripts/prepare_gpu_check.py`` builds the folder a device call carries (a vLLM
release's needed sources, the wheels of what they import that the machine lacks), then
``--rehearse`` runs ``scripts/gpu_check_vs_vllm.sh`` as the device would, under the
interpreter: a Python without its site-packages (no vLLM), given only the packages the
machine holds and the carried wheels. One release (0.33.0: the tree CI unpacks anyway),
wheels for this interpreter's Python (the device's are 3.12's, the same packages).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.timeout(300)
def test_rehearsal_compares_every_family_from_the_carried_folder_alone(tmp_path: Path) -> None:
    from spectune.kernels import FAMILIES

    check, results = tmp_path / "gpu-check", tmp_path / "out"
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    env = {**os.environ, "TRITON_INTERPRET": "1",
           "SPECTUNE_USER_DB": str(tmp_path / "user.db")}  # never the user's own database
    done = subprocess.run(
        [sys.executable, "scripts/prepare_gpu_check.py", "--versions", "0.33.0",
         "--python-version", python, "--out", str(check), "--rehearse", str(results)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    manifest = json.loads((check / "manifest.json").read_text())
    assert manifest["versions"] == ["0.33.0"] and manifest["wheels"]
    assert not list(check.rglob("*.so"))

    log = (results / "vs-vllm-0.33.0.log").read_text()
    report = json.loads((results / "vs-vllm-0.33.0.json").read_text())
    # The carried tree, not an installed vLLM, answered.
    assert report["vllm"]["version"] == "0.33.0"
    assert Path(report["vllm"]["path"]).resolve() == (check / "vllm-0.33.0" / "vllm").resolve()
    assert "not loaded" not in log  # the tuned-config reader imports there too
    rows = {row["family"]: row for row in report["rows"]}
    assert set(rows) == set(FAMILIES)
    for name in FAMILIES:
        assert f"\n{name} " in log
    measured = {name for name, row in rows.items() if row["verdict"] in ("faster", "not faster")}
    # Every family but the fused sampler, which no router serves in vLLM's place.
    assert measured == {"rejection_sample", "rejection_sample_mrv2", "gumbel_sample",
                        "temperature", "min_p", "top_k_top_p", "rejection_sample_folded",
                        "rejection_sample_mrv2_folded"}, rows
    assert all(rows[name]["reason"] for name in set(FAMILIES) - measured)
