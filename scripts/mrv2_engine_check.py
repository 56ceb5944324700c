"""A GPU check: a vLLM engine (Model Runner V2, ngram speculation) with and without spectune.

Builds the tests' tiny random-weight Llama, then runs the same prompts through two
engines, each in its own process (tests/vllm/_engine_run.py): one with
``SPECTUNE_DISABLE=1`` (vLLM's own MRV2 kernels), one with ``SPECTUNE_FORCE=1`` (routed to
spectune's ``rejection_sample_mrv2``, default configs). Greedy tokens must be identical
and the worker must report routed calls. Seeded sampling at temperature 0.8 is compared
too: MRV2's random numbers are functions of (seed, position), so the tokens should match
but where float rounding decides a near-tie; differing requests are reported, not
failed.

Needs a GPU and vLLM importable (vLLM uses Model Runner V2 wherever Triton runs).

Usage:
    python scripts/mrv2_engine_check.py [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.vllm._engine_run import build_model  # noqa: E402


def run_engines(model: Path) -> list[dict]:
    runs = [
        {"name": name, "model": str(model), "spec": True, "env": env, "greedy": True,
         "sampled_reps": 1, "worker_rpc": True}
        for name, env in (
            ("vllm", {"SPECTUNE_DISABLE": "1", "VLLM_USE_V2_MODEL_RUNNER": "1"}),
            ("spectune", {"SPECTUNE_FORCE": "1", "VLLM_USE_V2_MODEL_RUNNER": "1"}),
        )
    ]
    results = []
    for run in runs:  # one engine per process (see tests/vllm/_engine_run.py)
        done = subprocess.run(
            [sys.executable, "-m", "tests.vllm._engine_run", json.dumps([run])],
            cwd=ROOT, capture_output=True, text=True, timeout=900, check=False,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
        if done.returncode != 0 or not lines:
            raise SystemExit(f"engine {run['name']} failed:\n{done.stderr[-4000:]}")
        results.extend(json.loads(lines[-1].removeprefix("RESULT ")))
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="write the summary here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = build_model(Path(tmp) / "tiny-llama")
        vllm, ours = run_engines(model)
    worker_routed = sum(w["routed_calls"] for w in ours.get("worker", []))
    summary = {
        "greedy_identical": vllm["greedy"] == ours["greedy"],
        "greedy_acceptance": {r["name"]: r["greedy_counters"] for r in (vllm, ours)},
        "sampled_requests_differing": sum(
            a != b for a, b in zip(vllm["sampled"][0], ours["sampled"][0], strict=True)
        ),
        "worker_routed_calls": worker_routed,
        "vllm_worker_routed_calls": sum(w["routed_calls"] for w in vllm.get("worker", [])),
    }
    print(json.dumps(summary, indent=1))
    if args.json:
        args.json.write_text(json.dumps({"summary": summary, "runs": [vllm, ours]}, indent=1))
    return 0 if summary["greedy_identical"] and worker_routed > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
