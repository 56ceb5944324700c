"""``spectune sweep``: tune every requested problem on the current device.

Loading this module imports only click: ``spectune --help`` loads every command module.
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING

import click
from click.core import ParameterSource

from spectune.cli._tuner import LazyChoice, import_tuner, strategy_names
from spectune.identity import CPU_BACKEND
from spectune.space import DTYPES

if TYPE_CHECKING:
    from rich.console import Console

    from spectune.kernels import KernelFamily
    from spectune.tuning.problems import SweepItem
    from spectune.tuning.sweep import SweepOptions, SweepResult

__all__ = ["sweep"]


def _sweep_strategies() -> list[str]:
    return strategy_names(command="sweep")


def _kernel_names() -> list[str]:
    return sorted(import_tuner("spectune.kernels", command="sweep").FAMILIES)


@click.command()
@click.option("--kernel", "kernels", multiple=True, default=("rejection_sample",),
              show_default=True, type=LazyChoice(_kernel_names),
              help="Kernel family (repeatable).")
@click.option("--spec-lens", default="1-8", show_default=True,
              help="k values: 1-8 or 1,2,4 (at most the kernels' declared limit).")
@click.option("--batch-sizes", default="1,8,64", show_default=True,
              help="Batch sizes (looked up at their power-of-two bucket; at most the "
                   "kernels' declared limit).")
@click.option("--vocab-sizes", default="128256", show_default=True,
              help="Vocabulary sizes (at most the kernels' declared limit).")
@click.option("--dtype", "dtypes", multiple=True, default=("float32",), show_default=True,
              type=click.Choice(DTYPES), help="Logits dtype.")
@click.option("--no-draft-probs", is_flag=True, help="Tune for drafters without probabilities.")
@click.option("--trials", type=click.IntRange(min=1), default=30, show_default=True,
              help="Evaluations per study (at most the configs a requested space declares).")
@click.option("--time-budget", type=click.FloatRange(min=0, min_open=True),
              help="Seconds per study (finite).")
@click.option("--patience", type=click.IntRange(min=1),
              help="Stop a study after N evaluations without improvement (at most the "
                   "configs a requested space declares).")
@click.option("--db", help="Configs database (URL or path); default: SPECTUNE_DB or the user DB.")
@click.option("--storage", help="Optuna storage: journal file path or RDB URL (default: "
              "where the configs live: NAME.studies.journal beside a SQLite --db, the schema "
              "spectune_studies of a PostgreSQL --db).")
@click.option("--workers", type=click.IntRange(min=1), default=1, show_default=True,
              help="Processes sharing each study (at most four per CPU core).")
@click.option("--sampler", default="auto", show_default=True,
              type=LazyChoice(_sweep_strategies),
              help="Search strategy (auto: the recommended one).")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True,
              help="Seed of inputs and sampler (below 2**31).")
@click.option("--finalists", type=click.IntRange(min=1), default=3, show_default=True,
              help="The study's fastest configs (its best and runners-up within 1.5x of "
              "its time) measured again side by side before promotion, so that one noisy "
              "timing window does not pick the best; 1 takes the study's best as timed.")
@click.option("--transfer/--no-transfer", default=True, show_default=True,
              help="Let each study try what the database knows first: the best configs of "
              "neighbouring problems on this device and of other GPU models, dropped "
              "once they stop improving.")
@click.option("--isolate/--no-isolate", default=None,
              help="Run each trial in a child process with a watchdog, so a crash, an abort "
              "or a hung kernel fails the trial, not the sweep (default: on GPUs, not under "
              "the CPU interpreter).")
@click.option("--vs-vllm/--no-vs-vllm", "vs_vllm", default=True, show_default=True,
              help="Measure the config serving each shape beside the installed vLLM's own "
              "function (same inputs, same tokens checked, side by side) and record the "
              "verdict: the plugin routes a shape only where spectune was faster.")
@click.option("--json", "as_json", is_flag=True,
              help="Print the results as one JSON list on stdout, nothing else (progress "
              "and notes stay on stderr).")
@click.option("--wide", is_flag=True,
              help="The results table with every column, as wide as it needs (lines may "
              "pass the terminal's width).")
def sweep(
    kernels: tuple[str, ...], spec_lens: str, batch_sizes: str, vocab_sizes: str,
    dtypes: tuple[str, ...], no_draft_probs: bool, trials: int, time_budget: float | None,
    patience: int | None, db: str | None, storage: str | None, workers: int, sampler: str,
    seed: int, finalists: int, transfer: bool, isolate: bool | None, vs_vllm: bool,
    as_json: bool, wide: bool,
) -> None:
    """Tune the kernels for each (kernel, k, batch, vocab, dtype) on this device.

    Each problem gets one Optuna study (resumed when rerun); every trial must give the
    reference's exact result before it is timed; the study's best and its closest
    runners-up are measured again side by side (--finalists); a config is written to the
    database only when faster than the current row or the default by the promotion rule,
    the two measured side by side until the rule decides (a best the database already
    holds is "up to date"). Then the config serving each shape (the row's, else the
    default) is measured side by side with the installed vLLM's own function, and the
    verdict recorded on the row (a shape the default serves gets a row for it); without
    vLLM the verdicts read "not measured". Numbers past the kernels' declared limits are
    refused before anything runs. Ctrl-C stops cleanly: finished trials are kept, and a
    rerun resumes.

    The results table fits an 80-column terminal (the problem, its best config below it,
    default and best p50, speedup, vLLM's p50 over the serving config's, the database's
    verdict); --wide shows every column, --json prints the results as JSON instead.
    """
    optuna = import_tuner("optuna", command="sweep")
    import_tuner("spectune.tuning.sweep", command="sweep")
    from rich.console import Console

    from spectune.db import DatabaseError, batch_bucket
    from spectune.identity import detect_device
    from spectune.kernels import get_family
    from spectune.search import StorageUnavailableError, display_storage
    from spectune.tuning import WorkerStartError
    from spectune.tuning.problems import as_looked_up, sweep_items
    from spectune.tuning.sweep import MAX_SEED, SweepOptions, default_storage, max_workers

    # The progress bars say what Optuna's per-trial INFO lines would.
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    console = Console(stderr=True)
    # Every number is checked before anything is made or run: inputs past the kernels'
    # limits take minutes and gigabytes before anything fails.
    families = {name: get_family(name) for name in kernels}
    k_values = _bounded_ints(spec_lens, option="--spec-lens", dimension="spec_len",
                             families=families)
    batches = _bounded_ints(batch_sizes, option="--batch-sizes", dimension="batch",
                            families=families)
    vocabs = _bounded_ints(vocab_sizes, option="--vocab-sizes", dimension="vocab",
                           families=families)
    _at_most(seed, MAX_SEED, option="--seed", why="the samplers' seeds")
    _at_most(workers, max_workers(), option="--workers", why="four per CPU core")
    if time_budget is not None and not math.isfinite(time_budget):
        raise click.BadParameter(f"{time_budget} is not a finite number of seconds",
                                 param_hint=_hint("--time-budget"))
    device = detect_device()
    _check_evaluations(trials=trials, patience=patience, families=families,
                       backend=device.backend)
    try:
        options = SweepOptions(trials=trials, time_budget=time_budget, patience=patience,
                               db=db, storage=storage or default_storage(db),
                               workers=workers, sampler=sampler, seed=seed,
                               finalists=finalists, transfer=transfer, isolate=isolate,
                               vs_vllm=vs_vllm)
        buckets = sorted({batch_bucket(b) for b in batches})
        if buckets != batches:
            console.print(f"batch sizes {batches} tuned at their buckets {buckets}")
        with _memory_for_inputs():
            items = as_looked_up(sweep_items(
                kernels=kernels, spec_lens=k_values, batches=buckets, vocabs=vocabs,
                dtypes=dtypes, draft_probs=(not no_draft_probs,),
            ))
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    console.print(f"[bold]device[/]: {device.describe()}")
    shown = display_storage(options.storage or "")  # never a password on screen
    console.print(f"[bold]studies[/]: {len(items)} in {shown}")
    if device.backend == CPU_BACKEND:
        console.print("[yellow]timings are Triton-interpreter wall time on CPU, not GPU "
                      "figures[/]")
    try:
        with _memory_for_inputs():
            results = _run(items, options, console)
    except KeyboardInterrupt:
        console.print(f"[yellow]interrupted[/]: finished trials are kept in {shown}; "
                      "rerun the same command to resume")
        sys.exit(130)
    except (DatabaseError, WorkerStartError, StorageUnavailableError) as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(_results_json(results, storage=shown,
                                 device_name=device.device_name))
    else:
        _print_table(results, wide=wide)


@contextmanager
def _memory_for_inputs() -> Iterator[None]:
    """One line, not a traceback, when a problem within the kernels' limits still needs
    more memory for its inputs than this machine (or its GPU) has."""
    from spectune.messages import one_line

    try:
        yield
    except (MemoryError, RuntimeError) as exc:
        # torch's allocators say so in their messages (CUDA's OutOfMemoryError is a
        # RuntimeError); any other RuntimeError is a bug to see in full.
        text = str(exc).lower()
        if not isinstance(exc, MemoryError) and not any(
            phrase in text for phrase in ("can't allocate memory", "out of memory")
        ):
            raise
        raise click.ClickException(
            f"a requested problem's inputs do not fit in memory ({one_line(exc, limit=160)}); "
            "ask for smaller --spec-lens, --batch-sizes or --vocab-sizes"
        ) from None


# What each Problem dimension is called in messages.
_DIMENSIONS = {"spec_len": "speculation length", "batch": "batch", "vocab": "vocabulary"}


def _bounded_ints(
    text: str, *, option: str, dimension: str, families: Mapping[str, KernelFamily]
) -> list[int]:
    """The values of ``text`` (``1-8``, ``1,8,64``), each within the limit every family
    declares for ``dimension`` (a :class:`~spectune.kernels.ProblemLimits` field).

    The numbers are checked as written, before a range is expanded: ``1-10**20`` must not
    build a list first.

    Raises:
        click.BadParameter: naming ``option`` and the limit, for a number past it or a
            text that is no list of positive numbers.
    """
    from spectune.kernels import declared_limits
    from spectune.tuning.problems import parse_int_list

    limits = [(getattr(lim, dimension), name) for name, family in families.items()
              if (lim := declared_limits(family)) is not None]
    if limits:
        limit, kernel = min(limits)
        for digits in re.findall(r"\d+", text):
            significant = digits.lstrip("0")
            # Length first: int() refuses more than 4300 digits, and the answer is known.
            if len(significant) > len(str(limit)) or int(digits) > limit:
                shown = digits if len(digits) <= 24 else f"{digits[:12]}...({len(digits)} digits)"
                raise click.BadParameter(
                    f"{shown} is over the largest {_DIMENSIONS[dimension]} {kernel} takes "
                    f"({limit})", param_hint=_hint(option))
    try:
        return parse_int_list(text, name=option)
    except ValueError as exc:
        raise click.BadParameter(str(exc).removeprefix(f"{option}: "),
                                 param_hint=_hint(option)) from None


def _hint(option: str) -> str:
    """``option`` as click names an option in its own messages (quoted)."""
    return f"'{option}'"


def _at_most(value: int, limit: int, *, option: str, why: str) -> None:
    """Refuse ``value`` past ``limit`` (``why`` names the limit)."""
    if value > limit:
        raise click.BadParameter(f"{value} is over {limit} ({why})", param_hint=_hint(option))


def _check_evaluations(
    *, trials: int, patience: int | None, families: Mapping[str, KernelFamily], backend: str
) -> None:
    """Refuse a ``--trials`` or ``--patience`` no study could reach: more evaluations than
    the largest requested space declares configs on ``backend``.

    The default ``--trials`` is not refused: a smaller space stops its study when every
    config has been evaluated.
    """
    most, kernel = max((family.search_space(backend).cardinality(), name)
                       for name, family in families.items())
    source = click.get_current_context().get_parameter_source("trials")
    for option, value in (("--trials", None if source == ParameterSource.DEFAULT else trials),
                          ("--patience", patience)):
        if value is not None and value > most:
            raise click.BadParameter(
                f"{value} is more evaluations than any study can make ({kernel}'s space "
                f"declares {most} configs on {backend})", param_hint=_hint(option))


def _run(items: list[SweepItem], options: SweepOptions, console: Console) -> list[SweepResult]:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from spectune.search import Search, SearchObserver, SearchProgress
    from spectune.tuning.sweep import run_item

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
            task = progress.add_task(_problem_label(item), total=options.trials, best="")
            results.append(run_item(item, options=options, observers=[_Bar(task)]))
            progress.update(overall, advance=1)
    return results


def _problem_label(item: SweepItem) -> str:
    """``rejection_sample k=4 B=8 V=128256 bf16`` (`` no-dp`` without draft probs)."""
    from spectune.cli.db import problem_phrases

    return " ".join(problem_phrases(item.kernel, item.problem))


def _us(value: float | None) -> float | None:
    """A number for JSON: None for a missing or non-finite one (JSON has no NaN)."""
    return value if value is not None and math.isfinite(value) else None


def _results_json(
    results: list[SweepResult], *, storage: str | None, device_name: str
) -> str:
    """The results as one JSON list, a flat object per problem.

    Timings are in µs, named like the database's JSON rows (``default_p50_us``); a
    missing timing, speedup or best config (a study with no valid trial) is null.
    """
    import json

    payload = []
    for r in results:
        p = r.item.problem
        entry: dict[str, object] = {
            "kernel": r.item.kernel, "spec_len": p.spec_len, "batch": p.batch,
            "vocab": p.vocab, "dtype": p.dtype, "draft_probs": p.draft_probs,
            "device_name": device_name, "study": r.study, "storage": storage,
        }
        for name, timing in (("default", r.default), ("best", r.best)):
            for q in ("p20", "p50", "p80"):
                entry[f"{name}_{q}_us"] = None if timing is None else _us(getattr(timing, q))
        entry.update({
            "speedup": _us(r.speedup), "trials": r.trials,
            "best_evaluation": r.best_evaluation, "failed": r.failed, "invalid": r.invalid,
            "stop_reason": r.stop_reason, "promoted": r.promoted,
            "best_config": r.best_config, "default_config": r.default_config,
            "seconds": _us(r.seconds),
            "vs_vllm": None if r.vllm is None else r.vllm.verdict,
            "vllm_p50_us": None if r.vllm is None else _us(r.vllm.p50_us),
            "vllm_version": None if r.vllm is None else r.vllm.version,
            "vllm_reason": None if r.vllm is None else r.vllm.reason,
            "served_p50_us": None if r.served is None else _us(r.served.p50),
        })
        payload.append(entry)
    return json.dumps(payload, indent=2, allow_nan=False)


def _print_table(
    results: list[SweepResult], *, wide: bool = False, console: Console | None = None
) -> None:
    """Print the results table on ``console`` (default: stdout).

    By default it fits an 80-column terminal: the problem (wrapped between kernel and
    shape, never inside a number) with its best config below it, then default and best
    p50, speedup and the database's verdict. ``wide``: every column, each cell whole,
    the console widened to the table's width when narrower.
    """
    from rich.table import Table
    from rich.text import Text

    from spectune.cli.db import (
        NOT_COMPARED,
        Phrases,
        compact_table,
        config_phrases,
        print_table,
        problem_phrases,
        short_us,
    )

    title = ("sweep results (µs: p50; default vs best, and vLLM's own function vs the "
             "serving config, each measured side by side)")
    if wide:
        table = Table(title=title)
        for name in ("kernel", "k", "batch", "vocab", "dtype", "default µs", "best µs",
                     "speedup", "vs vLLM", "trials", "fail/invalid", "database", "config"):
            table.add_column(name, justify="right" if name in ("k", "batch", "vocab") else "left")
    else:
        table = compact_table(title)
        table.add_column("problem / best config")
        for name in ("default\nµs", "best\nµs", "speedup", "vs\nvLLM"):
            table.add_column(name, justify="right", no_wrap=True)
        table.add_column("database", no_wrap=True)
    # The wide table's figures as today's; the compact one's in at most six characters.
    number = (lambda us: f"{us:.1f}") if wide else short_us
    for r in results:
        default = number(r.default.p50) if r.default else "-"
        best = number(r.best.p50) if r.best else "-"
        speedup = f"{r.speedup:.2f}x" if r.speedup else "-"
        versus = NOT_COMPARED if r.vs_vllm is None else f"{r.vs_vllm:.2f}x"
        if wide:
            p = r.item.problem
            config = " ".join(config_phrases(r.best_config))
            table.add_row(r.item.kernel, str(p.spec_len), str(p.batch), str(p.vocab), p.dtype,
                          default, best, speedup, versus, str(r.trials),
                          f"{r.failed}/{r.invalid}", r.promoted, Text(config))
        else:
            cell = Phrases([(problem_phrases(r.item.kernel, r.item.problem), "", " "),
                            (config_phrases(r.best_config), "dim", ",")])
            table.add_row(cell, default, best, speedup, versus, r.promoted)
    print_table(table, wide=wide, console=console)
