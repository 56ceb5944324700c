"""The source hash of a kernel family: what its code does, not how the text looks.

Every tuned row carries its family's source hash and is used only while the hash
matches, so the hash must change when the kernels or their launcher change and must
not change for a docstring, a comment or a reformatting. It is computed from each
module's syntax tree without docstrings, written out by :func:`canonical_code` in a
form that does not depend on the Python version (an empty or absent field of a node
is left out, so fields that newer Pythons add, such as ``type_params``, do not count).

Parsing and writing out a kernel module takes 10-20 ms, at every import of the kernels
(every vLLM worker). So the package ships a memo, ``spectune/data/code_hashes.json``: for
each hashed module, the SHA-256 of its text and the digest of its code. A module whose
text is the one recorded (the shipped kernels) costs one SHA-256 of its text; any other
text (an edited kernel) is parsed, so the hash is always that of the code in use.
``python scripts/update_code_hashes.py`` rewrites the memo after a kernel edit; a test
fails while it is out of date.

Modules are named, not imported: a family's hash is read from its modules' files (the
vLLM plugin checks tuned rows against every family's hash, and imports only the kernels
it routes). Where a module lives is not what it does: the imports of moved modules are
written out at the paths the modules had when the hashes were first recorded
(:data:`_MOVED`), so that moving a module keeps every tuned row valid.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import json
import tokenize
from functools import lru_cache
from pathlib import Path
from types import ModuleType

from spectune.identity import source_hash

__all__ = ["MEMO_FILE", "canonical_code", "code_digest", "code_hash", "module_text",
           "write_memo"]

#: Text digest -> code digest of the modules the registered families hash.
MEMO_FILE = Path(__file__).resolve().parent.parent / "data" / "code_hashes.json"

_WITH_DOCSTRING = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)

#: Where modules (and one object) that hashed code imports lived when the family hashes
#: were first recorded (commit fbfd1de: every module flat in ``spectune/kernels/``), by
#: where they live now. An import of a new path is written out as the old one, in the
#: old form (``from spectune.kernels import rejection_folded_space as _folded_space``
#: for the folded spaces, once modules of their own), so a module whose code did not
#: change keeps its digest wherever it moved. One entry per move; never remove one.
_MOVED = {
    "spectune.kernels.rejection.rejection_sample": "spectune.kernels.rejection",
    "spectune.kernels.rejection.rejection_sample_constants":
        "spectune.kernels.rejection_constants",
    "spectune.kernels.rejection.rejection_sample_space": "spectune.kernels.rejection_space",
    "spectune.kernels.rejection.rejection_sample_space.FOLDED":
        "spectune.kernels.rejection_folded_space",
    "spectune.kernels.rejection_mrv2.rejection_sample_mrv2": "spectune.kernels.rejection_mrv2",
    "spectune.kernels.rejection_mrv2.rejection_sample_mrv2_constants":
        "spectune.kernels.rejection_mrv2_constants",
    "spectune.kernels.rejection_mrv2.rejection_sample_mrv2_space":
        "spectune.kernels.rejection_mrv2_space",
    "spectune.kernels.rejection_mrv2.rejection_sample_mrv2_space.FOLDED":
        "spectune.kernels.rejection_mrv2_folded_space",
    "spectune.kernels.sampling.gumbel_sample": "spectune.kernels.gumbel",
    "spectune.kernels.sampling.gumbel_sample_space": "spectune.kernels.gumbel_space",
    "spectune.kernels.sampling.min_p": "spectune.kernels.min_p",
    "spectune.kernels.sampling.min_p_space": "spectune.kernels.min_p_space",
    "spectune.kernels.sampling.sample": "spectune.kernels.sampling",
    "spectune.kernels.sampling.sample_space": "spectune.kernels.sampling_space",
    "spectune.kernels.sampling.temperature": "spectune.kernels.temperature",
    "spectune.kernels.sampling.temperature_space": "spectune.kernels.temperature_space",
    "spectune.kernels.sampling.top_k_top_p": "spectune.kernels.topk_topp",
    "spectune.kernels.sampling.top_k_top_p_space": "spectune.kernels.topk_topp_space",
}


def code_hash(*modules: str | ModuleType) -> str:
    """:func:`spectune.identity.source_hash` of the modules' code, in the given order."""
    return source_hash(*(code_digest(module) for module in modules))


def code_digest(module: str | ModuleType) -> str:
    """SHA-256 of the :func:`canonical_code` of ``module`` (a module or its dotted name;
    from the memo when its text is the recorded one). A named module is not imported.

    Raises:
        TypeError: ``module`` is neither a module nor a name (a function of the same name
            as its module, re-exported by a package, would hash only that function).
        ModuleNotFoundError: no module of that name.
    """
    name = _module_name(module)
    text = module_text(name)
    recorded = _memo().get(name)
    if recorded is not None and recorded.get("text") == _sha256(text):
        return str(recorded["code"])
    return _sha256(canonical_code(text))


def module_text(name: str) -> str:
    """The source text of the module ``name``, read from its file without importing it
    (only its parent packages are)."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        raise ModuleNotFoundError(f"no Python source for module {name!r}", name=name)
    # tokenize.open: the encoding the file declares, as the interpreter reads it.
    with tokenize.open(spec.origin) as file:
        return file.read()


def write_memo(modules: list[str | ModuleType], path: Path = MEMO_FILE) -> Path:
    """Record the text and code digests of ``modules`` in ``path`` (the shipped memo)."""
    texts = {name: module_text(name) for name in sorted(map(_module_name, modules))}
    memo = {
        name: {"text": _sha256(text), "code": _sha256(canonical_code(text))}
        for name, text in texts.items()
    }
    path.write_text(json.dumps(memo, indent=2) + "\n", encoding="utf-8")
    _memo.cache_clear()
    return path


def _module_name(module: str | ModuleType) -> str:
    if isinstance(module, ModuleType):
        return module.__name__
    if isinstance(module, str):
        return module
    raise TypeError(f"code hashes are of modules, got {type(module).__name__} {module!r}")


@lru_cache(maxsize=1)
def _memo() -> dict[str, dict[str, str]]:
    try:
        memo = json.loads(MEMO_FILE.read_text(encoding="utf-8"))
    except (OSError, ValueError):  # no memo: every module is parsed (slower, as correct)
        return {}
    return memo if isinstance(memo, dict) else {}


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def canonical_code(source: str) -> str:
    """``source``'s syntax tree without docstrings, as stable text.

    Raises:
        SyntaxError: if ``source`` is not valid Python.
    """
    out: list[str] = []
    _dump(ast.parse(source), out)
    return "".join(out)


def _dump(node: ast.AST, out: list[str]) -> None:
    """Append ``node`` as ``Type(field=value, ...)``, without empty fields or docstrings.

    Docstrings are dropped while dumping, in the same single pass over the tree: a
    kernel module's tree has thousands of nodes and the hash is computed at import.
    """
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        node = _as_before_moves(node)
    out.append(type(node).__name__)
    out.append("(")
    separator = ""
    for name in node._fields:
        value = getattr(node, name, None)
        if name == "body" and isinstance(node, _WITH_DOCSTRING) and _starts_with_docstring(value):
            value = value[1:]
        if value is None or (isinstance(value, list) and not value):
            continue
        out.append(f"{separator}{name}=")
        separator = ", "
        if isinstance(value, list):
            out.append("[")
            for index, item in enumerate(value):
                if index:
                    out.append(", ")
                _dump_value(item, out)
            out.append("]")
        else:
            _dump_value(value, out)
    out.append(")")


def _dump_value(value: object, out: list[str]) -> None:
    if isinstance(value, ast.AST):
        _dump(value, out)
    else:
        out.append(repr(value))


def _starts_with_docstring(body: list[ast.stmt]) -> bool:
    first = body[0] if body else None
    return (
        isinstance(first, ast.Expr)
        and isinstance(first.value, ast.Constant)
        and isinstance(first.value.value, str)
    )



def _as_before_moves(node: ast.Import | ast.ImportFrom) -> ast.Import | ast.ImportFrom:
    """``node`` with every moved path it imports written as before the move (:data:`_MOVED`).

    ``from package import name`` moved as a whole (``name`` in the table) becomes
    ``from old_package import old_name``; otherwise only the module it imports from is
    mapped. A statement whose names would come from different old modules keeps its
    names and only has its module mapped (no such import existed before any move).
    """
    if isinstance(node, ast.Import):
        if not any(a.name in _MOVED for a in node.names):
            return node
        return ast.Import(names=[ast.alias(name=_MOVED.get(a.name, a.name), asname=a.asname)
                                 for a in node.names])
    if node.level or node.module is None:
        return node
    module = _MOVED.get(node.module, node.module)
    wholes = [_MOVED.get(f"{node.module}.{a.name}") for a in node.names]
    if any(wholes):
        parents = {whole.rpartition(".")[0] if whole else module for whole in wholes}
        if len(parents) == 1:
            names = [ast.alias(name=whole.rpartition(".")[2] if whole else a.name,
                               asname=a.asname)
                     for a, whole in zip(node.names, wholes, strict=True)]
            return ast.ImportFrom(module=parents.pop(), names=names, level=0)
    if module == node.module:
        return node
    return ast.ImportFrom(module=module, names=node.names, level=node.level)
