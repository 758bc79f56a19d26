"""How fast a stage starts (issue #17): per stage flow module, the import time in a fresh interpreter
(best of --repeat) and the heavy packages the import loads; then stages that have nothing to do, run
as DVC starts them (`python -m flows.<stage>` in a temp workspace, against one Prefect server as
under `make demo`), split into interpreter start / imports / preflight / Prefect flow run start /
MLflow run start (then the stage's first real work) / its work and finish / exit handlers / interpreter
shutdown, and the same stage's wall time as DVC's command line (`python -m`).

    python bench/startup.py [--repeat 3] [--skip-stages]

Prints numbers only; nothing here asserts a time (tests/test_startup.py checks the imports).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from itertools import pairwise
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from flows.run import commit, copy_project  # noqa: E402

STAGES = ("model", "curate", "difficulty", "traces", "sft", "rl", "eval", "report")
HEAVY = (
    "torch",
    "transformers",
    "trl",
    "peft",
    "reasoning_gym",
    "datasets",
    "math_verify",
    "mlflow",
    "prefect",
    "matplotlib",
    "pandas",
)

# Imports flows.<stage> and prints its wall time and the heavy packages it loaded.
IMPORT = """
import json, sys, time
t = time.perf_counter()
import flows.{stage}
print(json.dumps({{"s": time.perf_counter() - t, "heavy": [m for m in {heavy!r} if m in sys.modules]}}))
"""

# The stage's entry (flows.stage.main) with a timestamp after each phase: the preflight and rung.tracking.stage_run
# are wrapped to stamp when the preflight is done, when the Prefect flow's body starts and when its MLflow run is
# open (the stage's first real work); the marks are written when the process has run its exit handlers.
STAGE = """
import time
marks = {{"start": time.time()}}
import atexit, contextlib, json
import flows.{stage} as module
from flows import stage
from rung import tracking
marks["imports"] = time.time()
checked, opened = stage.preflight, tracking.stage_run

def check(params, checks):
    checked(params, checks)
    marks["preflight"] = time.time()

@contextlib.contextmanager
def stamped(*args, **kwargs):
    marks["flow run"] = time.time()
    with opened(*args, **kwargs) as run:
        marks["mlflow run"] = time.time()
        yield run

def done():
    marks["exit handlers"] = time.time()
    with open("{marks}", "w") as f:
        json.dump(marks, f)

stage.preflight, tracking.stage_run = check, stamped
atexit.register(done)  # registered first, so run last
stage.main(getattr(module, "{stage}"), checks=module.CHECKS)
marks["work"] = time.time()
"""


def env(root: Path = ROOT) -> dict[str, str]:
    """This environment with `root`'s code importable and this venv's commands (dvc, git hooks) first on PATH."""
    return {
        **os.environ,
        "PYTHONPATH": str(root),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "DO_NOT_TRACK": "1",
    }


def import_times(repeat: int) -> dict[str, dict]:
    """Per stage: the best import time of `repeat` fresh interpreters and what the import loaded."""
    out = {}
    for stage in STAGES:
        runs = [
            json.loads(
                subprocess.run(
                    [sys.executable, "-c", IMPORT.format(stage=stage, heavy=HEAVY)],
                    cwd=ROOT,
                    env=env(),
                    capture_output=True,
                    text=True,
                    check=True,
                ).stdout
            )
            for _ in range(repeat)
        ]
        out[stage] = {"s": min(r["s"] for r in runs), "heavy": runs[0]["heavy"]}
    return out


def workspace(ws: Path) -> None:
    """A git workspace with the project's code, SFT disabled (zero-RL: `traces` writes an empty file and
    `sft` passes the base model through), an empty train split and a stand-in base model directory."""
    copy_project(ROOT, ws)
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["sft"]["enabled"] = False
    (ws / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    (ws / "data/curated").mkdir(parents=True)
    (ws / "data/curated/train.jsonl").write_text("")
    (ws / "data/models/base").mkdir(parents=True)
    (ws / "data/models/base/config.json").write_text("{}\n")
    commit(ws, "bench", env())


def stage_times(ws: Path, stage: str, stage_env: dict[str, str]) -> dict[str, float]:
    """Seconds of each phase of one run of a stage with nothing to do, from just before its process starts."""
    marks_file = ws / "marks.json"
    started = time.time()
    subprocess.run(
        [sys.executable, "-c", STAGE.format(stage=stage, marks=marks_file)],
        cwd=ws,
        env=stage_env,
        check=True,
        capture_output=True,
    )
    ended = time.time()
    marks = json.loads(marks_file.read_text())
    order = ["start", "imports", "preflight", "flow run", "mlflow run", "work", "exit handlers"]
    phases = {"interpreter": marks["start"] - started}
    phases.update({b: marks[b] - marks[a] for a, b in pairwise(order)})
    phases["shutdown"] = ended - marks["exit handlers"]
    phases["to first work"] = marks["mlflow run"] - started
    phases["total"] = ended - started
    plain = time.time()  # the same stage as DVC's command line, for the end-to-end wall time
    subprocess.run([sys.executable, "-m", f"flows.{stage}"], cwd=ws, env=stage_env, check=True, capture_output=True)
    phases["python -m"] = time.time() - plain
    return phases


def noop_stages(repeat: int) -> dict[str, dict[str, float]]:
    """Best (by total) of `repeat` runs of each no-op stage, after one run that creates the MLflow store."""
    from prefect.server.api.server import SubprocessASGIServer

    server = SubprocessASGIServer()  # one server for every stage, as flows.with_server gives `make demo`
    server.start(timeout=600)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            ws = Path(tmp)
            workspace(ws)
            stage_env = {**env(ws), "PREFECT_API_URL": server.api_url, "DVC_ROOT": str(ws)}
            stage_env.pop("MLFLOW_TRACKING_URI", None)
            stage_times(ws, "traces", stage_env)  # the first run creates mlflow.db, as the first stage of a demo does
            out = {}
            for stage in ("traces", "sft"):
                out[stage] = min((stage_times(ws, stage, stage_env) for _ in range(repeat)), key=lambda p: p["total"])
            return out
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--skip-stages", action="store_true", help="import times only")
    args = parser.parse_args()
    print(f"import of flows.<stage> in a fresh interpreter, best of {args.repeat} (s):")
    for stage, r in import_times(args.repeat).items():
        print(f"  {stage:<11} {r['s']:5.2f}  {' '.join(r['heavy'])}")
    if args.skip_stages:
        return
    print(f"stages with nothing to do, one Prefect server, best of {args.repeat} (s):")
    results = noop_stages(args.repeat)
    columns = list(next(iter(results.values())))
    print("  " + " " * 8 + "".join(f"{c:>14}" for c in columns))
    for stage, phases in results.items():
        print(f"  {stage:<8}" + "".join(f"{phases[c]:14.2f}" for c in columns))


if __name__ == "__main__":
    main()
