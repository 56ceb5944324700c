"""Where a study lives, and which of its running trials still have a live worker.

A study can sit in memory (replays, tests), in a JournalStorage file (several worker
processes on one host, safe under a file lock) or in an RDB URL (PostgreSQL for many
hosts; plain SQLite is not safe for concurrent Optuna writers).

Studies live where the configs live (:func:`studies_beside`): beside a SQLite configs
file, the journal file ``NAME.studies.journal``; in a PostgreSQL configs database, the
same database, with Optuna's tables in their own schema (:data:`STUDIES_SCHEMA`), since
Optuna and spectune's configs schema both keep their Alembic revision in a table named
``alembic_version``. What differs between the storages is the database part's storage
seam (:func:`spectune.db.backend_of`, :func:`spectune.db.study_rdb`); this module builds
Optuna's storages from what it says.

A PostgreSQL study survives a server restart: :func:`open_storage` checks pooled
connections before use and wraps the storage in a :class:`RetryingStorage`, which
retries calls that failed on a lost connection for a bounded time.

A worker marks each trial it runs with its host, process id and process start time, and
refreshes a heartbeat while the evaluation runs. A running trial whose process is gone
(same host) or whose heartbeat is older than ``stale_after`` seconds (any host) was
abandoned by a killed worker.
"""

from __future__ import annotations

import contextlib
import copy
import datetime
import logging
import math
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Container, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import optuna
from optuna.exceptions import StorageInternalError, UpdateFinishedTrialError
from optuna.storages import (
    BaseStorage,
    InMemoryStorage,
    JournalStorage,
    RDBStorage,
    _CachedStorage,
)
from optuna.storages.journal import JournalFileBackend, JournalFileOpenLock
from optuna.trial import FrozenTrial, TrialState

from spectune.db import (
    STUDIES_JOURNAL_SUFFIX,
    STUDIES_SCHEMA,
    backend_of,
    display_storage,
    is_permanent,
    lost_connection,
    study_rdb,
    write_target,
)
from spectune.messages import one_line

if TYPE_CHECKING:
    from optuna.distributions import BaseDistribution
    from optuna.study import StudyDirection
    from optuna.study._frozen import FrozenStudy

__all__ = [
    "RETRY_FOR_S",
    "STUDIES_JOURNAL_SUFFIX",
    "STUDIES_SCHEMA",
    "Heartbeat",
    "RetryingStorage",
    "StorageUnavailableError",
    "display_storage",
    "is_abandoned",
    "is_transient",
    "open_storage",
    "running_trial",
    "studies_beside",
    "unretried",
    "worker_identity",
]

OWNER_KEY = "spectune.owner"
HEARTBEAT_KEY = "spectune.heartbeat"
#: Trial system attribute naming the call that created the trial (see RetryingStorage).
CREATE_TOKEN_KEY = "spectune.create_token"

#: How long a :class:`RetryingStorage` retries a call that lost its connection.
RETRY_FOR_S = 120.0

_log = logging.getLogger(__name__)
_T = TypeVar("_T")


# -- where studies live -----------------------------------------------------------------


def studies_beside(db: str | os.PathLike[str] | None) -> str:
    """The study storage that belongs with a configs database.

    Args:
        db: The configs database as ``spectune sweep --db`` takes it (a file path,
            ``sqlite:///PATH`` or ``postgresql+psycopg://...``); ``None`` for the default
            write target (``SPECTUNE_DB`` when set, else the user database).

    Returns:
        For a SQLite file ``DIR/NAME.db``, the JournalStorage file
        ``DIR/NAME.studies.journal`` (a path); for a PostgreSQL database, the same URL
        with ``options=-c search_path=spectune_studies`` added, so that Optuna's tables
        live in the schema :data:`STUDIES_SCHEMA` of the same database (created by
        :func:`open_storage` when missing). The URL opens as is in ``optuna-dashboard``.

    Raises:
        spectune.db.DatabaseError: ``db`` is not a usable database target.
    """
    return backend_of(write_target() if db is None else db).studies_storage()


def open_storage(
    storage: str | Path | BaseStorage | None, *, retry_for: float = RETRY_FOR_S
) -> BaseStorage:
    """An Optuna storage for ``storage``.

    Args:
        storage: ``None`` for memory; an Optuna storage as is; a string with ``://``
            is an RDB URL (``sqlite:///x.db``, ``postgresql+psycopg://...``); anything else is
            the path of a JournalStorage file (created if missing).
        retry_for: Seconds a server database (not SQLite) is retried while unreachable,
            when opening it and on every call (:class:`RetryingStorage`).

    Raises:
        TypeError: naming ``storage`` when it is none of these.
        ValueError: a PostgreSQL URL of a configs database without a ``search_path``
            (use :func:`studies_beside`).
        StorageUnavailableError: the server stayed unreachable for ``retry_for`` seconds.
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
        rdb = study_rdb(storage)
        if not rdb.server:
            return RDBStorage(storage, engine_kwargs=rdb.engine_kwargs)
        return _open_server(storage, engine_kwargs=rdb.engine_kwargs, prepare=rdb.prepare,
                            retry_for=retry_for)
    raise TypeError(
        f"storage must be None, a path, an RDB URL or an optuna storage, got {storage!r}"
    )


def _open_server(
    url: str,
    *,
    engine_kwargs: dict[str, Any],
    prepare: Callable[[], contextlib.AbstractContextManager[None]] | None,
    retry_for: float,
) -> RetryingStorage:
    """A database server's study storage, retried while the server is unreachable.

    ``prepare`` is held around creating the storage (PostgreSQL: the init lock, and the
    studies schema created; see :func:`spectune.db.study_rdb`).
    """
    where = display_storage(url)

    def connect() -> BaseStorage:
        with prepare() if prepare is not None else contextlib.nullcontext():
            backend = RDBStorage(url, engine_kwargs=engine_kwargs)
        # What optuna.create_study puts around an RDBStorage: a cache of finished trials.
        return _CachedStorage(backend)

    inner = _retry(connect, retry_for=retry_for, where=where)
    return RetryingStorage(inner, retry_for=retry_for, where=where)


# -- retrying a server storage ----------------------------------------------------------


class StorageUnavailableError(StorageInternalError):
    """The study storage stayed unreachable for the whole retry period."""


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` (or what caused it) is a lost or refused database connection.

    Recognized by class names so that this module needs no database driver
    (:func:`spectune.db.lost_connection`): psycopg's and SQLAlchemy's operational and
    interface errors (Optuna wraps them in a ``StorageInternalError``), except those
    naming a missing database or role or a rejected password, which waiting does not
    cure.
    """
    cause = _connection_error(exc)
    return cause is not None and not is_permanent(cause)


def _connection_error(exc: BaseException) -> BaseException | None:
    """The driver's connection error in ``exc``'s chain (the innermost), if any."""
    return lost_connection(exc)


def _retry(
    call: Callable[[], _T], *, retry_for: float, where: str, what: str = "call"
) -> _T:
    """``call()``, retried with backoff while it fails on the connection."""
    deadline: float | None = None
    delay = 0.1
    while True:
        try:
            result = call()
        except Exception as exc:
            if not is_transient(exc):
                raise
            # The driver's words (connection refused...), not Optuna's wrapper's.
            why = one_line(_connection_error(exc) or exc, limit=200)
            now = time.monotonic()
            if deadline is None:
                deadline = now + retry_for
                _log.warning("study storage %s unreachable (%s); retrying for up to %g s",
                             where, why, retry_for)
            if now >= deadline:
                raise StorageUnavailableError(
                    f"study storage {where} unreachable for {retry_for:g} s ({what}): {why}"
                ) from exc
            time.sleep(min(delay, deadline - now))
            delay = min(delay * 2, 2.0)
            continue
        if deadline is not None:
            _log.warning("study storage %s reachable again", where)
        return result


class RetryingStorage(BaseStorage):
    """A storage that retries calls which failed on a lost database connection.

    Every call is retried with exponential backoff (0.1 s to 2 s) while it fails with a
    connection error (:func:`is_transient`), for up to ``retry_for`` seconds; then
    :class:`StorageUnavailableError` names the storage in one line. Other errors pass
    at once.

    A lost reply may hide a write that was done, so the calls that are not idempotent
    check before they act again:

    * ``create_new_trial`` tags the new trial with a token (system attribute
      ``spectune.create_token``); a retry returns the trial carrying it, if any, instead
      of creating a second one;
    * ``set_trial_state_values`` retried to a finished state that the trial already has
      (same values) was done by the first try: it returns ``True`` instead of raising
      ``UpdateFinishedTrialError``. A retried claim of a waiting trial (state RUNNING)
      that finds it already running returns ``False``, as a claim lost to another worker
      does: no trial ever has two workers. If the first try did claim it, the trial is
      left running without a worker and is recovered like an abandoned one
      (``stale_after``), its configuration retried;
    * attribute, parameter and intermediate-value writes are idempotent; a retried
      ``create_new_study`` may raise ``DuplicatedStudyError``, which
      ``create_study(load_if_exists=True)`` takes as the study being there.

    Args:
        inner: The storage to wrap (an RDB storage, or Optuna's cache around one).
        retry_for: Seconds to retry one call.
        where: The storage for messages (no password).
    """

    def __init__(
        self, inner: BaseStorage, *, retry_for: float = RETRY_FOR_S, where: str = "storage"
    ) -> None:
        if not (isinstance(retry_for, (int, float)) and math.isfinite(retry_for)
                and retry_for >= 0):
            raise ValueError(f"retry_for must be a finite number >= 0, got {retry_for!r}")
        self._inner = inner
        self.retry_for = float(retry_for)
        self.where = where

    @property
    def inner(self) -> BaseStorage:
        """The wrapped storage (calls on it are not retried)."""
        return self._inner

    def _call(self, what: str, call: Callable[[], _T]) -> _T:
        return _retry(call, retry_for=self.retry_for, where=self.where, what=what)

    # -- studies -------------------------------------------------------------------

    def create_new_study(
        self, directions: Sequence[StudyDirection], study_name: str | None = None
    ) -> int:
        return self._call(
            "create_new_study", lambda: self._inner.create_new_study(directions, study_name)
        )

    def delete_study(self, study_id: int) -> None:
        self._call("delete_study", lambda: self._inner.delete_study(study_id))

    def set_study_user_attr(self, study_id: int, key: str, value: Any) -> None:
        self._call(
            "set_study_user_attr", lambda: self._inner.set_study_user_attr(study_id, key, value)
        )

    def set_study_system_attr(self, study_id: int, key: str, value: Any) -> None:
        self._call(
            "set_study_system_attr",
            lambda: self._inner.set_study_system_attr(study_id, key, value),
        )

    def get_study_id_from_name(self, study_name: str) -> int:
        return self._call(
            "get_study_id_from_name", lambda: self._inner.get_study_id_from_name(study_name)
        )

    def get_study_name_from_id(self, study_id: int) -> str:
        return self._call(
            "get_study_name_from_id", lambda: self._inner.get_study_name_from_id(study_id)
        )

    def get_study_directions(self, study_id: int) -> list[StudyDirection]:
        return self._call(
            "get_study_directions", lambda: self._inner.get_study_directions(study_id)
        )

    def get_study_user_attrs(self, study_id: int) -> dict[str, Any]:
        return self._call(
            "get_study_user_attrs", lambda: self._inner.get_study_user_attrs(study_id)
        )

    def get_study_system_attrs(self, study_id: int) -> dict[str, Any]:
        return self._call(
            "get_study_system_attrs", lambda: self._inner.get_study_system_attrs(study_id)
        )

    def get_all_studies(self) -> list[FrozenStudy]:
        return self._call("get_all_studies", self._inner.get_all_studies)

    # -- trials --------------------------------------------------------------------

    def create_new_trial(self, study_id: int, template_trial: FrozenTrial | None = None) -> int:
        token = uuid.uuid4().hex
        template = _tagged(template_trial, token)
        tries = 0

        def create() -> int:
            nonlocal tries
            tries += 1
            if tries > 1:  # the first try may have created it before its reply was lost
                for trial in self._inner.get_all_trials(study_id, deepcopy=False):
                    if trial.system_attrs.get(CREATE_TOKEN_KEY) == token:
                        return trial._trial_id
            return self._inner.create_new_trial(study_id, template)

        return self._call("create_new_trial", create)

    def set_trial_param(
        self,
        trial_id: int,
        param_name: str,
        param_value_internal: float,
        distribution: BaseDistribution,
    ) -> None:
        self._call(
            "set_trial_param",
            lambda: self._inner.set_trial_param(
                trial_id, param_name, param_value_internal, distribution
            ),
        )

    def get_trial_id_from_study_id_trial_number(self, study_id: int, trial_number: int) -> int:
        return self._call(
            "get_trial_id_from_study_id_trial_number",
            lambda: self._inner.get_trial_id_from_study_id_trial_number(study_id, trial_number),
        )

    def get_trial_number_from_id(self, trial_id: int) -> int:
        return self._call(
            "get_trial_number_from_id", lambda: self._inner.get_trial_number_from_id(trial_id)
        )

    def get_trial_param(self, trial_id: int, param_name: str) -> float:
        return self._call(
            "get_trial_param", lambda: self._inner.get_trial_param(trial_id, param_name)
        )

    def set_trial_state_values(
        self, trial_id: int, state: TrialState, values: Sequence[float] | None = None
    ) -> bool:
        tries = 0

        def update() -> bool:
            nonlocal tries
            tries += 1
            try:
                return self._inner.set_trial_state_values(trial_id, state, values)
            except UpdateFinishedTrialError:
                if tries > 1 and _landed(self._inner.get_trial(trial_id), state, values):
                    return True  # the first try did it; its reply was lost
                raise

        return self._call("set_trial_state_values", update)

    def set_trial_intermediate_value(
        self, trial_id: int, step: int, intermediate_value: float
    ) -> None:
        self._call(
            "set_trial_intermediate_value",
            lambda: self._inner.set_trial_intermediate_value(trial_id, step, intermediate_value),
        )

    def set_trial_user_attr(self, trial_id: int, key: str, value: Any) -> None:
        self._call(
            "set_trial_user_attr", lambda: self._inner.set_trial_user_attr(trial_id, key, value)
        )

    def set_trial_system_attr(self, trial_id: int, key: str, value: Any) -> None:
        self._call(
            "set_trial_system_attr",
            lambda: self._inner.set_trial_system_attr(trial_id, key, value),
        )

    def get_trial(self, trial_id: int) -> FrozenTrial:
        return self._call("get_trial", lambda: self._inner.get_trial(trial_id))

    def get_all_trials(
        self,
        study_id: int,
        deepcopy: bool = True,
        states: Container[TrialState] | None = None,
    ) -> list[FrozenTrial]:
        return self._call(
            "get_all_trials",
            lambda: self._inner.get_all_trials(study_id, deepcopy=deepcopy, states=states),
        )

    def get_n_trials(
        self, study_id: int, state: tuple[TrialState, ...] | TrialState | None = None
    ) -> int:
        return self._call("get_n_trials", lambda: self._inner.get_n_trials(study_id, state))

    def get_best_trial(self, study_id: int) -> FrozenTrial:
        return self._call("get_best_trial", lambda: self._inner.get_best_trial(study_id))

    def remove_session(self) -> None:
        self._inner.remove_session()


def _tagged(template: FrozenTrial | None, token: str) -> FrozenTrial:
    """``template`` (or a fresh running trial, as storages create one) with ``token``."""
    if template is None:
        return running_trial(system_attrs={CREATE_TOKEN_KEY: token})
    tagged = copy.copy(template)
    tagged.system_attrs = {**template.system_attrs, CREATE_TOKEN_KEY: token}
    return tagged


def running_trial(
    *,
    params: dict[str, Any] | None = None,
    distributions: dict[str, BaseDistribution] | None = None,
    system_attrs: dict[str, Any] | None = None,
) -> FrozenTrial:
    """A template of a RUNNING trial started now, for ``create_new_trial``."""
    return FrozenTrial(
        number=-1,
        state=TrialState.RUNNING,
        value=None,
        datetime_start=datetime.datetime.now(),
        datetime_complete=None,
        params=dict(params or {}),
        distributions=dict(distributions or {}),
        user_attrs={},
        system_attrs=dict(system_attrs or {}),
        intermediate_values={},
        trial_id=-1,
    )


def _landed(trial: FrozenTrial, state: TrialState, values: Sequence[float] | None) -> bool:
    if trial.state != state:
        return False
    return values is None or list(trial.values or ()) == [float(v) for v in values]


def unretried(storage: BaseStorage) -> BaseStorage:
    """The storage under a :class:`RetryingStorage` (for calls better dropped than
    retried, such as heartbeats: the next one comes soon); ``storage`` otherwise."""
    return storage.inner if isinstance(storage, RetryingStorage) else storage


# -- workers and heartbeats -------------------------------------------------------------


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

    def __init__(
        self, storage: BaseStorage, trial_id: int, *, interval: float, beat_now: bool = True
    ) -> None:
        # A beat that fails is not retried: the next one comes after ``interval``.
        self._storage = unretried(storage)
        self._trial_id = trial_id
        self._interval = interval
        self._beat_now = beat_now  # False: the trial was created with its first beat
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="spectune-beat")

    def __enter__(self) -> Heartbeat:
        if self._beat_now:
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
