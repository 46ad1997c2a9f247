"""The layering is checked, not hoped for: measure -> record -> analysis -> trials -> tune/batch-size -> front ends.

Every ``import`` of a gpufeed module inside ``gpufeed/`` (at module level, in functions, or under
``TYPE_CHECKING``: all of them are dependencies a reader has to follow) is read from the source with
``ast``. A module may import from its own package and from lower layers; packages that share a layer
are independent of each other. Import cycles between modules are refused.

``KNOWN`` lists the edges that break the contract today, each with the change that removes it
(issue 12): the list may only shrink, and an entry that no longer occurs fails the test, so that it
is taken out.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.paths import REPO


PACKAGE = REPO / "gpufeed"

# Lowest first. A name stands for the module or package of that name and everything below it.
LAYERS: list[list[str]] = [
    ["gpufeed.defaults"],                                    # the defaults of the settings
    ["gpufeed._version", "gpufeed.units", "gpufeed.thresholds", "gpufeed.settings",
     "gpufeed.ranks_env"],                                   # who this process is under a launcher
    ["gpufeed.record"],
    ["gpufeed.measure"],                                     # the package itself (a docstring)
    ["gpufeed.measure.inside", "gpufeed.measure.outside"],   # inside the training process; outside it
    ["gpufeed.offload"],                                     # the training loader's batches made on Ray
    ["gpufeed.measure.runner", "gpufeed.analysis"],          # runs a command; reads a record
    ["gpufeed.api"],                                         # gpufeed.profile(): measure + analyse in-process
    ["gpufeed.trials"],                                      # one run of a command with settings overridden
    ["gpufeed.tune", "gpufeed.batchsize"],                   # searches made of trials
    ["gpufeed.autotune"],                                    # tune's search inside the training run
    ["gpufeed.arming"],                                      # a process under gpufeed: the probe, then autotune, offload
    ["gpufeed.integrations", "gpufeed.present"],
    ["gpufeed.cli", "gpufeed.demo", "gpufeed"],              # the command line; the package's facade
    ["gpufeed.__main__"],                                    # python -m gpufeed
]

# Imports that the layers allow but the design does not: (importer, imported) prefixes, and why.
FORBIDDEN: dict[tuple[str, str], str] = {
    ("gpufeed.present", "gpufeed.measure.outside.sampler"): "front ends read the host, they do not record it",
    ("gpufeed.present", "gpufeed.measure.runner"): "front ends present records; they do not run commands",
    ("gpufeed.analysis", "gpufeed.measure"): "the analysis reads the record alone (gpufeed analyze works later)",
    ("gpufeed.record", "gpufeed.measure"): "the record is the contract between both sides",
}

# (importer's component or prefix, imported component or prefix): what removes it.
KNOWN: dict[tuple[str, str], str] = {}
KNOWN_CYCLES: dict[frozenset[str], str] = {}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """The gpufeed modules a file imports (``from gpufeed import x`` names module x when x is one)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "gpufeed")
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                and node.module.split(".")[0] == "gpufeed":
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in modules else node.module)
    return found


def _component(module: str) -> tuple[int, str]:
    """(layer, component) of a module: the longest layer entry that contains it."""
    best: tuple[int, str] | None = None
    for level, names in enumerate(LAYERS):
        for name in names:
            # The package root names only itself: a new module must be given its layer.
            contains = module == name or (name != "gpufeed" and module.startswith(name + "."))
            if contains and (best is None or len(name) > len(best[1])):
                best = (level, name)
    assert best is not None, f"{module} belongs to no layer: add it to LAYERS"
    return best


def _under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(path, modules) - {name} for name, path in modules.items()}


def test_every_module_has_a_layer():
    for module in _modules():
        _component(module)  # raises for a module no layer names


def test_no_import_goes_up_or_sideways():
    broken: dict[tuple[str, str], list[str]] = {}
    for importer, imported in _graph().items():
        level_a, comp_a = _component(importer)
        for target in imported:
            level_b, comp_b = _component(target)
            for (a, b) in FORBIDDEN:
                if _under(importer, a) and _under(target, b):
                    broken.setdefault((a, b), []).append(f"{importer} imports {target}: {FORBIDDEN[a, b]}")
            if comp_a == comp_b or level_b < level_a:
                continue
            broken.setdefault((comp_a, comp_b), []).append(f"{importer} imports {target}")
    unexpected = {edge: where for edge, where in broken.items() if edge not in KNOWN}
    assert not unexpected, "imports against the layers:\n" + "\n".join(
        line for where in unexpected.values() for line in where)
    gone = set(KNOWN) - set(broken)
    assert not gone, f"no longer broken, take them out of KNOWN: {sorted(gone)}"


def _cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in graph:
                continue
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(frozenset(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycle():
    graph = _graph()
    # A package's __init__ re-exporting its own modules is not a cycle a reader has to untangle.
    graph = {m: {t for t in targets if not (m.startswith(t + ".") and _modules_is_package(t))}
             for m, targets in graph.items()}
    cycles = _cycles(graph)
    unexpected = [sorted(c) for c in cycles if c not in KNOWN_CYCLES]
    assert not unexpected, f"import cycles: {unexpected}"
    gone = set(KNOWN_CYCLES) - set(cycles)
    assert not gone, f"no longer a cycle, take them out of KNOWN_CYCLES: {[sorted(c) for c in gone]}"


def _modules_is_package(name: str) -> bool:
    return (PACKAGE.parent / Path(*name.split(".")) / "__init__.py").exists()


def test_the_checker_sees_a_violation(tmp_path):
    """The contract would catch an upward import: the checker is not vacuous."""
    modules = {"gpufeed.record.x": tmp_path / "x.py", "gpufeed.tune": tmp_path / "t.py"}
    source = tmp_path / "x.py"
    source.write_text("from gpufeed import tune\n")
    (importer_level, _), (target_level, _) = _component("gpufeed.record.x"), _component("gpufeed.tune")
    assert _imports(source, modules) == {"gpufeed.tune"}
    assert target_level > importer_level
    assert _cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [frozenset({"a", "b"})]


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(pytest.main([__file__, "-q"]))
