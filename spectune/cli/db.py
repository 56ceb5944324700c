"""``spectune db``: show, validate, export, import, merge and upgrade tuned-config databases.

Every failure ends the command with one line on stderr and a non-zero exit status,
never a traceback. A malformed row (edited by hand) gets one line of its own naming the
database, the row and the field: ``show`` and ``export`` skip it with a warning,
``validate`` lists it and exits 1, and ``merge`` and ``import`` refuse to write.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Sequence
from typing import Any, Literal, TypeVar

import click

from spectune.messages import one_line

__all__ = ["db"]

F = TypeVar("F", bound=Callable[..., Any])

#: The export format a file's suffix names (any other suffix: json).
_FORMAT_OF_SUFFIX = {".json": "json", ".csv": "csv", ".db": "sqlite", ".sqlite": "sqlite",
                     ".sqlite3": "sqlite"}  # fmt: skip

_DB_HELP = (
    "Database URL or file path. Default: every database readers look in "
    "(SPECTUNE_DB, the user database, the shipped one)."
)


def _clean_errors(command: F) -> F:
    """Turn any error into one clear line (click prints it and exits 1)."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except Exception as exc:
            from spectune.db import DatabaseError
            from spectune.space import InvalidConfigError

            known = (DatabaseError, InvalidConfigError, ValueError, OSError)
            prefix = "" if isinstance(exc, known) else f"unexpected {type(exc).__name__}: "
            raise click.ClickException(prefix + one_line(exc, limit=400)) from None

    return wrapper  # type: ignore[return-value]


def _note(message: str) -> None:
    click.echo(f"note: {message}", err=True)


def _skip_bad_row(error: Exception) -> None:
    """Say that a malformed row is left out (its message names database, row and field)."""
    click.echo(f"warning: skipped {one_line(error, limit=600)}", err=True)


class _Kernels:
    """The installed kernel families as the database needs them, or why they are not."""

    def __init__(self) -> None:
        self.hashes: dict[str, str] = {}
        self.spaces: Callable[[str, str], Any] | None = None
        self.problem = ""
        try:
            from spectune.kernels import family_hashes, family_space

            self.hashes = family_hashes()
        except Exception as exc:
            self.problem = (
                f"kernel registry unavailable ({one_line(exc, limit=400)}): rows cannot be "
                "checked against a search space or kernel hash"
            )
            return
        # A family whose space cannot be built makes its rows unusable, with the reason.
        self.spaces = family_space


def _rows(
    database: str | None, on_bad_row: Callable[[Any], None] = _skip_bad_row
) -> list[tuple[str, Any]]:
    """(source label, row) pairs: one database, or what readers see; malformed rows are
    left out, each told to ``on_bad_row``."""
    from spectune.db import effective_rows, open_store

    if database is not None:
        with open_store(database, readonly=True) as store:
            return [(store.location, row) for row in store.rows(on_bad_row=on_bad_row)]
    return [(source.name, row) for source, row in effective_rows(on_bad_row=on_bad_row)]


def _filter(rows: list[tuple[str, Any]], gpu: str | None, kernel: str | None) -> list[Any]:
    out = []
    for label, row in rows:
        if kernel is not None and row.kernel != kernel:
            continue
        if gpu is not None:
            wanted = gpu.lower()
            device = row.device
            if wanted not in device.device_name.lower() and wanted != device.arch.lower():
                continue
        out.append((label, row))
    return out


def _full_table(title: str, columns: Sequence[str], cells: Sequence[Sequence[str]]) -> Any:
    """A rich Table of every column named, boxed, each cell folded when too narrow."""
    from rich.table import Table
    from rich.text import Text

    table = Table(title=title, title_justify="left")
    for name in columns:
        table.add_column(name, overflow="fold")
    for row in cells:
        # Text, not str: a stored string is never read as rich markup.
        table.add_row(*(Text(cell) for cell in row))
    return table


def _table(title: str, columns: Sequence[str], cells: Sequence[Sequence[str]]) -> None:
    from rich.console import Console

    Console(soft_wrap=False).print(_full_table(title, columns, cells))


def _config_text(config: dict[str, int]) -> str:
    return ",".join(f"{k}={v}" for k, v in config.items())


# The compact tables (``db show``, ``sweep``) fit an 80-column terminal: one wide cell of
# phrases (the problem, the config) wrapped between phrases, narrow cells of numbers
# that never wrap. The helpers below are shared with ``spectune sweep``.

#: Short names of the logits dtypes, as the compact tables print them.
SHORT_DTYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


def problem_phrases(kernel: str, problem: Any) -> list[str]:
    """``["rejection_sample", "k=4 B=8 V=128256 bf16"]`` (`` no-dp`` appended without
    draft probs): the kernel and the shape, each kept whole on a line of a cell."""
    dtype = SHORT_DTYPES.get(problem.dtype, problem.dtype)
    shape = f"k={problem.spec_len} B={problem.batch} V={problem.vocab} {dtype}"
    return [kernel, shape + ("" if problem.draft_probs else " no-dp")]


def config_phrases(config: dict[str, int] | None) -> list[str]:
    """``["BLOCK_V=1024", "num_warps=4"]``: a config's parameters, one phrase each (a
    :class:`Phrases` line joins them with ``,``, as ``db export`` and ``show --wide``
    write a config)."""
    return [f"{k}={v}" for k, v in (config or {}).items()]


def short_us(value: float) -> str:
    """A time in µs in at most six characters below a second: ``12.35``, ``123.5``,
    ``1235``, ``123457`` (noise is larger than the digits left out)."""
    digits = 2 if value < 100 else 1 if value < 1000 else 0
    return f"{value:.{digits}f}"


class Phrases:
    """A table cell of lines of phrases, each line's phrases joined by its separator.

    A line wraps between phrases, not inside one, so ``k=4 B=8 V=151936 bf16`` or
    ``num_warps=8`` stays whole whenever the cell is as wide as it (a wrapped line ends
    with its separator, so ``,`` says the config goes on); a phrase wider than the cell
    wraps at its own spaces. Strings are printed as they are, never as markup.

    Args:
        lines: (phrases, rich style, separator) per line; a line without phrases is
            left out.
    """

    def __init__(self, lines: Sequence[tuple[Sequence[str], str, str]]) -> None:
        self.lines = [(tuple(phrases), style, sep) for phrases, style, sep in lines if phrases]

    def _wrapped(self, width: int) -> list[tuple[str, str]]:
        """(text, style) of each printed line, at most ``width`` wide where the phrases
        allow."""
        from rich.cells import cell_len

        out = []
        for phrases, style, sep in self.lines:
            line = ""
            for i, phrase in enumerate(phrases):
                # The separator after a phrase stays with it: "BLOCK_V=1024," then a break.
                piece = phrase + (sep.rstrip() if i < len(phrases) - 1 else "")
                glue = sep[len(sep.rstrip()):]  # what follows the separator's mark
                if line and cell_len(line) + len(glue) + cell_len(piece) > width:
                    out.append((line, style))
                    line = piece
                else:
                    line = f"{line}{glue}{piece}" if line else piece
            out.append((line, style))
        return out

    def __rich_measure__(self, console: Any, options: Any) -> Any:
        from rich.cells import cell_len
        from rich.measure import Measurement

        widest = max((cell_len(text) for text, _ in self._wrapped(1)), default=1)
        longest = max((cell_len(text) for text, _ in self._wrapped(10**6)), default=1)
        return Measurement(min(widest, options.max_width), min(longest, options.max_width))

    def __rich_console__(self, console: Any, options: Any) -> Any:
        from rich.text import Text

        for text, style in self._wrapped(options.max_width):
            yield Text(text, style=style)


def compact_table(title: str, *, title_justify: Literal["left", "center"] = "center") -> Any:
    """An empty rich Table of the compact kind: no edges, no vertical rules, a blank line
    between rows (a row takes several lines), the room left to the phrases' cell."""
    from rich import box
    from rich.table import Table

    return Table(title=title, title_justify=title_justify, box=box.SIMPLE_HEAD,
                 show_edge=False, pad_edge=False, collapse_padding=True, show_lines=True)


def print_table(table: Any, *, wide: bool, console: Any = None) -> None:
    """Print ``table`` on ``console`` (default: stdout, at the terminal's width).

    ``wide``: the console is first widened to the table's natural width when narrower,
    so that every cell stays whole (a pager scrolls sideways) rather than folded into
    fragments in columns a few characters wide.
    """
    from rich.console import Console
    from rich.measure import Measurement

    console = console or Console(soft_wrap=False)
    if wide:
        natural = Measurement.get(console, console.options.update_width(100_000), table)
        console.width = max(console.width, natural.maximum)
    console.print(table)


@click.group()
def db() -> None:
    """Tuned-config database: show, validate, export, import, merge, upgrade."""


@db.command()
@click.option("--db", "database", metavar="URL", help=_DB_HELP)
@click.option("--gpu", help="Only rows of this device (part of its name, or its arch).")
@click.option("--kernel", help="Only rows of this kernel family.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list of rows.")
@click.option(
    "--wide", is_flag=True,
    help="Every column (arch, draft probs, triton, tuned at, source), as wide as it needs "
    "(lines may pass the terminal's width).",
)  # fmt: skip
@_clean_errors
def show(
    database: str | None, gpu: str | None, kernel: str | None, as_json: bool, wide: bool
) -> None:
    """Show tuned rows (a table, or JSON with --json).

    The table fits an 80-column terminal: the problem with its config below it, the
    device, the tuned p50, the speedup over the default config, and how much faster
    than vLLM's own function (vLLM's p50 over the tuned p50, measured side by side; —
    where not measured); --wide shows every column (the default's p50, the vLLM
    version, the peak device memory of one call of the config and of vLLM's function,
    measured on GPUs only...).
    """
    from spectune.db import rows_to_json

    rows = _filter(_rows(database), gpu, kernel)
    if as_json:
        click.echo(rows_to_json(row for _, row in rows), nl=False)
        return
    if wide:
        cells = [_wide_cells(label, row) for label, row in rows]
        print_table(_full_table(f"{len(rows)} tuned rows", _WIDE_COLUMNS, cells), wide=True)
    else:
        print_table(_compact_rows_table(rows), wide=False)


#: ``db show --wide``'s columns, one per field a reader may want.
_WIDE_COLUMNS = (
    "kernel", "device", "arch", "k", "batch", "vocab", "dtype", "draft probs", "config",
    "p50 µs", "default p50 µs", "speedup", "vs vLLM", "vLLM version", "peak MiB",
    "vLLM peak MiB", "triton", "tuned (UTC)", "source",
)  # fmt: skip
#: What the ``vs vLLM`` cells say of a row whose config was not compared with vLLM.
NOT_COMPARED = "—"


def vs_vllm_text(row: Any) -> str:
    """``1.23x`` (vLLM's p50 over the tuned p50) for a row compared with vLLM, else
    :data:`NOT_COMPARED`."""
    ratio = row.vs_vllm_ratio
    return NOT_COMPARED if ratio is None else f"{ratio:.2f}x"


def _mib(value: float | None) -> str:
    """A peak memory figure (measured on GPUs only), or :data:`NOT_COMPARED`."""
    return NOT_COMPARED if value is None else f"{value:.1f}"


def _wide_cells(label: str, row: Any) -> tuple[str, ...]:
    return (
        row.kernel,
        row.device.device_name,
        row.device.arch,
        str(row.problem.spec_len),
        str(row.problem.batch),
        str(row.problem.vocab),
        row.problem.dtype,
        "yes" if row.problem.draft_probs else "no",
        _config_text(row.config),
        f"{row.tuned.p50:.2f}",
        f"{row.default.p50:.2f}",
        f"{row.speedup:.2f}x",
        vs_vllm_text(row),
        row.vllm.version or NOT_COMPARED,
        _mib(row.vllm.tuned_peak_mib),
        _mib(row.vllm.peak_mib),
        row.software.triton,
        row.tuned_at.strftime("%Y-%m-%d %H:%M"),
        label,
    )


def _compact_rows_table(rows: Sequence[tuple[str, Any]]) -> Any:
    """``db show``'s 80-column table of (source label, row) pairs."""
    table = compact_table(f"{len(rows)} tuned rows (µs: p50)", title_justify="left")
    table.add_column("problem / config")
    table.add_column("device")
    # No default p50 (the speedup tells it; --wide shows it): room for vs vLLM at 80.
    for name in ("tuned\nµs", "speedup", "vs\nvLLM"):
        table.add_column(name, justify="right", no_wrap=True)
    for _, row in rows:
        table.add_row(
            Phrases([(problem_phrases(row.kernel, row.problem), "", " "),
                      (config_phrases(row.config), "dim", ",")]),
            Phrases([([row.device.device_name], "", " "), ([row.device.arch], "dim", " ")]),
            short_us(row.tuned.p50),
            f"{row.speedup:.2f}x",
            vs_vllm_text(row),
        )
    return table


@db.command()
@click.option("--db", "database", metavar="URL", help=_DB_HELP)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list of verdicts.")
@_clean_errors
def validate(database: str | None, as_json: bool) -> None:
    """Say for every row whether it is usable on this machine, and why not.

    A malformed row is listed as not usable, with what is wrong, and named on stderr;
    the command then exits 1.
    """
    from spectune.db import check_row
    from spectune.identity import detect_device, detect_software

    malformed: list[Any] = []

    def bad_row(error: Any) -> None:
        malformed.append(error)
        click.echo(f"malformed: {one_line(error, limit=600)}", err=True)

    rows = _rows(database, on_bad_row=bad_row)
    kernels = _Kernels()
    if kernels.problem:
        _note(kernels.problem)
    device = detect_device()
    software = detect_software()
    verdicts = [
        (
            label,
            row,
            check_row(
                row,
                device=device,
                software=software,
                kernel_hashes=kernels.hashes,
                spaces=kernels.spaces,
            ),
        )
        for label, row in rows
    ]
    usable = sum(verdict.usable for _, _, verdict in verdicts)
    total = len(verdicts) + len(malformed)
    if as_json:
        payload = [
            {
                "source": label,
                "usable": verdict.usable,
                "reasons": list(verdict.reasons),
                "row": row.to_dict(),
            }
            for label, row, verdict in verdicts
        ]
        payload += [
            {
                "source": error.location,
                "usable": False,
                "reasons": [f"malformed: {error.problem}"],
                "row": None,
                "row_id": error.row_id,
                "key": error.key,
                "field": error.field,
            }
            for error in malformed
        ]
        click.echo(json.dumps(payload, indent=2))
    else:
        cells = [
            (
                row.kernel,
                row.device.device_name,
                f"k={row.problem.spec_len} batch={row.problem.batch} vocab={row.problem.vocab}"
                f" {row.problem.dtype}",
                label,
                "yes" if verdict.usable else "no",
                "; ".join(verdict.reasons),
            )
            for label, row, verdict in verdicts
        ]
        cells += [
            (f"row id {error.row_id}", "", f"key: {error.key}", error.location, "no",
             f"malformed: {error.problem}")
            for error in malformed
        ]  # fmt: skip
        _table(
            f"{usable} of {total} rows usable on {device.describe()}, triton {software.triton}",
            ("kernel", "device", "problem", "source", "usable", "why not"),
            cells,
        )
    if malformed:  # each is named above, on stderr: a bad row is bad data
        raise click.exceptions.Exit(1)


@db.command(name="export")
@click.argument("file", type=click.Path(dir_okay=True, writable=True))
@click.option("--db", "database", metavar="URL", help=_DB_HELP)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["json", "csv", "vllm-json", "sqlite"]),
    help="Default: by FILE's suffix (.csv: csv; .db, .sqlite: sqlite; else json). "
    "vllm-json: FILE is a directory; one file per kernel and device, named like vLLM's "
    "tuned config files. sqlite: a new database in rollback-journal mode, readable on "
    "read-only storage.",
)
@click.option("--gpu", help="Only rows of this device (part of its name, or its arch).")
@click.option("--kernel", help="Only rows of this kernel family.")
@_clean_errors
def export_(
    file: str, database: str | None, fmt: str | None, gpu: str | None, kernel: str | None
) -> None:
    """Write rows to FILE (JSON, CSV, a SQLite database, or vLLM-style JSON files)."""
    from pathlib import Path

    from spectune.db import write_database, write_rows_file

    if fmt is None:
        fmt = _FORMAT_OF_SUFFIX.get(Path(file).suffix.lower(), "json")
    rows = [row for _, row in _filter(_rows(database), gpu, kernel)]
    if fmt == "sqlite":
        written = [write_database(rows, file)]
    else:
        written = write_rows_file(rows, file, fmt=fmt)
    click.echo(f"exported {len(rows)} rows to {', '.join(map(str, written)) or file}", err=True)


@db.command(name="import")
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@click.option(
    "--into", "--db", "database", metavar="URL",
    help="Database to import into. Default: SPECTUNE_DB, else the user database.",
)  # fmt: skip
@click.option(
    "--format", "fmt", type=click.Choice(["json", "csv"]), help="Default: by FILE's suffix."
)
@_clean_errors
def import_(file: str, database: str | None, fmt: str | None) -> None:
    """Import rows from a JSON or CSV FILE (all or nothing; conflicts by promotion rule)."""
    from spectune.db import import_rows

    kernels = _Kernels()
    if kernels.problem:
        _note(kernels.problem)
    report = import_rows(file, into=database, fmt=fmt, spaces=kernels.spaces)
    click.echo(f"imported {report.describe()}", err=True)


@db.command()
@click.argument("sources", nargs=-1, required=True, metavar="SRC...")
@click.option("--into", "into", required=True, metavar="DST", help="Destination database.")
@_clean_errors
def merge(sources: tuple[str, ...], into: str) -> None:
    """Merge databases SRC... into DST.

    On a key present in several, the faster config is kept only when the difference is
    significant by the tuner's promotion rule; both provenances are kept.
    """
    from spectune.db import merge_databases

    kernels = _Kernels()
    if kernels.problem:
        _note(kernels.problem)
    report = merge_databases(list(sources), into=into, spaces=kernels.spaces)
    click.echo(f"merged {report.describe()}", err=True)


@db.command()
@click.option(
    "--db", "database", metavar="URL", help="Default: SPECTUNE_DB, else the user database."
)
@_clean_errors
def upgrade(database: str | None) -> None:
    """Create or upgrade a database's schema to the current revision."""
    from spectune.db import parse_target, upgrade_database, write_target

    url = write_target() if database is None else parse_target(database)
    before, after = upgrade_database(url)
    where = url.display()
    if before == after:
        click.echo(f"{where}: already at schema revision {after}", err=True)
    else:
        click.echo(f"{where}: schema revision {before or '(new)'} -> {after}", err=True)
