"""How a study's throughput scales with the worker processes sharing it on PostgreSQL.

    python benchmarks/bench_fleet.py --pg-url postgresql+psycopg://postgres@127.0.0.1:PORT/db \
        --workers 1,2,4,8 --trials 96 --scale 0.125 --samplers auto,random --json /tmp/fleet.json

For each sampler and each worker count N: a fresh database on the server of ``--pg-url``
(default: ``SPECTUNE_TEST_PG_URL``; dropped afterwards), its study where a sweep keeps it
(:func:`~spectune.search._storage.studies_beside`: the ``spectune_studies`` schema,
through the retrying storage), and N worker processes running one
:class:`~spectune.search.Search` on it until the study holds ``--trials`` charged
evaluations. The objective replays a recorded tuning space (``--space``, a T4 file): each
evaluation answers the recorded time and sleeps the recorded compile time plus the
recorded runs, times ``--scale``, as a real trial would spend them on a GPU.

Reports per N the study's trials per second (charged evaluations over the wall time from
the moment all workers start to the last evaluation recorded) and its ratio to linear
scaling, ``trials/s(N) / (N * trials/s(1))``: 1.0 is perfect. Since a strategy draws
configs of different recorded costs at different N, ``busy`` (the share of the workers'
time spent in evaluations) and its ratio to N=1's say the same without that noise.

What keeps it below linear is the engine's own time per trial: about 8 storage calls
(the study read twice, the trial created with its parameters and owner in one call, the
result), some 0.1 s of CPU per trial in the worker plus the server's, and the strategy's
proposal (``auto``'s Gaussian process: 0.17 s of CPU). N workers need about
``N * cpu / (evaluation + overhead)`` cores for that; when the machine has fewer free
(``worker cores`` shows the workers' share), every call waits for a core and scaling
flattens: that is the machine's limit, not the study's. ``skipped proposals`` counts
proposals that collided with another worker's (not charged). ``BENCH_FLEET_PROFILE=DIR``
writes a cProfile per worker. Prints a Markdown table; ``--json`` writes the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "tuning-spaces"
DEFAULT_SPACE = SHARED / "convolution_A100_T4.json.gz"
STUDY = "fleet"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pg-url", default=os.environ.get("SPECTUNE_TEST_PG_URL"),
                        help="a PostgreSQL URL on the server to use (default: "
                        "SPECTUNE_TEST_PG_URL); a fresh database is made per run")
    parser.add_argument("--workers", default="1,2,4,8", help="worker counts, comma-separated")
    parser.add_argument("--trials", type=int, default=96, help="charged evaluations per run")
    parser.add_argument("--scale", type=float, default=0.125,
                        help="seconds slept per recorded second of compile and runs")
    parser.add_argument("--samplers", default="auto", help="strategies, comma-separated")
    parser.add_argument("--space", type=Path, default=DEFAULT_SPACE, help="a T4 file")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument("--worker", nargs=2, metavar=("STORAGE", "SEED"),
                        help=argparse.SUPPRESS)  # one worker process (internal)
    parser.add_argument("--sampler", default="auto", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return _worker(args, storage=args.worker[0], seed=int(args.worker[1]))
    if not args.pg_url:
        parser.error("give --pg-url or set SPECTUNE_TEST_PG_URL")
    counts = [int(n) for n in args.workers.split(",") if n]
    if not counts or min(counts) < 1 or args.trials < 1 or args.scale < 0:
        parser.error("--workers, --trials must be positive and --scale >= 0")

    import optuna

    from spectune.search.replay import load_t4

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space = load_t4(args.space)
    costs = [_sleep_of(r, args.scale) for r in space.records.values()]
    mean_eval = statistics.fmean(costs)
    print(f"space {space.name}: {len(costs)} configs, one evaluation sleeps "
          f"{mean_eval:.3f} s on average (scale {args.scale}); {args.trials} trials per run; "
          f"{os.cpu_count()} CPUs", flush=True)
    runs: list[dict[str, Any]] = []
    for sampler in [s for s in args.samplers.split(",") if s]:
        for n in counts:
            run = _run(args, sampler=sampler, workers=n)
            runs.append(run)
            print(f"  {sampler:8s} {n} workers: {run['trials']} trials in {run['wall_s']:.2f} s "
                  f"= {run['trials_per_s']:.2f}/s", flush=True)
    for run in runs:
        base = next((r for r in runs if r["sampler"] == run["sampler"] and r["workers"] == 1),
                    None)
        run["vs_linear"] = (None if base is None else
                            run["trials_per_s"] / (run["workers"] * base["trials_per_s"]))
        # --scale 0 sleeps nothing: no busy time to compare ("-").
        run["busy_vs_linear"] = (None if base is None or not base["busy"] else
                                 run["busy"] / base["busy"])
    print()
    print(table(runs))
    if args.json:
        args.json.write_text(json.dumps({
            "space": space.name, "scale": args.scale, "mean_eval_s": mean_eval,
            "trials": args.trials, "cpus": os.cpu_count(), "runs": runs}, indent=1))
    return 0


def table(runs: list[dict[str, Any]]) -> str:
    """The runs as a Markdown table."""
    lines = [
        "| sampler | workers | trials | wall s | trials/s | vs linear | busy | vs linear (busy) "
        "| engine s/trial | worker CPU s/trial | worker cores | skipped proposals |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        linear = "-" if r.get("vs_linear") is None else f"{r['vs_linear']:.2f}x"
        busy = "-" if r.get("busy_vs_linear") is None else f"{r['busy_vs_linear']:.2f}x"
        skipped = sum(r["skipped"].values())
        lines.append(
            f"| {r['sampler']} | {r['workers']} | {r['trials']} | {r['wall_s']:.2f} "
            f"| {r['trials_per_s']:.2f} | {linear} | {r['busy']:.2f} | {busy} "
            f"| {r['engine_s_per_trial']:.3f} | {r['cpu_s_per_trial']:.3f} "
            f"| {r['worker_cores']:.2f} | {skipped} |"
        )
    return "\n".join(lines)


def _sleep_of(record: Any, scale: float) -> float:
    """What one evaluation of ``record`` sleeps: its compile time and runs, scaled."""
    return (record.compile_time + sum(record.runtimes)) / 1000.0 * scale


def _run(args: argparse.Namespace, *, sampler: str, workers: int) -> dict[str, Any]:
    """One study on a fresh database, run by ``workers`` processes."""
    from sqlalchemy import create_engine
    from sqlalchemy.engine import make_url

    from spectune.search import Search, studies_beside
    from spectune.search.replay import load_t4

    base = make_url(args.pg_url)
    name = f"spectune_fleet_{uuid.uuid4().hex[:10]}"
    admin = create_engine(base, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.exec_driver_sql(f'CREATE DATABASE "{name}"')
    try:
        db = base.set(database=name).render_as_string(hide_password=False)
        storage = studies_beside(db)
        # Created before the workers start, so that they only join it.
        engine = Search(space=load_t4(args.space).space, storage=storage, study_name=STUDY)
        procs = [_spawn(args, storage, sampler, seed=args.seed + 1000 * i + 1)
                 for i in range(workers)]
        for proc in procs:  # imported, connected, the study opened: ready
            line = proc.stdout.readline()  # type: ignore[union-attr]
            if line.strip() != "ready":
                raise SystemExit(f"worker failed to start: {line}{proc.stderr.read()}")  # type: ignore[union-attr]
        for proc in procs:
            proc.stdin.write("go\n")  # type: ignore[union-attr]
            proc.stdin.flush()  # type: ignore[union-attr]
        reports = []
        for proc in procs:
            out, err = proc.communicate(timeout=3600)
            if proc.returncode != 0:
                raise SystemExit(f"worker failed: {err[-2000:]}")
            reports.append(json.loads(out.strip().splitlines()[-1]))
        history = engine.history()
        skipped: dict[str, int] = {}
        for t in engine.study.get_trials(deepcopy=False):
            status = str(t.user_attrs.get("spectune.status", "ok"))
            if status not in ("ok", "fail", "invalid"):
                skipped[status] = skipped.get(status, 0) + 1
        # Until the study's last evaluation was recorded (not until the last worker
        # noticed and left): the study's throughput.
        done = max(t.datetime_complete for t in engine.study.get_trials(deepcopy=False)
                   if t.datetime_complete is not None)
        wall = done.timestamp() - min(r["go"] for r in reports)
        slept = sum(r["slept"] for r in reports)
        cpu = sum(r["cpu"] for r in reports)
        charged = len(history)
        return {
            "sampler": sampler, "workers": workers, "trials": charged, "wall_s": wall,
            "trials_per_s": charged / wall,
            # The share of the workers' time spent evaluating (sleeping): the figure
            # perfect scaling keeps, whichever configs (and so sleeps) a run drew.
            "busy": slept / (workers * wall),
            "per_worker_evaluations": [r["new"] for r in reports],
            # Time a worker spent on anything but the objective's sleep, per trial.
            "engine_s_per_trial": (workers * wall - slept) / max(charged, 1),
            # CPU the workers' processes used per trial, and the cores they kept busy.
            "cpu_s_per_trial": cpu / max(charged, 1),
            "worker_cores": cpu / wall,
            "skipped": skipped,
            "distinct_configs": len({json.dumps(r.config, sort_keys=True) for r in history}),
        }
    finally:
        with admin.connect() as connection:
            connection.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()


def _spawn(args: argparse.Namespace, storage: str, sampler: str, *, seed: int
           ) -> subprocess.Popen[str]:
    command = [sys.executable, str(Path(__file__).resolve()), "--worker", storage, str(seed),
               "--sampler", sampler, "--space", str(args.space), "--trials", str(args.trials),
               "--scale", str(args.scale)]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.Popen(command, cwd=ROOT, env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _worker(args: argparse.Namespace, *, storage: str, seed: int) -> int:
    """One worker: open the study, say ready, wait for go, search, report as JSON."""
    import optuna

    from spectune.search import FAILURE_KINDS, Outcome, Search
    from spectune.search.replay import load_t4

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    space = load_t4(args.space)
    slept = 0.0

    def objective(config: dict[str, int]) -> Outcome:
        nonlocal slept
        record = space.lookup(config)
        pause = _sleep_of(record, args.scale)
        time.sleep(pause)
        slept += pause
        if not record.ok or record.time is None:
            kind = record.status if record.status in FAILURE_KINDS else "other"
            return Outcome.failed(kind, record.status)
        return Outcome.ok(record.time)

    engine = Search(space=space.space, storage=storage, study_name=STUDY,
                    sampler=args.sampler, seed=seed)
    print("ready", flush=True)
    sys.stdin.readline()
    go, cpu = time.time(), time.process_time()
    if os.environ.get("BENCH_FLEET_PROFILE"):  # a folder: one cProfile dump per worker
        import cProfile

        with cProfile.Profile() as profile:
            result = engine.run(objective, max_evals=args.trials)
        profile.dump_stats(Path(os.environ["BENCH_FLEET_PROFILE"]) / f"{os.getpid()}.prof")
    else:
        result = engine.run(objective, max_evals=args.trials)
    print(json.dumps({"go": go, "end": time.time(), "new": result.new_evaluations,
                      "slept": slept, "cpu": time.process_time() - cpu}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
