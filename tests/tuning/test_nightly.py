"""``spectune nightly`` on CPU: planted missing, stale, regressed and broken rows are found,
re-tuned within the budget, recorded night by night, and reported.

The toy family (integer row sums, tests/tuning/toy_family.py) makes verdicts certain:
its default tile (16) is by far the slowest valid one, ``BLOCK=1024`` the fastest, and
``BUG=1`` gives a wrong result.
"""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner

from spectune.cli import main
from spectune.cli._nightly_report import _RESULT_COLUMNS, _result_cells
from spectune.cli.db import NOT_COMPARED
from spectune.db import TunedRow, open_store
from spectune.db._night_history import finish_night, night_results, nights, start_night
from spectune.db._row import utc_now
from spectune.identity import detect_device, detect_driver, detect_software
from spectune.promotion import Timing
from spectune.space import Problem
from spectune.tuning._job import JobError, load_job
from spectune.tuning.nightly import plan_night, run_night
from spectune.vllm import installed_vllm_version
from tests.tuning.toy_family import ToySumFamily

VOCAB = 256
FAST = {"BLOCK": 1024, "BUG": 0}
DEFAULT = {"BLOCK": 16, "BUG": 0}


def _job(tmp_path: Path, *, ks: str = "[1, 2, 3, 4]", budget: str = "'10m'",
         extra: str = "") -> Path:
    path = tmp_path / "job.toml"
    path.write_text(
        f'name = "toy night"\ndatabases = ["{tmp_path / "configs.db"}"]\n'
        f"budget = {budget}\nreport_dir = 'reports'\n{extra}\n"
        f"[[shapes]]\nkernels = ['toy_sum']\nspec_lens = {ks}\nbatch_sizes = [1]\n"
        f"vocab_sizes = [{VOCAB}]\ntrials = 5\n"
    )
    return path


def _row(k: int, config: dict[str, int], *, tuned: Timing, triton: str | None = None,
         torch: str | None = None, days_ago: int = 3) -> TunedRow:
    software = detect_software()
    software = replace(software, triton=triton or software.triton,
                       torch=torch or software.torch)
    toy = ToySumFamily()
    return TunedRow(
        device=detect_device(), software=software, kernel=toy.name,
        kernel_hash=toy.source_hash,
        problem=Problem(spec_len=k, batch=1, vocab=VOCAB, dtype="float32",
                        draft_probs=True),
        config=config, tuned=tuned, default=Timing(1e5, 1.1e5, 1.2e5), trials=5,
        tuning_seconds=1.0, host="planted", study="planted",
        tuned_at=utc_now() - timedelta(days=days_ago),
    )


def _invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, ["nightly", *args])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout, result.stderr


def _results_by_k(db: Path) -> dict[int, list[tuple[str, str]]]:
    with open_store(db) as store:
        out: dict[int, list[tuple[str, str]]] = {}
        for r in night_results(store, device=detect_device()):
            out.setdefault(r.problem.spec_len, []).append((r.action, r.verdict))
    return out


@pytest.fixture
def night(tmp_path: Path, toy_registered: ToySumFamily, monkeypatch: pytest.MonkeyPatch
          ) -> Path:
    monkeypatch.setenv("SPECTUNE_USER_DB", str(tmp_path / "user.db"))
    monkeypatch.delenv("SPECTUNE_DB", raising=False)
    return tmp_path


def test_a_night_finds_planted_rows_retunes_them_and_writes_the_report(night: Path) -> None:
    db = night / "configs.db"
    slow_recorded = Timing(0.9, 1.0, 1.1)  # far faster than the interpreter can run it
    with open_store(db) as store:
        store.record_many([
            # k=1: nothing -> missing. k=2: a row of another Triton -> stale.
            _row(2, FAST, tuned=Timing(10, 11, 12), triton="0.0.1-old"),
            # k=3: the current key, measured under another torch -> stale (superseded).
            _row(3, FAST, tuned=Timing(10, 11, 12), torch="0.0.1-old"),
            # k=4: the default as "tuned": no longer faster than the default -> regressed.
            _row(4, DEFAULT, tuned=Timing(10, 11, 12)),
            # k=5: the fast config, recorded impossibly fast -> slower than recorded.
            _row(5, FAST, tuned=slow_recorded),
            # k=6: a config that no longer gives the exact result -> broken.
            _row(6, {"BLOCK": 64, "BUG": 1}, tuned=Timing(10, 11, 12)),
        ])
    job = _job(night, ks="[1, 2, 3, 4, 5, 6]")

    code, out, err = _invoke(str(job), "--dry-run")
    assert code == 0, err
    order = [line.split()[1:3] for line in out.splitlines() if line.strip()[:1].isdigit()]
    assert [a for a, _ in order] == ["tune", "tune", "tune", "recheck", "recheck", "recheck"]
    assert "(missing)" in out and "triton 0.0.1-old" in out and "torch 0.0.1-old" in out

    code, out, err = _invoke(str(job), "--json")
    report = json.loads(out)
    (database,) = report["databases"]
    verdicts = {(r["spec_len"], r["action"]): r["verdict"] for r in database["results"]}
    assert verdicts[(1, "tune")] == "inserted"
    assert verdicts[(2, "tune")] == "inserted"
    assert verdicts[(3, "tune")] == "replaced"
    assert verdicts[(4, "recheck")] == "regressed"
    assert verdicts[(5, "recheck")] == "regressed"
    assert verdicts[(6, "recheck")] == "broken"
    # Each regression is re-tuned the same night, in a fresh study, and fixed.
    for k in (4, 5, 6):
        assert verdicts[(k, "retune")] in ("replaced", "removed"), verdicts
    assert report["needs_person"] == 0 and code == 0, database["needs_person"]
    with open_store(db, readonly=True) as store:
        rows = {r.problem.spec_len: r for r in store.rows(kernel="toy_sum")
                if r.software.triton == detect_software().triton}
    assert rows[3].software.torch == detect_software().torch
    assert [h.host for h in rows[3].history] == ["planted"]
    assert rows[4].config != DEFAULT and rows[6].config["BUG"] == 0

    files = report["report"]
    html = Path(files["html"]).read_text()
    assert "Results" in html and "regressed" in html and "<script" not in html
    assert f"toy_sum k=4 B=1 V={VOCAB} float32" in Path(files["markdown"]).read_text()
    for plot in ("speedup", "history", "evaluations"):
        assert Path(files[plot]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads(Path(files["json"]).read_text())["exit_status"] == 0

    # The next night re-checks every row, the one checked longest ago first.
    with open_store(db) as store:
        plan = plan_night(load_job(job), store=store, device=detect_device(),
                          software=detect_software(), driver="none")
    assert {w.action for w in plan} == {"recheck"}
    assert [w.since for w in plan] == sorted(w.since for w in plan)


def test_a_night_cut_short_needs_a_person_and_the_next_one_resumes(night: Path) -> None:
    db = night / "configs.db"
    with open_store(db) as store:
        store.record_many([_row(4, DEFAULT, tuned=Timing(10, 11, 12))])
    # The budget is spent by the re-check: its re-tune is left for the next night.
    job = _job(night, ks="[4]", budget="0.2")
    code, out, _ = _invoke(str(job), "--json")
    assert code == 1
    (database,) = json.loads(out)["databases"]
    assert database["status"] == "budget"
    assert [r["verdict"] for r in database["needs_person"]] == ["regressed"]
    assert [w["action"] for w in database["deferred"]] == ["retune"]
    page = Path(json.loads(out)["report"]["html"]).read_text()
    assert "Needs a person" in page and "Left for the next night" in page

    # The next night starts with the open regression, and fixes it.
    job = _job(night, ks="[4]")
    with open_store(db) as store:
        (first,) = plan_night(load_job(job), store=store, device=detect_device(),
                              software=detect_software(), driver="none")
    assert (first.action, first.why) == ("retune", "regressed")
    code, out, _ = _invoke(str(job), "--json")
    assert code == 0
    # Removed when, under a loaded CPU, no config beat the default side by side.
    (checked, retuned) = _results_by_k(db)[4]
    assert checked == ("recheck", "regressed")
    assert retuned[0] == "retune" and retuned[1] in ("replaced", "removed")
    with open_store(db) as store:
        statuses = [n.status for n in nights(store, device=detect_device())]
    assert statuses == ["budget", "complete"]


def test_a_driver_change_makes_older_rows_stale(night: Path) -> None:
    db = night / "configs.db"
    device, software = detect_device(), detect_software()
    with open_store(db) as store:
        store.record_many([_row(1, FAST, tuned=Timing(10, 11, 12), days_ago=5)])
        old = start_night(store, job="toy night", host="h", device=device, software=software,
                          driver="amdgpu 6.7.0", budget_seconds=60)
        finish_night(store, old.id, status="complete", summary={})
        job = load_job(_job(night, ks="[1]"))
        (work,) = plan_night(job, store=store, device=device, software=software,
                             driver="amdgpu 6.8.5")
        assert (work.action, work.why) == ("tune", "stale")
        assert "driver amdgpu 6.7.0 -> amdgpu 6.8.5" in work.reason
        # The same driver as every recorded night: nothing is stale.
        (work,) = plan_night(job, store=store, device=device, software=software,
                             driver="amdgpu 6.7.0")
        assert work.action == "recheck"


def test_an_interrupted_night_is_recorded_as_such(night: Path) -> None:
    db = night / "configs.db"
    job = load_job(_job(night, ks="[1, 2]"))
    device, software = detect_device(), detect_software()

    def stop_second(work: object, position: int, total: int) -> None:
        if position == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt) as caught:
        run_night(job, database=str(db), storage=str(night / "studies.journal"),
                  device=device, software=software, driver="none", on_work=stop_second)
    report = caught.value.report  # type: ignore[attr-defined]
    assert report.status == "interrupted" and len(report.results) == 1
    assert [w.item.problem.spec_len for w in report.deferred] == [2]
    # The tune measured its config beside vLLM: vLLM has no function for the toy family.
    (tuned,) = report.results
    assert (tuned.vs_vllm, tuned.vllm_p50, tuned.served_p50) == ("not measured", None, None)
    assert tuned.vllm_version == installed_vllm_version() and tuned.vs_vllm_ratio is None
    assert _result_cells(tuned)[_RESULT_COLUMNS.index("vs vLLM")] == NOT_COMPARED
    with open_store(db) as store:
        (run,) = nights(store, device=device)
        assert run.status == "interrupted" and run.summary["done"] == 1
        (recorded,) = night_results(store, run_ids=[run.id])
        assert (recorded.problem.spec_len, recorded.vs_vllm, recorded.vllm_version) \
            == (1, "not measured", tuned.vllm_version)


def test_shards_split_the_shapes_without_overlap(night: Path) -> None:
    job = load_job(_job(night, ks="[1, 2, 3, 4, 5, 6, 7, 8]"))
    device, software = detect_device(), detect_software()
    everything = plan_night(job, store=None, device=device, software=software, driver="none")
    shards = [plan_night(job, store=None, device=device, software=software, driver="none",
                         shard=(i, 3)) for i in range(3)]
    seen = [w.item for part in shards for w in part]
    assert sorted(seen, key=str) == sorted((w.item for w in everything), key=str)
    assert len(seen) == len(set(seen)) == 8


def test_a_dry_run_writes_nothing(night: Path) -> None:
    job = _job(night)
    code, out, err = _invoke(str(job), "--dry-run", "--json")
    assert code == 0, err
    (plan,) = json.loads(out)
    assert [w["why"] for w in plan["work"]] == ["missing"] * 4
    assert sorted(p.name for p in night.iterdir()) == ["job.toml"]


@pytest.mark.parametrize(("body", "message"), [
    ("name = 'x'\ndatabases = ['a.db']\n[[shapes]]\nkernels = ['toy_sum']\nspec_lens = [1]\n"
     "batch_sizes = [1]\nvocab_sizes = [64]\n", "budget: missing"),
    ("name = 'x'\ndatabases = ['a.db']\nbudget = '6h'\nbugdet = 1\n", "bugdet: unknown key"),
    ("name = 'x'\ndatabases = ['a.db']\nbudget = 'soon'\n", "budget: expected a duration"),
    ("name = 'x'\ndatabases = []\nbudget = 60\n", "databases: expected a non-empty list"),
    ("name = 'x'\ndatabases = ['a.db']\nbudget = 60\n[[shapes]]\nkernels = ['nope']\n",
     "shapes[0].kernels: unknown kernel family 'nope'"),
    ("name = 'x'\ndatabases = ['a.db']\nbudget = 60\n[[shapes]]\nkernels = ['toy_sum']\n"
     "spec_lens = '1-99999999999'\nbatch_sizes = [1]\nvocab_sizes = [64]\n",
     "shapes[0].spec_lens"),
    ("name = 'x'\ndatabases = ['a.db']\nbudget = 60\n[[shapes]]\nkernels = ['toy_sum']\n"
     "spec_lens = [1]\nbatch_sizes = [true]\nvocab_sizes = [64]\n",
     "shapes[0].batch_sizes: expected a list of int"),
    ("name = [", "is not valid TOML"),
])
def test_a_bad_job_file_is_one_line_naming_the_key(
    night: Path, body: str, message: str
) -> None:
    path = night / "bad.toml"
    path.write_text(body)
    with pytest.raises(JobError, match=None) as caught:
        load_job(path)
    assert message in str(caught.value) and str(path) in str(caught.value)
    code, _, err = _invoke(str(path))
    assert code == 2
    assert message in err and "Traceback" not in err


def test_a_missing_job_file_is_a_usage_error(night: Path) -> None:
    code, _, err = _invoke(str(night / "absent.toml"))
    assert code == 2 and "cannot be read" in err


@pytest.mark.parametrize(("now", "now_default", "regressed"), [
    # The whole system 20 % slower tonight: the default moved as much; not the config's.
    (Timing(11.8, 12.0, 12.2), Timing(118, 120, 122), False),
    # The config 30 % slower, the default where it was: regressed.
    (Timing(12.8, 13.0, 13.2), Timing(99, 100, 101), True),
    # 2 % slower: under the promotion rule's 3 %, whatever the noise.
    (Timing(10.19, 10.2, 10.21), Timing(100, 100, 100), False),
    # 10 % slower, but tonight's measurement spreads 20 %: within the noise.
    (Timing(10, 11, 12.2), Timing(100, 100, 100), False),
])
def test_slower_than_recorded_means_past_the_measured_noise(
    now: Timing, now_default: Timing, regressed: bool
) -> None:
    from spectune.promotion import MIN_GAIN
    from spectune.tuning.nightly import slowdown

    slower, noise = slowdown(recorded=Timing(9.9, 10.0, 10.1), now=now,
                             recorded_default=Timing(99, 100, 101), now_default=now_default)
    assert (slower > max(MIN_GAIN, noise)) is regressed


def test_sigterm_ends_the_night_as_interrupted_with_its_report(tmp_path: Path) -> None:
    # What systemd and Kubernetes send to stop a job: the real command, a real family.
    import os
    import signal
    import subprocess
    import sys
    import time

    job = tmp_path / "job.toml"
    job.write_text(
        f'name = "term"\ndatabases = ["{tmp_path / "configs.db"}"]\nbudget = "10m"\n'
        "report_dir = 'reports'\n[[shapes]]\nkernels = ['temperature']\nspec_lens = [1]\n"
        "batch_sizes = [1]\nvocab_sizes = [64, 128, 256]\ntrials = 40\n")
    env = dict(os.environ, TRITON_INTERPRET="1", SPECTUNE_USER_DB=str(tmp_path / "u.db"))
    env.pop("SPECTUNE_DB", None)
    command = str(Path(sys.executable).with_name("spectune"))  # the installed entry point
    proc = subprocess.Popen([command, "nightly", str(job)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    assert proc.stderr is not None
    deadline = time.monotonic() + 120
    seen = ""
    while "[1/3]" not in seen and time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        seen += line
    assert "[1/3]" in seen, seen
    time.sleep(1.0)
    proc.send_signal(signal.SIGTERM)
    _, rest = proc.communicate(timeout=120)
    assert proc.returncode == 130, seen + rest
    assert "interrupted" in rest
    with open_store(tmp_path / "configs.db") as store:
        (run,) = nights(store, device=detect_device())
    assert run.status == "interrupted"
    (page,) = (tmp_path / "reports").glob("*/index.html")
    assert "interrupted" in page.read_text()


def test_a_shape_the_default_won_is_not_tuned_again_on_the_same_system(night: Path) -> None:
    from spectune.db._night_history import NightlyResult, record_result

    db = night / "configs.db"
    device, software = detect_device(), detect_software()
    toy = ToySumFamily()
    job = load_job(_job(night, ks="[1, 2]"))
    with open_store(db) as store:
        run = start_night(store, job="toy night", host="h", device=device, software=software,
                          driver="none", budget_seconds=60)
        record_result(store, run.id, NightlyResult(
            kernel=toy.name, kernel_hash=toy.source_hash,
            problem=Problem(spec_len=1, batch=1, vocab=VOCAB, dtype="float32",
                            draft_probs=True),
            action="tune", reason="missing", verdict="default is best"))
        finish_night(store, run.id, status="complete", summary={})
        plan = plan_night(job, store=store, device=device, software=software, driver="none")
        assert [w.item.problem.spec_len for w in plan] == [2]
        # Another driver (or Triton, torch, runtime, kernel source): due again.
        plan = plan_night(job, store=store, device=device, software=software,
                          driver="amdgpu 6.8.5")
        assert [w.item.problem.spec_len for w in plan] == [1, 2]


def test_a_vllm_upgrade_makes_verdicts_stale_and_a_night_measures_them_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A row measured against another vLLM is re-checked even by a job that does not
    re-check, and its config measured again beside the installed vLLM's own MRV2
    ``rejection_sample``; the verdict is then the installed vLLM's."""
    from spectune.db import VllmComparison
    from spectune.kernels import get_family

    monkeypatch.setenv("SPECTUNE_USER_DB", str(tmp_path / "user.db"))
    monkeypatch.delenv("SPECTUNE_DB", raising=False)
    family = get_family("rejection_sample_mrv2")
    device, software = detect_device(), detect_software()
    problem = Problem(spec_len=1, batch=1, vocab=300, dtype="float32", draft_probs=True)
    row = TunedRow(
        device=device, software=software, kernel=family.name,
        kernel_hash=family.source_hash, problem=problem,
        config=family.default_config(problem, device.backend),
        tuned=Timing(9.0, 10.0, 11.0), default=Timing(9.0, 10.0, 11.0), trials=1,
        tuning_seconds=1.0, host="planted", study="planted",
        vllm=VllmComparison(verdict="faster", p50_us=20.0, version="0.31.0"),
    )
    db = tmp_path / "configs.db"
    with open_store(db) as store:
        store.record(row)
    job_path = tmp_path / "job.toml"
    job_path.write_text(
        f'name = "upgrade"\ndatabases = ["{db}"]\nbudget = "10m"\nrecheck = false\n'
        "[[shapes]]\nkernels = ['rejection_sample_mrv2']\nspec_lens = [1]\n"
        "batch_sizes = [1]\nvocab_sizes = [300]\ntrials = 2\n")
    job = load_job(job_path)
    installed = installed_vllm_version()
    with open_store(db) as store:
        planned = plan_night(job, store=store, device=device, software=software, driver="")
    assert [(w.action, w.reason.split("; ")[-1]) for w in planned] == [
        ("recheck", f"measured against vLLM 0.31.0, now {installed}")]
    # The command: its report's vs vLLM column and JSON carry tonight's measurement.
    code, out, err = _invoke(str(job_path), "--json", "--report-dir",
                             str(tmp_path / "reports"))
    assert code == 0, err
    (result,) = json.loads(out)["databases"][0]["results"]
    assert result["verdict"] == "ok" and f"vs vLLM {installed}" in result["message"], result
    (after,) = open_store(db).rows()
    assert after.vllm.version == installed and after.vllm.verdict in ("faster", "not faster")
    assert after.vllm.p50_us is not None and after.vllm.p50_us != 20.0
    # No device memory under the CPU interpreter: the peaks are not recorded.
    assert (after.vllm.peak_mib, after.vllm.tuned_peak_mib) == (None, None)
    assert (result["vs_vllm"], result["vllm_p50_us"], result["vllm_version"]) \
        == (after.vllm.verdict, after.vllm.p50_us, installed)
    ratio = result["vllm_p50_us"] / result["served_p50_us"]
    assert result["vs_vllm_ratio"] == round(ratio, 4)
    assert f"({ratio:.2f}x)" in result["message"]  # the same measurement
    assert f"{ratio:.2f}x vs vLLM" in err  # the line the terminal shows for the shape
    markdown = Path(json.loads(out)["report"]["markdown"]).read_text()
    header, line = [x for x in markdown.splitlines() if x.startswith("| ")]  # Results
    cells = dict(zip(header.split(" | "), line.split(" | "), strict=True))
    assert cells["vs vLLM"] == f"{ratio:.2f}x"
    assert f"<td>{ratio:.2f}x</td>" in Path(json.loads(out)["report"]["html"]).read_text()
    with open_store(db) as store:  # the history keeps it; nothing to do now
        (recorded,) = night_results(store, device=device)
        assert recorded.vs_vllm_ratio == pytest.approx(ratio)
        assert plan_night(job, store=store, device=device, software=software,
                          driver=detect_driver()) == []
