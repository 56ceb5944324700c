"""What a proposal of ``auto`` costs as a study grows.

    python benchmarks/bench_proposal_cost.py ../shared/tuning-spaces/convolution_A100_T4.json.gz \
        --repeats 5 --budget 200
    python benchmarks/bench_proposal_cost.py ../shared/tuning-spaces/dedispersion_A100_T4.json.gz \
        --repeats 2 --budget 800

Replays ``auto`` on a recorded space (exact answers, so every evaluation is free) and
times each step from one evaluation to the next: the study read, the proposal (the GP's
fit and acquisition) and Optuna's bookkeeping. Seeds 0 to ``--repeats`` - 1 run one
after the other in this process; the thread count is left to BLAS (no
``OPENBLAS_NUM_THREADS``), as in ``spectune sweep``. Prints the mean milliseconds per
evaluation over evaluations 2-100, 101-200, 201-400 and so on to ``--budget``, and the
slowest one (a hyperparameter refit, mostly). The goal is 50 ms per proposal.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import optuna

from spectune.search import SpaceIndex
from spectune.search.replay import RecordedSpace, engine_run, load_t4


def step_times(space: RecordedSpace, index: SpaceIndex, *, repeats: int,
               budget: int) -> np.ndarray:
    """Seconds from each evaluation to the next, per seed (column 0 unused)."""
    out = np.zeros((repeats, budget))
    stamps: list[float] = []

    def stamp(_fraction: float) -> None:
        stamps.append(time.perf_counter())

    for seed in range(repeats):
        stamps.clear()
        engine_run(space, budget=budget, sampler="auto", seed=seed, index=index,
                   on_evaluation=stamp)
        out[seed, 1:] = np.diff(stamps)
    return out


def windows(budget: int) -> list[tuple[int, int]]:
    """Evaluation ranges the table reports: 2-100, then doubling (101-200, 201-400, ...),
    the last one ending at ``budget``."""
    out, lo, hi = [(2, 100)], 101, 200
    while lo <= budget:
        out.append((lo, min(hi, budget)))
        lo, hi = hi + 1, 2 * hi
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file", type=Path)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--budget", type=int, default=200)
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    if args.budget < 101:
        parser.error("--budget must be at least 101")
    space = load_t4(args.file)
    index = SpaceIndex(space.space)
    spans = windows(args.budget)
    steps = step_times(space, index, repeats=args.repeats, budget=args.budget)
    # steps[:, i] is the step that ends at evaluation i + 1
    means = [steps[:, lo - 1:hi].mean() * 1e3 for lo, hi in spans]
    print("| space | seeds | " + " | ".join(f"ms/eval {lo}-{hi}" for lo, hi in spans)
          + " | slowest ms |")
    print("|---" * (len(spans) + 3) + "|")
    print(f"| {space.name} | {args.repeats} | " + " | ".join(f"{m:.1f}" for m in means)
          + f" | {steps.max() * 1e3:.0f} |")


if __name__ == "__main__":
    main()
