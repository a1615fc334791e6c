"""The packages depend one way: sqlmap under proxy, the engine under the server (issue 11, item 2).

Every import statement of ``proxy`` and ``sqlmap`` is read with :mod:`ast`, wherever it stands:
at module level, under ``if TYPE_CHECKING:``, or inside a function. The rules:

- ``sqlmap`` imports nothing of ``proxy``; ``sqlmap.errors`` (the bottom) imports nothing of ours.
- ``proxy.engine`` imports, of ``proxy``, only ``proxy.engine.*`` and ``proxy.errors`` (the
  engine raises ``InvalidParameterValue`` and ``BudgetExhausted``); ``sqlmap`` it may use.
- ``proxy.storage`` imports nothing of ``proxy.server``.
- The graph of all these imports has no cycle. A deferred import (in a function or under
  ``TYPE_CHECKING``) that closes a cycle is a cycle dodged, not removed, so it counts too.
  Deferred imports that close no cycle (the CLI's lazy start-up) are fine.

Importing a submodule also runs its parent packages' ``__init__``; those implicit edges are left
out, or every package that re-exports its submodules would be a cycle.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("proxy", "sqlmap")


@dataclass(frozen=True)
class Import:
    """One imported name (or module) of ours, and where its import statement stands."""

    importer: str
    target: str  # the module that the statement makes Python run
    name: str  # the name bound, or the module itself for ``import a.b``
    line: int
    deferred: bool  # inside a function or under ``if TYPE_CHECKING:``


def module_names() -> dict[str, Path]:
    """Map every module of the packages to its file (a package to its ``__init__.py``)."""
    modules = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join(parts)] = path
    return modules


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


ImportNode = ast.Import | ast.ImportFrom


def _statements(nodes: Iterable[ast.AST], deferred: bool) -> Iterator[tuple[ImportNode, bool]]:
    """Every import statement in ``nodes``, and whether it runs later than its module."""
    for node in nodes:
        if isinstance(node, ImportNode):
            yield node, deferred
        elif isinstance(node, ast.If) and _is_type_checking(node):
            yield from _statements(node.body, True)
            yield from _statements(node.orelse, deferred)  # runs at import time, like any code
        else:
            inner = isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
            yield from _statements(ast.iter_child_nodes(node), deferred or inner)


def imports_of(importer: str, path: Path, modules: dict[str, Path]) -> list[Import]:
    """The imports of our own modules that ``importer`` makes, resolved to modules."""
    found = []
    package = importer if path.name == "__init__.py" else importer.rpartition(".")[0]
    for node, deferred in _statements(ast.parse(path.read_text(), str(path)).body, deferred=False):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in modules:
                    found.append(Import(importer, alias.name, alias.name, node.lineno, deferred))
            continue
        base = node.module or ""
        if node.level:
            anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
            base = f"{anchor}.{base}" if base else anchor
        for alias in node.names:
            submodule = f"{base}.{alias.name}"
            target = submodule if submodule in modules else base
            if target in modules:
                found.append(Import(importer, target, alias.name, node.lineno, deferred))
    return found


def all_imports() -> list[Import]:
    modules = module_names()
    return [i for name, path in modules.items() for i in imports_of(name, path, modules)]


def _in(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def cycle_closers(imports: list[Import]) -> set[Import]:
    """The imports whose target reaches their importer again through the import graph."""
    edges: dict[str, set[str]] = {}
    for i in imports:
        edges.setdefault(i.importer, set()).add(i.target)

    def reaches(start: str, goal: str) -> bool:
        seen, todo = {start}, [start]
        while todo:
            for nxt in edges.get(todo.pop(), ()):
                if nxt == goal:
                    return True
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return False

    return {i for i in imports if i.target == i.importer or reaches(i.target, i.importer)}


def show(imports: set[Import] | list[Import]) -> str:
    """One line per import statement and target, naming what it takes."""
    names: dict[tuple[str, int, str], list[str]] = {}
    for i in sorted(imports, key=lambda i: (i.importer, i.line, i.name)):
        names.setdefault((i.importer, i.line, i.target), []).append(i.name)
    return "\n".join(
        f"  {importer}:{line} imports {target} ({', '.join(taken)})"
        for (importer, line, target), taken in names.items()
    )


@pytest.fixture(scope="module")
def imports() -> list[Import]:
    return all_imports()


def test_the_scan_sees_the_imports_it_judges(imports: list[Import]) -> None:
    """Guard against a parser that silently finds nothing (and so passes every rule)."""
    seen = {(i.importer, i.target) for i in imports}
    assert ("sqlmap.translate", "sqlmap.errors") in seen
    assert ("proxy.errors", "sqlmap.errors") in seen
    assert ("proxy.engine.budget", "proxy.errors") in seen
    assert any(i.deferred and i.importer == "proxy.cli" for i in imports)


def test_sqlmap_never_imports_proxy(imports: list[Import]) -> None:
    bad = [i for i in imports if _in(i.importer, "sqlmap") and _in(i.target, "proxy")]
    assert not bad, "sqlmap must not depend on the server:\n" + show(bad)


def test_sqlmap_errors_is_the_bottom(imports: list[Import]) -> None:
    bad = [i for i in imports if i.importer == "sqlmap.errors"]
    assert not bad, "sqlmap.errors imports nothing of ours:\n" + show(bad)


def test_engine_imports_only_engine_and_errors_of_proxy(imports: list[Import]) -> None:
    bad = [
        i
        for i in imports
        if _in(i.importer, "proxy.engine")
        and _in(i.target, "proxy")
        and not (_in(i.target, "proxy.engine") or i.target == "proxy.errors")
    ]
    assert not bad, "the engine must not import the server or storage:\n" + show(bad)


def test_storage_never_imports_the_server(imports: list[Import]) -> None:
    bad = [i for i in imports if _in(i.importer, "proxy.storage") and _in(i.target, "proxy.server")]
    assert not bad, "storage sits below the server:\n" + show(bad)


def test_no_import_cycles(imports: list[Import]) -> None:
    eager = cycle_closers([i for i in imports if not i.deferred])
    assert not eager, "module-level imports form a cycle:\n" + show(eager)
    dodged = {i for i in cycle_closers(imports) if i.deferred}
    assert not dodged, "deferred imports dodge a cycle (restructure instead):\n" + show(dodged)
