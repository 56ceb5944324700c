"""Benchmark: every kernel family against the importable vLLM's own function (issue 48).

For each registered family and each shape of the grid (B in {1, 8, 64}, k in {1, 2, 4, 8},
V in {32000, 128256, 151936} by default), the config that would serve the shape (a tuned
row of ``--db`` or the default sources, else the family's default) is measured beside the
function it replaces in the vLLM that ``import vllm`` finds, on the same inputs:
:func:`spectune.tuning.compare_with_vllm` checks the tokens and decides by the promotion
rule, timed with :func:`spectune.tuning.trial.gpu_time` on a GPU (wall time under the
interpreter, where the figures only prove the script runs). A family with no vLLM
function yet gets one row, "not measured", with the reason.

Prints a table and writes ``--json``. ``--max-seconds`` bounds the run: shapes not
started in time are listed as skipped. ``--quick``: one tiny shape per family (the CPU
rehearsal of ``scripts/gpu_check.sh``, see ``scripts/prepare_gpu_check.py``).

Usage:
    python scripts/bench_vs_vllm.py [--quick] [--families NAME ...] [--batch 1 8 64]
        [--k 1 2 4 8] [--vocab 32000 128256 151936] [--db PATH] [--max-seconds S]
        [--json OUT]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from spectune.identity import (  # noqa: E402
    CPU_BACKEND,
    detect_device,
    detect_software,
    torch_device,
)
from spectune.kernels import FAMILIES, get_family  # noqa: E402
from spectune.messages import one_line  # noqa: E402
from spectune.space import Problem  # noqa: E402

QUICK_SHAPE = (2, 2, 64)  # (B, k, V): seconds per family under the interpreter


def vllm_description() -> dict[str, Any]:
    """Which vLLM this process compares with: version, where from, its platform and
    whether it found a usable Triton (a failure to import is reported, not raised)."""
    try:
        import vllm
        from vllm.platforms import current_platform
        from vllm.triton_utils import HAS_TRITON
        from vllm.version import __version__
    except Exception as exc:  # an incomplete tree says why here, in one line
        return {"version": None, "error": f"{type(exc).__name__}: {one_line(exc)}"}
    return {"version": str(__version__), "path": str(Path(vllm.__file__).parent),
            "platform": type(current_platform).__name__, "has_triton": bool(HAS_TRITON)}


def serving_config(family: Any, problem: Problem, *, index: Any, device: Any,
                   software: Any) -> tuple[dict[str, int], str]:
    """The config that serves ``problem``: a tuned row's, else the family's default."""
    tuned = None if index is None else index.lookup(device=device, software=software,
                                                     kernel=family.name, problem=problem)
    if tuned is not None:
        return tuned, "tuned"
    return family.default_config(problem, device.backend), "default"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help=f"one tiny shape (B, k, V) = {QUICK_SHAPE} per family")
    parser.add_argument("--families", nargs="+", default=None, metavar="NAME")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--k", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--vocab", type=int, nargs="+", default=[32000, 128256, 151936])
    parser.add_argument("--db", default=None,
                        help="a database whose tuned rows serve (SPECTUNE_DB); default: "
                             "the default sources")
    parser.add_argument("--max-seconds", type=float, default=None)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    started = time.monotonic()

    if args.db is not None:
        os.environ["SPECTUNE_DB"] = args.db
    names = list(args.families or FAMILIES)
    unknown = sorted(set(names) - set(FAMILIES))
    if unknown:
        parser.error(f"unknown families {unknown}; known: {list(FAMILIES)}")
    shapes = ([QUICK_SHAPE] if args.quick
              else list(itertools.product(args.batch, args.k, args.vocab)))

    from spectune.db import load_index
    from spectune.tuning import compare_with_vllm
    from spectune.tuning.trial import gpu_time, wall_time
    from spectune.vllm import IncumbentUnavailable, vllm_incumbent

    device, software = detect_device(), detect_software()
    on_cpu = device.backend == CPU_BACKEND
    tensors = torch_device(device.backend)
    timer = (lambda fn: wall_time(fn, repeats=2)) if on_cpu else gpu_time
    index = load_index(device=device, software=software,
                       kernel_hashes={name: get_family(name).source_hash for name in names})
    vllm = vllm_description()
    print(f"device: {device.device_name} ({device.backend}); vLLM: {vllm}", flush=True)

    rows: list[dict[str, Any]] = []
    unavailable: set[str] = set()  # families without a vLLM function: one row says why
    # Shape after shape, every family at each: a spent budget leaves shapes out, not
    # families.
    for (batch, k, vocab), name in itertools.product(shapes, names):
        if name in unavailable:
            continue
        family = get_family(name)
        row: dict[str, Any] = {"family": name, "batch": batch, "k": k, "vocab": vocab}
        rows.append(row)
        if args.max_seconds is not None and time.monotonic() - started > args.max_seconds:
            row.update(verdict="skipped", reason="time budget spent")
            continue
        problem = Problem(spec_len=k, batch=batch, vocab=vocab)
        try:
            inputs = family.make_inputs(problem, seed=0, device=tensors)
            try:
                vllm_incumbent(name, inputs)
            except IncumbentUnavailable as exc:
                if "cannot run here" not in str(exc):  # none for the family at all
                    unavailable.add(name)
                    row.update(batch=None, k=None, vocab=None)
                row.update(verdict="not measured", reason=one_line(exc))
                print(format_row(row), flush=True)
                continue
            config, source = serving_config(family, problem, index=index, device=device,
                                            software=software)
            measured = compare_with_vllm(family=family, inputs=inputs, config=config,
                                         timer=timer)
        except Exception as exc:  # one shape failing must not end the whole table
            row.update(verdict="error", reason=f"{type(exc).__name__}: {one_line(exc)}")
            print(format_row(row), flush=True)
            continue
        comparison = measured.comparison
        ours = None if measured.ours is None else measured.ours.p50
        theirs = comparison.p50_us
        row.update(config=config, config_source=source, ours_p50_us=ours,
                   vllm_p50_us=theirs, verdict=comparison.verdict, reason=comparison.reason,
                   speedup=(theirs / ours) if ours and theirs else None)
        print(format_row(row), flush=True)
    rows.sort(key=lambda row: names.index(row["family"]))

    print()
    print(table(rows))
    measured_families = sorted({row["family"] for row in rows
                                if row["verdict"] in ("faster", "not faster")})
    print(f"\n{len(measured_families)} of {len(names)} families measured against vLLM "
          f"{vllm.get('version')}; {time.monotonic() - started:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"device": device.device_name, "backend": device.backend, "vllm": vllm,
             "shapes": shapes, "rows": rows}, indent=1, default=str) + "\n")


def _number(value: Any, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def format_row(row: dict[str, Any]) -> str:
    shape = ("-" if row.get("batch") is None
             else f"B={row['batch']} k={row['k']} V={row['vocab']}")
    verdict = row["verdict"]
    if row.get("reason"):
        verdict += f": {row['reason']}"
    return (f"{row['family']:<30} {shape:<24} {row.get('config_source', '-'):<8} "
            f"{_number(row.get('ours_p50_us')):>10} {_number(row.get('vllm_p50_us')):>10} "
            f"{_number(row.get('speedup'), 2):>8}  {verdict}")


def table(rows: list[dict[str, Any]]) -> str:
    header = (f"{'family':<30} {'shape':<24} {'config':<8} {'ours µs':>10} {'vLLM µs':>10} "
              f"{'speedup':>8}  verdict")
    return "\n".join([header, "-" * len(header), *(format_row(row) for row in rows)])


if __name__ == "__main__":
    main()
