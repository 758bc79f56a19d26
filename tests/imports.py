"""The project's static import map: each module's imports, the closure of a DVC stage's flow, and
`python -m tests.imports` to rewrite dvc.yaml's code deps from it (DVC does not follow imports)."""

from __future__ import annotations

import ast
import re
import sys
from functools import cache
from pathlib import Path

import networkx as nx
import yaml

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("rung", "flows", "tasks")
DVC = ROOT / "dvc.yaml"


def _holds_code(init: Path) -> bool:
    """Whether a package's `__init__.py` defines functions or classes or imports project modules (as
    rung.config does), rather than only naming the package (a docstring, a __version__, settings)."""
    body = ast.parse(init.read_text()).body
    return any(
        isinstance(n, (ast.FunctionDef, ast.ClassDef))
        or isinstance(n, ast.ImportFrom)
        and (n.module or "").split(".")[0] in PACKAGES
        for n in body
    )


def _name(path: Path) -> str:
    """The module's dotted name. A package's `__init__.py` that holds code is the package itself, so
    `from rung.config import Params` reaches it; any other stays `<package>.__init__`, outside the graph."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    if parts[-1] == "__init__" and _holds_code(path):
        parts = parts[:-1]
    return ".".join(parts)


@cache
def modules() -> dict[str, Path]:
    return {_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def imports(path: Path) -> set[str]:
    """Every module `path` imports, at module level or inside a function."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
            out |= {f"{node.module}.{a.name}" for a in node.names}  # `from rung import files` imports rung.files
    return out


@cache
def graph() -> nx.DiGraph:
    found = modules()
    g = nx.DiGraph()
    g.add_nodes_from(m for m in found if not m.endswith("__init__"))
    for name, path in found.items():
        if not name.endswith("__init__"):
            g.add_edges_from((name, m) for m in imports(path) if m in found and m != name)
    return g


# The report layer: every stage other than the report imports it only for its records (MLflow metric
# names, run tags, figures logged as artifacts, warning log lines), which are not DVC outputs; so
# editing a report warning's text does not make the pipeline stale. flows/stage.finish keeps the
# warnings out of the metrics files, and the report recomputes them from those files.
RECORDS = "rung.report"
REPORT_FLOW = "flows.report"


def closure(module: str, records: bool = True) -> set[str]:
    g = graph()
    if not records:
        g = g.subgraph(m for m in g if m != RECORDS and not m.startswith(RECORDS + "."))
    return {module, *nx.descendants(g, module)}


def stage_closure(module: str) -> set[str]:
    """A flow's import closure (without the report layer, unless it is the report's flow), plus that
    of each training job's entry module it runs (rung.train.launch imports `job.entry` by name, which
    static imports do not show)."""
    from rung.train.jobs import JOBS

    records = module == REPORT_FLOW
    found = closure(module, records)
    source = modules()[module].read_text()
    for job in JOBS:
        if f"{job.__name__}(" in source or f"{job.__name__}.of(" in source:  # built, or from params
            found |= closure(job.entry, records)
    return found


def stage_modules() -> dict[str, str]:
    """Each dvc.yaml stage's flow module (`python -m flows.<stage> [arg]`)."""
    stages = yaml.safe_load(DVC.read_text())["stages"]
    return {name: stage.get("do", stage)["cmd"].split()[2] for name, stage in stages.items()}


def code_deps(module: str) -> list[str]:
    return sorted(str(modules()[m].relative_to(ROOT)) for m in stage_closure(module))


_CODE = re.compile(r"^\s+- (rung|flows|tasks)/\S+\.py\n", re.M)


def write_dvc() -> None:
    """Replace each stage's code deps in dvc.yaml by its import closure, keeping every other line."""
    text, stages = DVC.read_text(), stage_modules()
    blocks = re.split(r"(?m)^(?=  [a-z_]+:\n)", text)
    out = []
    for block in blocks:
        name = block.split(":", 1)[0].strip()
        first = _CODE.search(block)
        if name in stages and first:
            indent = first.group(0)[: first.group(0).index("-")]
            listed = "".join(f"{indent}- {dep}\n" for dep in code_deps(stages[name]))
            block = _CODE.sub("", block[: first.start()]) + listed + _CODE.sub("", block[first.start() :])
        out.append(block)
    DVC.write_text("".join(out))


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    write_dvc()
