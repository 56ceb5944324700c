"""Prepare what ``scripts/gpu_check.sh`` needs to compare with vLLM on a lent GPU.

The lent machines hold PyTorch and Triton but no vLLM, reach nothing outside, and take
64 MiB of files per call. This script fills an ignored folder (``.gpu-check/``) that the
device call carries:

* ``vllm-<version>/``, per supported vLLM release: the Python sources of that release's
  wheel (``scripts/vllm_tree.py``) that the comparison imports, found by importing them
  here (with the directories of vLLM's kernel modules and platforms whole, for the paths
  a GPU takes and this CPU does not), and the ``.dist-info`` metadata vLLM reads its
  version from. Compiled extensions are never carried (vLLM's op library alone is about
  90 MB); ``vllm/_C_stable_libtorch.py``, an empty module written in its place, lets
  ``vllm.platforms.cuda`` import, so that vLLM runs on its CUDA platform as installed: its
  Triton kernels need none of those ops, and any use of one fails loudly;
* ``wheels/``: the packages those imports need that the machine lacks
  (``scripts/device_packages.txt``), at the versions installed here, for its Python;
* ``manifest.json``: what is there, and for which Python.

Refuses, in one line, above ``--limit-mib`` (60: the rest of the call's 64 MiB is the
working tree). Run it with the development interpreter (it has vLLM's dependencies):

    python scripts/prepare_gpu_check.py            # then carry ".gpu-check"

``--rehearse`` then runs ``scripts/gpu_check_vs_vllm.sh`` here, under the Triton
interpreter, as the device would: a Python whose site-packages hold only the machine's
packages (this interpreter's, filtered by ``scripts/device_packages.txt``, no vLLM) plus
the carried wheels, each vLLM tree first on its path (``tests/test_gpu_check.py``).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from vllm_tree import vllm_tree  # noqa: E402

VERSIONS = ("0.32.0", "0.33.0")
DEFAULT_OUT = ROOT / ".gpu-check"
DEVICE_PACKAGES = Path(__file__).resolve().parent / "device_packages.txt"
DEVICE_PYTHON = "3.12"
#: The wheel tags the device's pip takes (x86-64, glibc 2.39: Ubuntu 24.04's Python 3.12),
#: newest first; pip matches each exactly.
PLATFORMS = (*(f"manylinux_2_{n}_x86_64" for n in range(39, 16, -1)), "manylinux2014_x86_64",
             "manylinux1_x86_64")
LIMIT_MIB = 60.0
#: Written in place of vLLM's compiled op library (module doc).
OP_LIBRARY_STANDIN = "_C_stable_libtorch.py"
#: Directories carried whole (their ``.py`` files, not their subdirectories): the
#: platforms (the device resolves CUDA's, this host another) and the homes of the
#: functions the incumbents run.
WHOLE_DIRS = ("vllm/platforms", "vllm/triton_utils", "vllm/v1/sample", "vllm/v1/sample/ops",
              "vllm/v1/worker/gpu/sample", "vllm/v1/worker/gpu/spec_decode",
              "vllm/v1/spec_decode")

# What the comparison imports, run in a child process with the tree first on sys.path;
# prints {module: file} and {top-level name: distributions}. vLLM's modules are those
# spectune's incumbents load (spectune.vllm.incumbent_modules()), plus CUDA's platform.
_DISCOVER = r"""
import importlib, importlib.metadata, json, sys
tree, root, standin = sys.argv[1:4]
sys.path[:0] = [tree, root]
import vllm
vllm.__path__.append(standin)
from spectune.vllm import incumbent_modules
names = [*incumbent_modules(), "vllm.platforms.cuda", "vllm.version",
         "spectune.tuning.trial", "spectune.db", "triton.testing"]
failed = {}
for name in names:
    try:
        importlib.import_module(name)
    except Exception as exc:
        failed[name] = f"{type(exc).__name__}: {exc}"
from spectune.kernels import FAMILIES, get_family
for name in FAMILIES:
    get_family(name).load()
from vllm.platforms import current_platform
# The tuned rows the bench reads (--db): the database layer's own imports.
from spectune.db import load_index
from spectune.identity import detect_device, detect_software
load_index(device=detect_device(), software=detect_software(), kernel_hashes={})
files = {n: m.__file__ for n, m in list(sys.modules.items()) if getattr(m, "__file__", None)}
print(json.dumps({"files": files, "failed": failed,
                  "distributions": importlib.metadata.packages_distributions()}))
"""


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def device_packages() -> set[str]:
    """The machine's packages (normalised distribution names)."""
    lines = DEVICE_PACKAGES.read_text(encoding="utf-8").splitlines()
    return {_normal(line.strip()) for line in lines if line.strip() and not line.startswith("#")}


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def discover(tree: Path, standin: Path) -> dict:
    """What importing the comparison's modules loads, with ``tree`` first on the path."""
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    env["TRITON_INTERPRET"] = "1"
    done = subprocess.run([sys.executable, "-c", _DISCOVER, str(tree), str(ROOT),
                           str(standin)], env=env, capture_output=True, text=True,
                          cwd=ROOT)
    if done.returncode != 0:
        raise SystemExit(f"prepare_gpu_check: importing vLLM {tree.name}'s modules failed: "
                         f"{done.stderr.strip().splitlines()[-1:]}")
    found = json.loads(done.stdout.strip().splitlines()[-1])
    if found["failed"]:
        raise SystemExit(f"prepare_gpu_check: {tree.name}: {found['failed']}")
    return found


def carry_tree(version: str, staging: Path) -> set[str]:
    """Copy the needed sources of vLLM ``version`` into ``staging``; return the
    top-level names of the other packages they imported."""
    tree = vllm_tree(version)
    dest = staging / f"vllm-{version}"
    package = dest / "vllm"
    package.mkdir(parents=True)
    (package / OP_LIBRARY_STANDIN).write_text(
        '"""Stands in for vLLM\'s compiled op library, which spectune\'s GPU check does not\n'
        "carry (scripts/prepare_gpu_check.py): it lets vllm.platforms.cuda import. vLLM's\n"
        'Triton kernels use none of its ops; a use of one fails (torch.ops has none)."""\n')
    found = discover(tree, package)
    chosen: set[Path] = set()
    for file in found["files"].values():
        path = Path(file).resolve()
        if path.is_relative_to(tree.resolve()) and path.suffix == ".py":
            chosen.add(path.relative_to(tree.resolve()))
    for folder in WHOLE_DIRS:
        chosen.update(p.relative_to(tree) for p in (tree / folder).glob("*.py"))
    for relative in list(chosen):  # every package on the way is imported
        for parent in relative.parents:
            if (tree / parent / "__init__.py").is_file():
                chosen.add(parent / "__init__.py")
    for relative in sorted(chosen):
        (dest / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(tree / relative, dest / relative)
    info = f"vllm-{version}.dist-info"
    (dest / info).mkdir()
    for name in ("METADATA", "WHEEL", "entry_points.txt", "top_level.txt"):
        if (tree / info / name).is_file():
            shutil.copy2(tree / info / name, dest / info / name)
    sites = {Path(sysconfig.get_paths()[key]).resolve() for key in ("purelib", "platlib")}
    tops: set[str] = set()
    for name, file in found["files"].items():
        path, top = Path(file).resolve(), name.split(".")[0]
        # An installed package's own module (not one vendored inside another package).
        if any(path.is_relative_to(site) and path.relative_to(site).parts[0].split(".")[0]
               == top for site in sites):
            tops.add(top)
    return {dist for top in tops for dist in found["distributions"].get(top, [])}


def download_wheels(distributions: set[str], dest: Path, python_version: str) -> list[str]:
    """Wheels of ``distributions`` at the versions installed here, for the device."""
    pins = sorted(f"{name}=={importlib.metadata.version(name)}" for name in distributions)
    dest.mkdir(parents=True)
    if not pins:
        return pins
    command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
               "--only-binary=:all:", "--python-version", python_version,
               "--implementation", "cp", "-d", str(dest)]
    for tag in PLATFORMS:
        command += ["--platform", tag]
    subprocess.run([*command, *pins], check=True, stdout=sys.stderr)
    return pins


def prepare(*, out: Path, versions: tuple[str, ...], python_version: str,
            limit_mib: float) -> dict:
    """Build ``out`` (replacing it); returns the manifest."""
    staging = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}-"))
    try:
        needed: set[str] = set()
        for version in versions:
            needed |= carry_tree(version, staging)
        on_device = device_packages()
        missing = {dist for dist in needed if _normal(dist) not in on_device}
        pins = download_wheels(missing, staging / "wheels", python_version)
        trees = {version: _size(staging / f"vllm-{version}") for version in versions}
        manifest = {"python_version": python_version, "versions": list(versions),
                    "tree_bytes": trees, "wheels": pins,
                    "wheel_bytes": _size(staging / "wheels")}
        (staging / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
        total = _size(staging) / 2**20
        manifest["total_mib"] = round(total, 1)
        if total > limit_mib:
            raise SystemExit(f"prepare_gpu_check: {total:.1f} MiB is over the {limit_mib:g} "
                             f"MiB a device call can carry besides the working tree")
        if out.exists():
            shutil.rmtree(out)
        staging.rename(out)
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    return manifest


def device_like_site(dest: Path) -> None:
    """Links to this interpreter's installed packages that the device also holds."""
    on_device = device_packages()
    dest.mkdir(parents=True, exist_ok=True)
    for site in {Path(p) for p in (sysconfig.get_paths()["purelib"],
                                   sysconfig.get_paths()["platlib"])}:
        for dist in importlib.metadata.distributions(path=[str(site)]):
            if _normal(dist.metadata["Name"] or "") not in on_device:
                continue
            for top in {Path(f).parts[0] for f in dist.files or ()}:
                if top != ".." and (site / top).exists() and not (dest / top).exists():
                    (dest / top).symlink_to(site / top)


def rehearse(*, out: Path, results: Path, quick: bool = True) -> int:
    """Run ``scripts/gpu_check_vs_vllm.sh`` here as the device would (module doc)."""
    with tempfile.TemporaryDirectory(prefix="gpu-check-rehearsal-") as scratch:
        site = Path(scratch) / "site"
        device_like_site(site)
        bin_dir = Path(scratch) / "bin"
        bin_dir.mkdir()
        # python3 there: this interpreter without its site-packages (-S: no vLLM), the
        # device's packages on PYTHONPATH instead.
        wrapper = bin_dir / "python3"
        wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" -S -s "$@"\n')
        wrapper.chmod(0o755)
        env = {key: value for key, value in os.environ.items()
               if not key.startswith(("PYTHON", "SPECTUNE_VLLM", "VIRTUAL_ENV"))}
        env.update(PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}", PYTHONPATH=str(site),
                   TRITON_INTERPRET="1", OUT=str(results), SPECTUNE_GPU_CHECK=str(out),
                   PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
        if quick:
            env["VS_VLLM_ARGS"] = "--quick"
        results.mkdir(parents=True, exist_ok=True)
        return subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check_vs_vllm.sh")],
                              env=env, cwd=ROOT).returncode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--versions", nargs="+", default=list(VERSIONS))
    parser.add_argument("--python-version", default=DEVICE_PYTHON,
                        help="the wheels' Python (the device's: %(default)s)")
    parser.add_argument("--limit-mib", type=float, default=LIMIT_MIB)
    parser.add_argument("--rehearse", type=Path, default=None, metavar="RESULTS",
                        help="then run the vs-vLLM check here, as the device would, "
                             "writing into RESULTS")
    args = parser.parse_args()
    out = args.out.resolve()
    manifest = prepare(out=out, versions=tuple(args.versions),
                       python_version=args.python_version, limit_mib=args.limit_mib)
    trees = ", ".join(f"vLLM {v} {n / 2**20:.1f} MiB" for v, n in manifest["tree_bytes"].items())
    print(f"{out}: {manifest['total_mib']} MiB ({trees}; {len(manifest['wheels'])} wheels "
          f"{manifest['wheel_bytes'] / 2**20:.1f} MiB for Python {args.python_version}: "
          f"{', '.join(manifest['wheels'])})")
    if args.rehearse is not None:
        raise SystemExit(rehearse(out=out, results=args.rehearse.resolve()))


if __name__ == "__main__":
    main()
