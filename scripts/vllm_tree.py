"""Fetch a vLLM release's Python and Triton sources, unpacked, for tests and checks.

There is no CPU build of every vLLM release on the package registry, but every release's
wheel holds its Python and Triton sources. This script downloads the wheel once
(``pip download --no-deps``), unpacks it without its compiled extensions (``*.so``) into a
cache directory outside the repository, and prints that directory. Put it first on
``sys.path`` (``SPECTUNE_VLLM_TREE=<dir>``, see ``tests/conftest.py``) and vLLM's kernel
modules import and run under ``TRITON_INTERPRET=1``.

    python scripts/vllm_tree.py 0.33.0            # prints e.g. ~/.cache/spectune/vllm-0.33.0

The cache is ``$SPECTUNE_CACHE`` (default ``~/.cache/spectune``). A finished tree carries a
marker file, so a second run costs nothing and an interrupted one starts over.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

MARKER = ".spectune-unpacked"


def cache_root() -> Path:
    """Where unpacked vLLM trees are kept (outside the repository)."""
    configured = os.environ.get("SPECTUNE_CACHE")
    return Path(configured) if configured else Path.home() / ".cache" / "spectune"


def vllm_tree(version: str) -> Path:
    """The unpacked sources of vLLM ``version``, fetched on first use."""
    tree = cache_root() / f"vllm-{version}"
    if (tree / MARKER).is_file():
        return tree
    if tree.exists():
        shutil.rmtree(tree)
    tree.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=tree.parent) as download_dir:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
             "--only-binary=:all:", f"vllm=={version}", "-d", download_dir],
            check=True, stdout=sys.stderr,
        )
        wheels = sorted(Path(download_dir).glob("vllm-*.whl"))
        if len(wheels) != 1:
            raise SystemExit(f"vllm_tree: expected one vllm wheel, got {[w.name for w in wheels]}")
        staging = Path(tempfile.mkdtemp(dir=tree.parent, prefix=f".vllm-{version}-"))
        with zipfile.ZipFile(wheels[0]) as wheel:
            # Compiled extensions are left out: they need vLLM's CUDA/ROCm build, and the
            # Python and Triton sources are what the comparisons run.
            members = [name for name in wheel.namelist() if not name.endswith(".so")
                       and ".so." not in name]
            wheel.extractall(staging, members)
    (staging / MARKER).write_text(f"vllm {version}\n")
    staging.rename(tree)
    return tree


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("version", help="vLLM release, e.g. 0.33.0")
    args = parser.parse_args()
    print(vllm_tree(args.version))


if __name__ == "__main__":
    main()
