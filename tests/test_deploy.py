"""The scheduling examples in deploy/ parse, and the command each runs works (dry run).

A systemd service + timer and a Kubernetes CronJob (one GPU) and indexed Job (many GPUs,
one shard each) run ``spectune nightly``; each command is run here as its unit or pod
would run it (its job file, its environment), with ``--dry-run`` added: the plan is
made from the real job file and the real kernel families, and nothing is written.
"""

from __future__ import annotations

import configparser
import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from spectune.cli import main

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"
JOB_PATH = "/etc/spectune/nightly.toml"


def _unit(path: Path) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None, strict=True)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string(path.read_text())
    return parser


def _dry_run(argv: list[str], *, job: Path, env: dict[str, str]) -> list[dict[str, Any]]:
    """Run ``spectune ...`` as given, the job file mapped to ``job``, with --dry-run."""
    assert Path(argv[0]).name == "spectune", argv
    args = [str(job) if a == JOB_PATH else a for a in argv[1:]]
    assert args[0] == "nightly" and str(job) in args, argv
    result = CliRunner().invoke(main, [*args, "--dry-run", "--json"], env=env)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def _expand(argv: list[str], env: dict[str, str]) -> list[str]:
    # Kubernetes substitutes $(NAME) in a container's command from its environment.
    return [re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], a) for a in argv]


@pytest.fixture
def places(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SPECTUNE_USER_DB", str(tmp_path / "user.db"))
    monkeypatch.delenv("SPECTUNE_DB", raising=False)
    return tmp_path


def test_the_systemd_units_run_a_working_command(places: Path) -> None:
    service = _unit(DEPLOY / "systemd" / "spectune-nightly.service")
    timer = _unit(DEPLOY / "systemd" / "spectune-nightly.timer")
    assert service["Service"]["Type"] == "oneshot"
    assert timer["Timer"]["Unit"] == "spectune-nightly.service"
    assert re.fullmatch(r"\*-\*-\* \d\d:\d\d:\d\d", timer["Timer"]["OnCalendar"])
    assert timer["Install"]["WantedBy"] == "timers.target"
    env = dict(e.split("=", 1) for e in shlex.split(service["Service"]["Environment"]))
    env["SPECTUNE_USER_DB"] = str(places / "user.db")  # the unit's path is the host's
    (plan,) = _dry_run(shlex.split(service["Service"]["ExecStart"]),
                       job=DEPLOY / "nightly.toml", env=env)
    # The database does not exist here: everything is missing, and nothing is created.
    assert plan["database"] == "/var/lib/spectune/tuned.db"
    assert len(plan["work"]) == 9 and {w["why"] for w in plan["work"]} == {"missing"}
    assert not Path(plan["database"]).exists()
    assert sorted(p.name for p in places.iterdir()) == []


def _documents(name: str) -> dict[str, dict[str, Any]]:
    docs = list(yaml.safe_load_all((DEPLOY / "kubernetes" / name).read_text()))
    return {d["kind"]: d for d in docs}


def _pod_env(container: dict[str, Any], *, database: str, index: int = 0) -> dict[str, str]:
    env = {"JOB_COMPLETION_INDEX": str(index)}
    for var in container.get("env", []):
        if "valueFrom" in var:
            assert var["valueFrom"]["secretKeyRef"] == {"name": "spectune-db", "key": "url"}
            env[var["name"]] = database
        else:
            env[var["name"]] = var["value"]
    return env


def _mounted_job(places: Path) -> Path:
    config_map = _documents("cronjob.yaml")["ConfigMap"]
    job = places / "etc" / "nightly.toml"
    job.parent.mkdir()
    job.write_text(config_map["data"]["nightly.toml"])
    return job


def test_the_cronjob_runs_a_working_command(places: Path) -> None:
    docs = _documents("cronjob.yaml")
    cron = docs["CronJob"]["spec"]
    assert len(cron["schedule"].split()) == 5 and cron["concurrencyPolicy"] == "Forbid"
    pod = cron["jobTemplate"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts["job"] == str(Path(JOB_PATH).parent)
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["job"]["configMap"]["name"] == docs["ConfigMap"]["metadata"]["name"]
    database = str(places / "fleet.db")
    env = _pod_env(container, database=database)
    (plan,) = _dry_run(_expand(container["command"], env), job=_mounted_job(places), env=env)
    assert plan["database"] == database and len(plan["work"]) == 9
    assert not Path(database).exists()


def test_the_indexed_job_splits_the_shapes_between_its_pods(places: Path) -> None:
    job = _documents("indexed-job.yaml")["Job"]["spec"]
    assert job["completionMode"] == "Indexed"
    (container,) = job["template"]["spec"]["containers"]
    shard = container["command"][container["command"].index("--shard") + 1]
    assert shard == f"$(JOB_COMPLETION_INDEX)/{job['completions']}"
    mounted = _mounted_job(places)
    database = str(places / "fleet.db")
    shapes = []
    for index in range(job["completions"]):
        env = _pod_env(container, database=database, index=index)
        (plan,) = _dry_run(_expand(container["command"], env), job=mounted, env=env)
        shapes += [w["problem"] for w in plan["work"]]
    assert len(shapes) == len(set(shapes)) == 9
