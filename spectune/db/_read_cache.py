"""What the serving path read from a SQLite file, kept while the file is unchanged.

Every vLLM worker reads its tuned configs at start (:func:`spectune.db.load_index`); for
a database with 10,000 rows usable on the device, SQLite's reading them is most of the
plugin's start-up. A database file changes rarely (a tuning run, a merge) while every
worker of a node, at every restart, reads the same rows from it. So the rows read from
a file (what :meth:`~spectune.db._reader.Reader.candidates` returned, exactly as
SQLite returned them, and the file's row count) are kept in a file of their own, and
read from there while the database file is unchanged.

Only what SQLite returned is kept: every check of the rows runs again at each load,
with the running code (the key fields, the buckets, the configs against today's search
spaces), and the counts are those of the rows. The cache never makes usable a row that
reading the database would not.

Unchanged: the database file and its ``-wal`` and ``-journal`` files (an empty one
counts as absent) have the device, inode, size and modification time they had when
the rows were read, and the database file its change time (which a write sets and no
one sets back, whatever it does to the modification time; a file replaced is another
inode). Rows are kept only when those were the same before and after reading them,
and when every one of those files had last changed more than :data:`SETTLED_S` before:
a write in the same clock tick as a read could leave the times as they were (the
"racily clean" case of git's index).

The cache is a folder beside the user database (``<user database>.read-cache/``, made
only where the user database's folder exists): one file per database file, running
system and kernel families, for the families' hashes last read, replaced atomically,
written on a thread of its own once the load has built its index (:func:`keep_in_background`:
encoding and writing 10,000 rows takes about 10 ms, which a worker's start-up does not wait
for; the interpreter waits for it at exit).
A file holds a JSON header (what it was read for, the files' state, the count, the
distinct strings) and the rows column by column as arrays of 64-bit integers (an
integer column's values; a text column's, as indexes of its strings, -1 for NULL, which
the comparison with vLLM's version holds where not measured): nothing read is
executed, and reading 10,000 rows back costs a few milliseconds. Rows of other values
(a malformed row's BLOB, say) are not kept. Anything wrong with a file (absent,
unreadable, another format, key or file state, lengths that do not add up) means
reading the database; failing to write one is no error, and deleting them at any time
is harmless. PostgreSQL databases are read every time.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import sys
import threading
import time
from array import array
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from spectune.db._backend import DatabaseURL, backend_of
from spectune.db._locations import user_db_path

__all__ = ["SETTLED_S", "ReadCache", "keep_in_background", "wait_kept"]

logger = logging.getLogger("spectune.db")

#: How long before a read the files must have last changed for its rows to be kept.
SETTLED_S = 2.0
#: The cache files' format (a new one makes the old files unused): with the machine's
#: byte order, which the arrays are in. 2: text columns may hold NULL (-1), and the rows
#: hold the comparison with vLLM (schema revision 0004).
_FORMAT = f"spectune-read-cache-2-{sys.byteorder}"
#: The files whose state is the database's: SQLite's own beside it.
_SUFFIXES = ("", "-wal", "-journal")
#: The arrays' item type: 64-bit signed integers (SQLite's integers).
_ITEM = "q"

#: A file's identity and last change; ``None`` for a companion file that is absent.
FileState = tuple[int, int, int, int, int] | None
#: What a load reads of a database, per kernel family: its rows, column by column (no
#: column when it has none).
Groups = list[tuple[str, list[Sequence[Any]]]]


class ReadCache:
    """The kept rows of one SQLite database file, for one running system.

    Made by :meth:`of`, before the database is read (it notes the files' state then).

    Args:
        path: The database file (absolute).
        key: What selects the rows (the file, the running system, the kernel hashes,
            the columns).
        state: The files' state before reading.
    """

    def __init__(self, path: str, key: tuple[Any, ...], state: tuple[FileState, ...]) -> None:
        self._path = path
        self._key = key
        self._state = state

    @classmethod
    def of(
        cls,
        url: DatabaseURL,
        *,
        running: Sequence[Any],
        kernel_hashes: Mapping[str, str],
        columns: Sequence[str],
    ) -> ReadCache | None:
        """The cache of ``url``'s rows for this system; ``None`` when there is none to
        have (not a local file, or its state cannot be read)."""
        path = backend_of(url).local_file
        state = None if path is None else _files_state(path)
        if path is None or state is None:
            return None
        key = (_FORMAT, path, tuple(running), tuple(kernel_hashes.items()), tuple(columns))
        return cls(path, key, state)

    @property
    def file(self) -> Path:
        """Where the rows are kept: named after the database file, the running system and
        the families, then after what else selects the rows (their hashes change with
        spectune)."""
        user_db = user_db_path()
        _, database, running, hashes, columns = self._key
        where = _digest((database, running, tuple(name for name, _ in hashes)))
        what = _digest((_FORMAT, hashes, columns))
        return user_db.with_name(f"{user_db.name}.read-cache") / f"{where}-{what}.rows"

    def load(self) -> tuple[int, Groups] | None:
        """The kept row count and rows, if kept for the database as it is; else ``None``."""
        try:
            content = self.file.read_bytes()
        except FileNotFoundError:
            return None
        except OSError:
            logger.debug("spectune: read cache of %s not read", self._path, exc_info=True)
            return None
        try:
            return _decode(content, header=_plain({"key": self._key, "state": self._state}),
                           width=len(self._key[-1]) + 1)  # fmt: skip
        except Exception:  # not ours, or broken: read the database
            logger.debug("spectune: read cache of %s not used", self._path, exc_info=True)
            return None

    def keep(self, total: int, groups: Groups) -> None:
        """Keep what was read, if the files were settled and did not change meanwhile,
        in place of what was kept for the same file, system and families with other
        kernel hashes. Never raises: the rows were read, whatever happens to the copy.

        Nothing is kept while the user database's folder does not exist: loading never
        creates it.
        """
        temporary = None
        try:
            if _files_state(self._path) != self._state or not _settled(self._state):
                return
            file = self.file
            if not file.parent.parent.is_dir():
                return
            content = _encode(_plain({"key": self._key, "state": self._state}), total, groups)
            if content is None:
                return
            # Per process and thread: loads of one process may keep the same file.
            temporary = file.with_name(f"{file.name}.{os.getpid()}-{threading.get_ident()}.tmp")
            file.parent.mkdir(exist_ok=True)
            temporary.write_bytes(content)
            os.replace(temporary, file)
            where = file.name.partition("-")[0]
            for older in file.parent.glob(f"{where}-*.rows"):
                if older != file:
                    older.unlink(missing_ok=True)
        except Exception:  # read-only, full...
            logger.debug("spectune: read cache of %s not written", self._path, exc_info=True)
            if temporary is not None:
                with contextlib.suppress(OSError):
                    temporary.unlink(missing_ok=True)


#: The threads keeping what loads read, not yet joined (see :func:`wait_kept`).
_KEEPING: list[threading.Thread] = []


def keep_in_background(kept: Sequence[tuple[ReadCache, int, Groups]]) -> None:
    """Keep each of ``kept`` (a cache, the count and rows read for it) on a thread of
    its own, so that writing the copy (about 10 ms for 10,000 rows) is not on the
    loading worker's start-up path. Never raises.

    Not a daemon thread: the interpreter waits for it at exit, so a worker that stops
    at once leaves no half-written temporary file (unless killed).
    """
    if not kept:
        return
    try:
        thread = threading.Thread(
            target=_keep_all, args=(tuple(kept),), name="spectune-read-cache", daemon=False
        )
        thread.start()
        _KEEPING[:] = [each for each in _KEEPING if each.is_alive()] + [thread]
    except Exception:  # no thread to be had: keep inline, never raise
        logger.debug("spectune: read cache kept inline", exc_info=True)
        _keep_all(tuple(kept))


def wait_kept(timeout: float | None = None) -> None:
    """Wait until what earlier loads read is kept (tests, benchmarks, tools)."""
    for thread in list(_KEEPING):
        thread.join(timeout)


def _keep_all(kept: Sequence[tuple[ReadCache, int, Groups]]) -> None:
    for cache, total, groups in kept:
        cache.keep(total, groups)


def _encode(header: dict[str, Any], total: int, groups: Groups) -> bytes | None:
    """The file's content: the JSON header, a newline, the arrays; ``None`` when a value
    is neither an integer nor text (not kept)."""
    described, arrays = [], []
    for kernel, columns in groups:
        kinds, strings = [], []
        for values in columns:
            types = set(map(type, values))
            integers = _integers(values) if types == {int} else None
            if integers is not None:
                kinds.append("int")
                strings.append([])
                arrays.append(integers)
            elif types and types <= {str, type(None)}:
                distinct = sorted(set(values) - {None})
                at: dict[str | None, int] = {text: index for index, text in enumerate(distinct)}
                at[None] = -1
                kinds.append("text")
                strings.append(distinct)
                arrays.append(array(_ITEM, map(at.__getitem__, values)))
            else:
                return None
        described.append([kernel, len(columns[0]) if columns else 0, kinds, strings])
    text = json.dumps({**header, "total": total, "groups": described}, separators=(",", ":"))
    return text.encode() + b"\n" + b"".join(each.tobytes() for each in arrays)


def _integers(values: Sequence[int]) -> array[int] | None:
    """``int`` values (not ``bool``, which would come back as 1 or 0) as an array of
    64-bit integers; ``None`` when one is out of range (the array's conversion checks
    it, in C)."""
    try:
        return array(_ITEM, values)
    except OverflowError:
        return None


def _decode(content: bytes, *, header: dict[str, Any], width: int) -> tuple[int, Groups] | None:
    """The count and columns of a file's ``content``, if its header is ``header``;
    raises (or returns ``None``) on anything else."""
    end = content.index(b"\n")
    kept = json.loads(content[:end])
    if {key: kept.get(key) for key in header} != header:
        return None
    total, described = kept["total"], kept["groups"]
    if type(total) is not int or type(described) is not list:
        return None
    size = array(_ITEM).itemsize
    at = end + 1
    groups: Groups = []
    for kernel, count, kinds, strings in described:
        if type(kernel) is not str or type(count) is not int or count < 0:
            return None
        if count == 0:
            groups.append((kernel, []))
            continue
        if len(kinds) != width or len(strings) != width:
            return None
        columns: list[Sequence[Any]] = []
        for kind, distinct in zip(kinds, strings, strict=True):
            values = array(_ITEM)
            values.frombytes(content[at:at + count * size])
            at += count * size
            if len(values) != count:
                return None
            if kind == "int":
                columns.append(values.tolist())
            elif kind == "text" and all(type(each) is str for each in distinct):
                if not -1 <= min(values) <= max(values) < len(distinct):
                    return None
                # -1 (NULL) indexes the None after the strings.
                columns.append(list(map([*distinct, None].__getitem__, values)))
            else:
                return None
        groups.append((kernel, columns))
    return (total, groups) if at == len(content) else None


def _plain(value: Any) -> Any:
    """``value`` as JSON gives it back (tuples as lists)."""
    return json.loads(json.dumps(value))


def _digest(value: object) -> str:
    return hashlib.sha256(repr(value).encode()).hexdigest()[:16]


def _files_state(path: str) -> tuple[FileState, ...] | None:
    """The state of the database file and its companions; ``None`` if it cannot be read
    (the file is gone, or a companion cannot be looked at).

    An empty companion counts as absent: it holds nothing (the first reader of a WAL
    database makes an empty ``-wal`` file). A companion's change time is left out (as
    0): SQLite running as root gives the ``-wal`` file to the database's owner at every
    connection, which sets it, while every write of one sets its modification time.
    """
    states: list[FileState] = []
    for suffix in _SUFFIXES:
        try:
            found = os.stat(path + suffix)
        except FileNotFoundError:
            if not suffix:
                return None
            states.append(None)
            continue
        except OSError:
            return None
        if suffix and not found.st_size:  # what a reader leaves: no content
            states.append(None)
            continue
        changed = 0 if suffix else found.st_ctime_ns
        states.append((found.st_dev, found.st_ino, found.st_size, found.st_mtime_ns, changed))
    return tuple(states)


def _settled(state: tuple[FileState, ...]) -> bool:
    """Whether every file last changed more than :data:`SETTLED_S` ago."""
    last = max(max(each[3], each[4]) for each in state if each is not None)
    return time.time_ns() - last > SETTLED_S * 1e9
