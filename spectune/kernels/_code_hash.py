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
"""

from __future__ import annotations

import ast
import hashlib
import inspect
import json
from functools import lru_cache
from pathlib import Path
from types import ModuleType

from spectune.identity import source_hash

__all__ = ["MEMO_FILE", "canonical_code", "code_digest", "code_hash", "write_memo"]

#: Text digest -> code digest of the modules the registered families hash.
MEMO_FILE = Path(__file__).resolve().parent.parent / "data" / "code_hashes.json"

_WITH_DOCSTRING = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


def code_hash(*modules: ModuleType) -> str:
    """:func:`spectune.identity.source_hash` of the modules' code, in the given order."""
    return source_hash(*(code_digest(module) for module in modules))


def code_digest(module: ModuleType) -> str:
    """SHA-256 of ``module``'s :func:`canonical_code` (from the memo when its text is the
    recorded one).

    Raises:
        TypeError: ``module`` is not a module (a function of the same name as its module,
            re-exported by a package, would hash only that function).
    """
    if not isinstance(module, ModuleType):
        raise TypeError(f"code hashes are of modules, got {type(module).__name__} {module!r}")
    text = inspect.getsource(module)
    recorded = _memo().get(module.__name__)
    if recorded is not None and recorded.get("text") == _sha256(text):
        return str(recorded["code"])
    return _sha256(canonical_code(text))


def write_memo(modules: list[ModuleType], path: Path = MEMO_FILE) -> Path:
    """Record the text and code digests of ``modules`` in ``path`` (the shipped memo)."""
    memo = {
        module.__name__: {
            "text": _sha256(inspect.getsource(module)),
            "code": _sha256(canonical_code(inspect.getsource(module))),
        }
        for module in sorted(modules, key=lambda m: m.__name__)
    }
    path.write_text(json.dumps(memo, indent=2) + "\n", encoding="utf-8")
    _memo.cache_clear()
    return path


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

