"""The committed dvc.lock is the record of the demo run at this commit: each stage's code deps and
params are the files and values it was run with. A commit that changes a stage's code or params
without rerunning the pipeline (`make demo`, then commit dvc.lock) fails here."""

from __future__ import annotations

import hashlib

from ruamel.yaml import YAML

from tests import imports
from tests.imports import DVC, ROOT

LOCK = ROOT / "dvc.lock"
_YAML = YAML(typ="safe", pure=True)  # YAML 1.2, as DVC reads: 5e-5 is a number (PyYAML reads a string)
HINT = "dvc.lock is older than the committed code or params: run `make demo` and commit dvc.lock"


def _stages() -> dict[str, dict]:
    return _YAML.load(LOCK.read_text())["stages"]


def _value(params: dict, dotted: str) -> object:
    for key in dotted.split("."):
        params = params[key]
    return params


def test_every_stage_of_the_dag_is_in_the_lock():
    dag = _YAML.load(DVC.read_text())["stages"]
    params = _YAML.load((ROOT / "params.yaml").read_text())
    expected = set()
    for name, stage in dag.items():
        if "foreach" in stage:
            expected |= {f"{name}@{key}" for key in _value(params, stage["foreach"].strip("${}"))}
        else:
            expected.add(name)
    assert set(_stages()) == expected, HINT


def test_the_lock_records_the_code_each_stage_imports_as_it_is():
    modules = imports.stage_modules()
    stale = {}
    for name, stage in _stages().items():
        recorded = {d["path"]: d["md5"] for d in stage["deps"] if d["path"].endswith(".py")}
        needed = set(imports.code_deps(modules[name.split("@")[0]]))
        changed = sorted(
            p
            for p, md5 in recorded.items()
            if (ROOT / p).is_file() and hashlib.md5((ROOT / p).read_bytes()).hexdigest() != md5
        )
        if set(recorded) != needed or changed:
            stale[name] = {
                "changed": changed,
                "missing": sorted(needed - set(recorded)),
                "gone": sorted(set(recorded) - needed),
            }
    assert not stale, f"{HINT}: {stale}"


def test_the_lock_records_the_params_as_they_are():
    params = _YAML.load((ROOT / "params.yaml").read_text())
    stale = {
        f"{name}: {key}": value
        for name, stage in _stages().items()
        for key, value in stage.get("params", {}).get("params.yaml", {}).items()
        if _value(params, key) != value
    }
    assert not stale, f"{HINT}: {stale}"
