"""Where a strategy's first model proposals land, beside random search, on the same seeds.

    python benchmarks/bench_early_picks.py ../shared/tuning-spaces/convolution_MI250X_T4.json.gz \
        --samplers random,auto,gp-ei-ts10 --repeats 500

``--synthetic N --synthetic-start S`` adds the generated spaces of ``bench_replay.py``.

Every strategy starts with the same five random configurations (``n_init``); what
differs at 10 evaluations is evaluations 6-10. For each strategy, over ``--repeats``
seeds (exact answers): the best fraction of the optimum after 10 evaluations (median,
with a 95 % bootstrap interval, and mean); the mean fraction of evaluations 6-10; how
often one of them reaches ``--good`` of the optimum; and how often a seed has at least
one that does. Proposals that are good on average but move together (all five in a good
region, or none) raise the mean and lower the median: the second and third columns
against the last two tell which.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402
import optuna  # noqa: E402

from spectune.search import STRATEGIES, SpaceIndex  # noqa: E402
from spectune.search.replay import RecordedSpace, engine_run, load_t4  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_replay import VARIANTS, synthetic_files  # noqa: E402

BUDGET = 10


def picks(space: RecordedSpace, index: SpaceIndex, sampler: str, *, repeats: int) -> np.ndarray:
    """Fraction of the optimum of each evaluation, per seed (failures 0)."""
    factory = STRATEGIES.get(sampler) or VARIANTS[sampler]
    out = np.zeros((repeats, BUDGET))
    for seed in range(repeats):
        seen: list[float] = []
        engine_run(space, budget=BUDGET, sampler=factory, seed=seed, index=index,
                   on_evaluation=seen.append)
        out[seed] = seen
    return out


def _median_interval(x: np.ndarray, rng: np.random.Generator) -> tuple[float, float]:
    boots = np.median(rng.choice(x, size=(2000, len(x))), axis=1)
    return float(np.quantile(boots, 0.025)), float(np.quantile(boots, 0.975))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", type=Path, nargs="*")
    parser.add_argument("--synthetic", type=int, default=0)
    parser.add_argument("--synthetic-start", type=int, default=0)
    parser.add_argument("--samplers", default="random,auto")
    parser.add_argument("--repeats", type=int, default=500)
    parser.add_argument("--good", type=float, default=0.3)
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    tmp = tempfile.TemporaryDirectory()
    files = [*args.files, *synthetic_files(Path(tmp.name), count=args.synthetic,
                                           start=args.synthetic_start)]
    if not files:
        parser.error("give at least one file or --synthetic")
    g = args.good
    print(f"| space | strategy | best at 10: median [95 %] | mean | evals 6-10: mean | "
          f">= {g} per eval | seeds with one >= {g} |")
    print("|---|---|---|---|---|---|---|")
    for path in files:
        space = load_t4(path)  # read and enumerated once for every strategy
        index = SpaceIndex(space.space)
        for sampler in args.samplers.split(","):
            fractions = picks(space, index, sampler, repeats=args.repeats)
            best = fractions.max(axis=1)
            low, high = _median_interval(best, np.random.default_rng(0))
            model = fractions[:, 5:]
            print(
                f"| {path.name.split('.')[0]} | {sampler} | {np.median(best):.3f} "
                f"[{low:.3f}-{high:.3f}] | {best.mean():.3f} | {model.mean():.3f} | "
                f"{(model >= g).mean():.3f} | {(model >= g).any(axis=1).mean():.3f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
