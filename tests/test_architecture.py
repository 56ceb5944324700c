"""docs/architecture.md's rules, checked statically on spectune's source.

The table of parts in ``docs/architecture.md`` says which part may import which (and which
third-party packages); this test reads it, walks every import of every module under
``spectune/`` (at module level, inside functions, under ``TYPE_CHECKING``), and fails on an
import the table does not allow, an import of another part's private module (a dotted path
with a component starting with ``_``: parts talk through each other's public packages), an
import cycle, a module that belongs to no part, two
modules of the same name, or two public classes of the same name. The planted tests copy
the tree, break one rule each, and require the checker to name the break.
"""

from __future__ import annotations

import ast
import re
import shutil
import sys
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = Path("docs") / "architecture.md"
PACKAGE = "spectune"
_TABLE_MARK = "<!-- import rules: the test parses this table -->"
_LAZY_MARK = "(inside functions)"
# Modules whose names repeat by design: a package's __init__, Alembic's revision scripts,
# and the command modules of the CLI (each named after the command it holds).
_NAME_EXEMPT = re.compile(r"(^|/)__init__\.py$|^spectune/db/migrations/|^spectune/cli/")


@dataclass(frozen=True)
class Part:
    """One row of the table: a part, its modules and what it may import."""

    name: str
    paths: tuple[str, ...]  # files, or folders ending in "/"
    spectune: frozenset[str]  # parts it may import
    third_party: frozenset[str]  # top-level distributions' import names
    third_party_lazily: bool  # third-party imports only inside functions

    def holds(self, path: str) -> bool:
        return any(path == p or (p.endswith("/") and path.startswith(p)) for p in self.paths)


@dataclass(frozen=True)
class Import:
    """One import statement's target, as the importing module sees it."""

    importer: str  # dotted module name
    target: str  # dotted module name imported (or its package, for ``from x import y``)
    line: int
    in_function: bool


def read_parts(doc: Path) -> list[Part]:
    """The table after the marker in ``doc``."""
    lines = doc.read_text(encoding="utf-8").splitlines()
    start = lines.index(_TABLE_MARK) + 1
    header = [cell.strip() for cell in lines[start].strip().strip("|").split("|")]
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        cells = dict(zip(header, (c.strip() for c in line.strip().strip("|").split("|")),
                         strict=True))
        third = cells["may import (third party)"]
        rows.append(Part(
            name=cells["part"],
            paths=tuple(re.findall(r"`([^`]+)`", cells["modules"])),
            spectune=frozenset(_names(cells["may import (spectune)"])),
            third_party=frozenset(_names(third.replace(_LAZY_MARK, ""))),
            third_party_lazily=_LAZY_MARK in third,
        ))
    return rows


def _names(cell: str) -> list[str]:
    return [name.strip() for name in cell.split(",") if name.strip() not in ("", "—")]


def modules_of(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every module of the package under ``root``."""
    out = {}
    for path in sorted((root / PACKAGE).rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


class _ImportVisitor(ast.NodeVisitor):
    def __init__(self, module: str, is_package: bool, known: set[str]) -> None:
        self.module = module
        self.package = module if is_package else module.rpartition(".")[0]
        self.known = known
        self.depth = 0
        self.found: list[Import] = []

    def _function(self, node: ast.AST) -> None:
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _function

    def _add(self, target: str, node: ast.stmt) -> None:
        self.found.append(Import(self.module, target, node.lineno, self.depth > 0))

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add(alias.name, node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        base = node.module or ""
        if node.level:
            anchor = self.package.split(".")
            anchor = anchor[: len(anchor) - (node.level - 1)]
            base = ".".join([*anchor, base] if base else anchor)
        for alias in node.names:
            # ``from package import module`` imports the module; anything else, the package.
            sub = f"{base}.{alias.name}"
            self._add(sub if sub in self.known else base, node)


def imports_of(root: Path, modules: dict[str, Path]) -> Iterator[Import]:
    known = set(modules)
    for name, path in modules.items():
        visitor = _ImportVisitor(name, path.name == "__init__.py", known)
        visitor.visit(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)))
        yield from visitor.found


def check(root: Path) -> list[str]:
    """Every break of docs/architecture.md's rules in the tree under ``root``."""
    parts = read_parts(root / DOC)
    modules = modules_of(root)
    problems: list[str] = []
    part_of: dict[str, Part] = {}
    for name, path in modules.items():
        rel = path.relative_to(root).as_posix()
        owners = [p for p in parts if p.holds(rel)]
        if len(owners) != 1:
            problems.append(f"{rel} belongs to {len(owners)} parts of {DOC}, not one")
        else:
            part_of[name] = owners[0]
    graph: dict[str, set[str]] = defaultdict(set)
    for imp in imports_of(root, modules):
        part = part_of.get(imp.importer)
        if part is None:
            continue
        where = f"{modules[imp.importer].relative_to(root).as_posix()}:{imp.line}"
        top = imp.target.partition(".")[0]
        if top == PACKAGE:
            target = part_of.get(imp.target)
            if target is None:
                problems.append(f"{where} imports {imp.target}, which is not a module of "
                                f"{PACKAGE}/ in any part")
                continue
            graph[imp.importer].add(imp.target)
            if target is not part and target.name not in part.spectune:
                problems.append(f"{where}: part {part.name!r} imports {imp.target} (part "
                                f"{target.name!r}), which {DOC} does not allow")
            elif target is not part and _is_private(imp.target):
                problems.append(f"{where}: part {part.name!r} imports {imp.target}, a private "
                                f"module of part {target.name!r}; import what it exports "
                                "from its package instead")
        elif top not in sys.stdlib_module_names:
            if top not in part.third_party:
                problems.append(f"{where}: part {part.name!r} imports {top}, which {DOC} "
                                "does not allow")
            elif part.third_party_lazily and not imp.in_function:
                problems.append(f"{where}: part {part.name!r} imports {top} at module level; "
                                f"{DOC} allows it only inside functions")
    problems += [f"import cycle: {' -> '.join(cycle)}" for cycle in _cycles(graph)]
    problems += _duplicate_names(root, modules)
    return list(dict.fromkeys(problems))  # ``from x import a, b`` is one break, not two


def _is_private(module: str) -> bool:
    """Whether a dotted module path passes through a private module or package."""
    return any(piece.startswith("_") for piece in module.split(".")[1:])


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1 or node in graph.get(node, ()):
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def _duplicate_names(root: Path, modules: dict[str, Path]) -> list[str]:
    by_name: dict[str, list[str]] = defaultdict(list)
    classes: dict[str, list[str]] = defaultdict(list)
    for path in modules.values():
        rel = path.relative_to(root).as_posix()
        if not _NAME_EXEMPT.search(rel):
            by_name[path.stem.lstrip("_")].append(rel)
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                classes[node.name].append(rel)
    problems = [f"modules of the same name: {', '.join(paths)}"
                for paths in by_name.values() if len(paths) > 1]
    problems += [f"public classes named {name} in: {', '.join(paths)}"
                 for name, paths in classes.items() if len(paths) > 1]
    return problems


# --------------------------------------------------------------------------------------
# The tree as it is
# --------------------------------------------------------------------------------------


def test_the_table_names_every_part() -> None:
    parts = read_parts(ROOT / DOC)
    assert [p.name for p in parts] == [
        "ground floor", "kernels", "db", "search", "tuning", "vllm", "cli"]
    search = next(p for p in parts if p.name == "search")
    assert search.spectune == {"ground floor", "db"}  # the engine knows nothing of kernels
    vllm = next(p for p in parts if p.name == "vllm")
    assert vllm.spectune == {"ground floor", "kernels", "db"}
    assert "optuna" not in vllm.third_party and "vllm" in vllm.third_party


def test_spectune_follows_its_architecture() -> None:
    problems = check(ROOT)
    assert not problems, "\n".join(problems)


# --------------------------------------------------------------------------------------
# Planted breaks: the checker must name each
# --------------------------------------------------------------------------------------


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A copy of the package and of the rules, to break."""
    shutil.copytree(ROOT / PACKAGE, tmp_path / PACKAGE,
                    ignore=shutil.ignore_patterns("__pycache__", "*.db"))
    (tmp_path / "docs").mkdir()
    shutil.copy(ROOT / DOC, tmp_path / DOC)
    assert check(tmp_path) == []
    return tmp_path


def _append(path: Path, text: str) -> None:
    path.write_text(path.read_text(encoding="utf-8") + text, encoding="utf-8")


def test_planted_tuner_import_in_the_plugin_is_named(tree: Path) -> None:
    _append(tree / "spectune/vllm/_settings.py",
            "\n\ndef _bad() -> None:\n    import optuna  # noqa\n")
    assert check(tree) == [
        "spectune/vllm/_settings.py:" + str(_last_line(tree / "spectune/vllm/_settings.py"))
        + ": part 'vllm' imports optuna, which docs/architecture.md does not allow"
    ]


def test_planted_part_to_part_import_is_named(tree: Path) -> None:
    _append(tree / "spectune/kernels/_family.py",
            "\nif TYPE_CHECKING:\n    from spectune.tuning import sweep  # noqa\n")
    problems = check(tree)
    assert "part 'kernels' imports spectune.tuning.sweep (part 'tuning')" in problems[0]
    # The tuning part reaches the kernels (its sweeps launch them): the planted edge also
    # closes a cycle, named through the planted module.
    assert problems[1:] and all(
        p.startswith("import cycle:") and "spectune.kernels._family" in p for p in problems[1:])


def test_planted_private_import_across_parts_is_named(tree: Path) -> None:
    # The plugin may import the database part, but only what its package exports.
    _append(tree / "spectune/vllm/_settings.py",
            "\n\ndef _bad() -> None:\n    from spectune.db._row import utc_now  # noqa\n")
    line = _last_line(tree / "spectune/vllm/_settings.py")
    assert check(tree) == [
        f"spectune/vllm/_settings.py:{line}: part 'vllm' imports spectune.db._row, a private "
        "module of part 'db'; import what it exports from its package instead"
    ]


def test_planted_private_import_through_a_package_is_named(tree: Path) -> None:
    # ``from package import _module`` reaches the private module all the same.
    _append(tree / "spectune/cli/db.py", "\nfrom spectune.search import _gp  # noqa\n")
    problems = check(tree)
    assert len(problems) == 1
    assert "part 'cli' imports spectune.search._gp, a private module of part 'search'" in (
        problems[0])


def test_a_private_module_of_the_own_part_is_allowed(tree: Path) -> None:
    _append(tree / "spectune/vllm/doctor.py", "\nfrom spectune.vllm import _settings  # noqa\n")
    assert check(tree) == []


def test_planted_module_level_import_in_the_ground_floor_is_named(tree: Path) -> None:
    _append(tree / "spectune/space.py", "\nimport torch  # noqa\n")
    problems = check(tree)
    assert len(problems) == 1
    assert "part 'ground floor' imports torch at module level" in problems[0]


def test_planted_cycle_is_named(tree: Path) -> None:
    _append(tree / "spectune/messages.py", "\nimport spectune.space  # noqa\n")
    _append(tree / "spectune/space.py", "\nimport spectune.messages  # noqa\n")
    assert check(tree) == ["import cycle: spectune.messages -> spectune.space"]


def test_planted_unknown_module_and_orphan_are_named(tree: Path) -> None:
    (tree / "spectune/stray.py").write_text("from spectune.nowhere import x  # noqa\n")
    problems = check(tree)
    assert "spectune/stray.py belongs to 0 parts of docs/architecture.md, not one" in problems


def test_planted_duplicate_names_are_named(tree: Path) -> None:
    (tree / "spectune/db/_strategies.py").write_text("class SearchSpace:\n    pass\n")
    problems = check(tree)
    assert any(p.startswith("modules of the same name: ") and "search/_strategies.py" in p
               and "db/_strategies.py" in p for p in problems), problems
    assert any(p.startswith("public classes named SearchSpace in: ") for p in problems)


def _last_line(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())
