"""The packages' floors, read from the source with `ast`: a package imports nothing from the floors above it.

    isa/                      the chip and the bundle contract: imports nothing of ours
    runtime/                  runs bundles: imports isa/ only
    neuronx_cc_lite/tile/     the tile program (program, HBM tensors, verifier, printer)
    neuronx_cc_lite/ops/      the op registry, the ops' traits and facts
    passes/, partition/       graph -> graph, before lowering: they read ops/, never lower/
    lower/                    graph -> tile program; the lowerings register themselves in ops/
    codegen/                  tile program -> engine streams: reads tile/, never lower/

An import is at module level, inside a function, or under `if TYPE_CHECKING:` (a type only, never run); the floors
hold at every level except for the few imports listed in ALLOWED, each with its reason.
"""

from __future__ import annotations

import ast
import functools
import os
from typing import NamedTuple

from tests.conftest import ROOT

# (importing file, imported module, where): the imports that cross a floor on purpose
ALLOWED = {
    # the registry's entries are declared next to each lowering (@lowering) and that package imports every lowering
    # module: reading the registry imports it first, so that a pass or the command line always sees every op
    ("neuronx_cc_lite/ops/registry.py", "neuronx_cc_lite.lower", "function"),
    # a lowering is a function of a LowerCtx and a node: the type only
    ("neuronx_cc_lite/ops/registry.py", "neuronx_cc_lite.lower.context", "type"),
}


class Import(NamedTuple):  # compares equal to its (path, module, where) tuple in ALLOWED
    path: str  # the importing file, relative to the repository
    module: str  # the module imported (a submodule named by `from package import name` when it is one)
    where: str  # "module", "function" or "type"


def _is_module(name: str) -> bool:
    path = os.path.join(ROOT, *name.split("."))
    return os.path.isdir(path) or os.path.isfile(path + ".py")


def _imports(path: str) -> list[Import]:
    with open(os.path.join(ROOT, path)) as f:
        tree = ast.parse(f.read(), path)
    package = os.path.dirname(path).replace(os.sep, ".")
    found: list[Import] = []

    def visit(node: ast.AST, where: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = where
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                inner = "function"
            elif isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                inner = "type"
            if isinstance(child, ast.Import):
                found.extend(Import(path, alias.name, inner) for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:  # relative: from the importing package, up level - 1
                    parts = package.split(".")
                    base = ".".join(parts[:len(parts) - child.level + 1] + ([child.module] if child.module else []))
                for alias in child.names:
                    sub = f"{base}.{alias.name}"
                    found.append(Import(path, sub if _is_module(sub) else base, inner))
            visit(child, inner)

    visit(tree, "module")
    return found


def _sources(package: str) -> list[str]:
    paths = []
    for folder, _, files in os.walk(os.path.join(ROOT, package)):
        paths += [os.path.relpath(os.path.join(folder, name), ROOT) for name in files if name.endswith(".py")]
    return sorted(paths)


@functools.cache
def _all() -> list[Import]:
    return [i for package in ("isa", "runtime", "neuronx_cc_lite") for path in _sources(package)
            for i in _imports(path)]


def _in(name: str, *packages: str) -> bool:
    return any(name == p or name.startswith(p + ".") for p in packages)


def _check(importers: tuple[str, ...], imported: tuple[str, ...]) -> None:
    """No file under `importers` (folders) imports a module under `imported` (dotted packages), but as ALLOWED."""
    crossing = {i for i in _all() if i.path.startswith(importers) and _in(i.module, *imported)}
    assert crossing <= ALLOWED, f"imports across a floor: {sorted(crossing - ALLOWED)}"


def test_the_imports_are_found():
    """The parser sees every kind of import (a check that the checks below check something)."""
    found = set(_all())
    assert ("neuronx_cc_lite/lower/context.py", "neuronx_cc_lite.tile.program", "module") in found
    assert ("neuronx_cc_lite/codegen/stages.py", "neuronx_cc_lite.tile.program", "type") in found
    assert ("neuronx_cc_lite/codegen/stages.py", "neuronx_cc_lite.tile.printer", "function") in found
    assert ("neuronx_cc_lite/lower/elementwise.py", "neuronx_cc_lite.lower.integer_limbs", "module") in found


def test_isa_imports_neither_the_compiler_nor_the_runtime():
    _check(("isa/",), ("neuronx_cc_lite", "runtime"))


def test_the_runtime_never_imports_the_compiler():
    _check(("runtime/",), ("neuronx_cc_lite",))


def test_tile_and_ops_stand_below_lowering_codegen_and_the_passes():
    _check(("neuronx_cc_lite/tile/", "neuronx_cc_lite/ops/"),
           ("neuronx_cc_lite.lower", "neuronx_cc_lite.codegen", "neuronx_cc_lite.passes", "neuronx_cc_lite.partition"))


def test_the_tile_program_imports_only_the_isa_and_its_errors():
    ours = {i.module for i in _all() if i.path.startswith("neuronx_cc_lite/tile/") and _in(i.module, "neuronx_cc_lite")}
    outside = {m for m in ours if not _in(m, "neuronx_cc_lite.tile", "neuronx_cc_lite.errors")}
    assert not outside, outside


def test_codegen_the_passes_and_partitioning_never_import_lowering():
    _check(("neuronx_cc_lite/codegen/", "neuronx_cc_lite/passes/", "neuronx_cc_lite/partition/"),
           ("neuronx_cc_lite.lower",))


def test_codegen_never_imports_the_passes_or_the_registry():
    _check(("neuronx_cc_lite/codegen/",),
           ("neuronx_cc_lite.passes", "neuronx_cc_lite.partition", "neuronx_cc_lite.ops"))


def test_no_circle_among_the_lowerings():
    """No module of lower/ imports itself through others, at module level or in a function (normalize.py and
    feature_norm.py did: the step they share is moments.py's). Type-only imports never run and do not count."""
    imports: dict[str, set[str]] = {}
    for i in _all():
        runs = i.where != "type" and i not in ALLOWED
        if runs and i.path.startswith("neuronx_cc_lite/lower/") and _in(i.module, "neuronx_cc_lite.lower") and \
                i.module != "neuronx_cc_lite.lower":
            imports.setdefault(i.path[:-len(".py")].replace("/", "."), set()).add(i.module)

    def reachable(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for module in imports.get(todo.pop(), ()):
                if module not in seen:
                    seen.add(module)
                    todo.append(module)
        return seen

    circles = sorted(m for m in imports if m in reachable(m))
    assert not circles, f"modules of lower/ on an import circle: {circles}"


def test_every_allowed_crossing_is_still_there():
    """An entry of ALLOWED that no import needs any more is taken out."""
    assert ALLOWED <= set(_all()), sorted(ALLOWED - set(_all()))
