"""Benchmark: spectune's sampling kernels against vLLM 0.32's, side by side in one run.

On the same inputs, for B in {1, 8, 64, 256} rows and V in {32000, 128256, 151936}:

* ``top_k_top_p``: vLLM's Triton ``apply_top_k_top_p_triton`` (its fixed tiles) vs
  ``spectune.kernels.top_k_top_p`` (rows with top-k 50 and top-p 0.9 mixed with top-p
  only), both masking a fresh copy of the logits each call;
* ``temperature``, ``min_p``, ``gumbel``: Model Runner V2's kernels vs spectune's;
* ``chain`` vs ``fused``: MRV2's sampling step as vLLM runs it (fp32 copy, temperature,
  min-p, top-k/top-p, Gumbel-max) vs ``spectune.kernels.sample`` (one kernel, nothing
  written but the tokens).

Prints p50 latency and the speedup (vLLM / ours), and checks the results on every shape
(masks and tokens equal but where the references flag ambiguity or a near-tie; vLLM's
Triton top-k/top-p approximates the sort-based definition and its differences are
counted, not failed). Default configs, or ``--config`` for one family.

Needs vLLM importable. On a GPU vLLM's kernels run natively. On CPU (``--quick``, tiny
shapes, ``TRITON_INTERPRET=1``) vLLM's kernels are loaded bound to the real Triton
(tests/kernels/vllm_mrv2.py, tests/kernels/sampling/vllm_topk_topp.py) only to prove the
script works: its figures mean nothing.

Usage:
    python benchmarks/bench_sampling.py [--quick] [--json OUT]
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from spectune.identity import CPU_BACKEND, detect_device, torch_device  # noqa: E402
from spectune.kernels import (  # noqa: E402
    apply_min_p,
    apply_temperature,
    gumbel_sample,
    sample,
    top_k_top_p,
)
from spectune.kernels.sampling import (  # noqa: E402
    gumbel_results_agree,
    sample_reference,
    top_k_top_p_reference,
)

FULL = {"batch": (1, 8, 64, 256), "vocab": (32000, 128256, 151936)}
QUICK = {"batch": (1, 4), "vocab": (1000,)}


def vllm_kernels(gpu: bool) -> SimpleNamespace:
    """vLLM's sampling functions: imported on a GPU, interpreter-bound on CPU."""
    if gpu:
        from vllm.v1.sample.ops.topk_topp_triton import apply_top_k_top_p_triton
        from vllm.v1.worker.gpu.sample import gumbel, min_p

        return SimpleNamespace(top_k_top_p=apply_top_k_top_p_triton,
                               temperature=gumbel.apply_temperature,
                               min_p=min_p.apply_min_p, gumbel=gumbel.gumbel_sample)
    from tests.kernels.sampling.vllm_topk_topp import load_vllm_top_k_top_p_triton
    from tests.kernels.vllm_mrv2 import load_vllm_mrv2

    mrv2 = load_vllm_mrv2()
    return SimpleNamespace(top_k_top_p=load_vllm_top_k_top_p_triton(),
                           temperature=mrv2.gumbel.apply_temperature,
                           min_p=mrv2.min_p.apply_min_p, gumbel=mrv2.gumbel.gumbel_sample)


def timeit(fn: Callable[[], object], *, gpu: bool) -> float:
    """p50 in microseconds."""
    if gpu:
        import triton.testing

        return float(triton.testing.do_bench(fn, quantiles=[0.5], warmup=25, rep=100)) * 1e3
    fn()
    samples = []
    for _ in range(3):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1e6)
    return statistics.median(samples)


def make_inputs(batch: int, vocab: int, device: torch.device) -> dict[str, torch.Tensor]:
    """Peaked float32 logits; request states with common settings, one per row."""
    gen = torch.Generator().manual_seed(batch * 7 + vocab)
    logits = torch.randn(batch, vocab, generator=gen) * 2
    logits[torch.arange(batch), torch.randint(0, vocab, (batch,), generator=gen)] += 8
    states = batch
    temps = torch.tensor([0.8, 0.6, 1.0, 1.2])[torch.arange(states) % 4]
    return {
        "logits": logits.to(device),
        "mapping": torch.arange(batch, dtype=torch.int32, device=device),
        "temperature": temps.to(device),
        "min_p": torch.tensor([0.05, 0.0, 0.1, 0.0])[torch.arange(states) % 4].to(device),
        "top_k": torch.tensor([50, vocab, 20, vocab], dtype=torch.int32)[
            torch.arange(states) % 4].to(device),
        "top_p": torch.tensor([0.9, 0.95, 1.0, 0.8])[torch.arange(states) % 4].to(device),
        "seed": torch.randint(0, 2**62, (states,), generator=gen).to(device),
        "pos": torch.randint(0, 2**20, (batch,), generator=gen).to(device),
    }


def measure(batch: int, vocab: int, *, theirs: SimpleNamespace, device: torch.device,
            gpu: bool) -> list[dict[str, Any]]:
    x = make_inputs(batch, vocab, device)
    logits, mapping = x["logits"], x["mapping"]
    k = x["top_k"][mapping.long()]
    p = x["top_p"][mapping.long()]
    records = []

    def record(name: str, vllm_fn: Callable[[], object], ours_fn: Callable[[], object],
               check: str) -> None:
        t_vllm, t_ours = timeit(vllm_fn, gpu=gpu), timeit(ours_fn, gpu=gpu)
        records.append({"kernel": name, "batch": batch, "vocab": vocab, "vllm_us": t_vllm,
                        "ours_us": t_ours, "speedup": t_vllm / t_ours, "check": check})

    # top-k/top-p: ours must equal the definition; vLLM's approximation is counted.
    ref = top_k_top_p_reference(logits, k, p)
    ours_mask = top_k_top_p(logits.clone(), k, p).cpu()
    their_mask = theirs.top_k_top_p(logits.clone(), k, p).cpu()
    assert bool(((ours_mask == ref.logits) | ref.ambiguous).all()), "top_k_top_p off the reference"
    off = int(((their_mask != ref.logits) & ~ref.ambiguous).sum())
    record("top_k_top_p", lambda: theirs.top_k_top_p(logits.clone(), k, p),
           lambda: top_k_top_p(logits.clone(), k, p, validate=False),
           f"vLLM off the definition at {off} tokens")

    a, b = logits.clone(), logits.clone()
    theirs.temperature(a, mapping, x["temperature"])
    apply_temperature(b, mapping, x["temperature"])
    assert torch.equal(a, b), "temperature differs from vLLM's"
    record("temperature", lambda: theirs.temperature(a, mapping, x["temperature"]),
           lambda: apply_temperature(b, mapping, x["temperature"], validate=False), "equal")

    a, b = logits.clone(), logits.clone()
    theirs.min_p(a, mapping, x["min_p"])
    apply_min_p(b, mapping, x["min_p"])
    assert torch.equal(a, b), "min_p differs from vLLM's"
    record("min_p", lambda: theirs.min_p(a, mapping, x["min_p"]),
           lambda: apply_min_p(b, mapping, x["min_p"], validate=False), "equal")

    args = (logits, mapping, x["temperature"], x["seed"], x["pos"], True, False)
    assert torch.equal(theirs.gumbel(*args), gumbel_sample(*args)), "gumbel differs"
    record("gumbel", lambda: theirs.gumbel(*args),
           lambda: gumbel_sample(*args, validate=False), "equal")

    def chain() -> torch.Tensor:
        y = logits.float().clone()
        theirs.temperature(y, mapping, x["temperature"])
        theirs.min_p(y, mapping, x["min_p"])
        y = theirs.top_k_top_p(y, k, p)
        return theirs.gumbel(y, mapping, x["temperature"], x["seed"], x["pos"], False, False)

    fused_args = (logits, mapping, x["temperature"], x["min_p"], x["top_k"], x["top_p"],
                  x["seed"], x["pos"])
    tokens, their_tokens = sample(*fused_args), chain()
    expected = sample_reference(*fused_args)
    assert gumbel_results_agree(expected, tokens)[0], "fused sampler off the reference"
    differ = int((tokens.cpu() != their_tokens.cpu()).sum())
    record("chain vs fused", chain, lambda: sample(*fused_args, validate=False),
           f"{differ} of {batch} tokens differ from vLLM's chain (near-ties: "
           f"{int(expected.near_tie.sum())})")
    return records


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    identity = detect_device()
    gpu = identity.backend != CPU_BACKEND
    device = torch.device(torch_device(identity.backend))
    grid = QUICK if args.quick else FULL
    theirs = vllm_kernels(gpu)
    print(f"# device: {identity.describe()}")
    print(f"{'kernel':15} {'B':>4} {'V':>7} {'vllm us':>10} {'ours us':>10} {'speedup':>8}  check")
    records = []
    for batch, vocab in itertools.product(grid["batch"], grid["vocab"]):
        for rec in measure(batch, vocab, theirs=theirs, device=device, gpu=gpu):
            records.append(rec)
            print(f"{rec['kernel']:15} {batch:>4} {vocab:>7} {rec['vllm_us']:>10.1f} "
                  f"{rec['ours_us']:>10.1f} {rec['speedup']:>7.2f}x  {rec['check']}",
                  flush=True)
    for name in dict.fromkeys(r["kernel"] for r in records):
        speedups = [r["speedup"] for r in records if r["kernel"] == name]
        print(f"# {name}: geometric-mean speedup {statistics.geometric_mean(speedups):.2f}x "
              f"over {len(speedups)} shapes (min {min(speedups):.2f}x, max {max(speedups):.2f}x)")
    return [{"device": identity.as_dict(), **r} for r in records]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny shapes (CPU smoke run)")
    parser.add_argument("--json", type=Path, help="write the records here")
    args = parser.parse_args()
    records = run(args)
    if args.json:
        args.json.write_text(json.dumps(records, indent=1))


if __name__ == "__main__":
    main()
