"""Benchmark: spectune's fused verification against vLLM 0.32's unfused launch sequence.

Times, side by side in one run, for B in {1, 8, 64}, k in {1, 2, 4, 8} and V in
{32000, 128256, 151936}, greedy and random (draft probs) verification:

* ``vllm``: the unfused sequence (scripts/_vllm_sequence.py), random draws included;
* ``ours``: the same torch-made draws, then spectune's kernels with the default config
  (or ``--config``);
* ``ours-fused-rng``: spectune drawing its own random numbers in-kernel (``seeds``).

Prints p50 latency, the speedup (vllm / ours) and the fraction of the HBM floor: the
time to read the logits (and draft probs and inv_q where used) once at the copy
bandwidth measured in the same run. On a GPU it also prints the peak device memory of one
call of each (MiB allocated at the peak beyond what was allocated before the call:
outputs, scratch, and for ``ours`` the torch-made draws); on CPU there is none (``null``
in the JSON). On CPU it runs under TRITON_INTERPRET=1 on tiny
shapes (``--quick``) only to prove it works; its figures mean nothing.

Usage:
    python scripts/bench_verify.py [--quick] [--config '{"BLOCK_V": 4096, ...}']
                                   [--json OUT.json]
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

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _vllm_sequence import vllm_sequence

from spectune.identity import CPU_BACKEND, detect_device, torch_device
from spectune.kernels import get_family, rejection_sample
from spectune.space import DTYPES, Problem
from spectune.tuning import peak_memory_mib

FULL = {"batch": (1, 8, 64), "k": (1, 2, 4, 8), "vocab": (32000, 128256, 151936)}
QUICK = {"batch": (1, 2), "k": (1, 2), "vocab": (1000,)}


def timeit(fn: Callable[[], object], *, gpu: bool) -> tuple[float, float, float]:
    """p20, p50, p80 in microseconds."""
    if gpu:
        import triton.testing

        q = triton.testing.do_bench(fn, quantiles=[0.2, 0.5, 0.8], warmup=25, rep=100)
        return tuple(v * 1e3 for v in q)  # type: ignore[return-value]
    fn()
    samples = []
    for _ in range(3):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1e6)
    samples.sort()
    return samples[0], statistics.median(samples), samples[-1]


def copy_bandwidth(device: torch.device, *, gpu: bool) -> float:
    """Device-to-device copy bandwidth in bytes/s (read + write), measured now."""
    n = (512 << 20) // 4 if gpu else (16 << 20) // 4
    src = torch.empty(n, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    _, p50, _ = timeit(lambda: dst.copy_(src), gpu=gpu)
    return 2 * src.numel() * 4 / (p50 * 1e-6)


def measure(
    mode: str, batch: int, k: int, vocab: int, *, dtype: str, given: dict | None,
    device: torch.device, backend: str, bandwidth: float, gpu: bool,
) -> dict[str, object]:
    """Time the three variants on one shape."""
    family = get_family("rejection_sample")
    problem = Problem(spec_len=k, batch=batch, vocab=vocab, dtype=dtype,
                      draft_probs=mode == "random")
    inputs = family.make_inputs(problem, seed=0, device=device)
    draft, cu, logits, bonus = inputs.args()
    is_greedy = None if mode == "greedy" else inputs.is_greedy
    dp = inputs.draft_probs
    config = family.default_config(problem, backend)
    seeds = torch.arange(batch, dtype=torch.int64, device=device)

    def baseline() -> torch.Tensor:
        return vllm_sequence(draft, cu, logits, bonus, max_spec_len=k, draft_probs=dp,
                             is_greedy=is_greedy)

    def ours(cfg: dict | None) -> torch.Tensor:
        extra = {}
        if is_greedy is not None:
            # The draws vLLM makes, made the same way (what the plugin does by default).
            extra["uniform_probs"] = torch.rand(draft.shape[0], dtype=torch.float64,
                                                device=device)
            extra["inv_q"] = torch.empty(batch, vocab, device=device).exponential_().reciprocal()
        return rejection_sample(draft, cu, logits, bonus, max_spec_len=k, draft_probs=dp,
                                is_greedy=is_greedy, config=cfg, validate=False, **extra)

    def fused_rng() -> torch.Tensor:
        return rejection_sample(draft, cu, logits, bonus, max_spec_len=k, draft_probs=dp,
                                is_greedy=is_greedy, config=config, validate=False,
                                seeds=None if is_greedy is None else seeds)

    if mode == "greedy":
        # Same semantics and no randomness: the tokens must be identical.
        assert torch.equal(baseline(), ours(config)), (mode, batch, k, vocab)
    t_vllm = timeit(baseline, gpu=gpu)
    t_ours = timeit(lambda: ours(config), gpu=gpu)
    t_fused = timeit(fused_rng, gpu=gpu)
    t_given = timeit(lambda: ours(given), gpu=gpu) if given else None
    # Memory beside time (None off a GPU): one call each, after the timed ones.
    m_vllm = peak_memory_mib(baseline, device=device)
    m_ours = peak_memory_mib(lambda: ours(config), device=device)
    m_fused = peak_memory_mib(fused_rng, device=device)
    floor_bytes = batch * k * vocab * logits.element_size()
    if mode == "random":
        floor_bytes += batch * k * vocab * 4  # draft probs
    # The copy bandwidth counts bytes read plus bytes written.
    floor_us = 2 * floor_bytes / bandwidth * 1e6
    return {
        "mode": mode, "batch": batch, "k": k, "vocab": vocab, "dtype": dtype,
        "config": config, "vllm_us": t_vllm, "ours_us": t_ours, "fused_rng_us": t_fused,
        "given_us": t_given, "given_config": given,
        "speedup": t_vllm[1] / t_ours[1], "speedup_fused_rng": t_vllm[1] / t_fused[1],
        "floor_us": floor_us, "floor_fraction": floor_us / t_ours[1],
        "vllm_peak_mib": m_vllm, "ours_peak_mib": m_ours, "fused_rng_peak_mib": m_fused,
    }


def run(args: argparse.Namespace) -> list[dict[str, object]]:
    identity = detect_device()
    gpu = identity.backend != CPU_BACKEND
    device = torch.device(torch_device(identity.backend))
    grid = QUICK if args.quick else FULL
    bandwidth = copy_bandwidth(device, gpu=gpu)
    given = json.loads(args.config) if args.config else None
    print(f"# device: {identity.describe()}; copy bandwidth {bandwidth / 1e9:.1f} GB/s")
    header = (f"{'mode':7} {'B':>3} {'k':>2} {'V':>7} {'vllm us':>9} {'ours us':>9} "
              f"{'speedup':>7} {'fused-rng us':>12} {'floor %':>7}")
    header += f" {'vllm MiB':>9} {'ours MiB':>9}" if gpu else ""  # peak memory: GPUs only
    print(header + (f" {'given us':>9}" if given else ""))
    records = []
    for mode, batch, k, vocab in itertools.product(
        ("greedy", "random"), grid["batch"], grid["k"], grid["vocab"]
    ):
        rec = measure(mode, batch, k, vocab, dtype=args.dtype, given=given, device=device,
                      backend=identity.backend, bandwidth=bandwidth, gpu=gpu)
        records.append(rec)
        line = (f"{mode:7} {batch:>3} {k:>2} {vocab:>7} {rec['vllm_us'][1]:>9.1f} "
                f"{rec['ours_us'][1]:>9.1f} {rec['speedup']:>6.2f}x "
                f"{rec['fused_rng_us'][1]:>12.1f} {100 * rec['floor_fraction']:>6.1f}%")
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
