"""Transfer by replay: what a prior from another GPU gains, and what a wrong one costs.

    python benchmarks/bench_transfer.py --repeats 30 --budget 50 --workers 2 --out /tmp/t.json

For each (target, prior) pair of recorded spaces, the engine (``auto``) is replayed on
the target with the same seeds three ways: without a prior; with the prior's five
fastest configurations the target holds evaluated first (``warm_start``, how
``--prior`` worked before :class:`~spectune.search.TransferStrategy`); and through
``TransferStrategy`` (the prior on alternate turns, dropped after two misses), which
``spectune replay --prior`` and ``spectune sweep`` now use. Two priors that mislead on
purpose bound the cost: the target's own five slowest correct configurations
(``adversarial``), and a prior of another kernel family (no parameter in common, so no
configuration transfers and nothing is charged). Prints two Markdown tables of the
fraction of the optimum at each budget: the median over seeds, and the mean (steadier
than the median where seeds split between two basins); then the median gain of
``TransferStrategy`` over no prior with its 95 % paired bootstrap interval (the seeds
resampled together: both columns ran the same seeds), which says whether a gain or a
cost is more than the seeds drawn.

``--base-sees own`` measures a variant of ``TransferStrategy`` (not the product's): the
base strategy never sees the prior's evaluations (its model, best, trust region and
start are its own), so it searches as it would without a prior, a few turns later.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402
import optuna  # noqa: E402
from optuna.trial import FrozenTrial, TrialState  # noqa: E402

from spectune.search import (  # noqa: E402
    STRATEGIES,
    History,
    ProposalContext,
    Strategy,
    TransferStrategy,
)
from spectune.search.replay import (  # noqa: E402
    RecordedSpace,
    ReplayReport,
    load_t4,
    prior_configs,
    replay,
)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_replay import paired_interval  # noqa: E402

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "tuning-spaces"

#: (target, prior): same kernel on another GPU of the same vendor, of another vendor, and
#: another kernel family.
PAIRS = (
    ("convolution_A4000", "convolution_A100"),
    ("dedispersion_A6000", "dedispersion_A100"),
    ("dedispersion_A4000", "dedispersion_A6000"),
    ("convolution_A100", "convolution_MI250X"),
    ("convolution_MI250X", "convolution_A4000"),
    ("convolution_A100", "dedispersion_A100"),
)


#: One way of running the target (``_stats``): per-budget lists, and per-seed lists.
Stats = dict[str, list[Any]]


class OwnEvaluations(Strategy):
    """``base`` on a history without the evaluations of ``prior`` (``--base-sees own``)."""

    def __init__(self, base: Strategy, *, prior: list[dict[str, int]]) -> None:
        self.base = base
        self.prior = prior
        self.name = f"{base.name}-own"
        self._members: set[int] | None = None

    def propose(self, ctx: ProposalContext) -> int | None:
        if self._members is None:
            self._members = {r for c in self.prior if (r := ctx.index.row(c)) is not None}
        h = ctx.history
        mine = np.array([int(r) not in self._members for r in h.rows], dtype=bool)
        own = History(rows=h.rows[mine], times=h.times[mine], pending=h.pending)
        return self.base.propose(dataclasses.replace(ctx, history=own))

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        self.base.before_trial(study, trial)

    def after_trial(self, study: optuna.Study, trial: FrozenTrial, state: TrialState,
                    values: Sequence[float] | None) -> None:
        self.base.after_trial(study, trial, state, values)


def own_transfer(seed: int, *, sampler: str, prior: list[dict[str, int]]) -> Strategy:
    """``TransferStrategy`` around ``sampler`` whose base sees only its own evaluations."""
    base = OwnEvaluations(STRATEGIES[sampler](seed), prior=prior)
    return TransferStrategy(base, prior=prior, random_start=0)


def slowest(space: RecordedSpace, n: int) -> list[dict[str, int]]:
    """The ``n`` slowest correct configurations: a prior as wrong as one can be."""
    ranked = sorted(((r.time, k) for k, r in space.records.items() if r.ok), reverse=True)
    return [dict(zip(space.space.names, k, strict=True)) for _, k in ranked[:n]]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=SHARED, help="folder of the T4 files")
    parser.add_argument("--pairs", default="",
                        help="target:prior,... (file stems; default: the built-in pairs)")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--budget", type=int, default=50)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--top", type=int, default=5, help="prior configurations")
    parser.add_argument("--sampler", default="auto")
    parser.add_argument("--base-sees", choices=("all", "own"), default="all",
                        help="own: the base strategy never sees the prior's evaluations "
                             "(a variant, not what TransferStrategy does)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    pairs = [tuple(p.split(":")) for p in args.pairs.split(",") if p] or list(PAIRS)

    def run(target: RecordedSpace, *, prior: list[dict[str, int]] | None = None,
            **kw: object) -> Stats:
        sampler: object = args.sampler
        if prior and args.base_sees == "own":
            sampler = functools.partial(own_transfer, sampler=args.sampler, prior=prior)
        elif prior:
            kw["prior"] = prior
        report = replay(target, budget=args.budget, repeats=args.repeats,
                        sampler=sampler, workers=args.workers, **kw)  # type: ignore[arg-type]
        return _stats(report)

    records = []
    budgets: list[int] = []
    cache: dict[str, Stats] = {}
    for target_name, prior_name in pairs:
        target = load_t4(args.dir / f"{target_name}_T4.json.gz")
        prior = load_t4(args.dir / f"{prior_name}_T4.json.gz")
        configs = prior_configs(prior, target, top=args.top)
        if target_name not in cache:
            report = replay(target, budget=args.budget, repeats=args.repeats,
                            sampler=args.sampler, workers=args.workers)
            budgets = [r.budget for r in report.results]
            cache[target_name] = _stats(report)
            worst = slowest(target, args.top)
            records.append(_record(target_name, "adversarial (its slowest)", len(worst),
                                   cache[target_name], run(target, warm_start=worst),
                                   run(target, prior=worst)))
            print(json.dumps(records[-1]), flush=True)
        none = cache[target_name]
        records.append(_record(target_name, prior_name, len(configs), none,
                               run(target, warm_start=configs) if configs else none,
                               run(target, prior=configs) if configs else none))
        print(json.dumps(records[-1]), flush=True)
    print(table(records, budgets, args.repeats))
    print()
    print(table(records, budgets, args.repeats, stat="mean"))
    print()
    print(gain_table(records, budgets, args.repeats))
    if args.out:
        args.out.write_text(json.dumps({"budgets": budgets, "repeats": args.repeats,
                                        "records": records}, indent=1))
    return 0


def _stats(report: ReplayReport) -> Stats:
    """Median and mean fraction of the optimum at each reported budget, random's median,
    and every seed's fraction at each budget (``seeds``: budgets x seeds)."""
    curves = report.engine_curves
    return {"median": [r.median_fraction for r in report.results],
            "mean": [float(np.mean(curves[:, r.budget - 1])) for r in report.results],
            "random": [r.random_median_fraction for r in report.results],
            "seeds": [curves[:, r.budget - 1].tolist() for r in report.results]}


def _record(target: str, prior: str, configs: int, none: Stats, first: Stats,
            transfer: Stats) -> dict[str, object]:
    """One row: medians under the plain keys (as before), means under ``*_mean``, and the
    95 % paired interval of transfer's median gain at each budget (``transfer_gain_95``)."""
    return {"target": target, "prior": prior, "configs": configs,
            "none": none["median"], "first": first["median"], "transfer": transfer["median"],
            "none_mean": none["mean"], "first_mean": first["mean"],
            "transfer_mean": transfer["mean"], "random": none["random"],
            "transfer_gain_95": [paired_interval(t, n) for t, n
                                 in zip(transfer["seeds"], none["seeds"], strict=True)]}


def table(records: list[dict[str, object]], budgets: list[int], repeats: int, *,
          stat: str = "median") -> str:
    """Fraction without a prior (``stat`` over seeds), and the gain of each way of using one."""
    suffix = "" if stat == "median" else "_mean"
    head = " | ".join(f"{b} evals: none / first / transfer" for b in budgets)
    lines = [f"| target ← prior | configs | {head} |", "|---|---|" + "---|" * len(budgets)]
    for r in records:
        cells = []
        for i in range(len(budgets)):
            none = r["none" + suffix][i]  # type: ignore[index]
            first = r["first" + suffix][i] - none  # type: ignore[index]
            transfer = r["transfer" + suffix][i] - none  # type: ignore[index]
            cells.append(f"{none:.3f} / {first:+.3f} / {transfer:+.3f}")
        lines.append(f"| {r['target']} ← {r['prior']} | {r['configs']} | " + " | ".join(cells)
                     + " |")
    lines.append(f"\n{stat} of {repeats} seeds, the same for every column; first and transfer "
                 "are gains over none.")
    return "\n".join(lines)


def gain_table(records: list[dict[str, object]], budgets: list[int], repeats: int) -> str:
    """Transfer's median gain over none at each budget, with its 95 % paired interval;
    "clear" where the interval, as printed (3 decimals), is on one side of zero."""
    head = " | ".join(f"{b} evals" for b in budgets)
    lines = [f"| target ← prior | {head} |", "|---|" + "---|" * len(budgets)]
    for r in records:
        cells = []
        for i, (lo, hi) in enumerate(r["transfer_gain_95"]):  # type: ignore[arg-type]
            gain = r["transfer"][i] - r["none"][i]  # type: ignore[index]
            clear = " clear" if round(lo, 3) > 0 or round(hi, 3) < 0 else ""
            cells.append(f"{gain:+.3f} [{lo:+.3f} to {hi:+.3f}]{clear}")
        lines.append(f"| {r['target']} ← {r['prior']} | " + " | ".join(cells) + " |")
    lines.append(f"\nmedian gain of transfer over none, {repeats} seeds, 95 % paired "
                 "bootstrap interval.")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
