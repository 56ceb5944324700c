"""Where a study lives, and which of its running trials still have a live worker.

A study can sit in memory (replays, tests), in a JournalStorage file (several worker
processes on one host, safe under a file lock) or in an RDB URL (PostgreSQL for many
hosts; plain SQLite is not safe for concurrent Optuna writers).

A worker marks each trial it runs with its host, process id and process start time, and
refreshes a heartbeat while the evaluation runs. A running trial whose process is gone
(same host) or whose heartbeat is older than ``stale_after`` seconds (any host) was
abandoned by a killed worker.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

import optuna
from optuna.storages import BaseStorage, InMemoryStorage, JournalStorage, RDBStorage
from optuna.storages.journal import JournalFileBackend, JournalFileOpenLock

__all__ = ["Heartbeat", "is_abandoned", "open_storage", "worker_identity"]

OWNER_KEY = "spectune.owner"
HEARTBEAT_KEY = "spectune.heartbeat"


def open_storage(storage: str | Path | BaseStorage | None) -> BaseStorage:
    """An Optuna storage for ``storage``.

    Args:
        storage: ``None`` for memory; an Optuna storage as is; a string with ``://``
            is an RDB URL (``sqlite:///x.db``, ``postgresql://...``); anything else is
            the path of a JournalStorage file (created if missing).

    Raises:
        TypeError: naming ``storage`` when it is none of these.
    """
    if storage is None:
        return InMemoryStorage()
    if isinstance(storage, BaseStorage):
        return storage
    if isinstance(storage, Path) or (isinstance(storage, str) and "://" not in storage):
        path = str(storage)
        if not path:
            raise TypeError("storage must not be an empty path")
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        return JournalStorage(JournalFileBackend(path, lock_obj=JournalFileOpenLock(path)))
    if isinstance(storage, str):
        kwargs: dict[str, Any] = {}
        if storage.startswith("sqlite"):
            kwargs["engine_kwargs"] = {"connect_args": {"timeout": 60}}
        return RDBStorage(storage, **kwargs)
    raise TypeError(
        f"storage must be None, a path, an RDB URL or an optuna storage, got {storage!r}"
    )


def worker_identity() -> dict[str, Any]:
    """Host, process id and process start time of this process."""
    pid = os.getpid()
    return {"host": socket.gethostname(), "pid": pid, "start": _process_start(pid)}


def is_abandoned(
    trial: optuna.trial.FrozenTrial, *, stale_after: float, now: float | None = None
) -> bool:
    """Whether a RUNNING trial's worker is gone."""
    owner = trial.system_attrs.get(OWNER_KEY)
    beat = trial.system_attrs.get(HEARTBEAT_KEY)
    now = time.time() if now is None else now
    if isinstance(owner, dict) and owner.get("host") == socket.gethostname():
        pid = owner.get("pid")
        if isinstance(pid, int) and not _alive(pid, owner.get("start")):
            return True
    last = beat if isinstance(beat, (int, float)) else None
    if last is None and trial.datetime_start is not None:
        last = trial.datetime_start.timestamp()
    return last is not None and now - last > stale_after


class Heartbeat:
    """Refreshes the heartbeat of one running trial from a daemon thread."""

    def __init__(self, storage: BaseStorage, trial_id: int, *, interval: float) -> None:
        self._storage = storage
        self._trial_id = trial_id
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="spectune-beat")

    def __enter__(self) -> Heartbeat:
        self._beat()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self._beat()

    def _beat(self) -> None:
        # The trial may have finished meanwhile, or the storage hiccupped: next beat retries.
        with contextlib.suppress(Exception):
            self._storage.set_trial_system_attr(self._trial_id, HEARTBEAT_KEY, time.time())


def _process_start(pid: int) -> int | None:
    # Field 22 of /proc/PID/stat: start time in clock ticks since boot; tells a reused
    # pid from the original process. Absent off Linux: pid liveness alone is used.
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    try:
        return int(text.rsplit(")", 1)[1].split()[19])
    except (IndexError, ValueError):
        return None


def _alive(pid: int, start: object) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    if isinstance(start, int):
        now_start = _process_start(pid)
        if now_start is not None and now_start != start:
            return False
    return _not_zombie(pid)


def _not_zombie(pid: int) -> bool:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    try:
        return text.rsplit(")", 1)[1].split()[0] != "Z"
    except IndexError:
        return True
