"""Benchmark: spectune's MRV2 verification against vLLM 0.32's Model Runner V2 kernels.

Times, side by side in one run and on the same inputs, vLLM's own MRV2
``rejection_sample`` (``vllm/v1/worker/gpu/spec_decode/rejection_sampler_utils.py``, its
fixed launch parameters) and ``spectune.kernels.rejection_sample_mrv2`` with its default
config (or ``--config``), for B in {1, 8, 64}, k in {1, 2, 4, 8}, V in {32000, 128256,
151936}, all-greedy and all-random batches, with draft logits (a model drafter) and
without (ngram). Prints p50 latency, the speedup (vLLM / ours), and checks the tokens:
equal for greedy batches; for random ones equal but where the PyTorch reference flags a
near-tie. On a GPU it also prints the peak device memory of one call of each (MiB
allocated at the peak beyond what was allocated before the call); on CPU there is none
(``null`` in the JSON).

Needs vLLM importable (``pip install vllm``); on a GPU vLLM's kernels run natively. On CPU
(``--quick``, tiny shapes, ``TRITON_INTERPRET=1``) vLLM's kernels are loaded bound to the
real Triton (tests/kernels/vllm_mrv2.py) only to prove the script works: its figures
mean nothing.

Usage:
    python scripts/bench_verify_mrv2.py [--quick] [--dtype bfloat16]
                                        [--config '{"BLOCK_V": 4096, ...}'] [--json OUT]
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT))

from bench_verify import copy_bandwidth, timeit  # noqa: E402

from spectune.identity import CPU_BACKEND, detect_device, torch_device  # noqa: E402
from spectune.kernels import get_family, rejection_sample_mrv2  # noqa: E402
from spectune.kernels.rejection_mrv2 import (  # noqa: E402
    mrv2_results_agree,
    rejection_sample_mrv2_reference,
)
from spectune.space import DTYPES, Problem  # noqa: E402
from spectune.tuning import peak_memory_mib  # noqa: E402

FULL = {"batch": (1, 8, 64), "k": (1, 2, 4, 8), "vocab": (32000, 128256, 151936)}
QUICK = {"batch": (1, 2), "k": (1, 2), "vocab": (1000,)}


def vllm_mrv2(gpu: bool) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """vLLM's MRV2 ``rejection_sample``: imported on a GPU, interpreter-bound on CPU."""
    if gpu:
        from vllm.v1.worker.gpu.spec_decode.rejection_sampler_utils import rejection_sample

        return rejection_sample
    from tests.kernels.vllm_mrv2 import load_vllm_mrv2

    return load_vllm_mrv2().rejection_sample


def emitted(result: tuple[torch.Tensor, torch.Tensor]) -> list[list[int]]:
    """Each request's sampled tokens (entries past its count are not part of the result)."""
    sampled, counts = (t.cpu() for t in result)
    return [sampled[i, : int(n)].tolist() for i, n in enumerate(counts)]


def check_tokens(
    theirs: tuple[torch.Tensor, torch.Tensor], ours: tuple[torch.Tensor, torch.Tensor],
    args: tuple[object, ...], *, greedy: bool,
) -> int:
    """Ours must emit vLLM's tokens; a random batch may differ only at a near-tie that
    the PyTorch reference flags (computed only then: it is slow at real sizes). Returns
    how many requests differ."""
    mine, vllm = emitted(ours), emitted(theirs)
    if mine == vllm:
        return 0
    assert not greedy, "greedy tokens differ from vLLM's"
    expected = rejection_sample_mrv2_reference(*args)
    for name, result in (("vllm", theirs), ("ours", ours)):
        ok, why = mrv2_results_agree(expected, result)
        assert ok, (name, why)
    return sum(a != b for a, b in zip(mine, vllm, strict=True))


def measure(
    mode: str, drafter: str, batch: int, k: int, vocab: int, *, dtype: str,
    given: dict | None, device: torch.device, backend: str, bandwidth: float, gpu: bool,
    theirs: Callable[..., tuple[torch.Tensor, torch.Tensor]],
) -> dict[str, object]:
    """Time vLLM's and ours on one shape; check the tokens."""
    family = get_family("rejection_sample_mrv2")
    problem = Problem(spec_len=k, batch=batch, vocab=vocab, dtype=dtype,
                      draft_probs=drafter == "model")
    inputs = family.make_inputs(problem, seed=0, device=device)
    if mode == "greedy":
        inputs.temperature.zero_()
    args = inputs.args()
    config = family.default_config(problem, backend)

    def baseline() -> tuple[torch.Tensor, torch.Tensor]:
        return theirs(*args[:11], use_fp64=False)

    def ours(cfg: dict) -> tuple[torch.Tensor, torch.Tensor]:
        return rejection_sample_mrv2(*args, config=cfg, validate=False)

    near_ties = check_tokens(baseline(), ours(config), args, greedy=mode == "greedy")
    t_vllm = timeit(baseline, gpu=gpu)
    t_ours = timeit(lambda: ours(config), gpu=gpu)
    t_given = timeit(lambda: ours(given), gpu=gpu) if given else None
    # Memory beside time (None off a GPU): one call each, after the timed ones.
    m_vllm = peak_memory_mib(baseline, device=device)
    m_ours = peak_memory_mib(lambda: ours(config), device=device)
    rows = batch * (k + 1)
    floor_bytes = rows * vocab * inputs.target_logits.element_size()
    if drafter == "model" and mode == "random":
        floor_bytes += batch * k * vocab * inputs.target_logits.element_size()
    floor_us = 2 * floor_bytes / bandwidth * 1e6  # the copy bandwidth counts read + write
    return {
        "mode": mode, "drafter": drafter, "batch": batch, "k": k, "vocab": vocab,
        "dtype": dtype, "config": config, "vllm_us": t_vllm, "ours_us": t_ours,
        "given_us": t_given, "given_config": given, "speedup": t_vllm[1] / t_ours[1],
        "floor_us": floor_us, "floor_fraction": floor_us / t_ours[1],
        "differing_at_near_ties": near_ties,
        "vllm_peak_mib": m_vllm, "ours_peak_mib": m_ours,
    }


def run(args: argparse.Namespace) -> list[dict[str, object]]:
    identity = detect_device()
    gpu = identity.backend != CPU_BACKEND
    device = torch.device(torch_device(identity.backend))
    grid = QUICK if args.quick else FULL
    theirs = vllm_mrv2(gpu)
    bandwidth = copy_bandwidth(device, gpu=gpu)
    given = json.loads(args.config) if args.config else None
    print(f"# device: {identity.describe()}; copy bandwidth {bandwidth / 1e9:.1f} GB/s")
    print(f"{'mode':7} {'drafter':7} {'B':>3} {'k':>2} {'V':>7} {'vllm us':>9} "
          f"{'ours us':>9} {'speedup':>7} {'floor %':>7}"
          + (f" {'vllm MiB':>9} {'ours MiB':>9}" if gpu else "")  # peak memory: GPUs only
          + (f" {'given us':>9}" if given else ""))
    records = []
    for mode, drafter, batch, k, vocab in itertools.product(
        ("greedy", "random"), ("ngram", "model"), grid["batch"], grid["k"], grid["vocab"]
    ):
        rec = measure(mode, drafter, batch, k, vocab, dtype=args.dtype, given=given,
                      device=device, backend=identity.backend, bandwidth=bandwidth, gpu=gpu,
                      theirs=theirs)
        records.append(rec)
        line = (f"{mode:7} {drafter:7} {batch:>3} {k:>2} {vocab:>7} {rec['vllm_us'][1]:>9.1f} "
                f"{rec['ours_us'][1]:>9.1f} {rec['speedup']:>6.2f}x "
                f"{100 * rec['floor_fraction']:>6.1f}%")
        if gpu:
            line += f" {rec['vllm_peak_mib']:>9.2f} {rec['ours_peak_mib']:>9.2f}"
        if given:
            line += f" {rec['given_us'][1]:>9.1f}"
        print(line, flush=True)
    speedups = [r["speedup"] for r in records]
    print(f"# geometric-mean speedup over {len(records)} shapes: "
          f"{statistics.geometric_mean(speedups):.2f}x (min {min(speedups):.2f}x, "
          f"max {max(speedups):.2f}x)")
    return [{"device": identity.as_dict(), "copy_bandwidth_Bps": bandwidth, **r}
            for r in records]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny shapes (CPU smoke run)")
    parser.add_argument("--dtype", default="bfloat16", choices=DTYPES)
    parser.add_argument("--config", help="a launch config (JSON) to time beside the default")
    parser.add_argument("--json", type=Path, help="write the records here")
    args = parser.parse_args()
    records = run(args)
    if args.json:
        args.json.write_text(json.dumps(records, indent=1))


if __name__ == "__main__":
    main()
