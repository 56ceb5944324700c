"""spectune.tuning.sweep and `spectune sweep`: gated trials, promotion, the CLI."""

from __future__ import annotations

import dataclasses
import json
import os
import re

import pytest
from click.testing import CliRunner

from spectune.cli import main
from spectune.db import open_store
from spectune.identity import detect_device
from spectune.kernels import FAMILIES, KernelFamily
from spectune.promotion import Timing
from spectune.space import Problem
from spectune.tuning.problems import (
    SweepItem,
    as_looked_up,
    parse_int_list,
    study_name,
    sweep_items,
)
from spectune.tuning.sweep import SweepOptions, run_item
from spectune.tuning.trial import TrialRunner
from spectune.vllm import installed_vllm_version
from tests.tuning.toy_family import ToySumFamily

if os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
    pytest.skip("sweeps run kernels under TRITON_INTERPRET=1", allow_module_level=True)

TOY = ToySumFamily()
PROBLEM = Problem(spec_len=1, batch=2, vocab=3000)


def test_trial_gate_times_only_exact_configs() -> None:
    runner = TrialRunner(family=TOY, problem=PROBLEM, backend="cpu-interpreter")
    ok = runner({"BLOCK": 64, "BUG": 0})
    assert ok.status.value == "ok" and ok.time > 0
    assert ok.attrs["p20_us"] <= ok.attrs["p50_us"] <= ok.attrs["p80_us"]
    wrong = runner({"BLOCK": 64, "BUG": 1})
    assert wrong.status.value == "invalid" and "reference" in wrong.message
    broken = runner({"BLOCK": 3, "BUG": 0})
    assert broken.status.value == "fail"
    assert "power of 2" in broken.message
    assert "\n" not in broken.message  # one line: the error's first
    timing = runner.timer(lambda: TOY.launch(runner.inputs, {"BLOCK": 64, "BUG": 0}))
    assert isinstance(timing, Timing) and timing.p20 <= timing.p50 <= timing.p80


def test_toy_family_is_a_kernel_family() -> None:
    assert isinstance(TOY, KernelFamily)
    for problem in (PROBLEM, Problem(spec_len=3, batch=1, vocab=7, dtype="float16",
                                     draft_probs=False)):
        assert TOY.problem_of(TOY.make_inputs(problem, seed=0)) == problem


def test_sweep_promotes_the_fastest_exact_config(toy_registered, places) -> None:
    options = SweepOptions(trials=10, db=places["db"], storage=places["storage"])
    result = run_item(SweepItem(TOY.name, PROBLEM), options=options)
    # Ten trials exhaust the space: 2 fail to compile, 4 give a wrong result.
    assert result.trials == 10
    assert (result.failed, result.invalid) == (2, 4)
    assert result.best_config == {"BLOCK": 1024, "BUG": 0}
    assert result.promoted == "inserted"
    assert result.speedup is not None and result.speedup > 1.03
    rows = open_store(places["db"]).rows(kernel=TOY.name)
    assert len(rows) == 1
    row = rows[0]
    assert row.config == {"BLOCK": 1024, "BUG": 0}
    assert row.study == result.study and row.trials == 10
    assert row.tuned.p50 < row.default.p50
    # Rerunning resumes the finished study: nothing new to evaluate, same best, which
    # the database holds: up to date, nothing measured or written again.
    again = run_item(SweepItem(TOY.name, PROBLEM), options=options)
    assert again.trials == 10 and again.best_config == result.best_config
    assert again.stop_reason in ("max_evals", "exhausted")
    assert again.promoted == "up to date"
    assert open_store(places["db"]).rows(kernel=TOY.name) == [row]


def test_sweep_never_promotes_invalid_or_failed(toy_registered, places) -> None:
    options = SweepOptions(trials=10, db=places["db"], storage=places["storage"])
    run_item(SweepItem(TOY.name, Problem(spec_len=2, batch=1, vocab=500)), options=options)
    for row in open_store(places["db"]).rows(kernel=TOY.name):
        assert row.config["BUG"] == 0 and row.config["BLOCK"] != 3


def test_cli_sweep_then_db_show_lists_the_rows(toy_registered, places) -> None:
    runner = CliRunner()
    result = runner.invoke(main, [
        "sweep", "--kernel", TOY.name, "--spec-lens", "1-2", "--batch-sizes", "2",
        "--vocab-sizes", "3000", "--trials", "10", "--db", places["db"],
        "--storage", places["storage"],
    ])
    assert result.exit_code == 0, result.output
    shown = runner.invoke(main, ["db", "show", "--db", places["db"], "--json"])
    assert shown.exit_code == 0, shown.output
    rows = json.loads(shown.stdout)
    assert sorted(r["spec_len"] for r in rows) == [1, 2]
    assert all(r["config"] == {"BLOCK": 1024, "BUG": 0} for r in rows)
    assert all(r["kernel"] == TOY.name and r["backend"] == "cpu-interpreter" for r in rows)


def test_cli_sweep_real_kernel_tiny_shape(places) -> None:
    """The real verification kernels, end to end, on one tiny problem."""
    result = CliRunner().invoke(main, [
        "sweep", "--spec-lens", "1", "--batch-sizes", "1", "--vocab-sizes", "700",
        "--trials", "3", "--db", places["db"], "--storage", places["storage"],
    ])
    assert result.exit_code == 0, result.output
    assert "sweep results" in result.output
    store = open_store(places["db"])
    rows = store.rows()
    # Measured beside vLLM's own V1 verification: a row either way, with the verdict.
    assert rows, result.output
    for row in rows:
        FAMILIES["rejection_sample"].search_space("cpu-interpreter").validate(row.config)
        assert row.vllm.verdict in ("faster", "not faster"), row.vllm
        assert row.vllm.version == installed_vllm_version()


def test_cli_sweep_of_the_mrv2_family_writes_rows_db_show_lists(places) -> None:
    """The MRV2 verification family, tuned end to end and measured beside vLLM's own
    MRV2 ``rejection_sample`` (both under the interpreter here): a row is written, keyed
    by the family, with vLLM's p50, its version and the verdict, whichever config
    serves (the study's best, or the default: the default's 1024-logit resampling tile
    loops five times over V = 4099)."""
    runner = CliRunner()
    outputs = []
    # A row is written whether or not the promotion rule was met (the default's row
    # holds the verdict); should vLLM's side fail to be measured on a loaded host, a
    # rerun resumes the study with more trials and measures again.
    for trials in ("4", "8"):
        result = runner.invoke(main, [
            "sweep", "--kernel", "rejection_sample_mrv2", "--spec-lens", "1", "--batch-sizes",
            "1", "--vocab-sizes", "4099", "--trials", trials, "--finalists", "1",
            "--db", places["db"], "--storage", places["storage"],
        ])
        assert result.exit_code == 0, result.output
        outputs.append(result.output)
        shown = runner.invoke(main, ["db", "show", "--db", places["db"], "--json"])
        assert shown.exit_code == 0, shown.output
        rows = json.loads(shown.stdout)
        if rows:
            break
    assert [(r["kernel"], r["spec_len"], r["batch"], r["vocab"]) for r in rows] == [
        ("rejection_sample_mrv2", 1, 1, 4099)
    ], "\n".join(outputs)
    family = FAMILIES["rejection_sample_mrv2"]
    assert rows[0]["kernel_hash"] == family.source_hash
    family.search_space("cpu-interpreter").validate(rows[0]["config"])
    row = rows[0]
    assert row["vs_vllm"] in ("faster", "not faster"), row
    assert row["vllm_p50_us"] > 0 and row["vllm_version"] == installed_vllm_version()
    # The sweep's table: vLLM's p50 over the serving config's, as measured side by side;
    # db show's: over the row's tuned p50.
    assert re.search(r"\d\.\d\dx +\d+\.\d\dx +\w", outputs[-1]), outputs[-1]
    ratio = f"{row['vllm_p50_us'] / row['tuned_p50_us']:.2f}x"
    shown = runner.invoke(main, ["db", "show", "--db", places["db"]])
    assert ratio in shown.output, shown.output


def test_sweep_records_not_measured_where_vllm_has_no_such_function(
    toy_registered, places
) -> None:
    """A family vLLM has no function for: the verdict says so, and no row is written
    for the default (nothing was measured against vLLM); --no-vs-vllm skips it."""
    item = SweepItem(TOY.name, Problem(spec_len=2, batch=1, vocab=500))
    options = SweepOptions(trials=3, db=places["db"], storage=places["storage"])
    result = run_item(item, options=options)
    assert result.vllm is not None and result.vllm.verdict == "not measured"
    assert result.vllm.reason and TOY.name in result.vllm.reason, result.vllm
    assert result.vs_vllm is None
    rows = open_store(places["db"]).rows()
    assert all(row.vllm.verdict == "not measured" for row in rows)
    if result.promoted in ("not faster", "default is best"):
        assert rows == []  # no default row without a measurement against vLLM
    skipped = run_item(item, options=dataclasses.replace(options, vs_vllm=False))
    assert skipped.vllm is None


def test_sweep_items_are_keyed_as_the_plugin_looks_them_up() -> None:
    """Sampling ignores k and the drafter: one study per shape, under the problem its
    launches are looked up by; verification keeps every k."""
    items = sweep_items(kernels=["gumbel_sample", "rejection_sample"], spec_lens=[1, 2, 3],
                        batches=[1, 4], vocabs=[97], dtypes=["float32"])
    looked_up = as_looked_up(items)
    gumbel = [i.problem for i in looked_up if i.kernel == "gumbel_sample"]
    assert gumbel == [Problem(spec_len=1, batch=b, vocab=97, draft_probs=False) for b in (1, 4)]
    assert [i for i in looked_up if i.kernel == "rejection_sample"] == [
        i for i in items if i.kernel == "rejection_sample"
    ]


@pytest.mark.parametrize(
    ("kernel", "dtype"), [("temperature", "bfloat16"), ("min_p", "float32"),
                          ("top_k_top_p", "float32"), ("sample", "bfloat16")]
)
def test_sweep_of_a_sampling_family(places, kernel: str, dtype: str) -> None:
    """The sampling families, tuned end to end: every trial's launch is gated against the
    reference on the same inputs, and all are exact (the in-place ones write a copy, so
    repeated launches never compound), keyed by the problem their launches are looked up
    under (one per shape, whatever --spec-lens says)."""
    items = as_looked_up(sweep_items(kernels=[kernel], spec_lens=[1, 2], batches=[2],
                                     vocabs=[3000], dtypes=[dtype]))
    assert [i.problem for i in items] == [
        Problem(spec_len=1, batch=2, vocab=3000, dtype=dtype, draft_probs=False)
    ]
    options = SweepOptions(trials=4, db=places["db"], storage=places["storage"])
    result = run_item(items[0], options=options)
    assert result.trials == 4
    assert (result.failed, result.invalid) == (0, 0)
    assert result.best_config is not None and result.best is not None
    # Measured beside vLLM's own step; the fused sampler is routed by no router and
    # replaces no one vLLM function, so it says why it was not measured.
    measured = result.vllm
    assert measured is not None
    if kernel == "sample":
        assert measured.verdict == "not measured" and measured.reason, measured
    else:
        assert measured.verdict in ("faster", "not faster"), measured
        assert measured.p50_us is not None and measured.p50_us > 0
    family = FAMILIES[kernel]
    for row in open_store(places["db"]).rows(kernel=kernel):
        assert row.kernel_hash == family.source_hash
        family.search_space("cpu-interpreter").validate(row.config)
        assert row.vllm.verdict == measured.verdict


def test_problem_helpers() -> None:
    assert parse_int_list("1-4,8", name="x") == [1, 2, 3, 4, 8]
    with pytest.raises(ValueError, match="--k"):
        parse_int_list("0", name="--k")
    items = sweep_items(kernels=["a"], spec_lens=[1, 2], batches=[1], vocabs=[7],
                        dtypes=["float32"])
    assert [i.problem.spec_len for i in items] == [1, 2]
    device = detect_device()
    names = {study_name(device, i, "h") for i in items}
    assert len(names) == 2 and all(device.device_name in n for n in names)


def test_two_workers_share_one_study(places) -> None:
    """--workers 2: a second process joins the study; no trial lost or repeated."""
    from spectune.search import Search

    family = FAMILIES["rejection_sample"]
    # Trials long enough (V=6000 under the interpreter) that the spawned worker, which
    # needs a few seconds to import torch and triton, joins before the study is done.
    item = SweepItem("rejection_sample", Problem(spec_len=2, batch=2, vocab=6000))
    options = SweepOptions(trials=12, db=places["db"], storage=places["storage"], workers=2)
    result = run_item(item, options=options)
    assert result.trials == 12
    device = detect_device()
    study = Search(space=family.search_space(device.backend), storage=places["storage"],
                   study_name=study_name(device, item, family.source_hash))
    history = study.history()
    assert len(history) == 12
    configs = [tuple(sorted(r.config.items())) for r in history]
    assert len(set(configs)) == 12  # no configuration evaluated twice
    owners = {t.system_attrs.get("spectune.owner", {}).get("pid")
              for t in study.study.get_trials(deepcopy=False)}
    assert len(owners - {None}) == 2  # both processes evaluated trials


@pytest.mark.parametrize("kernel", ["rejection_sample_folded", "rejection_sample_mrv2_folded"])
def test_sweep_of_folded_verification_over_k(places, kernel: str) -> None:
    """Verification with the sampling parameters folded in, tuned per k: one study and
    one row per speculation length, every trial gated against the parameters applied
    first, rows keyed by the folded family (its own hash and space); the serving config
    measured beside vLLM's apply-then-verify sequence (a verdict, vLLM's p50)."""
    items = as_looked_up(sweep_items(kernels=[kernel], spec_lens=[1, 3], batches=[2],
                                     vocabs=[257], dtypes=["float32"]))
    assert [i.problem.spec_len for i in items] == [1, 3]
    # One finalist: the rematch of runners-up is tested on the toy family.
    options = SweepOptions(trials=2, db=places["db"], storage=places["storage"], finalists=1)
    family = FAMILIES[kernel]
    for item in items:
        result = run_item(item, options=options)
        assert result.trials == 2
        assert (result.failed, result.invalid) == (0, 0)
        assert result.best_config is not None
        assert {"BLOCK_T", "PIVOTS"} <= set(result.best_config)
        family.search_space("cpu-interpreter").validate(result.best_config)
        measured = result.vllm
        assert measured is not None and measured.verdict in ("faster", "not faster"), measured
        assert measured.p50_us is not None and measured.p50_us > 0
        assert measured.version == installed_vllm_version()
    # A row is written only where the promotion rule says the best beat the default.
    for row in open_store(places["db"]).rows(kernel=kernel):
        assert row.kernel_hash == family.source_hash
        assert row.problem.spec_len in (1, 3)
        assert row.vllm.verdict in ("faster", "not faster"), row.vllm


@pytest.mark.parametrize("transfer", [True, False])
def test_a_study_on_a_new_gpu_starts_from_what_other_gpus_found(
    toy_registered, places, transfer: bool
) -> None:
    """By default the database's rows of the same kernel on other GPU models are the
    study's prior: tried right after the default (TransferStrategy); --no-transfer
    starts cold."""
    from spectune.search import Search
    from tests.db.conftest import H200, make_row

    found = {"BLOCK": 256, "BUG": 0}
    with open_store(places["db"]) as store:
        store.record(make_row(device=H200, kernel=TOY.name, kernel_hash=TOY.source_hash,
                              spec_len=PROBLEM.spec_len, batch=PROBLEM.batch,
                              vocab=PROBLEM.vocab, dtype=PROBLEM.dtype,
                              draft_probs=PROBLEM.draft_probs, config=found))
    options = SweepOptions(trials=3, db=places["db"], storage=places["storage"],
                           transfer=transfer)
    result = run_item(SweepItem(TOY.name, PROBLEM), options=options)
    space = TOY.search_space(detect_device().backend)
    configs = [r.config for r in Search(space=space, storage=places["storage"],
                                        study_name=result.study).history()]
    assert configs[0] == TOY.default_config(PROBLEM, "cpu")
    assert (configs[1] == found) is transfer


def test_cli_sweep_no_transfer_flag(toy_registered, places) -> None:
    result = CliRunner().invoke(main, [
        "sweep", "--kernel", TOY.name, "--spec-lens", "1", "--batch-sizes", "2",
        "--vocab-sizes", "3000", "--trials", "2", "--db", places["db"],
        "--storage", places["storage"], "--no-transfer",
    ])
    assert result.exit_code == 0, result.output
