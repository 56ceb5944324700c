"""A fleet of search workers on one study in PostgreSQL, beside the configs it tunes.

Where studies live (:func:`studies_beside`), the retrying storage, and the fleet on a real
server: a worker killed with SIGKILL (found by its dead pid on this host, or by its stale
heartbeat as if on another host), a server restart mid-study, a multi-process
``spectune sweep``, and a smoke run of ``benchmarks/bench_fleet.py``. The PostgreSQL tests
are marked ``postgres`` and skip without ``SPECTUNE_TEST_PG_URL`` (they fail under CI);
the restart test runs a private server of its own, never the shared one.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import optuna
import psycopg
import pytest
from click.testing import CliRunner
from optuna.exceptions import StorageInternalError
from optuna.storages import InMemoryStorage
from optuna.trial import TrialState
from sqlalchemy import create_engine
from sqlalchemy.exc import IntegrityError, OperationalError

from spectune.db._locations import parse_target
from spectune.db._reader import REVISIONS
from spectune.search import Outcome, Search
from spectune.search._recording import RETRY_KEY, STATUS_KEY, config_of
from spectune.search._storage import (
    CREATE_TOKEN_KEY,
    OWNER_KEY,
    STUDIES_SCHEMA,
    RetryingStorage,
    StorageUnavailableError,
    display_storage,
    is_transient,
    open_storage,
    studies_beside,
)

# The same places and server as the database tests: no test reads SPECTUNE_DB from the
# outside or touches the real user database; PostgreSQL tests skip without a server, and
# fail in CI.
from tests.db.conftest import _isolated_locations, pg_server_url  # noqa: F401

from .spaces import bowl, grid_space

optuna.logging.set_verbosity(optuna.logging.ERROR)
ROOT = Path(__file__).resolve().parents[2]
STUDY = "fleet"


# -- places -----------------------------------------------------------------------------


def _tables(url: str, schema: str) -> set[str]:
    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            rows = connection.exec_driver_sql(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = %s",
                (schema,),
            ).all()
    finally:
        engine.dispose()
    return {r[0] for r in rows}


# -- where studies live -----------------------------------------------------------------


def test_studies_beside_a_sqlite_file_is_a_journal_next_to_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "configs.db"
    journal = str(tmp_path / "configs.studies.journal")
    assert studies_beside(str(db)) == journal
    assert studies_beside(db) == journal
    assert studies_beside(f"sqlite:///{db}") == journal
    # None: the default write target, the user database (SPECTUNE_USER_DB here) ...
    assert studies_beside(None) == str(tmp_path / "home" / "spectune.studies.journal")
    # ... or SPECTUNE_DB when set.
    monkeypatch.setenv("SPECTUNE_DB", str(tmp_path / "other.db"))
    assert studies_beside(None) == str(tmp_path / "other.studies.journal")


def test_studies_beside_a_postgres_database_is_its_own_schema_there(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url = "postgresql+psycopg://us%40er:p%2Fw%3A@db.example:5433/my%20db?sslmode=require"
    spec = studies_beside(url)
    parsed, original = parse_target(spec), parse_target(url)
    # The same server, database and credentials; Optuna's tables in their own schema.
    for field in ("driver", "username", "password", "host", "port", "database"):
        assert getattr(parsed, field) == getattr(original, field), field
    query = dict(parsed.query)
    assert query["sslmode"] == "require"
    assert query["options"] == f"-c search_path={STUDIES_SCHEMA}"
    # For messages: no password.
    assert display_storage(spec) == spec.replace(":p%2Fw%3A@", ":***@") != spec
    assert display_storage("/a/b.journal") == "/a/b.journal"
    # Options of the configs URL are kept; ours comes last, so it wins.
    spec = studies_beside("postgresql+psycopg://u@h/d?options=-c%20statement_timeout%3D5000")
    assert dict(parse_target(spec).query)["options"] == (
        f"-c statement_timeout=5000 -c search_path={STUDIES_SCHEMA}"
    )
    monkeypatch.setenv("SPECTUNE_DB", url)
    assert studies_beside(None) == studies_beside(url)


def test_a_sqlite_configs_file_and_its_journal_coexist(tmp_path: Path) -> None:
    from spectune.cli import main
    from spectune.db import open_store

    db = tmp_path / "configs.db"
    with open_store(str(db)) as store:
        assert store.count() == 0
    storage = studies_beside(str(db))
    attrs = {"kernel": "toy", "k": 4, "batch": 8, "vocab": 128, "dtype": "float32"}
    engine = Search(space=grid_space(), storage=storage, study_name=STUDY, user_attrs=attrs)
    engine.run(lambda c: Outcome.ok(bowl(c)), max_evals=4)
    assert Path(storage).is_file() and Path(storage).parent == db.parent
    loaded = optuna.load_study(study_name=STUDY, storage=open_storage(storage))
    assert loaded.user_attrs == attrs and len(loaded.trials) == 4
    result = CliRunner().invoke(main, ["db", "validate", "--db", str(db)])
    assert result.exit_code == 0, result.output


@pytest.mark.postgres
def test_configs_and_studies_share_one_postgres_database(pg_url: str) -> None:
    from spectune.cli import main
    from spectune.db import open_store

    storage = studies_beside(pg_url)
    attrs = {"kernel": "temperature", "k": 1, "batch": 1, "vocab": 64, "device": "cpu"}
    # Studies first, on an empty database: the configs schema is created beside them ...
    engine = Search(space=grid_space(), storage=storage, study_name=STUDY, user_attrs=attrs)
    engine.run(lambda c: Outcome.ok(bowl(c)), max_evals=5)
    with open_store(pg_url) as store:
        assert store.count() == 0
    # ... and studies opened again on a database that holds the configs.
    other = Search(space=grid_space(), storage=storage, study_name="second",
                   user_attrs={"kernel": "min_p"})
    other.run(lambda c: Outcome.ok(bowl(c)), max_evals=3)

    public, studies = _tables(pg_url, "public"), _tables(pg_url, STUDIES_SCHEMA)
    assert {"alembic_version", "tuned_configs"} <= public
    assert not public & {"studies", "trials", "version_info"}
    assert {"alembic_version", "studies", "trials", "version_info"} <= studies
    engine_ = create_engine(pg_url)
    with engine_.connect() as connection:
        ours = connection.exec_driver_sql("SELECT version_num FROM alembic_version").scalar()
        theirs = connection.exec_driver_sql(
            f"SELECT version_num FROM {STUDIES_SCHEMA}.alembic_version").scalar()
    engine_.dispose()
    assert ours in REVISIONS and theirs not in REVISIONS
    # Our reader and CLI see a valid configs database ...
    with open_store(pg_url, readonly=True) as store:
        assert store.count() == 0
    result = CliRunner().invoke(main, ["db", "validate", "--db", pg_url])
    assert result.exit_code == 0, result.output
    # ... and Optuna (or optuna-dashboard) opens the studies from the plain URL.
    names = sorted(optuna.study.get_all_study_names(storage))
    assert names == ["fleet", "second"]
    loaded = optuna.load_study(study_name=STUDY, storage=storage)
    assert loaded.user_attrs == attrs
    assert sum(t.state == TrialState.COMPLETE for t in loaded.trials) == 5
    resumed = Search(space=grid_space(), storage=storage, study_name=STUDY)
    assert len(resumed.history()) == 5
    assert isinstance(resumed.storage, RetryingStorage)
    # The configs URL itself as a study storage is refused: Optuna's tables (and its
    # alembic_version) would land beside ours.
    with pytest.raises(ValueError, match="holds spectune's tuned configs"):
        open_storage(pg_url)
    assert not _tables(pg_url, "public") & {"studies", "trials", "version_info"}


# -- the retrying storage, without a server ---------------------------------------------


def _lost_reply() -> Exception:
    """What a request whose connection died under it raises, as Optuna passes it on."""
    try:
        try:
            raise psycopg.OperationalError("server closed the connection unexpectedly")
        except psycopg.OperationalError as exc:
            raise OperationalError("COMMIT", {}, exc) from exc
    except OperationalError as exc:
        wrapped = StorageInternalError("An exception is raised during the commit.")
        wrapped.__cause__ = exc
        return wrapped


class _LosesReplies(InMemoryStorage):
    """Does each write, then loses the reply of the first ``create_new_trial`` and of
    the first ``set_trial_state_values`` to a finished state."""

    def __init__(self) -> None:
        super().__init__()
        self.lost: set[str] = set()

    def _lose(self, what: str) -> None:
        if what not in self.lost:
            self.lost.add(what)
            raise _lost_reply()

    def create_new_trial(self, study_id: int, template_trial: Any = None) -> int:
        trial_id = super().create_new_trial(study_id, template_trial)
        self._lose("create")
        return trial_id

    def set_trial_state_values(self, trial_id: int, state: TrialState,
                               values: Any = None) -> bool:
        done = super().set_trial_state_values(trial_id, state, values)
        if state.is_finished():
            self._lose("finish")
        return done


def test_transient_errors_are_told_from_others() -> None:
    assert is_transient(_lost_reply())
    assert is_transient(psycopg.OperationalError("connection refused"))
    assert is_transient(psycopg.errors.AdminShutdown("terminating connection"))
    missing = psycopg.OperationalError('connection failed: FATAL: database "x" does not exist')
    assert not is_transient(missing)
    assert not is_transient(psycopg.OperationalError("password authentication failed"))
    assert not is_transient(IntegrityError("INSERT", {}, Exception("duplicate key")))
    assert not is_transient(ValueError("nope"))


def test_retried_writes_whose_reply_was_lost_are_not_done_twice() -> None:
    inner = _LosesReplies()
    storage = RetryingStorage(inner, retry_for=30)
    study = optuna.create_study(storage=storage, study_name="s")
    trial = study.ask()
    x = trial.suggest_int("x", 0, 9)
    # The create was retried: one trial, the one made by the first try (its token).
    trials = study.get_trials()
    assert len(trials) == 1 and trials[0].system_attrs[CREATE_TOKEN_KEY]
    # The finish was retried: it reports done, instead of "already finished".
    study.tell(trial, float(x))
    assert inner.lost == {"create", "finish"}
    assert [t.state for t in study.get_trials()] == [TrialState.COMPLETE]
    assert study.get_trials()[0].value == float(x)


def test_an_unreachable_storage_fails_in_one_line_after_the_retry_period() -> None:
    class Down(InMemoryStorage):
        def get_all_studies(self) -> Any:
            raise _lost_reply()

    storage = RetryingStorage(Down(), retry_for=0.3, where="postgresql+psycopg://u:***@h/d")
    start = time.monotonic()
    with pytest.raises(StorageUnavailableError) as info:
        storage.get_all_studies()
    assert 0.3 <= time.monotonic() - start < 3
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(
        "study storage postgresql+psycopg://u:***@h/d unreachable for 0.3 s (get_all_studies)"
    )
    start = time.monotonic()
    with pytest.raises(KeyError):  # not a connection error: raised at once
        RetryingStorage(InMemoryStorage(), retry_for=30).get_study_id_from_name("absent")
    assert time.monotonic() - start < 1


# -- a fleet of worker processes --------------------------------------------------------


def _spawn(storage: str, log: Path, *, max_evals: int, seed: int, sleep: float,
           stale_after: float, heartbeat: float, host: str | None = None,
           hang_at: int | None = None) -> subprocess.Popen[str]:
    command = [
        sys.executable, "-m", "tests.search.pg_worker", storage, str(log),
        "--study", STUDY, "--seed", str(seed), "--max-evals", str(max_evals),
        "--sleep", str(sleep), "--stale-after", str(stale_after),
        "--heartbeat-interval", str(heartbeat),
    ]
    if host is not None:
        command += ["--host", host]
    if hang_at is not None:
        command += ["--hang-at", str(hang_at)]
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    return subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _lines(*logs: Path) -> list[tuple[str, int, str]]:
    """``(kind, pid, config)`` of every line of the workers' logs."""
    out = []
    for log in logs:
        if log.exists():
            for line in log.read_text().splitlines():
                kind, pid, config = line.split(" ", 2)
                out.append((kind, int(pid), config))
    return out


def _finish(procs: list[subprocess.Popen[str]], timeout: float) -> list[str]:
    """Wait for every worker; their stderr. Fails naming the first that failed."""
    errs = []
    deadline = time.monotonic() + timeout
    for proc in procs:
        try:
            out, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            raise
        assert proc.returncode == 0, err[-3000:]
        assert json.loads(out.strip().splitlines()[-1])["stop_reason"] == "max_evals", out
        errs.append(err)
    return errs


def _key(config: dict[str, int]) -> str:
    return json.dumps(config, sort_keys=True)


def _check_study(storage: str, logs: list[Path], *, max_evals: int) -> tuple[Search, list[str]]:
    """The study holds exactly ``max_evals`` charged evaluations, each of a different
    config, and exactly the evaluations the workers finished. Returns the configs the
    workers started without finishing (cut by a kill)."""
    engine = Search(space=grid_space(), storage=storage, study_name=STUDY)
    trials = engine.study.get_trials()
    assert not [t.number for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)]
    history = engine.history()
    configs = [_key(r.config) for r in history]
    assert len(history) == max_evals  # the study's limit, charged exactly
    assert len(set(configs)) == max_evals  # no config charged twice
    lines = _lines(*logs)
    done = [c for kind, _pid, c in lines if kind == "done"]
    assert sorted(done) == sorted(configs)  # nothing finished lost, none recorded twice
    started = [c for kind, _pid, c in lines if kind == "start"]
    cut = list(started)
    for config in done:
        cut.remove(config)
    return engine, cut


@pytest.mark.postgres
@pytest.mark.parametrize("detection", ["dead-pid", "stale-heartbeat"])
def test_a_sigkilled_worker_is_recovered_by_the_others(
    pg_url: str, tmp_path: Path, detection: str
) -> None:
    storage = studies_beside(pg_url)
    Search(space=grid_space(), storage=storage, study_name=STUDY)  # created once
    max_evals = 24
    # Same host: the dead pid is seen at once, so a long stale_after proves it. Another
    # host: only the heartbeat tells, going stale after 3 s.
    stale = 600.0 if detection == "dead-pid" else 3.0
    host = None if detection == "dead-pid" else "elsewhere.example"
    logs = [tmp_path / f"worker{i}.log" for i in range(3)]
    victim = _spawn(storage, logs[0], max_evals=max_evals, seed=0, sleep=0.1,
                    stale_after=stale, heartbeat=0.2, host=host, hang_at=3)
    others = [_spawn(storage, logs[i], max_evals=max_evals, seed=i, sleep=0.15,
                     stale_after=stale, heartbeat=0.2) for i in (1, 2)]
    try:
        deadline = time.monotonic() + 90
        while sum(kind == "start" for kind, _p, _c in _lines(logs[0])) < 3:
            assert victim.poll() is None, victim.communicate()
            assert time.monotonic() < deadline, "the victim is too slow"
            time.sleep(0.02)
        victim.kill()  # SIGKILL, in its third evaluation: it holds a RUNNING trial
        victim.wait()
        killed_at = time.monotonic()
        _finish(others, timeout=120)
    finally:
        for proc in (victim, *others):
            if proc.poll() is None:
                proc.kill()
    elapsed = time.monotonic() - killed_at

    engine, cut = _check_study(storage, logs, max_evals=max_evals)
    victim_lines = _lines(logs[0])
    assert victim_lines[-1][0] == "start"
    assert cut == [victim_lines[-1][2]]  # only the victim's last evaluation was cut
    trials = engine.study.get_trials()
    abandoned = [t for t in trials if t.user_attrs.get(STATUS_KEY) == "abandoned"]
    assert len(abandoned) == 1 and abandoned[0].state == TrialState.FAIL
    assert _key(config_of(abandoned[0])) == cut[0]
    owner = abandoned[0].system_attrs[OWNER_KEY]
    assert owner["pid"] == victim.pid
    assert owner["host"] == (socket.gethostname() if host is None else host)
    # Its config was retried, once, by another worker, and charged then.
    retries = [t for t in trials if t.user_attrs.get(RETRY_KEY) == abandoned[0].number]
    assert len(retries) == 1 and retries[0].state == TrialState.COMPLETE
    assert _key(config_of(retries[0])) == cut[0]
    retried_by = {pid for kind, pid, c in _lines(*logs[1:]) if kind == "done" and c == cut[0]}
    assert len(retried_by) == 1 and victim.pid not in retried_by
    if detection == "dead-pid":
        assert elapsed < 60  # found by its pid, not by a 600 s stale heartbeat


class _PrivateServer:
    """A PostgreSQL server of this test's own, to restart (loopback, trust, no fsync)."""

    def __init__(self, bindir: Path, root: Path, port: int) -> None:
        self.bindir, self.root, self.port = bindir, root, port
        self.data = root / "data"
        self.url = f"postgresql+psycopg://postgres@127.0.0.1:{port}/fleet"

    def _run(self, *command: str, check: bool = True) -> None:
        prefix = ["runuser", "-u", "postgres", "--"] if os.getuid() == 0 else []
        # Never a pipe: the server inherits the descriptors and would hold them open.
        with open(self.root / "ctl.log", "a") as log:
            subprocess.run([*prefix, *command], stdin=subprocess.DEVNULL, stdout=log,
                           stderr=log, check=check, timeout=120)

    def init(self) -> None:
        self._run(str(self.bindir / "initdb"), "-D", str(self.data), "-U", "postgres",
                  "--auth=trust", "-E", "UTF8", "--no-locale")
        self.start()
        self._run(str(self.bindir / "createdb"), "-h", "127.0.0.1", "-p", str(self.port),
                  "-U", "postgres", "fleet")

    def start(self) -> None:
        options = (f"-c listen_addresses=127.0.0.1 -p {self.port} "
                   f"-c unix_socket_directories={self.root} -c fsync=off "
                   "-c synchronous_commit=off -c full_page_writes=off")
        self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-l",
                  str(self.root / "server.log"), "-w", "-t", "60", "-o", options, "start")

    def stop(self, mode: str = "fast") -> None:
        self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w",
                  "stop", check=mode == "fast")


def _pg_bindir() -> Path:
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"),
                   key=lambda p: [int(x) if x.isdigit() else 0 for x in p.parts[-3].split(".")])
    if not found:
        if os.environ.get("CI"):
            pytest.fail("no PostgreSQL server binaries under /usr/lib/postgresql, but CI is set")
        pytest.skip("no PostgreSQL server binaries (apt-get install postgresql)")
    return found[-1].parent


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def private_pg() -> Iterator[_PrivateServer]:
    """A private server, stopped and removed afterwards."""
    pg_server_url()  # skips (or fails in CI) with the other PostgreSQL tests
    bindir = _pg_bindir()
    # Not tmp_path: the postgres user cannot enter pytest's root-only temporary folders.
    root = Path(tempfile.mkdtemp(prefix="spectune-fleet-pg-", dir="/tmp"))
    if os.getuid() == 0:
        shutil.chown(root, "postgres")
    server = _PrivateServer(bindir, root, _free_port())
    try:
        server.init()
        yield server
    finally:
        server.stop("immediate")
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.postgres
def test_the_fleet_survives_a_server_restart(private_pg: _PrivateServer, tmp_path: Path) -> None:
    storage = studies_beside(private_pg.url)
    Search(space=grid_space(), storage=storage, study_name=STUDY)
    max_evals = 36
    logs = [tmp_path / f"worker{i}.log" for i in range(3)]
    procs = [_spawn(storage, logs[i], max_evals=max_evals, seed=i, sleep=0.25,
                    stale_after=30.0, heartbeat=0.3) for i in range(3)]
    try:
        deadline = time.monotonic() + 90
        while sum(kind == "done" for kind, _p, _c in _lines(*logs)) < 8:
            assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
            assert time.monotonic() < deadline, "workers too slow"
            time.sleep(0.05)
        private_pg.stop("fast")  # every connection is cut; new ones are refused
        down = sum(kind == "done" for kind, _p, _c in _lines(*logs))
        time.sleep(3)
        private_pg.start()
        errs = _finish(procs, timeout=150)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    assert down < max_evals  # the restart came mid-study
    engine, cut = _check_study(storage, logs, max_evals=max_evals)
    assert cut == []  # no evaluation was lost or repeated
    assert not [t for t in engine.study.get_trials()
                if t.user_attrs.get(STATUS_KEY) == "abandoned"]
    # The workers did see the outage, and came back.
    assert any("unreachable" in e and "reachable again" in e for e in errs), errs
    assert all("Traceback" not in e for e in errs), errs


@pytest.mark.postgres
def test_sweep_processes_share_one_study_in_postgres(pg_url: str, tmp_path: Path) -> None:
    from spectune.db import open_store

    storage = studies_beside(pg_url)
    env = dict(os.environ, TRITON_INTERPRET="1", SPECTUNE_USER_DB=str(tmp_path / "user.db"),
               OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    env.pop("SPECTUNE_DB", None)
    command = [sys.executable, "-c", "from spectune.cli import main; main()", "sweep",
               "--kernel", "temperature", "--spec-lens", "1", "--batch-sizes", "1",
               "--vocab-sizes", "32768", "--trials", "8", "--db", pg_url,
               "--storage", storage, "--json"]
    procs = [subprocess.Popen([*command, "--seed", str(i)], cwd=ROOT, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(3)]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-3000:]
        results.append(json.loads(out))
    studies = {r["study"] for result in results for r in result}
    assert len(studies) == 1  # one study, shared
    (name,) = studies
    assert all(r["trials"] == 8 for result in results for r in result)
    study = optuna.load_study(study_name=name, storage=storage)
    charged = [t for t in study.trials if t.state in (TrialState.COMPLETE, TrialState.FAIL)
               and t.user_attrs.get(STATUS_KEY) in ("ok", "fail", "invalid")]
    assert len(charged) == 8
    assert len({_key(config_of(t)) for t in charged}) == 8
    with open_store(pg_url, readonly=True) as store:
        rows = [r for r in store.rows() if r.kernel == "temperature"]
    promoted = [r["promoted"] for result in results for r in result]
    # One row for the problem, however many processes promoted it (unless the study's
    # best was no faster than the default: V=32768 makes that unlikely, 1.5x usually).
    assert len(rows) == 1 or set(promoted) <= {"not faster", "default is best"}, promoted
    assert len(rows) <= 1 and all(r.study == name for r in rows)


@pytest.mark.postgres
def test_the_fleet_benchmark_runs(tmp_path: Path) -> None:
    from spectune.search.replay import SyntheticSpec, write_synthetic

    server = pg_server_url()
    out = tmp_path / "fleet.json"
    # A generated space: a clean checkout has no ../shared/tuning-spaces beside it.
    spec = SyntheticSpec(tiles=2, knobs=1, switches=0, interactions=1, roughness=0.1,
                         fail_fraction=0.0, max_configs=60)
    space = write_synthetic(tmp_path / "fleet_T4.json.gz", spec, seed=3)
    done = subprocess.run(
        [sys.executable, "benchmarks/bench_fleet.py", "--pg-url", server, "--workers", "1,2",
         "--trials", "6", "--scale", "0.005", "--samplers", "random", "--space", str(space),
         "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env=dict(os.environ, OPENBLAS_NUM_THREADS="1"),
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    report = json.loads(out.read_text())
    assert [(r["workers"], r["trials"]) for r in report["runs"]] == [(1, 6), (2, 6)]
    assert all(r["distinct_configs"] == 6 and r["trials_per_s"] > 0 for r in report["runs"])
    assert report["runs"][0]["vs_linear"] == pytest.approx(1.0)
    assert "| random | 2 | 6 |" in done.stdout
