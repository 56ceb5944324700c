"""Which vLLM release's semantics a kernel reproduces: the ``vllm_version=`` of the kernels.

A kernel whose tokens differ between vLLM releases takes ``vllm_version`` ("0.32" or
"0.33"); ``None`` means :func:`vllm_semantics_version`: the installed vLLM's release if it
is a supported one, else the newest supported. The installed release is read without
importing vLLM (its ``vllm/_version.py``, found on ``sys.path``), or from the imported
package when it already is.
"""

from __future__ import annotations

import functools
import importlib.util
import re
import sys
from pathlib import Path

__all__ = ["SUPPORTED_VLLM_VERSIONS", "installed_vllm_release", "resolve_vllm_version",
           "vllm_semantics_version"]

#: The vLLM releases whose semantics the kernels reproduce, oldest first.
SUPPORTED_VLLM_VERSIONS = ("0.32", "0.33")


def installed_vllm_release() -> str | None:
    """``"major.minor"`` of the vLLM that ``import vllm`` gives, or ``None`` (none, or
    unreadable)."""
    module = sys.modules.get("vllm")
    version = getattr(module, "__version__", None) if module is not None else None
    if not isinstance(version, str):
        version = _version_on_path()
    match = re.match(r"(\d+)\.(\d+)", version or "")
    return f"{match[1]}.{match[2]}" if match else None


@functools.cache
def vllm_semantics_version() -> str:
    """The release whose semantics ``vllm_version=None`` selects: the installed vLLM's if
    supported, else the newest supported (read once per process)."""
    installed = installed_vllm_release()
    return installed if installed in SUPPORTED_VLLM_VERSIONS else SUPPORTED_VLLM_VERSIONS[-1]


def resolve_vllm_version(vllm_version: str | None) -> str:
    """``vllm_version`` checked (``None``: :func:`vllm_semantics_version`).

    Raises:
        ValueError: not one of :data:`SUPPORTED_VLLM_VERSIONS`.
    """
    if vllm_version is None:
        return vllm_semantics_version()
    if vllm_version not in SUPPORTED_VLLM_VERSIONS:
        raise ValueError(
            f"vllm_version must be one of {', '.join(SUPPORTED_VLLM_VERSIONS)} (or None: the "
            f"installed vLLM's), got {vllm_version!r}"
        )
    return vllm_version


@functools.cache
def _version_on_path() -> str | None:
    """``__version__`` from the ``vllm/_version.py`` that ``import vllm`` would load."""
    try:
        spec = importlib.util.find_spec("vllm")  # imports nothing for a top-level name
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        try:
            text = (Path(folder) / "_version.py").read_text(encoding="utf-8")
        except OSError:
            continue
        found = re.search(r"^__version__\s*=.*?['\"]([^'\"]+)['\"]", text, re.MULTILINE)
        if found:
            return found[1]
    return None
