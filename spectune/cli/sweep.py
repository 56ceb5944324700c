"""``spectune sweep``: tune every requested problem on the current device.

Loading this module imports only click: ``spectune --help`` loads every command module.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import click

from spectune.cli._tuner import LazyChoice, import_tuner, strategy_names
from spectune.identity import CPU_BACKEND
from spectune.space import DTYPES

if TYPE_CHECKING:
    from rich.console import Console

    from spectune.autotune.problems import SweepItem
    from spectune.autotune.sweep import SweepOptions, SweepResult

__all__ = ["sweep"]


def _sweep_strategies() -> list[str]:
    return strategy_names(command="sweep")


def _kernel_names() -> list[str]:
    return sorted(import_tuner("spectune.kernels", command="sweep").FAMILIES)


@click.command()
@click.option("--kernel", "kernels", multiple=True, default=("rejection_sample",),
              show_default=True, type=LazyChoice(_kernel_names),
              help="Kernel family (repeatable).")
@click.option("--spec-lens", default="1-8", show_default=True, help="k values: 1-8 or 1,2,4.")
@click.option("--batch-sizes", default="1,8,64", show_default=True,
              help="Batch sizes (looked up at their power-of-two bucket).")
@click.option("--vocab-sizes", default="128256", show_default=True, help="Vocabulary sizes.")
@click.option("--dtype", "dtypes", multiple=True, default=("float32",), show_default=True,
              type=click.Choice(DTYPES), help="Logits dtype.")
@click.option("--no-draft-probs", is_flag=True, help="Tune for drafters without probabilities.")
@click.option("--trials", type=click.IntRange(min=1), default=30, show_default=True,
              help="Evaluations per study.")
@click.option("--time-budget", type=click.FloatRange(min=0, min_open=True),
              help="Seconds per study.")
@click.option("--patience", type=click.IntRange(min=1),
              help="Stop a study after N evaluations without improvement.")
@click.option("--db", help="Configs database (URL or path); default: SPECTUNE_DB or the user DB.")
@click.option("--storage", help="Optuna storage: journal file path or RDB URL "
              "(default: a journal file next to the user database).")
@click.option("--workers", type=click.IntRange(min=1), default=1, show_default=True,
              help="Processes sharing each study.")
@click.option("--sampler", default="auto", show_default=True,
              type=LazyChoice(_sweep_strategies),
              help="Search strategy (auto: the recommended one).")
@click.option("--seed", default=0, show_default=True, help="Seed of inputs and sampler.")
def sweep(
    kernels: tuple[str, ...], spec_lens: str, batch_sizes: str, vocab_sizes: str,
    dtypes: tuple[str, ...], no_draft_probs: bool, trials: int, time_budget: float | None,
    patience: int | None, db: str | None, storage: str | None, workers: int, sampler: str,
    seed: int,
) -> None:
    """Tune the kernels for each (kernel, k, batch, vocab, dtype) on this device.

    Each problem gets one Optuna study (resumed when rerun); every trial must give the
    reference's exact result before it is timed; a config is written to the database
    only when faster than the current row or the default by the promotion rule.
    Ctrl-C stops cleanly: finished trials are kept, and a rerun resumes.
    """
    optuna = import_tuner("optuna", command="sweep")
    import_tuner("spectune.autotune.sweep", command="sweep")
    from rich.console import Console

    from spectune.autotune.problems import as_looked_up, parse_int_list, sweep_items
    from spectune.autotune.sweep import SweepOptions, default_storage
    from spectune.db import DatabaseError, batch_bucket
    from spectune.identity import detect_device

    # The progress bars say what Optuna's per-trial INFO lines would.
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    console = Console(stderr=True)
    try:
        batches = parse_int_list(batch_sizes, name="--batch-sizes")
        buckets = sorted({batch_bucket(b) for b in batches})
        if buckets != batches:
            console.print(f"batch sizes {batches} tuned at their buckets {buckets}")
        items = as_looked_up(sweep_items(
            kernels=kernels, spec_lens=parse_int_list(spec_lens, name="--spec-lens"),
            batches=buckets, vocabs=parse_int_list(vocab_sizes, name="--vocab-sizes"),
            dtypes=dtypes, draft_probs=(not no_draft_probs,),
        ))
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    options = SweepOptions(trials=trials, time_budget=time_budget, patience=patience, db=db,
                           storage=storage or str(default_storage()), workers=workers,
                           sampler=sampler, seed=seed)
    device = detect_device()
    console.print(f"[bold]device[/]: {device.describe()}")
    console.print(f"[bold]studies[/]: {len(items)} in {options.storage}")
    if device.backend == CPU_BACKEND:
        console.print("[yellow]timings are Triton-interpreter wall time on CPU, not GPU "
                      "figures[/]")
    try:
        results = _run(items, options, console)
    except KeyboardInterrupt:
        console.print(f"[yellow]interrupted[/]: finished trials are kept in {options.storage}; "
                      "rerun the same command to resume")
        sys.exit(130)
    except DatabaseError as exc:
        raise click.ClickException(str(exc)) from None
    _print_table(results)


def _run(items: list[SweepItem], options: SweepOptions, console: Console) -> list[SweepResult]:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from spectune.autotune import Search, SearchObserver, SearchProgress
    from spectune.autotune.sweep import run_item

    results: list[SweepResult] = []
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn(), TextColumn("{task.fields[best]}"))
    with Progress(*columns, console=console, transient=False) as progress:
        overall = progress.add_task("problems", total=len(items), best="")

        class _Bar(SearchObserver):
            def __init__(self, task: int) -> None:
                self.task = task

            def on_start(
                self, search: Search, *, evaluations: int, max_evals: int | None
            ) -> None:
                progress.update(self.task, completed=evaluations, total=max_evals)

            def on_trial(self, p: SearchProgress) -> None:
                best = f"best {p.best.time:.1f} us" if p.best and p.best.time else ""
                progress.update(self.task, completed=p.evaluations, best=best)

        for item in items:
            p = item.problem
            label = (f"{item.kernel} k={p.spec_len} B={p.batch} V={p.vocab} {p.dtype}"
                     f"{'' if p.draft_probs else ' no-dp'}")
            task = progress.add_task(label, total=options.trials, best="")
            results.append(run_item(item, options=options, observers=[_Bar(task)]))
            progress.update(overall, advance=1)
    return results


def _print_table(results: list[SweepResult]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="sweep results (µs: p50; default vs best, measured side by side)")
    for name in ("kernel", "k", "batch", "vocab", "dtype", "default µs", "best µs",
                 "speedup", "trials", "fail/invalid", "database", "config"):
        table.add_column(name, justify="right" if name in ("k", "batch", "vocab") else "left")
    for r in results:
        p = r.item.problem
        table.add_row(
            r.item.kernel, str(p.spec_len), str(p.batch), str(p.vocab), p.dtype,
            f"{r.default.p50:.1f}" if r.default else "-",
            f"{r.best.p50:.1f}" if r.best else "-",
            f"{r.speedup:.2f}x" if r.speedup else "-",
            str(r.trials), f"{r.failed}/{r.invalid}", r.promoted,
            " ".join(f"{k}={v}" for k, v in (r.best_config or {}).items()),
        )
    Console().print(table)
