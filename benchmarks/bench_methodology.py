"""The autotuning-methodology package's performance score, for ours and the peers, by replay.

    python benchmarks/bench_methodology.py --synthetic 6 --synthetic-start 100 --repeats 30 \
        --budget 100 --workers 2 --samplers auto,tpe,random \
        --peers kt-genetic_algorithm,kt-simulated_annealing,kt-pso --out /tmp/m.json

The ``autotuning-methodology`` package (the software of "A Methodology for Comparing
Auto-Tuning Optimization Algorithms", 2024, doi:10.1016/j.future.2024.05.021, built on the
same benchmark hub as the shared T4 files; ``pip install 'spectune[bench]'``) scores a
strategy on a space by how far its curve lies between random search's and the optimum.
What this script takes from the package, unchanged:

* the space's statistics and its cut-off points (``SearchspaceStatistics``, read from the
  T4 file): the range runs from the evaluation where random search is expected to have
  covered 1 % of the way from the median configuration to the optimum, to where it
  covers 95 % (the package's defaults);
* the baseline: the calculated expected best of random search without replacement among
  correct configurations (``RandomSearchCalculatedBaseline``);
* the strategy's curve as the package builds it: at each evaluation, the configuration
  whose rank is the median over seeds of the ranks of the best found so far;
* the standardisation ``(curve - baseline) / (optimum - baseline)``: 0 is random search,
  1 the optimum from the first evaluation on, below 0 worse than random.

The score on a space is the mean of the standardised curve over the range, and the
aggregate is the mean over spaces, as the package reports it. Two differences, both
stated with the figures: the package's default axis is tuning time (compile and
benchmark times summed), this one counts evaluations, as every other table of
docs/replay.md does; and where the 95 % cut-off lies beyond ``--budget`` (the runs stop
there), the range is cut at the budget and the space is marked as such in the output.
``--budget full`` runs every space to its own cut-off, so no range is cut: the package's
full-range score (slow: the cut-offs of the shared files and generated spaces 100-105
lie at 51-1425 evaluations).

    python benchmarks/bench_methodology.py --synthetic 6 --synthetic-start 100 --repeats 10 \
        --budget full --workers 2 --samplers auto,random --peers kt-genetic_algorithm
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import sys
import tempfile
import warnings
from pathlib import Path

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402

from spectune.search import STRATEGIES  # noqa: E402
from spectune.search.replay import RecordedSpace, load_t4, replay  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_replay import (  # noqa: E402
    KT_PREFIX,
    SHARED,
    _kt_report,
    synthetic_files,
)

#: The package's default cut-offs (its ``experiments_defaults.json``).
CUTOFF_START = 0.01
CUTOFF_END = 0.95

#: ``--budget`` value that runs each space to its own 95 % cut-off.
FULL = "full"


def package_statistics(t4: Path, workdir: Path) -> object:
    """The package's ``SearchspaceStatistics`` of a T4 file (it reads plain JSON only)."""
    from autotuning_methodology.searchspace_statistics import SearchspaceStatistics

    plain = workdir / t4.name.removesuffix(".gz")
    if t4.name.endswith(".gz"):
        with gzip.open(t4, "rb") as src, plain.open("wb") as dst:
            shutil.copyfileobj(src, dst)
    else:
        shutil.copyfile(t4, plain)
    return SearchspaceStatistics(
        application_name=t4.name, device_name="", minimization=True,
        objective_time_keys=["compilation", "runtimes"], objective_performance_keys=["time"],
        full_search_space_file_path=plain, full_validate=False,
    )


def cutoffs(stats: object) -> tuple[int, int]:
    """The package's range of a space: its first and last evaluation (1 % and 95 %)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the package warns when it moves a cut-off
        start, end, _, _ = stats.cutoff_point_fevals_time_start_end(  # type: ignore[attr-defined]
            CUTOFF_START, CUTOFF_END)
    return int(start), int(end)


def _budget(text: str) -> int | str:
    """``--budget``: a positive number of evaluations, or :data:`FULL`."""
    if text == FULL:
        return FULL
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a number or {FULL!r}, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def score(stats: object, curves: np.ndarray, *, optimum: float) -> dict[str, object]:
    """The package's score of one strategy on one space.

    Args:
        stats: The space's ``SearchspaceStatistics``.
        curves: Fraction of the optimum of the best configuration held after each
            evaluation, one row per seed (``ReplayReport.engine_curves``); 0 before any
            correct configuration (left out of the median; where every seed is at 0,
            the slowest correct configuration counts).
        optimum: The space's best recorded time (the fractions' numerator).

    Returns:
        ``score`` (mean of the standardised curve over the range), the range's first and
        last evaluation, the package's 95 % cut-off, and whether the range was cut at
        the budget (the curves' length).

    Raises:
        ValueError: The package cannot score the space (its cut-offs coincide, or the
            baseline reaches the optimum inside the range).
    """
    from autotuning_methodology.baseline import RandomSearchCalculatedBaseline
    from autotuning_methodology.curves import get_indices_in_distribution

    dist = stats.objective_performances_total_sorted  # type: ignore[attr-defined]
    if not np.isclose(dist[0], optimum, rtol=1e-9):
        raise ValueError(f"the package's optimum {dist[0]} is not the replay's {optimum}")
    start, end = cutoffs(stats)
    budget = curves.shape[1]
    stop = min(end, budget)
    if stop <= start:
        raise ValueError(f"the range {start}-{end} starts beyond the budget {budget}")
    fevals = np.arange(start, stop + 1)
    held = curves[:, fevals - 1]
    times = np.where(held > 0, optimum / np.where(held > 0, held, 1.0), np.nan)
    # Back to the recorded values (the fractions went through one division).
    pos = np.clip(np.searchsorted(dist, times * (1 - 1e-9)), 0, len(dist) - 1)
    snapped = np.where(np.isnan(times), np.nan, dist[pos])
    if not np.allclose(snapped, times, rtol=1e-7, equal_nan=True):
        raise ValueError("a curve holds a time that the space does not")
    ranks = get_indices_in_distribution(snapped, dist)
    # Seeds without a correct configuration yet are left out of the median, as the
    # package leaves them out; where no seed has one, the package stops with an error,
    # and this takes the slowest correct configuration instead.
    found = ~np.isnan(ranks).all(axis=0)
    median = np.full(len(fevals), len(dist) - 1)
    median[found] = np.round(np.nanmedian(ranks[:, found], axis=0)).astype(int)
    curve = dist[median]
    baseline = RandomSearchCalculatedBaseline(stats)
    standardised = baseline.get_standardised_curves(fevals, [curve], x_type="fevals")[0]
    return {"score": float(np.mean(standardised)), "first": int(start), "last": int(stop),
            "cutoff": int(end), "cut_at_budget": bool(end > budget)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", default="", help="comma-separated T4 files (default: shared)")
    parser.add_argument("--no-shared", action="store_true")
    parser.add_argument("--synthetic", type=int, default=0)
    parser.add_argument("--synthetic-start", type=int, default=0)
    parser.add_argument("--samplers", default="auto,random",
                        help=f"engine strategies ({', '.join(STRATEGIES)}); random is "
                        "the engine's uniform draws")
    parser.add_argument("--peers", default="", help="kt-<strategy>,... (Kernel Tuner)")
    parser.set_defaults(noisy=False)  # exact answers only (bench_replay's peers read it)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--budget", type=_budget, default=100,
                        help="evaluations per run, or 'full': each space to its 95 %% "
                        "cut-off")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    try:
        import autotuning_methodology  # noqa: F401
    except ImportError as exc:
        raise SystemExit(f"needs the autotuning-methodology package: pip install "
                         f"'spectune[bench]' ({exc})") from None

    files = [Path(f) for f in args.files.split(",") if f]
    if not files and not args.no_shared:
        files = sorted(SHARED.glob("*_T4.json.gz"))
    tmp = tempfile.TemporaryDirectory()
    work = Path(tmp.name)
    files += synthetic_files(work, count=args.synthetic, start=args.synthetic_start)
    names = [*args.samplers.split(","), *[p for p in args.peers.split(",") if p]]
    unknown = [n for n in names if n not in STRATEGIES and not n.startswith(KT_PREFIX)]
    if unknown:
        parser.error(f"unknown strategies {', '.join(unknown)}: --samplers takes "
                     f"{', '.join(STRATEGIES)}; --peers kt-<strategy>")

    rows: list[dict[str, object]] = []
    for f in files:
        space = load_t4(f)
        stats = package_statistics(f, work)
        budget = cutoffs(stats)[1] if args.budget == FULL else args.budget
        for name in names:
            # The seeds of bench_replay.py's default base (0), engine and peers alike.
            curves = _curves(space, name, argparse.Namespace(**{**vars(args),
                                                                "budget": budget, "seed": 0}))
            try:
                row = {"file": space.name, "strategy": name, **score(stats, curves,
                                                                      optimum=space.optimum)}
            except ValueError as exc:
                row = {"file": space.name, "strategy": name, "score": None, "error": str(exc)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    print(table(rows, names, args.repeats))
    if args.out:
        args.out.write_text(json.dumps({"repeats": args.repeats, "budget": args.budget,
                                        "rows": rows}, indent=1))
    return 0


def _curves(space: RecordedSpace, name: str, args: argparse.Namespace) -> np.ndarray:
    """The runs of ``name`` on ``space``, named and dispatched as bench_replay.py does."""
    if name.startswith(KT_PREFIX):
        report = _kt_report(space, name[len(KT_PREFIX):], args)
    else:
        report = replay(space, budget=args.budget, repeats=args.repeats, sampler=name,
                        workers=args.workers, seed=args.seed)
    return report.engine_curves  # type: ignore[attr-defined]


def table(rows: list[dict[str, object]], names: list[str], repeats: int) -> str:
    """Score per space and strategy, and the aggregate (mean over the spaces scored)."""
    files = list(dict.fromkeys(str(r["file"]) for r in rows))
    cell = {(str(r["file"]), str(r["strategy"])): r for r in rows}
    lines = ["| space | evaluations | " + " | ".join(names) + " |",
             "|---|---|" + "---|" * len(names)]
    for f in files:
        first = cell[(f, names[0])]
        span = (f"{first['first']}-{first['last']}" + (f" (cut-off {first['cutoff']})"
                                                       if first["cut_at_budget"] else "")
                if first.get("score") is not None else str(first.get("error")))
        lines.append(f"| {f} | {span} | " + " | ".join(
            "—" if cell[(f, n)]["score"] is None else f"{cell[(f, n)]['score']:.3f}"
            for n in names) + " |")
    for label, keep in (("aggregate", lambda r: True),
                        ("aggregate, spaces not cut", lambda r: not r.get("cut_at_budget"))):
        means = []
        for n in names:
            got = [float(cell[(f, n)]["score"]) for f in files  # type: ignore[arg-type]
                   if cell[(f, n)]["score"] is not None and keep(cell[(f, n)])]
            means.append(f"{np.mean(got):.3f} ({len(got)})" if got else "—")
        lines.append(f"| **{label}** | | " + " | ".join(means) + " |")
    lines.append(f"\n{repeats} seeds per cell, the same for every strategy; aggregate: the "
                 "mean over the spaces scored (their number in brackets).")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
