"""The never-raising reader the vLLM plugin uses: one load, then O(1) lookups.

:func:`load_index` reads every source once (``SPECTUNE_DB``, the user database, the
shipped one; first wins per key), keeps only rows usable on the running system (see
:mod:`spectune.db._checks`) and returns a :class:`ConfigIndex`: per kernel family, a
dict keyed by problem (batch bucketed) for the running device and Triton version. A
source that is absent, corrupt, of another schema or unreachable is logged and
skipped; nothing here raises.

Each entry also holds the row's comparison with vLLM (``vs_vllm`` and
``vllm_version``, see :class:`spectune.db.VllmComparison`), which :meth:`ConfigIndex.entry`
returns: the plugin serves a config in place of vLLM's function only where it says
``faster`` for the installed vLLM version. A database of a revision before 0004 (no such
columns) reads as not measured.

A row edited into nonsense is skipped alone, and counted: the loader checks what it
uses of a row (its key fields, booleans strictly, the batch bucket and the config) as
:class:`spectune.db.TunedRow` would, once per distinct value. A comparison edited into
nonsense (an unknown verdict, a bad version, ``faster`` without a version) reads as not
measured: the config is still used, never routed on. It reads no other field
(it runs at every vLLM worker's start: ``benchmarks/bench_db_load.py`` and
``benchmarks/bench_plugin.py`` time it), so a row malformed only elsewhere (a bad
timestamp) is still used; ``spectune db validate`` names every malformed row. Where
every row of a family is usable (the common case) its entries are built without a
Python loop over the rows (which are handled column by column).

Sources are read by :mod:`spectune.db._reader` (``sqlite3`` or ``psycopg``): loading
never imports SQLAlchemy. What was read from a SQLite file is kept while the file is
unchanged (:mod:`spectune.db._read_cache`): a worker that starts again, or another
worker of the node, reads it from there, and checks it as read rows are checked.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from operator import attrgetter, itemgetter
from typing import TYPE_CHECKING, Any, NamedTuple

from spectune.db._buckets import batch_bucket, is_batch_bucket
from spectune.db._checks import Checker, Spaces, running_identity
from spectune.db._fields import PROBLEM_FIELDS, VS_VLLM_VERDICTS, Field, check_name
from spectune.db._locations import ENV_DB, Source, readable_sources
from spectune.db._read_cache import Groups, ReadCache, keep_in_background
from spectune.db._reader import reading
from spectune.db.errors import DatabaseError
from spectune.messages import one_line

if TYPE_CHECKING:
    from spectune.identity import DeviceIdentity, SoftwareIdentity
    from spectune.space import Problem

__all__ = ["ConfigIndex", "IndexEntry", "SourceReport", "load_index"]

logger = logging.getLogger("spectune.db")

#: The problem's fields a lookup matches exactly; the batch is matched at its bucket.
_EXACT = tuple(f for f in PROBLEM_FIELDS if f.name != "batch")
_EXACT_VALUES = attrgetter(*(f.attribute for f in _EXACT))
#: The columns an entry's key is read with, in order: the exact fields, then the batch.
KEY_COLUMNS = (*(f.name for f in _EXACT), "batch")
#: The columns an entry is read with (the config follows them): the key columns, then
#: the comparison with vLLM that serving needs.
READ_COLUMNS = (*KEY_COLUMNS, "vs_vllm", "vllm_version")
#: Parts of a stored row as read (:data:`READ_COLUMNS`, then the config as stored): the
#: entry's key (the exact fields' values, then the batch bucket), its exact fields'
#: values, its batch, its comparison (verdict, version), its config.
_KEY_OF = itemgetter(slice(0, len(_EXACT) + 1))
_EXACT_OF = itemgetter(slice(0, len(_EXACT)))
_BATCH_OF = itemgetter(len(_EXACT))
_COMPARISON_OF = itemgetter(slice(len(_EXACT) + 1, len(_EXACT) + 3))
_CONFIG_OF = itemgetter(len(_EXACT) + 3)
#: What an entry of a row whose stored comparison is malformed says.
_NOT_MEASURED = ("not measured", None)

#: Kernel family -> (the exact problem fields' values..., batch bucket) -> (config,
#: verdict, vLLM version) (one flat table per family: loading builds it in one pass; a
#: lookup, once per shape, builds its key).
Entries = dict[str, dict[tuple[Any, ...], tuple[dict[str, int], str, str | None]]]


class IndexEntry(NamedTuple):
    """What the index holds for one problem: the tuned config and how it compared with
    vLLM's own function (see :class:`spectune.db.VllmComparison`).

    Attributes:
        config: The tuned config (a copy: the caller may change it).
        vs_vllm: One of :data:`spectune.db.VS_VLLM_VERDICTS`.
        vllm_version: The vLLM version the comparison was measured under, or ``None``.
    """

    config: dict[str, int]
    vs_vllm: str
    vllm_version: str | None


class SourceReport(NamedTuple):
    """What loading one source found.

    A named tuple, not a dataclass: this module is on vLLM's worker start-up path,
    where generating dataclass methods costs milliseconds.

    Attributes:
        name: ``SPECTUNE_DB``, ``user``, ``shipped`` or a caller's label.
        location: File path or URL (without password).
        status: ``read``, ``absent`` or ``error``.
        rows: Rows it holds.
        usable: Rows usable on the running system.
        used: Usable rows not overridden by an earlier source.
        error: The one-line reason when ``status`` is ``error``.
        malformed: Rows measured here that were skipped as malformed (edited into
            values no row may hold).
    """

    name: str
    location: str
    status: str
    rows: int = 0
    usable: int = 0
    used: int = 0
    error: str = ""
    malformed: int = 0

    def describe(self) -> str:
        if self.status == "absent":
            return f"{self.name} {self.location} (absent)"
        if self.status == "error":
            return f"{self.name} {self.location} (skipped: {self.error})"
        skipped = f", {self.malformed} malformed skipped" if self.malformed else ""
        return (
            f"{self.name} {self.location} ({self.rows} rows, {self.usable} usable here, "
            f"{self.used} used{skipped})"
        )


class ConfigIndex:
    """Tuned configs usable on the running system, in memory.

    :meth:`lookup` is two dict lookups; it returns ``None`` when no usable row matches,
    in which case callers use the kernel's deterministic default config. :meth:`entry`
    finds the same row, with its comparison with vLLM; :meth:`count_faster` counts the
    entries faster than vLLM under a vLLM version.

    Args:
        running: The running system's device identity and Triton version (see
            :func:`spectune.db._checks.running_identity`) the entries were loaded for.
        entries: Kernel family -> (the values of the problem's exact fields, all but
            the batch, in field order, then the batch bucket) -> (config, verdict,
            vLLM version).
        sources: What loading each source found.
    """

    def __init__(
        self,
        *,
        running: tuple[Any, ...] = (),
        entries: Entries | None = None,
        sources: Sequence[SourceReport] = (),
    ) -> None:
        self._running = running
        # The last (device, software) pair found to be the running one: the serving
        # path asks with the same objects every time (they are frozen).
        self._checked: tuple[object, object] = (None, None)
        self._entries: Entries = entries or {}
        self.sources = tuple(sources)

    def __len__(self) -> int:
        return sum(len(table) for table in self._entries.values())

    def lookup(
        self,
        *,
        device: DeviceIdentity,
        software: SoftwareIdentity,
        kernel: str,
        problem: Problem,
    ) -> dict[str, int] | None:
        """The tuned config for ``problem`` (batch looked up at its bucket), or ``None``.

        Never raises: arguments of the wrong kind simply find nothing.
        """
        found = self._find(device, software, kernel, problem)
        return None if found is None else dict(found[0])

    def entry(
        self,
        *,
        device: DeviceIdentity,
        software: SoftwareIdentity,
        kernel: str,
        problem: Problem,
    ) -> IndexEntry | None:
        """The tuned config for ``problem`` with its comparison with vLLM, or ``None``.

        Matches as :meth:`lookup` does (the batch at its bucket); never raises.
        """
        found = self._find(device, software, kernel, problem)
        if found is None:
            return None
        config, verdict, version = found
        return IndexEntry(dict(config), verdict, version)

    def count_faster(self, *, vllm_version: str | None) -> int:
        """How many entries say ``faster`` than vLLM's function under ``vllm_version``
        (those the plugin may serve in its place); 0 for ``None`` (no vLLM). Never raises."""
        if vllm_version is None:
            return 0
        try:
            return sum(
                verdict == "faster" and version == vllm_version
                for table in self._entries.values()
                for _, verdict, version in table.values()
            )
        except Exception:  # never raise into the serving path
            logger.debug("spectune: counting faster configs failed", exc_info=True)
            return 0

    def _find(
        self, device: Any, software: Any, kernel: Any, problem: Any
    ) -> tuple[dict[str, int], str, str | None] | None:
        """The entry of ``problem`` as held, or ``None``; never raises."""
        try:
            checked = self._checked
            if device is not checked[0] or software is not checked[1]:
                if running_identity(device, software) != self._running:
                    return None
                self._checked = (device, software)
            table = self._entries.get(kernel)
            if table is None:
                return None
            return table.get((*_EXACT_VALUES(problem), batch_bucket(problem.batch)))
        except Exception:  # never raise into the serving path
            logger.debug("spectune tuned-config lookup failed", exc_info=True)
            return None

    def describe(self) -> str:
        """One line for a log: how many configs, from which databases."""
        parts = "; ".join(s.describe() for s in self.sources) or "no databases"
        return f"spectune: {len(self)} tuned configs usable here, from {parts}"


def load_index(
    *,
    device: DeviceIdentity,
    software: SoftwareIdentity,
    kernel_hashes: Mapping[str, str],
    spaces: Spaces | None = None,
    sources: Sequence[Source] | None = None,
) -> ConfigIndex:
    """Load the tuned configs usable on the running system. Never raises.

    Args:
        device: The running device (``spectune.identity.detect_device()``).
        software: The running software (``spectune.identity.detect_software()``).
        kernel_hashes: Kernel family name -> source hash of the installed kernels;
            rows of other hashes or families are not used.
        spaces: Search spaces of the running backend, kernel name -> space (or a
            ``(kernel, backend) -> space`` callable); rows whose config is outside are
            not used. ``None`` checks only the shape of configs.
        sources: Databases to read, first wins per key; ``None`` means
            :func:`spectune.db.default_sources`.

    Returns:
        The index; empty (with the reason logged and in ``sources``) when nothing could
        be read.
    """
    try:
        checker = Checker(
            device=device, software=software, kernel_hashes=kernel_hashes, spaces=spaces
        )
        reports: list[SourceReport] = []
        if sources is None:
            sources, error = readable_sources()
            if error is not None:  # a bad SPECTUNE_DB: skip it, read the others
                message = one_line(error)
                logger.warning("spectune: skipping %s: %s", ENV_DB, message)
                reports.append(
                    SourceReport(name=ENV_DB, location="(invalid)", status="error", error=message)
                )
        entries: Entries = {}
        to_keep: list[tuple[ReadCache, int, Groups]] = []
        reports += [_load(source, checker, entries, to_keep) for source in sources]
    except Exception as exc:  # bad arguments: log, the caller uses defaults
        logger.warning("spectune: tuned configs not loaded: %s", one_line(exc))
        return ConfigIndex()
    index = ConfigIndex(running=checker.running, entries=entries, sources=reports)
    logger.info("%s", index.describe())
    # What was read from files is kept once the index is built, off the loading path.
    keep_in_background(to_keep)
    return index


def _load(
    source: Source, checker: Checker, entries: Entries,
    to_keep: list[tuple[ReadCache, int, Groups]],
) -> SourceReport:
    """Add a source's usable rows to ``entries`` (earlier sources win), and what was read
    from a file for its read cache to ``to_keep``; never raises."""
    name, location = source.name, source.location
    try:
        if source.url.absent:
            return SourceReport(name=name, location=location, status="absent")
        total, groups = _read(source, checker, to_keep)
    except Exception as exc:  # a reader the serving path uses never raises
        message = one_line(exc)
        logger.warning("spectune: skipping tuned-config database %s: %s", location, message)
        if not isinstance(exc, DatabaseError):
            logger.debug("details", exc_info=True)
        return SourceReport(name=name, location=location, status="error", error=message)
    usable = used = malformed = 0
    valid_exact = _ExactCheck()
    for kernel, columns in groups:
        if not columns or not columns[0]:
            continue
        usable_here, used_here, malformed_here = _add_rows(
            kernel, columns, checker=checker, valid_exact=valid_exact, entries=entries
        )
        usable += usable_here
        used += used_here
        malformed += malformed_here
    if malformed:
        logger.warning(
            "spectune: skipped %d malformed rows of %s (spectune db validate --db %s names "
            "them)", malformed, location, location,
        )  # fmt: skip
    return SourceReport(
        name=name,
        location=location,
        status="read",
        rows=total,
        usable=usable,
        used=used,
        malformed=malformed,
    )


def _read(
    source: Source, checker: Checker, to_keep: list[tuple[ReadCache, int, Groups]]
) -> tuple[int, Groups]:
    """A source's row count and, per family, its rows measured on the running system,
    column by column (:data:`READ_COLUMNS`, then the config as stored): kept from an
    earlier read of the same SQLite file while it is unchanged
    (:mod:`spectune.db._read_cache`), else read (and added to ``to_keep``, to be kept)."""
    cache = ReadCache.of(source.url, running=checker.running,
                         kernel_hashes=checker.kernel_hashes, columns=READ_COLUMNS)  # fmt: skip
    kept = None if cache is None else cache.load()
    if kept is not None:
        return kept
    with reading(source.url, immutable=source.immutable) as reader:
        reader.require_current()
        total = reader.count()
        read = reader.candidates(
            columns=READ_COLUMNS, running=checker.running, kernel_hashes=checker.kernel_hashes
        )
    groups: Groups = [(kernel, list(zip(*rows, strict=True))) for kernel, rows in read]
    if cache is not None:
        to_keep.append((cache, total, groups))
    return total, groups


def _add_rows(
    kernel: str, columns: Sequence[Sequence[Any]], *, checker: Checker,
    valid_exact: _ExactCheck, entries: Entries,
) -> tuple[int, int, int]:
    """Add one family's rows of a source to ``entries`` (an earlier source's entry wins).

    Args:
        kernel: The family.
        columns: Its rows measured on the running system, as read, column by column:
            :data:`READ_COLUMNS`, then the config as stored.
        checker: Checks the configs, once per distinct stored config.
        valid_exact: Checks the exact fields' values, once per distinct value.
        entries: What earlier sources added.

    Returns:
        How many rows were usable, how many of those were added (not overridden by an
        earlier source), how many were malformed.
    """
    # Rows come filtered on the running system and kernel hash: only the key columns
    # and the config are left to check, each distinct value once (rows share few
    # configs, problems and buckets). The stored values stay the keys: SQLite's 1 and 0
    # equal (and hash as) True and False, which lookups use; a driver returns an
    # integer column as int, never bool.
    exact, batches, configs = columns[:len(_EXACT)], columns[len(_EXACT)], columns[-1]
    vs_vllm, versions = columns[len(_EXACT) + 1], columns[len(_EXACT) + 2]
    count = len(configs)
    verdicts = checker.stored_configs(kernel, set(configs))
    usable_configs = {stored: config for stored, (config, _) in verdicts.items()
                      if config is not None}  # fmt: skip
    comparisons = {pair: _comparison(pair) for pair in set(zip(vs_vllm, versions, strict=True))}
    table = entries.get(kernel, {})
    if (
        len(usable_configs) == len(verdicts)
        and all(map(is_batch_bucket, set(batches)))
        and valid_exact.columns_valid(exact)
        and all(pair is held for pair, held in comparisons.items())
    ):  # every row usable: no loop in Python
        keys = zip(*exact, batches, strict=True)
        held = zip(map(usable_configs.__getitem__, configs), vs_vllm, versions, strict=True)
        added = dict(zip(keys, held, strict=True))
        if len(added) == count:  # else two rows share a key (a stored 1 and True)
            before = len(table)
            added.update(table)  # an earlier source's entry wins
            entries[kernel] = added
            return count, len(added) - before, 0
    usable = used = malformed = 0
    entries[kernel] = table
    for row in zip(*columns, strict=True):
        config, bad_config = verdicts[_CONFIG_OF(row)]
        if bad_config or not valid_exact(_EXACT_OF(row)) or not is_batch_bucket(_BATCH_OF(row)):
            malformed += 1
            continue
        if config is None:
            continue
        usable += 1
        key = _KEY_OF(row)
        if key not in table:  # an earlier source's (or row's) entry wins
            table[key] = (config, *comparisons[_COMPARISON_OF(row)])
            used += 1
    return usable, used, malformed


def _comparison(stored: tuple[Any, Any]) -> tuple[Any, Any]:
    """A stored (verdict, vLLM version) pair itself when it is one a row may hold (as
    :class:`spectune.db.VllmComparison` checks it), else not measured."""
    verdict, version = stored
    if type(verdict) is not str or verdict not in VS_VLLM_VERDICTS:
        return _NOT_MEASURED
    if version is None:
        return stored if verdict == "not measured" else _NOT_MEASURED
    try:
        check_name("vllm_version", version)
    except ValueError:
        return _NOT_MEASURED
    return stored


class _ExactCheck:
    """Whether the exact problem fields of a stored row hold values a row may hold.

    ``draft_probs`` must be a boolean, or 0 or 1 as SQLite stores one: not ``'false'``,
    ``'maybe'`` or 2. A tuple is valid when each of its values is: each distinct tuple,
    and each field's distinct value, is checked once.
    """

    def __init__(self) -> None:
        self._tuples: dict[tuple[Any, ...], bool] = {}
        self._values: list[dict[Any, bool]] = [{} for _ in _EXACT]

    def __call__(self, stored: tuple[Any, ...]) -> bool:
        valid = self._tuples.get(stored)
        if valid is None:
            valid = self._tuples[stored] = all(
                self._value(field, memo, value)
                for field, memo, value in zip(_EXACT, self._values, stored, strict=True)
            )
        return valid

    def columns_valid(self, columns: Sequence[Sequence[Any]]) -> bool:
        """Whether the exact fields of every row hold values a row may hold, given the
        rows' exact fields column by column; each column's distinct values checked once."""
        return all(
            all(self._value(field, memo, value) for value in set(column))
            for field, memo, column in zip(_EXACT, self._values, columns, strict=True)
        )

    @staticmethod
    def _value(field: Field, memo: dict[Any, bool], value: Any) -> bool:
        valid = memo.get(value)
        if valid is None:
            try:
                field.check(field.from_stored(value))
                valid = True
            except (TypeError, ValueError):
                valid = False
            memo[value] = valid
        return valid
