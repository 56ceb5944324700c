"""``spectune nightly JOB.toml``: a night of tuning, within a budget, with a report.

Loading this module imports only click: ``spectune --help`` loads every command module.
"""

from __future__ import annotations

import re
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from spectune.cli._tuner import import_tuner

if TYPE_CHECKING:
    from spectune.tuning import NightlyJob
    from spectune.tuning.nightly import NightReport

__all__ = ["nightly"]


@click.command()
@click.argument("job_file", metavar="JOB.toml", type=click.Path(dir_okay=False))
@click.option("--db", "databases", multiple=True, metavar="URL",
              help="Database(s) to check and tune instead of the job's (repeatable).")
@click.option("--budget", help="Wall time of the night instead of the job's (3600, 90m, 6h).")
@click.option("--report-dir", type=click.Path(file_okay=False),
              help="Where the report goes instead of the job's report_dir.")
@click.option("--shard", default="0/1", show_default=True, metavar="I/N",
              help="Take only shard I of N of the shapes (N GPUs of one model sharing a job, "
                   "e.g. a Kubernetes indexed Job: --shard $(JOB_COMPLETION_INDEX)/N).")
@click.option("--isolate/--no-isolate", default=None,
              help="Run each trial in a child process with a watchdog (default: on GPUs).")
@click.option("--dry-run", is_flag=True,
              help="Print the plan (what would be tuned, re-tuned, re-checked, in order) "
                   "and exit; nothing is measured or written.")
@click.option("--json", "as_json", is_flag=True,
              help="Print the night's report as JSON on stdout.")
def nightly(job_file: str, databases: tuple[str, ...], budget: str | None,
            report_dir: str | None, shard: str, isolate: bool | None, dry_run: bool,
            as_json: bool) -> None:
    """Find and do tonight's tuning work in each database of JOB.toml.

    Shapes with no row for this device, and rows made stale by a change of Triton,
    torch, GPU runtime, driver, kernel source or search space, are tuned first; then
    rows an earlier night found regressed are re-tuned; then tuned rows are re-checked,
    oldest first: gated against the reference and timed against the default side by
    side, flagged as regressed when no longer faster by the promotion rule or slower
    than recorded by more than the measured spread. Stops starting work when the budget
    is spent (the next night resumes), records every night in the database's history and
    writes a report (Markdown, HTML with plots, JSON).

    Exit status: 0 clean, 1 a regression or failure needs a person, 2 usage error
    (including a bad job file).
    """
    optuna = import_tuner("optuna", command="nightly")
    import_tuner("spectune.tuning.nightly", command="nightly")
    from spectune.tuning import JobError, load_job, parse_duration

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        job = load_job(job_file)
        if budget is not None:
            job = _with(job, budget=parse_duration(budget, where="--budget"))
    except JobError as exc:
        raise click.UsageError(str(exc)) from None
    if databases:
        job = _with(job, databases=tuple(databases))
    if report_dir is not None:
        job = _with(job, report_dir=Path(report_dir))
    shard_of = _shard(shard)
    if dry_run:
        _dry_run(job, shard=shard_of, as_json=as_json)
        return
    with _sigterm_as_interrupt():
        status = _night(job, shard=shard_of, isolate=isolate, as_json=as_json)
    sys.exit(status)


def _with(job: NightlyJob, **changes: Any) -> NightlyJob:
    from dataclasses import replace

    return replace(job, **changes)


def _shard(text: str) -> tuple[int, int]:
    match = re.fullmatch(r"(\d{1,6})/(\d{1,6})", text.strip())
    if not match or not 0 <= int(match.group(1)) < int(match.group(2)):
        raise click.BadParameter(f"expected I/N with 0 <= I < N, got {text!r}",
                                 param_hint="'--shard'")
    return int(match.group(1)), int(match.group(2))


@contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """systemd and Kubernetes stop a job with SIGTERM: stop as on Ctrl-C (the night is
    closed as interrupted, its report written, finished trials kept)."""

    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _environment() -> tuple[Any, Any, str]:
    from spectune.identity import detect_device, detect_driver, detect_software

    return detect_device(), detect_software(), detect_driver()


def _console() -> Any:
    from rich.console import Console

    return Console(stderr=True)


def _dry_run(job: NightlyJob, *, shard: tuple[int, int], as_json: bool) -> None:
    import json

    from spectune.cli._nightly_report import shape_label
    from spectune.db import DatabaseError, open_store, parse_target
    from spectune.tuning.nightly import plan_night

    device, software, driver = _environment()
    console = _console()
    plans = []
    for database in job.databases:
        try:
            url = parse_target(database)
            # A database that does not exist yet is not created by a dry run.
            store = None if url.absent else open_store(url, readonly=True)
            try:
                work = plan_night(job, store=store, device=device, software=software,
                                  driver=driver, shard=shard)
            finally:
                if store is not None:
                    store.close()
        except (DatabaseError, ValueError) as exc:
            raise click.ClickException(f"{database}: {exc}") from None
        plans.append((database, work))
    if as_json:
        click.echo(json.dumps([{"database": db, "work": [
            {"kernel": w.item.kernel, "problem": shape_label(w.item.kernel, w.item.problem),
             "action": w.action, "why": w.why, "reason": w.reason} for w in work]}
            for db, work in plans], indent=2))
        return
    console.print(f"device: {device.describe()}; driver {driver}")
    for database, work in plans:
        console.print(f"[bold]{database}[/]: {len(work)} shapes to do, in this order "
                      f"(budget {job.budget:.0f} s)")
        for i, w in enumerate(work, 1):
            click.echo(f"{i:4d}. {w.action:<8} {shape_label(w.item.kernel, w.item.problem)}"
                       f"  ({w.reason})")


def _night(job: NightlyJob, *, shard: tuple[int, int], isolate: bool | None,
           as_json: bool) -> int:
    import json
    import time

    from spectune.cli._nightly_report import report_json, shape_label, write_report
    from spectune.db import DatabaseError, night_results, open_store
    from spectune.identity import CPU_BACKEND
    from spectune.messages import one_line
    from spectune.tuning.nightly import NightInterrupted, NightReport, run_night

    device, software, driver = _environment()
    console = _console()
    console.print(f"[bold]device[/]: {device.describe()}; driver {driver}")
    if device.backend == CPU_BACKEND:
        console.print("[yellow]timings are Triton-interpreter wall time on CPU, not GPU "
                      "figures[/]")
    use_isolation = device.backend != CPU_BACKEND if isolate is None else isolate
    started = time.monotonic()
    reports: list[NightReport] = []
    history: dict[str, list[Any]] = {}
    interrupted = False
    for database in job.databases:
        left = job.budget - (time.monotonic() - started)
        storage = job.storage or _studies_for(database)

        def on_work(work: Any, position: int, total: int) -> None:
            console.print(f"[{position}/{total}] {work.action} "
                          f"{shape_label(work.item.kernel, work.item.problem)} ({work.reason})")

        def on_result(result: Any) -> None:
            speed = "" if result.speedup is None else f", {result.speedup:.2f}x"
            if result.vs_vllm_ratio is not None:
                speed += f", {result.vs_vllm_ratio:.2f}x vs vLLM"
            style = "red" if result.verdict in ("regressed", "broken", "failed") else "green"
            console.print(f"    -> [{style}]{result.verdict}[/]{speed} ({result.seconds:.1f} s)")

        try:
            report = run_night(job, database=database, storage=storage, device=device,
                               software=software, driver=driver, budget=max(left, 0.0),
                               shard=shard, isolate=use_isolation, on_work=on_work,
                               on_result=on_result)
        except KeyboardInterrupt as exc:
            interrupted = True
            console.print("[yellow]interrupted[/]: the night is recorded as interrupted; "
                          "finished trials are kept, the next night resumes")
            if isinstance(exc, NightInterrupted):
                reports.append(exc.report)
            break
        except (DatabaseError, OSError) as exc:
            report = NightReport(job=job.name, database=database, device=device,
                                 software=software, driver=driver, budget=max(left, 0.0),
                                 started=datetime.now(timezone.utc), status="failed",
                                 error=one_line(exc, limit=400))
            console.print(f"[red]{database}: {report.error}[/]")
        reports.append(report)
        if report.run is not None:
            try:
                with open_store(database) as store:
                    history[database] = night_results(store, device=device)
            except DatabaseError:
                history[database] = list(report.results)
    needs = any(r.needs_person or r.error for r in reports)
    status = 1 if needs else 0
    files: dict[str, str] = {}
    if reports:
        stamp = reports[0].started.strftime("%Y%m%d-%H%M%S")
        out = job.report_dir / f"{_safe(job.name)}-{stamp}"
        files = write_report(reports, out=out, history=history, exit_status=status)
        console.print(f"report: {files['html']} ({files['markdown']})")
    if as_json:
        click.echo(json.dumps(report_json(reports, exit_status=status, files=files), indent=2))
    if interrupted:
        return 130
    return status


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-") or "job"


def _studies_for(database: str) -> str:
    from spectune.tuning.sweep import default_storage

    return default_storage(database)
