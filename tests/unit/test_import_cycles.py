"""No import cycles between packages at any level, and none between the modules of any package
(imports made only for type checking, and imports inside functions, count too). The layers
contract in pyproject.toml orders the top-level packages; this covers what is inside them."""

from __future__ import annotations

import itertools

import grimp
import pytest

ROOTS = ("orchestrator", "operators")
# Packages that must exist for the check to mean something (every package is checked).
MODULE_LEVEL = (
    "orchestrator.control",
    "orchestrator.runtime",
    "orchestrator.runtime.elastic",
    "orchestrator.sim",
    "orchestrator.policies",
    "orchestrator.spec",
    "orchestrator.costmodel",
    "orchestrator.planner",
    "orchestrator.worker",
)


def cycles(graph: grimp.ImportGraph, module_level: tuple[str, ...] = ()) -> list[str]:
    """Pairs of siblings that import each other (directly or not): sibling packages anywhere,
    and sibling modules in the ``module_level`` packages."""
    children: dict[str, list[str]] = {}
    for module in graph.modules:
        parent = module.rpartition(".")[0]
        if parent and (parent in module_level or graph.find_children(module)):
            children.setdefault(parent, []).append(module)
    found = []
    for siblings in children.values():
        for a, b in itertools.combinations(sorted(siblings), 2):
            there = graph.chain_exists(importer=a, imported=b, as_packages=True)
            if there and graph.chain_exists(importer=b, imported=a, as_packages=True):
                found.append(f"{a} <-> {b}")
    return found


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph(*ROOTS)


def test_no_cycles_between_packages_or_between_the_modules_of_any_package(
    graph: grimp.ImportGraph,
) -> None:
    packages = tuple(m for m in graph.modules if graph.find_children(m))
    assert set(MODULE_LEVEL) <= set(packages)
    assert cycles(graph, packages) == []


def test_a_cycle_is_found_between_packages_and_between_modules() -> None:
    g = grimp.ImportGraph()
    for m in ("p", "p.a", "p.a.x", "p.b", "p.b.y", "p.m1", "p.m2"):
        g.add_module(m)
    g.add_import(importer="p.a.x", imported="p.b.y")
    assert cycles(g) == []
    g.add_import(importer="p.b.y", imported="p.a.x")
    g.add_import(importer="p.m1", imported="p.m2")
    g.add_import(importer="p.m2", imported="p.m1")
    assert cycles(g) == ["p.a <-> p.b"]  # p's modules are checked only when asked
    assert cycles(g, ("p",)) == ["p.a <-> p.b", "p.m1 <-> p.m2"]
