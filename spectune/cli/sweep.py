"""``spectune sweep``: tune every requested problem on the current device."""

from __future__ import annotations

import sys

import click

__all__ = ["sweep"]


@click.command()
@click.option("--kernel", "kernels", multiple=True, default=("rejection_sample",),
              show_default=True, help="Kernel family (repeatable).")
@click.option("--spec-lens", default="1-8", show_default=True, help="k values: 1-8 or 1,2,4.")
@click.option("--batch-sizes", default="1,8,64", show_default=True,
              help="Batch sizes (looked up at their power-of-two bucket).")
@click.option("--vocab-sizes", default="128256", show_default=True, help="Vocabulary sizes.")
@click.option("--dtype", "dtypes", multiple=True, default=("float32",), show_default=True,
              type=click.Choice(["float32", "bfloat16", "float16"]), help="Logits dtype.")
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
              help="Search strategy: auto (= gp-ts), gp-ts, tpe+gp-tr, gp-tr, gp, tpe or random.")
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
    import optuna
    from rich.console import Console

    from spectune.autotune.problems import parse_int_list, sweep_items
    from spectune.autotune.sweep import SweepOptions, default_storage
    from spectune.db import DatabaseError, batch_bucket
    from spectune.identity import detect_device
    from spectune.kernels import FAMILIES

    # The progress bars say what Optuna's per-trial INFO lines would.
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    console = Console(stderr=True)
    try:
        for name in kernels:
            if name not in FAMILIES:
                raise ValueError(f"--kernel: unknown kernel family {name!r}; "
                                 f"known: {sorted(FAMILIES)}")
        batches = parse_int_list(batch_sizes, name="--batch-sizes")
        buckets = sorted({batch_bucket(b) for b in batches})
        if buckets != batches:
            console.print(f"batch sizes {batches} tuned at their buckets {buckets}")
        items = sweep_items(
            kernels=kernels, spec_lens=parse_int_list(spec_lens, name="--spec-lens"),
            batches=buckets, vocabs=parse_int_list(vocab_sizes, name="--vocab-sizes"),
            dtypes=dtypes, draft_probs=(not no_draft_probs,),
        )
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    options = SweepOptions(trials=trials, time_budget=time_budget, patience=patience, db=db,
                           storage=storage or str(default_storage()), workers=workers,
                           sampler=sampler, seed=seed)
    device = detect_device()
    console.print(f"[bold]device[/]: {device.describe()}")
    console.print(f"[bold]studies[/]: {len(items)} in {options.storage}")
    if device.backend == "cpu-interpreter":
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


def _run(items, options, console):  # type: ignore[no-untyped-def]
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from spectune.autotune._engine import SearchObserver
    from spectune.autotune.sweep import run_item

    results = []
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn(), TextColumn("{task.fields[best]}"))
    with Progress(*columns, console=console, transient=False) as progress:
        overall = progress.add_task("problems", total=len(items), best="")

        class _Bar(SearchObserver):
            def __init__(self, task: int) -> None:
                self.task = task

            def on_start(self, search, *, evaluations, max_evals):  # type: ignore[no-untyped-def]
                progress.update(self.task, completed=evaluations, total=max_evals)

            def on_trial(self, p):  # type: ignore[no-untyped-def]
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


def _print_table(results) -> None:  # type: ignore[no-untyped-def]
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
