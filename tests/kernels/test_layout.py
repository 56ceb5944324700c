"""How ``spectune/kernels/`` is laid out, and what reading its registry costs.

* One subpackage per family group (``rejection``, ``rejection_mrv2``, ``sampling``), its
  modules named after the family they serve (``<family>.py``: kernels and launcher;
  ``<family>_<role>.py``); code several families share in ``spectune/kernels/_*.py``.
* The public names: ``spectune.kernels.__all__`` (kernel functions, registry) and each
  subpackage's (references, inputs, rules, tolerances), bound at first use.
* Importing the package and reading the registry (``FAMILIES``, ``get_family``,
  ``family_hashes()``, ``family_space()``) imports no Triton kernel, nor Triton, nor
  torch: a vLLM worker imports the kernels it routes, and ``spectune db`` none.
* Outside the package (and its own tests, which may test its private modules), code
  imports only its public packages.
"""

from __future__ import annotations

import ast
import importlib
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import spectune.kernels
from spectune.kernels import FAMILIES

ROOT = Path(__file__).resolve().parents[2]
KERNELS = ROOT / "spectune" / "kernels"
GROUPS = ("rejection", "rejection_mrv2", "sampling")
PUBLIC = {"spectune.kernels", *(f"spectune.kernels.{group}" for group in GROUPS)}
#: What a module of a family subpackage holds, after the family's name.
ROLES = {"space", "inputs", "ref", "family", "constants", "fly", "versions"}
#: Imports of private modules outside the package, each with its reason.
ALLOWED_PRIVATE = {
    # The kernels' own maintenance tool: it rewrites the memo of spectune/kernels.
    ("scripts/update_code_hashes.py", "spectune.kernels._code_hash"),
    # Times the V1 launcher's private input checks, per call.
    ("benchmarks/bench_plugin.py", "spectune.kernels.rejection.rejection_sample"),
}

_FRESH = """
import json, sys
import spectune.kernels as k
names = sorted(k.FAMILIES)
families = [k.get_family(name) for name in names]
hashes = k.family_hashes()
spaces = {name: [k.family_space(name, b).names for b in ("cuda", "hip", "cpu-interpreter")]
          for name in names}
print(json.dumps({"hashes": hashes, "modules": sorted(sys.modules), "names": names,
                  "spaces": {n: len(s) for n, s in spaces.items()}}))
"""


def _kernel_modules() -> set[str]:
    """Every module of the package that defines ``@triton.jit`` functions."""
    out = set()
    for path in KERNELS.rglob("*.py"):
        if re.search(r"^@triton\.jit\b", path.read_text(encoding="utf-8"), re.MULTILINE):
            parts = path.relative_to(ROOT).with_suffix("").parts
            out.add(".".join(parts))
    return out


def test_reading_the_registry_imports_no_kernel() -> None:
    done = subprocess.run([sys.executable, "-c", _FRESH], capture_output=True, text=True,
                          cwd=ROOT, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    fresh = json.loads(done.stdout.splitlines()[-1])
    loaded = set(fresh["modules"])
    kernels = _kernel_modules()
    assert len(kernels) >= 11, sorted(kernels)
    assert not loaded & kernels, sorted(loaded & kernels)
    assert not {m for m in loaded if m.partition(".")[0] in ("triton", "torch")}
    assert fresh["names"] == sorted(FAMILIES)
    assert fresh["hashes"] == spectune.kernels.family_hashes()
    assert all(count == 3 for count in fresh["spaces"].values())


def test_modules_are_named_after_their_families() -> None:
    families_of: dict[str, set[str]] = {group: set() for group in GROUPS}
    for name, family in FAMILIES.items():
        group = family.adapter_path.split(".")[2]  # type: ignore[attr-defined]
        families_of[group].add(name)
        # The family's own modules live in its group's subpackage.
        for path in (family.adapter_path, family.space_path):  # type: ignore[attr-defined]
            assert path.startswith(f"spectune.kernels.{group}."), (name, path)
    for group, names in families_of.items():
        assert names, group
        for path in (KERNELS / group).glob("*.py"):
            stem = path.stem
            if stem == "__init__":
                continue
            assert any(stem == f or (stem.startswith(f"{f}_") and stem[len(f) + 1:] in ROLES)
                       for f in names), f"{group}/{path.name}: not <family>[_<role>]"
    for path in KERNELS.glob("*.py"):
        assert path.name == "__init__.py" or path.name.startswith("_"), path.name
    assert {p.name for p in KERNELS.iterdir() if p.is_dir() and p.name != "__pycache__"} == set(
        GROUPS)


@pytest.mark.parametrize("package", sorted(PUBLIC))
def test_public_names_resolve(package: str) -> None:
    module = importlib.import_module(package)
    for name in module.__all__:
        assert not name.startswith("_")
        value = getattr(module, name)
        # A lazy name never shadows a submodule (importing it would rebind the name).
        assert importlib.util.find_spec(f"{package}.{name}") is None, name
        assert not isinstance(value, type(module)), name
    assert set(module.__all__) <= set(dir(module))
    with pytest.raises(AttributeError):
        module.no_such_name  # noqa: B018


def test_the_package_offers_the_kernels_and_the_registry() -> None:
    assert sorted(spectune.kernels.__all__) == sorted([
        "FAMILIES", "KernelFamily", "LOGITS_DTYPES", "MAX_VOCAB", "ProblemLimits",
        "apply_min_p", "apply_temperature", "declared_limits", "family_hashes",
        "family_space", "get_family", "gumbel_sample", "preload", "rejection_sample",
        "rejection_sample_mrv2", "sample", "top_k_top_p", "vllm_semantics_version",
    ])


def _imports(path: Path) -> list[tuple[int, str]]:
    """``(line, module)`` of every import in ``path`` (``from x import y``: ``x.y`` when it
    names a module, else ``x``)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                is_module = sub.startswith("spectune.") and importlib.util.find_spec(
                    node.module) is not None and _is_module(sub)
                out.append((node.lineno, sub if is_module else node.module))
    return out


def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


def test_only_public_packages_are_imported_from_outside() -> None:
    folders = [ROOT / "spectune", ROOT / "tests", ROOT / "benchmarks", ROOT / "scripts"]
    own = (KERNELS, ROOT / "tests" / "kernels")
    bad = []
    for folder in folders:
        for path in sorted(folder.rglob("*.py")):
            if any(path.is_relative_to(o) for o in own):
                continue
            rel = path.relative_to(ROOT).as_posix()
            for line, module in _imports(path):
                if (module.startswith("spectune.kernels") and module not in PUBLIC
                        and (rel, module) not in ALLOWED_PRIVATE):
                    bad.append(f"{rel}:{line} imports {module}")
    assert not bad, "\n".join(bad)
