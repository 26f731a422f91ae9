"""The package's own import graph, read with `ast` (nothing is imported): no cycle between its
modules, and no module imports from a layer above its own.

The layers, lowest first, are shared/ARCHITECTURE.md's "Rules of the road", with two changes the
code showed to be better:

- ``workloads/`` (the rank side) sits right above the parsers, below ``profiles/`` and
  ``cluster/``: it imports nothing of the package but the model, the maths and the parsers (it
  runs on every rank, far from the controller), and the node probe's controller side
  (`cluster.probe.probe_here`) reads this machine with the rank's own reader. The architecture's
  "workloads beside launch" made that read an upward import;
- ``options/`` (the Settings), ``rank_tests``, ``testbed/``, ``health_check`` and ``fabric_scan`` are not named
  there; they sit with checks, burnin, plans and the harness: each imports launch or burnin and is
  imported by the session or the glue.

Inside ``session/`` the stages of the session's start are layers of their own, in the order the
start runs them (`session.start`): spec, probe, choose, preflight, set aside; then the session
object (``core``), built from their values; then what reads a started session (the plan, the
headers, the retest); then ``start``, which runs them all; the package's face last. A stage
imports only the stages before it: none calls back up.

Every import counts: at module level, inside a function, under ``TYPE_CHECKING``. A type named
across layers ties them as surely as a call does.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "pytest_gpucluster"
ROOT = "pytest_gpucluster"

LAYERS: tuple[tuple[str, ...], ...] = (
    ("", "atomic", "errors", "maths", "results.model", "results.text", "sigterm"),  # the model
    ("parsers", "inputs"),
    ("workloads",),  # the rank side (see the module docstring)
    ("profiles", "cluster"),
    ("launch",),
    (
        "checks",
        "burnin",
        "plans",
        "harness",
        "options",
        "rank_tests",
        "testbed",
        "health_check",
        "fabric_scan",
    ),
    ("results",),  # records and report: the rest of results/
    ("session",),
    ("plugin", "fixtures", "cli"),
)
"""Each layer's members, as module paths under the package; a member holds its submodules, and a
longer member wins (``results.model`` is the model, the rest of ``results`` is records)."""

SESSION_STAGES: tuple[tuple[str, ...], ...] = (
    ("spec",),
    ("probe",),
    ("choose",),
    ("preflight",),
    ("set_aside",),
    ("core",),
    ("plan", "header", "retest"),
    ("start",),
    ("",),
)


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        parts = parts[:-1] if parts[-1] == "__init__" else parts
        found[".".join((ROOT, *parts))] = path
    return found


MODULES = _modules()


def _resolve(name: str) -> str | None:
    """The package's module that ``name`` names (the longest existing prefix), or None."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(module: str) -> Iterator[tuple[str, int]]:
    """(imported module, line) for every import of ``module`` that names the package."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                stem = ".".join(base + ([node.module] if node.module else []))
            else:
                stem = node.module or ""
            # ``from pkg import mod`` imports the module ``pkg.mod`` where one exists.
            names = [
                f"{stem}.{alias.name}" if f"{stem}.{alias.name}" in MODULES else stem for alias in node.names
            ]
        else:
            continue
        for name in names:
            if name == ROOT or name.startswith(ROOT + "."):
                target = _resolve(name)
                if target is not None and target != module:
                    yield target, node.lineno


GRAPH = {module: sorted(set(_imports(module))) for module in MODULES}


def _rank(module: str, layers: tuple[tuple[str, ...], ...], prefix: str) -> int | None:
    """The index of the layer whose longest member holds ``module`` (None: in no layer)."""
    best: tuple[int, int] | None = None
    for index, members in enumerate(layers):
        for member in members:
            full = ".".join(p for p in (prefix, member) if p)
            holds = module == full or (member != "" and module.startswith(full + "."))
            if holds and (best is None or len(full) > best[1]):
                best = (index, len(full))
    return None if best is None else best[0]


def layer_of(module: str) -> int | None:
    return _rank(module, LAYERS, ROOT)


def stage_of(module: str) -> int | None:
    return _rank(module, SESSION_STAGES, f"{ROOT}.session")


def test_every_module_has_a_layer():
    """A new top-level module or package must be given its layer here (and in ARCHITECTURE.md)."""
    assert [m for m in MODULES if layer_of(m) is None] == []
    assert [m for m in MODULES if m.startswith(f"{ROOT}.session") and stage_of(m) is None] == []


def test_no_module_imports_from_a_layer_above_its_own():
    upward = [
        f"{MODULES[a].relative_to(PACKAGE.parent)}:{line} imports {b} (layer {layer_of(b)} above {layer_of(a)})"
        for a, targets in GRAPH.items()
        for b, line in targets
        if (layer_of(b) or 0) > (layer_of(a) or 0)
    ]
    assert upward == []


def test_results_import_nothing_of_the_session():
    """results/ records and reports; what it needs of the session's names lives below it."""

    def within(module: str, package: str) -> bool:
        return module == f"{ROOT}.{package}" or module.startswith(f"{ROOT}.{package}.")

    leaks = [
        (a, b)
        for a, targets in GRAPH.items()
        for b, _ in targets
        if within(a, "results") and within(b, "session")
    ]
    assert leaks == []


def test_no_session_stage_calls_back_up():
    """Inside session/: each stage imports only the stages before it (the module docstring)."""
    upward = [
        f"{a} imports {b}"
        for a, targets in GRAPH.items()
        for b, _ in targets
        if (sa := stage_of(a)) is not None and (sb := stage_of(b)) is not None and sb > sa
    ]
    assert upward == []


def _cycles() -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target, _ in GRAPH[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in GRAPH:
        if module not in index:
            visit(module)
    return found


def test_no_import_cycle():
    """(parsers/dcgm_diag and dcgm_diag_text were one, through a deferred import: their values
    now live in parsers/dcgm_diag_model, which both import.)"""
    assert _cycles() == []


def test_the_reader_sees_a_planted_upward_import_and_cycle():
    """The checks above can fail: an upward import and a two-module cycle, planted in a copy of the
    graph, are both found."""
    planted = dict(GRAPH)
    planted[f"{ROOT}.errors"] = [*GRAPH[f"{ROOT}.errors"], (f"{ROOT}.plugin", 1)]
    planted[f"{ROOT}.plugin"] = [*GRAPH[f"{ROOT}.plugin"], (f"{ROOT}.errors", 1)]
    globals()["GRAPH"], saved = planted, GRAPH
    try:
        assert any(f"{ROOT}.errors" in c and f"{ROOT}.plugin" in c for c in _cycles())
        assert (layer_of(f"{ROOT}.plugin") or 0) > (layer_of(f"{ROOT}.errors") or 0)
    finally:
        globals()["GRAPH"] = saved
