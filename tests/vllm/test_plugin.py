"""The entry point, vLLM's plugin filtering, the controls, and the worker-side decision.

Everything runs against the installed vLLM: its entry-point loader, its real
``VllmConfig`` (built by ``EngineArgs`` from a tiny local model), its CPU platform's
kernel overrides, and the module-level function ``RejectionSampler.forward`` calls.
"""

from __future__ import annotations

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
import torch
import vllm._custom_ops  # noqa: F401  (loads vLLM's C++ ops)
from vllm.engine.arg_utils import EngineArgs
from vllm.platforms.cpu import CpuPlatform
from vllm.plugins import DEFAULT_PLUGINS_GROUP, load_plugins_by_group
from vllm.triton_utils import dispatcher
from vllm.v1.sample import rejection_sampler as rs

from spectune import vllm_plugin
from spectune._vllm_route import expand_kernel
from spectune.db import TunedRow, open_store
from spectune.identity import detect_device, detect_software
from spectune.kernels import get_family
from spectune.promotion import Timing
from spectune.space import Problem
from tests.vllm.conftest import needs_kernels
from tests.vllm.test_route import call, make_batch

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


@pytest.fixture
def plugin_log(
    spec_config: Any, plain_config: Any
) -> Iterator[list[logging.LogRecord]]:
    """Records of the plugin's logger (under vLLM's, which does not propagate to root).

    Set up after the engine configs: building one re-runs vLLM's logging set-up, which
    drops the handlers of loggers under ``vllm``.
    """
    records: list[logging.LogRecord] = []

    class _Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    handler = _Keep(logging.DEBUG)
    log = logging.getLogger("vllm.spectune")
    log.addHandler(handler)
    try:
        yield records
    finally:
        log.removeHandler(handler)


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
    router = vllm_plugin._STATE.router
    if router is not None:
        router.uninstall(dispatcher)
        router.reset()
    assert rs.rejection_sample is original


def messages(records: list[logging.LogRecord], level: int) -> list[str]:
    return [r.getMessage() for r in records if r.levelno == level]


# --------------------------------------------------------------------------------------
# Entry point and vLLM's plugin filtering
# --------------------------------------------------------------------------------------


def test_entry_point_is_discoverable() -> None:
    found = [ep for ep in entry_points(group=DEFAULT_PLUGINS_GROUP) if ep.name == "spectune"]
    assert len(found) == 1
    assert found[0].value == "spectune.vllm_plugin:register"
    assert found[0].load() is vllm_plugin.register


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
        assert plugins["spectune"] is vllm_plugin.register


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
    "imported": "spectune.vllm_plugin" in sys.modules,
    "hooked": bool(getattr(hook, "_spectune_worker_hook", False)),
    "log": records,
}))
"""


def _probe(env: dict[str, str]) -> dict[str, Any]:
    """``load_general_plugins()`` in a fresh process, as every vLLM process runs it."""
    full = {k: v for k, v in os.environ.items() if k not in _SPECTUNE_ENV}
    full.update(env)
    done = subprocess.run([sys.executable, "-c", _PROBE], env=full, cwd=ROOT,
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


def test_register_hooks_the_platform_once_and_is_idempotent() -> None:
    vllm_plugin.register()
    vllm_plugin.register()
    method = CpuPlatform.register_triton_kernel_overrides
    assert getattr(method.__func__, "_spectune_worker_hook", False)
    # A second hook would wrap the first: the hook calls the platform's own method.
    vllm_plugin._hook_worker_init()
    assert CpuPlatform.register_triton_kernel_overrides.__func__ is method.__func__


@pytest.mark.parametrize(
    ("version", "ok"),
    [("0.32.0", True), ("0.32.3.dev12+gabcdef", True), ("0.31.9", False), ("0.33.0", False),
     ("1.32.0", False), ("dev", False), ("", False)],
)
def test_supported_vllm_range(version: str, ok: bool) -> None:
    assert vllm_plugin.vllm_supported(version) is ok


def test_installed_vllm_is_supported() -> None:
    from vllm.version import __version__

    assert vllm_plugin.vllm_supported(__version__)


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
    assert vllm_plugin._caller_vllm_config(sys._getframe()) is vllm_config
    vllm_plugin.register()
    before = vllm_plugin.routed_calls()
    CpuPlatform.register_triton_kernel_overrides()  # what init_worker calls
    assert rs.expand_kernel.func is expand_kernel
    router = vllm_plugin._STATE.router
    assert router is not None and router.installed
    batch = make_batch([2, 3], 24, seed=1, draft_probs=False)
    out, _ = call(rs.rejection_sample, batch, [1.0, 0.0], [0])
    expected, _ = call(router.original, batch, [1.0, 0.0], [0])
    assert out.tolist() == expected.tolist()
    assert vllm_plugin.routed_calls() == before + 1
    info = messages(plugin_log, logging.INFO)
    assert info and "routed vLLM V1 rejection sampling and the CPU expand step" in info[-1]
    assert "0 tuned configs usable here (SPECTUNE_FORCE=1)" in info[-1]
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
    vllm_plugin._on_worker_init(spec_config, at_first_call=True)
    router = vllm_plugin._STATE.router
    assert router is not None and router.installed and not router.configured
    assert not plugin_log  # nothing identified or loaded yet
    prefetch = vllm_plugin._STATE.prefetch
    assert prefetch is not None
    prefetch.join(timeout=120)
    assert not prefetch.is_alive()
    before = vllm_plugin.routed_calls()
    batch = make_batch([3, 2], 24, seed=2, draft_probs=True)
    out, _ = call(rs.rejection_sample, batch, [1.0, 1.0], [0, 1])
    expected, _ = call(router.original, batch, [1.0, 1.0], [0, 1])
    assert out.tolist() == expected.tolist()
    if force:
        assert router.installed and router.configured
        assert vllm_plugin.routed_calls() == before + 1
        info = messages(plugin_log, logging.INFO)
        assert len(info) == 1 and "routed vLLM V1 rejection sampling" in info[0]
    else:  # no tuned configs: vLLM's function from the first call on
        assert not router.installed
        assert vllm_plugin.routed_calls() == before
        warnings = messages(plugin_log, logging.WARNING)
        assert len(warnings) == 1 and "nothing routed" in warnings[0]


@needs_kernels
@pytest.mark.parametrize(
    ("env", "spec", "why"),
    [
        ({"SPECTUNE_DISABLE": "1", "SPECTUNE_FORCE": "1"}, True, "disabled by SPECTUNE_DISABLE"),
        ({"SPECTUNE_FORCE": "1"}, False, "no speculative decoding in this engine"),
        ({"SPECTUNE_FORCE": "1", "VLLM_USE_V2_MODEL_RUNNER": "1"}, True, "Model Runner V2"),
    ],
    ids=["disabled", "no-spec", "model-runner-v2"],
)
def test_worker_leaves_vllm_alone(
    monkeypatch: pytest.MonkeyPatch, spec_config: Any, plain_config: Any, worker_state: None,
    plugin_log: list[logging.LogRecord], env: dict[str, str], spec: bool, why: str,
) -> None:
    original = rs.rejection_sample
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    vllm_plugin._on_worker_init(spec_config if spec else plain_config)
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
    assert vllm_plugin._why_not_v1(spec_config) == ""
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")
    assert spec_config.use_v2_model_runner
    assert "Model Runner V2" in vllm_plugin._why_not_v1(spec_config)


@needs_kernels
def test_no_tuned_configs_means_one_warning_and_vllm_unchanged(
    spec_config: Any, worker_state: None, plugin_log: list[logging.LogRecord],
) -> None:
    original = rs.rejection_sample
    platform_expand = rs.expand_kernel.func
    vllm_plugin._on_worker_init(spec_config)
    assert rs.rejection_sample is original
    assert rs.expand_kernel.func is platform_expand
    warnings = messages(plugin_log, logging.WARNING)
    assert len(warnings) == 1 and "nothing routed" in warnings[0]
    assert "SPECTUNE_FORCE=1 routes with default configs" in warnings[0]


# --------------------------------------------------------------------------------------
# The database: SPECTUNE_DB, tuned configs used, bad databases harmless
# --------------------------------------------------------------------------------------

_TUNED = {"BLOCK_V": 256, "SPLITS": 2, "num_warps": 1, "num_stages": 1}


def _row(problem: Problem, *, kernel_hash: str | None = None) -> TunedRow:
    family = get_family("rejection_sample")
    return TunedRow(
        device=detect_device(), software=detect_software(), kernel=family.name,
        kernel_hash=kernel_hash or family.source_hash, problem=problem, config=dict(_TUNED),
        tuned=Timing(9.0, 10.0, 11.0), default=Timing(18.0, 20.0, 22.0), trials=10,
        tuning_seconds=1.0, host="test", study="test",
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
    vllm_plugin._on_worker_init(spec_config)  # no SPECTUNE_FORCE
    router = vllm_plugin._STATE.router
    assert router is not None and router.installed
    assert router.config_for(3, 3, 300, torch.float32, False) == _TUNED
    assert router.config_for(3, 3, 300, torch.float32, True) != _TUNED  # other problem
    batch = make_batch([3, 1, 3], 300, seed=4, draft_probs=False)
    out, _ = call(rs.rejection_sample, batch, [1.0, 1.0, 0.0], [0, 1])
    expected, _ = call(router.original, batch, [1.0, 1.0, 0.0], [0, 1])
    assert out.tolist() == expected.tolist()
    assert router.stats.tuned_shapes == 1
    info = messages(plugin_log, logging.INFO)
    assert len(info) == 1 and "1 tuned configs usable here; routed" in info[0]
    assert str(db) in info[0]


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
    vllm_plugin._on_worker_init(spec_config)
    assert rs.rejection_sample is original
    warnings = messages(plugin_log, logging.WARNING)
    assert len(warnings) == 1 and "nothing routed" in warnings[0], warnings


def test_load_configs_without_databases() -> None:
    configs = vllm_plugin._load_configs(detect_device(), detect_software())
    assert configs.usable == 0
    assert configs.lookup(Problem(spec_len=1, batch=1, vocab=10)) is None
    assert "absent-user.db (absent)" in configs.description
