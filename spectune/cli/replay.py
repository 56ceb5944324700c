"""``spectune replay``: benchmark the search engine on a recorded T4 space."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from spectune.cli._tuner import LazyChoice, import_tuner, strategy_names

if TYPE_CHECKING:
    from rich.console import Console

    from spectune.search.replay import ReplayReport

__all__ = ["replay"]


def _one_blas_thread() -> None:
    # Tiny GP matrices: BLAS threads only contend. Must run before numpy is first
    # imported, which loading the strategy names (to check --sampler) does.
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, "1")


def _replay_strategies() -> list[str]:
    _one_blas_thread()
    return strategy_names(command="replay")


@click.command()
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--budget",
    type=click.IntRange(min=1),
    default=100,
    show_default=True,
    help="Largest number of evaluations per run (budgets 10, 20, 50, 100, 200 up to it).",
)
@click.option(
    "--repeats",
    type=click.IntRange(min=1),
    default=50,
    show_default=True,
    help="Seeds per budget, for the engine and random search alike.",
)
@click.option(
    "--sampler",
    default="auto",
    show_default=True,
    type=LazyChoice(_replay_strategies),
    help="Engine strategy (auto: the recommended one).",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Base seed.")
@click.option(
    "--noisy",
    is_flag=True,
    help="Answer with one recorded run instead of the mean; charge the compile time.",
)
@click.option(
    "--plot",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write fraction of the optimum vs evaluations to this PNG.",
)
@click.option("--json", "as_json", is_flag=True, help="Print only the JSON summary on stdout.")
@click.option(
    "--workers",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Processes running seeds in parallel.",
)
@click.option(
    "--prior",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Another recorded space (the same kernel elsewhere): its fastest configurations "
    "are tried on alternate turns, the first first, until they stop improving (as "
    "`spectune sweep` starts from other GPUs' rows); the runs without it are reported "
    "beside.",
)
@click.option(
    "--prior-top",
    type=click.IntRange(min=1),
    default=5,
    show_default=True,
    help="How many of the prior's fastest configurations it offers.",
)
def replay(
    file: Path,
    budget: int,
    repeats: int,
    sampler: str,
    seed: int,
    noisy: bool,
    plot: Path | None,
    as_json: bool,
    workers: int,
    prior: Path | None,
    prior_top: int,
) -> None:
    """Replay the search engine on a fully measured space in T4 format (FILE.json.gz).

    Reports, for each budget, the median and quartiles over seeds of the fraction of
    the optimum reached (best recorded time / recorded time of the best configuration
    found), beside random search on the same budgets.
    """
    _one_blas_thread()
    replay_module = import_tuner("spectune.search.replay", command="replay")
    run_replay = replay_module.replay
    if plot is not None:
        import_tuner("matplotlib", command="replay")
    # Read (and check) the files before the progress bar starts: a bad file is one line.
    space = _load(replay_module, file)
    prior_list: list[dict[str, int]] = []
    if prior is not None:
        try:
            prior_list = replay_module.prior_configs(
                _load(replay_module, prior), space, top=prior_top
            )
        except (ValueError, KeyError) as exc:
            raise _bad_data(prior, exc) from exc
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    err = Console(stderr=True)
    with Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err,
        transient=True,
    ) as bar:
        runs = 2 if prior is not None else 1
        task = bar.add_task(f"replay {file.name}", total=2 * repeats * runs)
        reports = []
        try:
            for i, start in enumerate([prior_list, []][:runs]):
                reports.append(run_replay(
                    space,
                    budget=budget,
                    repeats=repeats,
                    sampler=sampler,
                    seed=seed,
                    noisy=noisy,
                    workers=workers,
                    progress=lambda done, i=i: bar.update(task, completed=i * 2 * repeats + done),
                    prior=start,
                ))
        except (ValueError, KeyError) as exc:
            raise _bad_data(file, exc) from exc
    # Given the loaded space, the report names its stem: name the file, as given.
    reports = [dataclasses.replace(r, file=str(file)) for r in reports]
    report = reports[0]
    if prior is not None:
        without = reports[1]
        if as_json:
            click.echo(json.dumps({"prior": str(prior), "prior_configs": len(prior_list),
                                   "with_prior": report.to_json(),
                                   "without_prior": without.to_json()}))
        else:
            _prior_table(report, without, prior, len(prior_list), Console())
        if plot is not None:
            _plot(report, plot)
            err.print(f"plot written to {plot}")
        return
    if plot is not None:
        _plot(report, plot)
    if as_json:
        click.echo(json.dumps(report.to_json()))
        return
    _table(report, Console())
    if plot is not None:
        err.print(f"plot written to {plot}")


def _load(replay_module: Any, path: Path) -> Any:
    """The recorded space of a T4 file; a bad file is a one-line error (exit code 1)."""
    try:
        return replay_module.load_t4(path)
    except (ValueError, KeyError) as exc:
        raise _bad_data(path, exc) from exc


def _bad_data(path: Path, exc: Exception) -> click.ClickException:
    """The one-line error (exit code 1) for a file the replay cannot use."""
    from spectune.search.replay import T4FileError

    if isinstance(exc, T4FileError):
        return click.ClickException(str(exc))  # already "FILE: WHERE: PROBLEM"
    return click.ClickException(f"{path}: {exc}")


def _table(report: ReplayReport, console: Console) -> None:
    from rich.table import Table

    title = (
        f"{Path(report.file).name}: optimum {report.optimum:.6g}, sampler {report.sampler}, "
        f"{report.repeats} seeds{', noisy' if report.noisy else ''}"
    )
    table = Table(title=title)
    for col in ("budget", "median", "q25", "q75", "random median", "random q25-q75"):
        table.add_column(col, justify="right")
    for r in report.results:
        better = r.median_fraction > r.random_median_fraction
        table.add_row(
            str(r.budget),
            f"[{'green' if better else 'red'}]{r.median_fraction:.3f}[/]",
            f"{r.q25_fraction:.3f}",
            f"{r.q75_fraction:.3f}",
            f"{r.random_median_fraction:.3f}",
            f"{r.random_q25_fraction:.3f}-{r.random_q75_fraction:.3f}",
        )
    console.print(table)


def _prior_table(with_prior: ReplayReport, without: ReplayReport, prior: Path, used: int,
                 console: Console) -> None:
    from rich.table import Table

    title = (f"{Path(with_prior.file).name} with prior {prior.name} ({used} configurations "
             f"offered), sampler {with_prior.sampler}, {with_prior.repeats} seeds")
    table = Table(title=title)
    for col in ("budget", "with prior", "without", "gain", "random"):
        table.add_column(col, justify="right")
    for a, b in zip(with_prior.results, without.results, strict=True):
        gain = a.median_fraction - b.median_fraction
        table.add_row(str(a.budget), f"{a.median_fraction:.3f}", f"{b.median_fraction:.3f}",
                      f"[{'green' if gain >= 0 else 'red'}]{gain:+.3f}[/]",
                      f"{a.random_median_fraction:.3f}")
    console.print(table)


def _plot(report: ReplayReport, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for curves, label, color in (
        (report.engine_curves, f"engine ({report.sampler})", "tab:blue"),
        (report.random_curves, "random search", "tab:gray"),
    ):
        x = np.arange(1, curves.shape[1] + 1)
        q25, med, q75 = np.quantile(curves, [0.25, 0.5, 0.75], axis=0)
        ax.plot(x, med, color=color, label=f"{label}, median")
        ax.fill_between(x, q25, q75, color=color, alpha=0.25, label=f"{label}, quartiles")
    ax.axhline(0.95, color="tab:red", linestyle=":", linewidth=1, label="0.95")
    ax.set_xscale("log")
    ax.set_xlabel("evaluations")
    ax.set_ylabel("fraction of the optimum")
    ax.set_ylim(0, 1.02)
    ax.set_title(
        f"{Path(report.file).name} ({report.repeats} seeds{', noisy' if report.noisy else ''})"
    )
    ax.legend(loc="lower right", fontsize=8)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
