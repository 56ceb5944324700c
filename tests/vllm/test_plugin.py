"""The entry point, vLLM's plugin filtering, the controls, and the worker-side decision.

Everything runs against the installed vLLM: its entry-point loader, its real
``VllmConfig`` (built by ``EngineArgs`` from a tiny local model), its CPU platform's
kernel overrides, and the module-level function ``RejectionSampler.forward`` calls.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import pytest
import vllm._custom_ops  # noqa: F401  (loads vLLM's C++ ops)
from vllm.engine.arg_utils import EngineArgs
from vllm.platforms.cpu import CpuPlatform
from vllm.plugins import DEFAULT_PLUGINS_GROUP, load_plugins_by_group
from vllm.v1.sample import rejection_sampler as rs
from vllm.v1.worker.gpu.spec_decode import rejection_sampler as mrv2_rs

import spectune.vllm
from spectune.db import TunedRow, VllmComparison, open_store
from spectune.identity import detect_device, detect_software
from spectune.kernels import get_family
from spectune.promotion import Timing
from spectune.space import Problem
from spectune.vllm import _hook as hook
from spectune.vllm._configs import TunedConfigs
from spectune.vllm._router import PassToVllm
from spectune.vllm._settings import installed_vllm_version, vllm_supported
from spectune.vllm._v1_router import expand_kernel
from tests.vllm.conftest import needs_kernels, plugin_records
from tests.vllm.test_route import call, inputs_of, make_batch

pytestmark = [pytest.mark.vllm]

ROOT = Path(__file__).resolve().parents[2]
_SPECTUNE_ENV = ("SPECTUNE_DISABLE", "SPECTUNE_FORCE", "SPECTUNE_RNG", "SPECTUNE_DB",
                 "VLLM_USE_V2_MODEL_RUNNER", "VLLM_PLUGINS")


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in _SPECTUNE_ENV:
        monkeypatch.delenv(name, raising=False)
    # Never read the developer's own user database.
    monkeypatch.setenv("SPECTUNE_USER_DB", str(tmp_path / "absent-user.db"))


@pytest.fixture(scope="module", autouse=True)
def _cpu_fallbacks() -> None:
    """vLLM's own kernels on this host, as a worker has them before our hook runs: the CPU
    platform's C++ fallbacks (whatever tests ran before, or none)."""
    hook.platform_overrides_only()


@pytest.fixture
def plugin_log(
    spec_config: Any, plain_config: Any
) -> Iterator[list[logging.LogRecord]]:
    """Records of the plugin's logger (under vLLM's, which does not propagate to root).

    Set up after the engine configs: building one re-runs vLLM's logging set-up, which
    drops the handlers of loggers under ``vllm``.
    """
    with plugin_records() as records:
        yield records


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.vllm._engine_run import build_model

    return build_model(tmp_path_factory.mktemp("model") / "tiny-llama")


@pytest.fixture(scope="module")
def spec_config(tiny_model: Path) -> Any:
    return engine_config(tiny_model, spec=True)


@pytest.fixture(scope="module")
def plain_config(tiny_model: Path) -> Any:
    return engine_config(tiny_model, spec=False)


def engine_config(model: Path, *, spec: bool) -> Any:
    """vLLM's real ``VllmConfig`` for the tiny model (ngram speculation or none)."""
    extra: dict[str, Any] = {}
    if spec:
        extra["speculative_config"] = {"method": "ngram", "num_speculative_tokens": 3,
                                       "prompt_lookup_max": 3, "prompt_lookup_min": 1}
    args = EngineArgs(model=str(model), skip_tokenizer_init=True, dtype="float32",
                      max_model_len=256, enforce_eager=True, **extra)
    return args.create_engine_config()


@pytest.fixture
def worker_state() -> Iterator[None]:
    """Leave vLLM's module as the test found it, whatever the plugin did."""
    original = rs.rejection_sample
    assert getattr(original, "__self__", None) is None  # vLLM's own function
    yield
    router = hook.STATE.router
    if router is not None:
        router.uninstall()
        hook.STATE.router = None
    assert rs.rejection_sample is original


def messages(records: list[logging.LogRecord], level: int) -> list[str]:
    return [r.getMessage() for r in records if r.levelno == level]


# --------------------------------------------------------------------------------------
# Entry point and vLLM's plugin filtering
# --------------------------------------------------------------------------------------


def test_entry_point_is_discoverable() -> None:
    found = [ep for ep in entry_points(group=DEFAULT_PLUGINS_GROUP) if ep.name == "spectune"]
    assert len(found) == 1
    assert found[0].value == "spectune.vllm:register"
    assert found[0].load() is spectune.vllm.register


@pytest.mark.parametrize(
    ("allowed", "loaded"),
    [(None, True), ("spectune", True), ("spectune,other", True), ("other", False), ("", False)],
)
def test_vllm_plugins_filtering(
    monkeypatch: pytest.MonkeyPatch, allowed: str | None, loaded: bool
) -> None:
    if allowed is not None:
        monkeypatch.setenv("VLLM_PLUGINS", allowed)
    plugins = load_plugins_by_group(DEFAULT_PLUGINS_GROUP)
    assert ("spectune" in plugins) is loaded
    if loaded:
        assert plugins["spectune"] is spectune.vllm.register


_PROBE = """
import json, logging, sys
records = []
class Keep(logging.Handler):
    def emit(self, record): records.append(record.getMessage())
logging.getLogger("vllm.spectune").addHandler(Keep())
logging.getLogger("vllm.spectune").setLevel(logging.DEBUG)
from vllm.plugins import load_general_plugins
from vllm.platforms import current_platform
load_general_plugins()
hook = getattr(type(current_platform).register_triton_kernel_overrides, "__func__", None)
print("PROBE " + json.dumps({
    "imported": "spectune.vllm" in sys.modules,
    "hooked": bool(getattr(hook, "_spectune_worker_hook", False)),
    "log": records,
}))
"""


def _probe(env: dict[str, str], *, code: str = _PROBE) -> dict[str, Any]:
    """``code`` (default: ``load_general_plugins()``, as every vLLM process runs it) in a
    fresh process."""
    full = {k: v for k, v in os.environ.items() if k not in _SPECTUNE_ENV}
    full.update(env)
    done = subprocess.run([sys.executable, "-c", code], env=full, cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    lines = [line for line in done.stdout.splitlines() if line.startswith("PROBE ")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    return json.loads(lines[-1][len("PROBE "):])


def test_load_general_plugins_filtered_out_and_disabled() -> None:
    """In fresh processes: VLLM_PLUGINS without spectune never imports it;
    SPECTUNE_DISABLE=1 loads it but hooks nothing, and says so once."""
    filtered = _probe({"VLLM_PLUGINS": "some_other_plugin"})
    assert filtered == {"imported": False, "hooked": False, "log": []}
    disabled = _probe({"SPECTUNE_DISABLE": "1"})
    assert disabled["imported"] and not disabled["hooked"]
    assert len(disabled["log"]) == 1 and "disabled by SPECTUNE_DISABLE=1" in disabled["log"][0]


_SERVING_PROBE = """
import json, sys
import vllm.v1.sample.rejection_sampler
from vllm.platforms import current_platform
current_platform.register_triton_kernel_overrides()  # vLLM's own worker step
before = set(sys.modules)
import spectune.vllm
from spectune.vllm import _hook
spectune.vllm.register()
_hook.on_worker_init(None, at_first_call=False)  # the CPU path: load and route in line
router = _hook.STATE.router
_hook.STATE.prefetch.join()  # the routed families' kernels, imported in the background
new = set(sys.modules) - before
print("PROBE " + json.dumps({
    "routed": router is not None and router.installed and router.configured,
    "usable": router.configs.usable if router is not None and router.configs else None,
    "new": sorted(m for m in new if "." not in m or m.startswith("spectune.")),
}))
"""


@needs_kernels
def test_serving_imports_no_tuner_and_no_sqlalchemy(tmp_path: Path) -> None:
    """A worker that loads a SQLite database and routes imports none of the tuner's
    packages, nor SQLAlchemy, nor the command line (in a fresh process, beyond what vLLM
    itself imported)."""
    problem = Problem(spec_len=3, batch=4, vocab=300, dtype="float32", draft_probs=False)
    db = _database(tmp_path / "tuned.db", [_row(problem)])
    probe = _probe({"SPECTUNE_DB": str(db), "SPECTUNE_USER_DB": str(tmp_path / "none.db"),
                    "TRITON_INTERPRET": "1"}, code=_SERVING_PROBE)
    assert probe["routed"] and probe["usable"] == 1
    new = set(probe["new"])
    assert "spectune.vllm._v1_router" in new and "spectune.kernels" in new
    # The V1 runner's kernels, and no kernel of a family it does not route.
    assert "spectune.kernels.rejection.rejection_sample" in new
    not_routed = {"spectune.kernels.rejection_mrv2.rejection_sample_mrv2",
                  "spectune.kernels.sampling.temperature", "spectune.kernels.sampling.min_p",
                  "spectune.kernels.sampling.gumbel_sample", "spectune.kernels.sampling.sample"}
    assert not new & not_routed, sorted(new & not_routed)
    forbidden = {"optuna", "scipy", "matplotlib", "sqlalchemy", "alembic", "click", "rich",
                 "spectune.search", "spectune.tuning", "spectune.cli", "spectune.vllm.doctor"}
    assert not new & forbidden, sorted(new & forbidden)


def test_register_hooks_the_platform_once_and_is_idempotent() -> None:
    spectune.vllm.register()
    spectune.vllm.register()
    method = CpuPlatform.register_triton_kernel_overrides
    assert getattr(method.__func__, "_spectune_worker_hook", False)
    # A second hook would wrap the first: the hook calls the platform's own method.
    hook.hook_worker_init()
    assert CpuPlatform.register_triton_kernel_overrides.__func__ is method.__func__


@pytest.mark.parametrize(
    ("version", "ok"),
    [("0.32.0", True), ("0.32.3.dev12+gabcdef", True), ("0.31.9", False), ("0.33.0", True),
     ("0.33.2", True), ("0.34.0", False), ("1.32.0", False), ("dev", False), ("", False)],
)
def test_supported_vllm_range(version: str, ok: bool) -> None:
    assert vllm_supported(version) is ok


def test_installed_vllm_is_supported() -> None:
    from vllm.version import __version__

    assert vllm_supported(__version__)


# --------------------------------------------------------------------------------------
# The worker: what CpuPlatform.register_triton_kernel_overrides() now also does
# --------------------------------------------------------------------------------------


@needs_kernels
def test_worker_routes_after_the_platform_overrides(
    monkeypatch: pytest.MonkeyPatch, spec_config: Any, worker_state: None,
    plugin_log: list[logging.LogRecord],
) -> None:
    """The platform's C++ fallbacks are registered first, then ours on top: routed."""
    monkeypatch.setenv("SPECTUNE_FORCE", "1")
    # Named as in vLLM's init_worker, whose local the hook reads the engine's config from.
    vllm_config = spec_config
    assert hook.caller_vllm_config(sys._getframe()) is vllm_config
    spectune.vllm.register()
    before = spectune.vllm.routed_calls()
    CpuPlatform.register_triton_kernel_overrides()  # what init_worker calls
    assert rs.expand_kernel.func is expand_kernel
    router = hook.STATE.router
    assert router is not None and router.installed
    batch = make_batch([2, 3], 24, seed=1, draft_probs=False)
    out, _ = call(rs.rejection_sample, batch, [1.0, 0.0], [0])
    expected, _ = call(router.original, batch, [1.0, 0.0], [0])
    assert out.tolist() == expected.tolist()
    assert spectune.vllm.routed_calls() == before + 1
    info = messages(plugin_log, logging.INFO)
    assert info and "routed vLLM V1 rejection sampling and the CPU expand step" in info[-1]
    assert "0 tuned configs usable here, 0 faster than vLLM" in info[-1]
    assert "for every shape (SPECTUNE_FORCE=1)" in info[-1]
    assert "device cpu (cpu-interpreter" in info[-1]


@needs_kernels
@pytest.mark.parametrize("force", [True, False], ids=["forced", "no-configs"])
def test_worker_can_decide_at_the_first_call(
    monkeypatch: pytest.MonkeyPatch, spec_config: Any, worker_state: None,
    plugin_log: list[logging.LogRecord], force: bool,
) -> None:
    """The GPU path (device known only at the first call), exercised on CPU."""
    if force:
        monkeypatch.setenv("SPECTUNE_FORCE", "1")
    hook.on_worker_init(spec_config, at_first_call=True)
    router = hook.STATE.router
    assert router is not None and router.installed and not router.configured
    assert not plugin_log  # nothing identified or loaded yet
    prefetch = hook.STATE.prefetch
    assert prefetch is not None
    prefetch.join(timeout=120)
    assert not prefetch.is_alive()
    before = spectune.vllm.routed_calls()
    batch = make_batch([3, 2], 24, seed=2, draft_probs=True)
    out, _ = call(rs.rejection_sample, batch, [1.0, 1.0], [0, 1])
    expected, _ = call(router.original, batch, [1.0, 1.0], [0, 1])
    assert out.tolist() == expected.tolist()
    if force:
        assert router.installed and router.configured
        assert spectune.vllm.routed_calls() == before + 1
        info = messages(plugin_log, logging.INFO)
        assert len(info) == 1 and "routed vLLM V1 rejection sampling" in info[0]
    else:  # no tuned configs: vLLM's function from the first call on
        assert not router.installed
        assert spectune.vllm.routed_calls() == before
        warnings = messages(plugin_log, logging.WARNING)
        assert len(warnings) == 1 and "nothing routed" in warnings[0]


@needs_kernels
@pytest.mark.parametrize(
    ("env", "spec", "why"),
    [
        ({"SPECTUNE_DISABLE": "1", "SPECTUNE_FORCE": "1"}, True, "disabled by SPECTUNE_DISABLE"),
        ({"SPECTUNE_FORCE": "1"}, False, "no speculative decoding in this engine"),
    ],
    ids=["disabled", "no-spec"],
)
def test_worker_leaves_vllm_alone(
    monkeypatch: pytest.MonkeyPatch, spec_config: Any, plain_config: Any, worker_state: None,
    plugin_log: list[logging.LogRecord], env: dict[str, str], spec: bool, why: str,
) -> None:
    original = rs.rejection_sample
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    hook.on_worker_init(spec_config if spec else plain_config)
    assert rs.rejection_sample is original
    assert rs.expand_kernel.func is not expand_kernel
    info = messages(plugin_log, logging.INFO)
    assert len(info) == 1 and why in info[0]
    assert not messages(plugin_log, logging.WARNING)


@needs_kernels
def test_model_runner_v2_is_detected_from_the_config(
    monkeypatch: pytest.MonkeyPatch, spec_config: Any
) -> None:
    assert not spec_config.use_v2_model_runner  # no Triton GPU driver here: V1
    assert not hook.uses_model_runner_v2(spec_config)
    assert not hook.uses_model_runner_v2(None)  # unknown engine: V1 assumed
    assert hook.why_not_routed(spec_config) == ""
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")
    assert spec_config.use_v2_model_runner
    assert hook.uses_model_runner_v2(spec_config)
    assert hook.why_not_routed(spec_config) == ""


@needs_kernels
def test_worker_routes_model_runner_v2(
    monkeypatch: pytest.MonkeyPatch, spec_config: Any, worker_state: None,
    plugin_log: list[logging.LogRecord],
) -> None:
    """An MRV2 engine: MRV2's seam is routed, V1's left alone, the log line says which."""
    from spectune.vllm._mrv2_router import Mrv2Router

    monkeypatch.setenv("SPECTUNE_FORCE", "1")
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")
    original_v1 = rs.rejection_sample
    original_mrv2 = mrv2_rs.rejection_sample
    try:
        hook.on_worker_init(spec_config)
        router = hook.STATE.router
        assert isinstance(router, Mrv2Router) and router.installed
        assert mrv2_rs.rejection_sample == router.rejection_sample
        assert router.original is original_mrv2
        assert rs.rejection_sample is original_v1
        assert rs.expand_kernel.func is not expand_kernel
        info = messages(plugin_log, logging.INFO)
        assert len(info) == 1, info
        assert "routed vLLM Model Runner V2 verification to spectune kernels" in info[0]
        assert "family rejection_sample_mrv2" in info[0]
        assert not messages(plugin_log, logging.WARNING)
    finally:
        if hook.STATE.router is not None:
            hook.STATE.router.uninstall()
            hook.STATE.router = None
    assert mrv2_rs.rejection_sample is original_mrv2


@needs_kernels
def test_no_tuned_configs_means_one_warning_and_vllm_unchanged(
    spec_config: Any, worker_state: None, plugin_log: list[logging.LogRecord],
) -> None:
    original = rs.rejection_sample
    platform_expand = rs.expand_kernel.func
    hook.on_worker_init(spec_config)
    assert rs.rejection_sample is original
    assert rs.expand_kernel.func is platform_expand
    warnings = messages(plugin_log, logging.WARNING)
    assert len(warnings) == 1 and "nothing routed" in warnings[0]
    assert "SPECTUNE_FORCE=1 routes with default configs" in warnings[0]


# --------------------------------------------------------------------------------------
# The database: SPECTUNE_DB, tuned configs used, bad databases harmless
# --------------------------------------------------------------------------------------

_TUNED = {"BLOCK_V": 256, "SPLITS": 2, "num_warps": 1, "num_stages": 1}


def _row(problem: Problem, *, kernel_hash: str | None = None, vs_vllm: str = "faster",
         vllm_version: str | None = None) -> TunedRow:
    """A row of ``problem`` whose config was (nominally) measured ``vs_vllm`` against the
    installed vLLM (or ``vllm_version``)."""
    family = get_family("rejection_sample")
    if vs_vllm == "not measured":
        comparison = VllmComparison(reason="vLLM is not installed")
    else:
        comparison = VllmComparison(verdict=vs_vllm, p50_us=15.0 if vs_vllm == "faster" else 5.0,
                                    version=vllm_version or installed_vllm_version())
    return TunedRow(
        device=detect_device(), software=detect_software(), kernel=family.name,
        kernel_hash=kernel_hash or family.source_hash, problem=problem, config=dict(_TUNED),
        tuned=Timing(9.0, 10.0, 11.0), default=Timing(18.0, 20.0, 22.0), trials=10,
        tuning_seconds=1.0, host="test", study="test", vllm=comparison,
    )


def _database(path: Path, rows: list[TunedRow]) -> Path:
    with open_store(path) as store:
        store.record_many(rows)
    return path


@needs_kernels
def test_tuned_config_from_spectune_db_is_used(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, spec_config: Any, worker_state: None,
    plugin_log: list[logging.LogRecord],
) -> None:
    # Batch 3 is looked up at bucket 4.
    problem = Problem(spec_len=3, batch=4, vocab=300, dtype="float32", draft_probs=False)
    db = _database(tmp_path / "tuned.db", [_row(problem)])
    monkeypatch.setenv("SPECTUNE_DB", str(db))
    hook.on_worker_init(spec_config)  # no SPECTUNE_FORCE
    router = hook.STATE.router
    assert router is not None and router.installed
    batch = make_batch([3, 1, 3], 300, seed=4, draft_probs=False)
    assert router.config_for(inputs_of(router, batch)) == _TUNED
    with_dp = make_batch([3, 1, 3], 300, seed=4, draft_probs=True)
    with pytest.raises(PassToVllm, match="no row"):  # another problem: vLLM's
        inputs_of(router, with_dp)
    out, _ = call(rs.rejection_sample, batch, [1.0, 1.0, 0.0], [0, 1])
    expected, _ = call(router.original, batch, [1.0, 1.0, 0.0], [0, 1])
    assert out.tolist() == expected.tolist()
    assert router.stats.tuned_shapes == 1 and router.stats.routed == 1
    info = messages(plugin_log, logging.INFO)
    assert len(info) == 1 and "1 tuned configs usable here, 1 faster than vLLM" in info[0]
    assert str(db) in info[0]


@needs_kernels
def test_only_shapes_faster_than_vllm_are_routed_the_rest_counted(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, spec_config: Any, worker_state: None,
    plugin_log: list[logging.LogRecord],
) -> None:
    """One shape per verdict, on vLLM's own module function: routed only where its row
    says spectune was faster under the installed vLLM; every other call is vLLM's,
    counted by reason; the tokens are vLLM's either way."""
    def shape(batch: int) -> Problem:
        return Problem(spec_len=3, batch=batch, vocab=300, draft_probs=False)

    rows = {  # request count -> the row of its shape (bucket) and what the call does
        1: (_row(shape(1)), "routed"),
        2: (_row(shape(2), vs_vllm="not faster"), "vllm faster here"),
        4: (_row(shape(4), vs_vllm="not measured"), "not measured against vLLM"),
        # Measured under another vLLM: stale until `spectune nightly` measures it again.
        8: (_row(shape(8), vllm_version="0.31.0"), "not measured against vLLM"),
        16: (None, "no row"),
    }
    db = _database(tmp_path / "tuned.db", [row for row, _ in rows.values() if row])
    monkeypatch.setenv("SPECTUNE_DB", str(db))
    hook.on_worker_init(spec_config)
    router = hook.STATE.router
    assert router is not None and router.installed
    expected_passed: dict[str, int] = {}
    for requests, (_, outcome) in rows.items():
        batch = make_batch([3] * requests, 300, seed=requests, draft_probs=False)
        for _ in range(2):  # the second call takes the per-shape decision cached
            out, _ = call(rs.rejection_sample, batch, [0.0] * requests, [])
            vllm_out, _ = call(router.original, batch, [0.0] * requests, [])
            assert out.tolist() == vllm_out.tolist()
            if outcome != "routed":
                expected_passed[outcome] = expected_passed.get(outcome, 0) + 1
    assert router.stats.routed == 2
    assert router.stats.passed_reasons == expected_passed
    assert spectune.vllm.passed_calls() == expected_passed
    info = messages(plugin_log, logging.INFO)
    assert len(info) == 1 and "4 tuned configs usable here, 1 faster than vLLM" in info[0]


@needs_kernels
def test_rows_none_faster_than_vllm_route_nothing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, spec_config: Any, worker_state: None,
    plugin_log: list[logging.LogRecord],
) -> None:
    problem = Problem(spec_len=3, batch=4, vocab=300)
    db = _database(tmp_path / "tuned.db", [_row(problem, vs_vllm="not faster")])
    monkeypatch.setenv("SPECTUNE_DB", str(db))
    original = rs.rejection_sample
    hook.on_worker_init(spec_config)
    assert rs.rejection_sample is original
    warnings = messages(plugin_log, logging.WARNING)
    assert len(warnings) == 1 and "none measured faster than vLLM" in warnings[0], warnings
    assert "nothing routed" in warnings[0]


@needs_kernels
def test_force_routes_every_shape_whatever_the_verdicts(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, spec_config: Any, worker_state: None,
) -> None:
    problem = Problem(spec_len=3, batch=4, vocab=300, dtype="float32", draft_probs=False)
    db = _database(tmp_path / "tuned.db", [_row(problem, vs_vllm="not faster")])
    monkeypatch.setenv("SPECTUNE_DB", str(db))
    monkeypatch.setenv("SPECTUNE_FORCE", "1")
    hook.on_worker_init(spec_config)
    router = hook.STATE.router
    assert router is not None and router.installed
    batch = make_batch([3, 1, 3], 300, seed=4, draft_probs=False)
    assert router.config_for(inputs_of(router, batch)) == _TUNED  # the row's config
    with_dp = make_batch([3, 1, 3], 300, seed=4, draft_probs=True)
    assert router.config_for(inputs_of(router, with_dp)) != _TUNED  # the default


@needs_kernels
@pytest.mark.parametrize("kind", ["corrupt", "missing", "stale"])
def test_bad_database_means_one_warning_and_vllm_unchanged(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, spec_config: Any, worker_state: None,
    plugin_log: list[logging.LogRecord], kind: str,
) -> None:
    path = tmp_path / "tuned.db"
    if kind == "corrupt":
        path.write_bytes(b"this is not SQLite" * 100)
    elif kind == "stale":  # measured with another version of the kernels
        problem = Problem(spec_len=3, batch=4, vocab=300)
        _database(path, [_row(problem, kernel_hash="0123456789abcdef")])
    monkeypatch.setenv("SPECTUNE_DB", str(path))
    original = rs.rejection_sample
    hook.on_worker_init(spec_config)
    assert rs.rejection_sample is original
    warnings = messages(plugin_log, logging.WARNING)
    assert len(warnings) == 1 and "nothing routed" in warnings[0], warnings


@needs_kernels
def test_worker_loads_the_rows_of_the_families_it_routes_only(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, spec_config: Any, worker_state: None,
    plugin_log: list[logging.LogRecord],
) -> None:
    problem = Problem(spec_len=3, batch=4, vocab=300, dtype="float32", draft_probs=False)
    mrv2 = get_family("rejection_sample_mrv2")  # Model Runner V2's: not routed on V1
    other = dataclasses.replace(
        _row(problem), kernel=mrv2.name, kernel_hash=mrv2.source_hash,
        config=next(iter(mrv2.search_space(detect_device().backend))),
    )
    db = _database(tmp_path / "tuned.db", [_row(problem), other])
    monkeypatch.setenv("SPECTUNE_DB", str(db))
    assert TunedConfigs.load().usable == 2  # every installed family
    hook.on_worker_init(spec_config)
    router = hook.STATE.router
    assert router is not None and router.installed
    assert router.families[0] == "rejection_sample"
    assert mrv2.name not in router.families
    assert router.configs is not None and router.configs.usable == 1
    assert router.configs.lookup(mrv2.name, problem) is None
    info = messages(plugin_log, logging.INFO)
    assert len(info) == 1 and "(2 rows, 1 usable here, 1 used)" in info[0], info
    assert "1 tuned configs usable here, 1 faster than vLLM" in info[0]


def test_load_configs_without_databases() -> None:
    configs = TunedConfigs.load()
    assert configs.usable == 0
    assert configs.device == detect_device()
    assert configs.lookup("rejection_sample", Problem(spec_len=1, batch=1, vocab=10)) is None
    assert "absent-user.db (absent)" in configs.description
