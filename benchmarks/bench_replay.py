"""Compare the product's strategies and their peers, held out, by replay of recorded spaces.

    python benchmarks/bench_replay.py --leave-one-out --synthetic 6 --synthetic-start 100 \
        --repeats 300 --repeats-for convolution=500 --budget 100 --workers 2 \
        --peers tpe,kt-genetic_algorithm,kt-pso        # docs/replay.md names every peer

Replays each candidate (``--samplers``: names of ``spectune.search.STRATEGIES``,
default ``auto``) and each peer (``--peers``) on the shared T4 files
(``../shared/tuning-spaces/*_T4.json.gz``, or ``--files``) and on ``--synthetic N``
generated spaces (seeds S..S+N-1 with ``--synthetic-start S``; varying roughness and
failure rates), every one on the same seeds, derived from ``--seed`` (default 0): run
``i`` has the same seed whatever ``--repeats``, so 20 seeds are the first 20 of 500.
``--repeats-for PREFIX=N,...`` gives the files whose name starts with PREFIX N seeds
instead. Prints one line per (space, strategy): the median fraction of the optimum at
each budget with its quartiles, random search's median, the share of seeds at 0.95 of
the optimum at 100, the first evaluation where the median reaches 0.95, and seconds per
run.

Peers named ``kt-<strategy>`` (``kt-genetic_algorithm``, ``kt-bayes_opt``, ...) are
Kernel Tuner 1.5's strategies in its simulation mode on the same files, seeds and score
(``pip install 'spectune[bench]'``; how evaluations are counted: kt_peers.py); ``tpe``
and ``optuna-gp`` are Optuna's samplers on the engine.

``--leave-one-out`` judges the choice among the candidates on spaces it never saw: for
each file in turn, the candidate with the best score on the *other* files (the mean,
over those files and the reported budgets, of the median fraction of the optimum; ties
to the candidate listed first) is chosen, and its results on the file left out are
reported, beside every peer and random search; peers are never chosen. The figure that
counts is the worst held-out file at each budget. Printed as Markdown tables, then the
held-out cells that miss a goal (``unmet_goals``: 0.95 of the optimum at 100, at or
above the best peer at 20, 50 and 100, above random search everywhere) and the goals met
only within the seeds' noise (``fragile_goals``), each with a 95 % bootstrap interval of
its margin over the seeds. ``--out`` then holds ``{"runs": [...], "leave_one_out":
{...}, "unmet_goals": [...], "fragile_goals": [...]}`` (without ``--leave-one-out``, the
list of runs), and every cell of ``runs`` its seeds' fractions.

``--from RUNS.json,...`` runs nothing: it reads the runs of earlier ``--out`` files (of
either form) and, with ``--leave-one-out``, judges their union, so runs made apart (a
group of files, a peer added later on the same seeds) give one held-out table
(``--samplers``, when given, keeps only those candidates; peers stay); without it, it
merges them into ``--out``:

    python benchmarks/bench_replay.py --leave-one-out --from /tmp/conv.json,/tmp/rest.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402

from spectune.search import STRATEGIES  # noqa: E402
from spectune.search.replay import (  # noqa: E402
    ReplayReport,
    SyntheticSpec,
    load_t4,
    replay,
    write_synthetic,
)

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "tuning-spaces"

#: Synthetic spaces: (roughness, fail fraction) cycled over seeds.
SYNTHETIC = [(0.05, 0.05), (0.1, 0.25), (0.2, 0.05), (0.3, 0.4), (0.1, 0.05), (0.2, 0.2)]


def synthetic_files(directory: Path, *, count: int, start: int) -> list[Path]:
    """Write the generated spaces ``synthetic<start>`` .. ``synthetic<start + count - 1>``."""
    files = []
    for seed in range(start, start + count):
        rough, fail = SYNTHETIC[seed % len(SYNTHETIC)]
        spec = SyntheticSpec(roughness=rough, fail_fraction=fail)
        files.append(write_synthetic(directory / f"synthetic{seed}.json.gz", spec, seed=seed))
    return files


def repeats_for(spec: str, *, default: int) -> dict[str, int]:
    """``--repeats-for``'s ``PREFIX=N,...`` as ``{prefix: N}`` (``default`` elsewhere).

    Raises:
        ValueError: naming the entry that is not ``PREFIX=N`` with a positive N.
    """
    out: dict[str, int] = {}
    for entry in (e for e in spec.split(",") if e):
        prefix, _, count = entry.partition("=")
        if not prefix or not count.isdigit() or int(count) < 1:
            raise ValueError(f"--repeats-for: expected PREFIX=N with N >= 1, got {entry!r}")
        out[prefix] = int(count)
    return out


def file_repeats(name: str, overrides: dict[str, int], *, default: int) -> int:
    """Seeds for the space ``name``: the longest matching prefix's, else ``default``."""
    matches = [p for p in overrides if name.startswith(p)]
    return overrides[max(matches, key=len)] if matches else default


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", default="", help="comma-separated T4 files (default: shared)")
    parser.add_argument("--samplers", default=None,
                        help=f"candidates, comma-separated (default: auto): "
                        f"{', '.join(STRATEGIES)}")
    parser.add_argument("--peers", default="",
                        help="strategies reported beside the chosen one, never chosen "
                        "(kt-<strategy>, tpe, optuna-gp, ...)")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--repeats-for", default="",
                        help="PREFIX=N,...: N seeds on the files whose name starts with PREFIX")
    parser.add_argument("--budget", type=int, default=100)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--synthetic", type=int, default=0)
    parser.add_argument(
        "--synthetic-start", type=int, default=0, help="seed of the first generated space"
    )
    parser.add_argument("--no-shared", action="store_true")
    parser.add_argument("--noisy", action="store_true")
    parser.add_argument("--seed", type=int, default=0,
                        help="base seed: run i of every strategy and peer uses the seed "
                        "derived from (seed, i); another base gives another seed set")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--leave-one-out", action="store_true",
                        help="choose among --samplers on the other files, report the held-out one")
    parser.add_argument("--from", dest="stored", default="",
                        help="comma-separated --out files whose runs to judge instead of running")
    args = parser.parse_args()
    if args.stored:
        try:
            rows = stored_runs([Path(f) for f in args.stored.split(",") if f],
                               candidates=args.samplers.split(",") if args.samplers else None)
        except (OSError, ValueError) as exc:
            print(f"--from: {exc}", file=sys.stderr)
            return 2
        if args.leave_one_out:
            return _judge(rows, args)
        if not args.out:
            print("--from needs --leave-one-out, or --out for the merged runs", file=sys.stderr)
            return 2
        args.out.write_text(json.dumps(rows, indent=1))
        return 0
    candidates = [n for n in (args.samplers or "auto").split(",") if n]
    peers = [p for p in args.peers.split(",") if p]
    unknown = [n for n in candidates if n not in STRATEGIES] + [
        p for p in peers if p not in STRATEGIES and not p.startswith(KT_PREFIX)]
    if unknown:
        parser.error(f"unknown strategies {', '.join(unknown)}: --samplers takes "
                     f"{', '.join(STRATEGIES)}; --peers those and kt-<strategy>")
    try:
        overrides = repeats_for(args.repeats_for, default=args.repeats)
    except ValueError as exc:
        parser.error(str(exc))

    files = [Path(f) for f in args.files.split(",") if f]
    if not files and not args.no_shared:
        files = sorted(SHARED.glob("*_T4.json.gz"))
    tmp = tempfile.TemporaryDirectory()
    files += synthetic_files(Path(tmp.name), count=args.synthetic, start=args.synthetic_start)

    rows = []
    for f in files:
        space = load_t4(f)
        repeats = file_repeats(space.name, overrides, default=args.repeats)
        for name in [*candidates, *peers]:
            start = time.monotonic()
            if name.startswith(KT_PREFIX):
                report = _kt_report(space, name[len(KT_PREFIX):],
                                    argparse.Namespace(**{**vars(args), "repeats": repeats}))
            else:
                report = replay(
                    space,
                    budget=args.budget,
                    repeats=repeats,
                    sampler=name,
                    workers=args.workers,
                    noisy=args.noisy,
                    seed=args.seed,
                )
            seconds = (time.monotonic() - start) * args.workers / repeats
            at100 = report.engine_curves[:, min(100, args.budget) - 1]
            row = {
                "file": space.name,
                "sampler": name,
                "role": "peer" if name in peers else "candidate",
                "repeats": repeats,
                "seed": args.seed,
                "noisy": args.noisy,
                "hit95_at_100": float(np.mean(at100 >= 0.95)),
                "median95_at": median_reaches(report.engine_curves, 0.95),
                "seconds_per_run": seconds,
                **report.to_json(),
            }
            row["results"] = budget_cells(report)
            rows.append(row)
            cells = " ".join(
                f"{r['budget']}:{r['median_fraction']:.3f}[{r['q25_fraction']:.2f}-{r['q75_fraction']:.2f}]"
                f"/r{r['random_median_fraction']:.3f}"
                for r in row["results"]
            )
            print(
                f"{space.name:28s} {name:14s} {cells} hit95@100={row['hit95_at_100']:.2f} "
                f"median95@{row['median95_at'] or '-'} "
                f"({seconds:.1f}s/run)",
                flush=True,
            )
    if not args.leave_one_out:
        if args.out:
            args.out.write_text(json.dumps(rows, indent=1))
        return 0
    return _judge(rows, args)


def _judge(rows: list[dict[str, object]], args: argparse.Namespace) -> int:
    """The leave-one-out table and goal checks of ``rows``; ``--out`` gets all of it."""
    if len({str(row["file"]) for row in rows}) < 2:
        print("--leave-one-out needs at least two files", file=sys.stderr)
        return 2
    loo = leave_one_out(rows)
    print(loo_table(loo))
    checks = goal_checks(loo)
    unmet, fragile = _unmet(checks), _fragile(checks)
    clear = sum(1 for c in checks if not c.met and c.clear)
    print("\nGoals unmet: " + ("none" if not unmet else f"{len(unmet)}, {clear} of them "
                                "clear of the seeds' noise (95 % bootstrap interval)"))
    for line in unmet:
        print(f"* {line}")
    print(f"\nGoals met within the seeds' noise: {len(fragile) or 'none'}")
    for line in fragile:
        print(f"* {line}")
    if args.out:
        args.out.write_text(json.dumps({"runs": rows, "leave_one_out": loo,
                                        "unmet_goals": unmet, "fragile_goals": fragile},
                                       indent=1))
    return 0


def stored_runs(paths: Sequence[Path], *, candidates: Sequence[str] | None = None,
                ) -> list[dict[str, object]]:
    """The runs of earlier ``--out`` files, as ``main`` records them.

    Args:
        paths: ``--out`` files: a list of runs, or ``{"runs": [...], ...}``.
        candidates: Keep only these candidates (every peer stays); ``None``: all.

    Raises:
        ValueError: naming the file when one holds no runs, when two hold the same
            (file, strategy) pair, when the runs report different budgets, or when a
            kept candidate lacks a file that others have: the rule compares candidates
            on the same files and budgets only.
    """
    rows: list[dict[str, object]] = []
    where: dict[tuple[str, str], Path] = {}
    for path in paths:
        data = json.loads(path.read_text())
        runs = data.get("runs") if isinstance(data, dict) else data
        if not isinstance(runs, list) or not runs:
            raise ValueError(f"{path} holds no runs of bench_replay.py --out")
        for row in runs:
            if not (isinstance(row, dict) and {"file", "sampler", "results"} <= row.keys()):
                raise ValueError(f"{path} holds no runs of bench_replay.py --out")
            key = (str(row["file"]), str(row["sampler"]))
            if key in where:
                raise ValueError(f"{key[1]} on {key[0]} is in both {where[key]} and {path}")
            where[key] = path
            if (candidates is None or row.get("role", "candidate") == "peer"
                    or row["sampler"] in candidates):
                rows.append(row)
    budgets = {tuple(cell["budget"] for cell in row["results"]) for row in rows}
    if len(budgets) > 1:
        raise ValueError(f"the runs report different budgets: {sorted(budgets)}")
    files = {str(row["file"]) for row in rows}
    kept = candidates if candidates is not None else sorted(
        {str(r["sampler"]) for r in rows if r.get("role", "candidate") == "candidate"})
    for name in kept:
        missing = sorted(files - {str(r["file"]) for r in rows if r["sampler"] == name})
        if missing:
            raise ValueError(f"{name} has no run on {', '.join(missing)}")
    if candidates is not None:  # the order given is the order ties go by
        rank = {name: i for i, name in enumerate(candidates)}
        rows.sort(key=lambda r: rank.get(str(r["sampler"]), len(rank)))
    return rows


#: Candidates named ``kt-<strategy>`` are Kernel Tuner's strategies (benchmarks/kt_peers.py).
KT_PREFIX = "kt-"


def _kt_report(space: object, strategy: str, args: argparse.Namespace) -> object:
    if args.noisy:
        raise SystemExit("Kernel Tuner peers replay recorded means only (no --noisy)")
    try:
        from kt_peers import kt_replay
    except ImportError as exc:
        raise SystemExit(f"kt-* candidates need Kernel Tuner: pip install 'spectune[bench]' "
                         f"({exc})") from None
    return kt_replay(space, strategy=strategy, budget=args.budget,  # type: ignore[arg-type]
                     repeats=args.repeats, workers=args.workers, seed=args.seed)


def budget_cells(report: ReplayReport) -> list[dict[str, object]]:
    """Each budget's results as ``--out`` stores them: the report's, with random search's
    quartiles beside its median, and every seed's fraction of the optimum (``fractions``,
    ``random_fractions``; in seed order, rounded to 6 digits) for the goals' intervals."""
    return [{**r, "random_q25_fraction": b.random_q25_fraction,
             "random_q75_fraction": b.random_q75_fraction,
             "fractions": _per_seed(report.engine_curves, b.budget),
             "random_fractions": _per_seed(report.random_curves, b.budget)}
            for r, b in zip(report.to_json()["results"], report.results, strict=True)]


def _per_seed(curves: np.ndarray, budget: int) -> list[float]:
    return [round(float(v), 6) for v in curves[:, budget - 1]]


def median_reaches(curves: np.ndarray, level: float) -> int | None:
    """The first evaluation (from 1) at which the median over seeds of the best so far
    (``curves``: seeds x evaluations, fractions of the optimum) is at ``level`` or above;
    ``None`` when it never is within the budget. A cell at a fixed budget says which side
    of it a median lies; this says by how many evaluations."""
    reached = np.flatnonzero(np.median(curves, axis=0) >= level)
    return int(reached[0]) + 1 if len(reached) else None


def selection_score(run: dict[str, object]) -> float:
    """What a candidate is chosen by: its mean median fraction over the budgets."""
    results = run["results"]
    assert isinstance(results, list)
    return float(np.mean([r["median_fraction"] for r in results]))


def leave_one_out(rows: list[dict[str, object]]) -> dict[str, object]:
    """For each file, the candidate best on the other files and its held-out results.

    Args:
        rows: One run per (file, candidate), as ``main`` records them.

    Returns:
        ``{"held_out": [...], "worst": [...]}``: per file, the chosen candidate, its
        selection scores on the other files (every candidate's) and its results on the
        file; per budget, the worst held-out file's median and which file it is.
    """
    runs: dict[str, dict[str, dict[str, object]]] = {}
    for row in rows:
        runs.setdefault(str(row["file"]), {})[str(row["sampler"])] = row
    files = list(runs)
    candidates = [n for n, r in runs[files[0]].items() if r.get("role", "candidate") == "candidate"]
    # Peers may have run on some files only (stored runs merged by --from).
    peers = list(dict.fromkeys(n for f in files for n, r in runs[f].items()
                               if r.get("role") == "peer"))
    held_out = []
    for held in files:
        others = [f for f in files if f != held]
        scores = {c: float(np.mean([selection_score(runs[f][c]) for f in others]))
                  for c in candidates}
        # Ties go to the candidate listed first.
        chosen = max(candidates, key=lambda c: (scores[c], -candidates.index(c)))
        run = runs[held][chosen]
        held_out.append({
            "file": held, "chosen": chosen, "scores_on_others": scores,
            "repeats": run["repeats"], "results": run["results"],
            "peers": {p: runs[held][p]["results"] for p in peers if p in runs[held]},
        })
    worst = []
    for i, result in enumerate(held_out[0]["results"]):  # type: ignore[arg-type]
        cells = [(h["results"][i]["median_fraction"], h["file"]) for h in held_out]  # type: ignore[index]
        value, where = min(cells)
        worst.append({"budget": result["budget"], "median_fraction": value, "file": where,
                      "random_median_fraction": min(
                          h["results"][i]["random_median_fraction"] for h in held_out)})  # type: ignore[index]
    return {"candidates": candidates, "peers": peers, "held_out": held_out, "worst": worst}


def loo_table(loo: dict[str, object]) -> str:
    """The leave-one-out result as a Markdown table (median [q25-q75] / random median)."""
    held_out = loo["held_out"]
    assert isinstance(held_out, list)
    budgets = [r["budget"] for r in held_out[0]["results"]]
    lines = [
        "| held-out file | chosen on the others | seeds | "
        + " | ".join(f"{b} evals" for b in budgets) + " |",
        "|---|---|---|" + "---|" * len(budgets),
    ]
    for h in held_out:
        cells = [f"{r['median_fraction']:.3f} [{r['q25_fraction']:.2f}-{r['q75_fraction']:.2f}]"
                 f" / r {r['random_median_fraction']:.3f}" for r in h["results"]]
        lines.append(f"| {h['file']} | {h['chosen']} | {h['repeats']} | " + " | ".join(cells)
                     + " |")
    worst = loo["worst"]
    assert isinstance(worst, list)
    lines.append("| **worst held-out** | | | " + " | ".join(
        f"**{w['median_fraction']:.3f}** ({w['file']})" for w in worst) + " |")
    if loo.get("peers"):
        lines += ["", peers_table(loo)]
    return "\n".join(lines)


def peers_table(loo: dict[str, object]) -> str:
    """Per held-out file and budget: the chosen candidate, every peer, random search.

    Medians over the same seeds; the best peer of each cell in bold when it beats ours.
    """
    held_out = loo["held_out"]
    peers = loo["peers"]
    assert isinstance(held_out, list) and isinstance(peers, list)
    lines = ["| held-out file | evals | ours (chosen) | " + " | ".join(peers) + " | random |",
             "|---|---|---|" + "---|" * (len(peers) + 1)]
    for h in held_out:
        for i, ours in enumerate(h["results"]):
            values = [h["peers"][p][i]["median_fraction"] if p in h["peers"] else None
                      for p in peers]
            best = max((v for v in values if v is not None), default=None)
            cells = ["-" if v is None else f"**{v:.3f}**"
                     if v == best and v > ours["median_fraction"] else f"{v:.3f}"
                     for v in values]
            lines.append(f"| {h['file']} | {ours['budget']} | {ours['median_fraction']:.3f} | "
                         + " | ".join(cells) + f" | {ours['random_median_fraction']:.3f} |")
    return "\n".join(lines)


#: Issue 14's goals for the chosen candidate on each held-out file: a median of at least
#: ``GOAL_LEVEL`` of the optimum at ``GOAL_AT`` evaluations, at or above the best peer at
#: ``PEER_BUDGETS``, above random search at every budget.
GOAL_LEVEL = 0.95
GOAL_AT = 100
PEER_BUDGETS = (20, 50, 100)


#: Bootstrap resamples behind each goal's interval (``goal_checks``).
BOOTSTRAP_RESAMPLES = 2000


@dataclass(frozen=True)
class GoalCheck:
    """One goal checked on one held-out cell.

    Attributes:
        cell: Which cell and goal: ``"<file> at <budget>: <ours> < <what>"`` for a miss,
            ``>=`` (a peer, the level) or ``>`` (random search) where it is met.
        goal: ``"level"``, ``"peer"`` or ``"random"``.
        met: Whether the medians meet it: at or above the level, at or above the peer
            (a tie meets it), above random search (a tie does not).
        interval: 95 % bootstrap interval over seeds of the margin: our median minus the
            level, the peer's median or random search's (negative: short of it);
            ``None`` where the cells carry no per-seed fractions.
    """

    cell: str
    goal: str
    met: bool
    interval: tuple[float, float] | None

    @property
    def clear(self) -> bool | None:
        """Whether the seeds settle the verdict: the whole interval on its side of zero
        (a tie at zero sides with the verdict as the medians' tie does); ``None``
        without an interval. A verdict that is not clear could turn with another seed
        set of the same size."""
        if self.interval is None:
            return None
        lo, hi = self.interval
        if self.goal == "random":
            return lo > 0 if self.met else hi <= 0
        return lo >= 0 if self.met else hi < 0

    @property
    def line(self) -> str:
        if self.interval is None:
            return self.cell
        lo, hi = self.interval
        verdict = "clear" if self.clear else "within the seeds' noise"
        return f"{self.cell} (margin 95 % interval {lo:+.3f} to {hi:+.3f}: {verdict})"


def goal_checks(
    loo: dict[str, object], *, resamples: int = BOOTSTRAP_RESAMPLES
) -> list[GoalCheck]:
    """Every goal on every held-out cell (``GOAL_LEVEL`` at ``GOAL_AT``, the best peer at
    ``PEER_BUDGETS``, random search at every budget), in file and budget order. Medians
    over the same seeds.

    Where the cells hold every seed's fraction (``budget_cells``), each check carries a
    95 % percentile-bootstrap interval of its margin, the seeds of each side resampled
    apart (``resamples`` times from a fixed generator: the same run gives the same
    intervals). It says whether the seeds settle the verdict: once, a goal met on 100 seeds
    within the noise was missed clearly on 1000."""
    held_out = loo["held_out"]
    assert isinstance(held_out, list)
    rng = np.random.default_rng(0)

    def margin(ours: object, theirs: object = None, level: float | None = None
               ) -> tuple[float, float] | None:
        return _margin(ours, theirs, level=level, rng=rng, resamples=resamples)  # type: ignore[arg-type]

    checks = []
    for h in held_out:
        for i, r in enumerate(h["results"]):
            budget, ours = r["budget"], r["median_fraction"]
            seeds = r.get("fractions")
            where = f"{h['file']} at {budget}: {ours:.3f}"
            if budget == GOAL_AT:
                met = ours >= GOAL_LEVEL
                checks.append(GoalCheck(f"{where} {'>=' if met else '<'} {GOAL_LEVEL}",
                                        "level", met, margin(seeds, level=GOAL_LEVEL)))
            if budget in PEER_BUDGETS and h["peers"]:
                peer, cell = max(((p, v[i]) for p, v in h["peers"].items()),
                                 key=lambda pc: pc[1]["median_fraction"])
                met = ours >= cell["median_fraction"]
                checks.append(GoalCheck(
                    f"{where} {'>=' if met else '<'} {peer} {cell['median_fraction']:.3f}",
                    "peer", met, margin(seeds, cell.get("fractions"))))
            met = ours > r["random_median_fraction"]
            checks.append(GoalCheck(
                f"{where} {'>' if met else '<='} random {r['random_median_fraction']:.3f}",
                "random", met, margin(seeds, r.get("random_fractions"))))
    return checks


def _margin(
    ours: list[float] | None,
    theirs: list[float] | None,
    *,
    rng: np.random.Generator,
    resamples: int,
    level: float | None = None,
) -> tuple[float, float] | None:
    """95 % bootstrap interval of ``median(ours) - median(theirs)`` (or ``- level``)."""
    if ours is None or (theirs is None and level is None):
        return None
    a = np.asarray(ours, dtype=float)
    diffs = np.median(a[rng.integers(len(a), size=(resamples, len(a)))], axis=1)
    if theirs is None:
        diffs -= level
    else:
        b = np.asarray(theirs, dtype=float)
        diffs -= np.median(b[rng.integers(len(b), size=(resamples, len(b)))], axis=1)
    lo, hi = np.quantile(diffs, [0.025, 0.975])
    return float(lo), float(hi)


def paired_interval(ours: Sequence[float], base: Sequence[float], *,
                    resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0) -> tuple[float, float]:
    """95 % bootstrap interval of ``median(ours) - median(base)`` where both ran the same
    seeds, in the same order: each resample draws seeds and takes both sides' fractions
    of those seeds, so the spread between seeds that both share cancels out (``_margin``
    resamples each side apart: its sides may be of different runs)."""
    a, b = np.asarray(ours, dtype=float), np.asarray(base, dtype=float)
    if a.shape != b.shape or not len(a):
        raise ValueError("paired_interval needs the same seeds on both sides")
    idx = np.random.default_rng(seed).integers(len(a), size=(resamples, len(a)))
    diffs = np.median(a[idx], axis=1) - np.median(b[idx], axis=1)
    lo, hi = np.quantile(diffs, [0.025, 0.975])
    return float(lo), float(hi)


def unmet_goals(loo: dict[str, object]) -> list[str]:
    """The checks (``goal_checks``) that miss, one line each (with its interval where the
    cells hold the seeds); empty when every goal is met."""
    return _unmet(goal_checks(loo))


def fragile_goals(loo: dict[str, object]) -> list[str]:
    """The goals met on these seeds whose interval crosses zero: another seed set of the
    same size could miss them."""
    return _fragile(goal_checks(loo))


def _unmet(checks: list[GoalCheck]) -> list[str]:
    return [c.line for c in checks if not c.met]


def _fragile(checks: list[GoalCheck]) -> list[str]:
    return [c.line for c in checks if c.met and c.clear is False]


if __name__ == "__main__":
    sys.exit(main())
