"""The layers hold: the core `rung/` imports no orchestration (prefect, dvc, flows, tasks), `tasks/`
imports no flows, no project module imports itself through others, and every DVC stage lists the
code it imports as deps (DVC does not follow imports)."""
from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx
import yaml

from rung.train.jobs import RLJob, SFTJob
from tests.conftest import ROOT

PACKAGES = ("rung", "flows", "tasks")


def _modules() -> dict[str, Path]:
    return {".".join(p.relative_to(ROOT).with_suffix("").parts): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}


def _imports(path: Path) -> set[str]:
    """Every module `path` imports, at module level or inside a function."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
            out |= {f"{node.module}.{a.name}" for a in node.names}  # `from rung import files` imports rung.files
    return out


def _graph() -> nx.DiGraph:
    modules = _modules()
    graph = nx.DiGraph()
    graph.add_nodes_from(modules)
    for name, path in modules.items():
        graph.add_edges_from((name, m) for m in _imports(path) if m in modules and m != name and not m.endswith("__init__"))
    return graph


def test_the_core_imports_no_orchestration_and_tasks_no_flows():
    bad = []
    for name, path in _modules().items():
        tops = {m.split(".")[0] for m in _imports(path)}
        forbidden = {"prefect", "dvc", "flows", "tasks"} if name.startswith("rung.") else {"flows"} if name.startswith("tasks.") else set()
        bad += [f"{name} imports {m}" for m in sorted(tops & forbidden)]
    assert not bad


def test_no_import_cycles():
    assert list(nx.simple_cycles(_graph())) == []


def _closure(module: str) -> set[str]:
    graph = _graph()
    return {m for m in {module, *nx.descendants(graph, module)} if not m.endswith("__init__")}


def _stage_closure(module: str) -> set[str]:
    """A flow's import closure, plus that of each training job's entry module it runs (rung.train.launch
    imports `job.entry` by name, which static imports do not show)."""
    found = _closure(module)
    source = _modules()[module].read_text()
    for job in (SFTJob, RLJob):
        if f"{job.__name__}(" in source:
            found |= _closure(job.entry)
    return found


def test_each_stage_lists_the_code_it_imports():
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    missing = {}
    for name, stage in stages.items():
        stage = stage.get("do", stage)
        module = stage["cmd"].split()[2]  # python -m flows.<stage> [arg]
        deps = set(stage["deps"])
        needed = {str(_modules()[m].relative_to(ROOT)) for m in _stage_closure(module)}
        if needed - deps:
            missing[name] = sorted(needed - deps)
    assert not missing, f"dvc.yaml deps miss imported code: {missing}"
