"""The layers hold: each part of `rung/` imports only the parts below it, the core imports no
orchestration (prefect, dvc, flows, tasks), `tasks/` imports no flows, no module imports itself
through others, and every DVC stage lists exactly the code it imports as deps (DVC does not follow
imports)."""

from __future__ import annotations

import networkx as nx
import yaml

from tests import imports
from tests.imports import DVC

# rung's parts from the bottom up: a part imports only parts on lower rows
LAYERS = [
    {"rung.redaction"},
    {"rung.errors"},
    {"rung.seeding", "rung.files", "rung.paths", "rung.placement", "rung.onednn", "rung.compat", "rung.sandbox"},
    {"rung.objectives"},
    {"rung.config"},
    {"rung.answers", "rung.models"},
    {"rung.generate"},
    {"rung.envs"},
    {"rung.data", "rung.train"},
    {"rung.rewardmodels"},
    {"rung.eval"},
    {"rung.rl"},
    {"rung.report", "rung.checks"},
    {"rung.tracking", "rung.preflight"},
]


def _part(module: str) -> str:
    return ".".join(module.split(".")[:2])


def test_every_part_of_rung_has_a_layer():
    parts = {_part(m) for m in imports.graph() if m.startswith("rung.")}
    assert parts == set().union(*LAYERS)


def test_each_part_imports_only_parts_below_it():
    level = {part: i for i, row in enumerate(LAYERS) for part in row}
    upward = sorted(
        f"{a} imports {b}"
        for a, b in imports.graph().edges
        if a.startswith("rung.") and _part(a) != _part(b) and level[_part(a)] <= level[_part(b)]
    )
    assert not upward


def test_the_core_imports_no_orchestration_and_tasks_no_flows():
    bad = []
    for name, path in imports.modules().items():
        tops = {m.split(".")[0] for m in imports.imports(path)}
        forbidden = (
            {"prefect", "dvc", "flows", "tasks"}
            if name.startswith("rung.")
            else {"flows"}
            if name.startswith("tasks.")
            else set()
        )
        bad += [f"{name} imports {m}" for m in sorted(tops & forbidden)]
    assert not bad


def test_no_import_cycles():
    assert list(nx.simple_cycles(imports.graph())) == []


def test_each_stage_lists_exactly_the_code_it_imports():
    stages = yaml.safe_load(DVC.read_text())["stages"]
    wrong = {}
    for name, module in imports.stage_modules().items():
        listed = {d for d in stages[name].get("do", stages[name])["deps"] if d.endswith(".py")}
        needed = set(imports.code_deps(module))
        if listed != needed:
            wrong[name] = {"missing": sorted(needed - listed), "not imported": sorted(listed - needed)}
    assert not wrong, (
        f"dvc.yaml code deps differ from the stages' imports (python -m tests.imports rewrites them): {wrong}"
    )
