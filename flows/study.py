"""A seed study: every arm of a study definition for every seed, as DVC experiments run by the
sweep machinery (flows/sweep.py: checked and preflighted before anything is queued, then DVC's
queue), aggregated over seeds and compared prompt by prompt (rung/report/study.py), its page written
(rung/report/studypage.py) into
data/studies/<name>/study.{md,html,json}, one MLflow parent run for the study (the experiments'
pipeline runs become its children) and the Prefect artifact `rung-study`.

    python -m flows.study bench/curriculum.yaml --jobs 1
    rung study bench/curriculum.yaml
    rung study bench/curriculum.yaml --aggregate-only [--experiments-at COMMIT]

An experiment of the study that already succeeded for this commit (same name) is not run again,
so an interrupted study continues where it stopped. With --aggregate-only nothing runs: every
experiment `<name>-<arm>-<seed>` is read wherever it ran (DVC experiments are keyed to the commit
they ran at, their baseline), and the page is written with this commit's statistics, saying at which
commit the experiments ran and at which the statistics.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import dvc.api
import mlflow
from dvc.exceptions import PathMissingError
from dvc.repo.experiments.utils import exp_refs_by_names
from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact
from scmrepo.git import Git

from flows import sweep
from flows.stage import main
from rung import config, paths, preflight, tracking
from rung.checks import workspace
from rung.errors import InputError
from rung.eval.results import EvalRecord, EvalResult, StudyResult, StudyRun
from rung.report import study as core
from rung.report import studypage
from tasks import dvc as dvc_tasks

CHECKS = (preflight.check, workspace.git_identity)
"""What this stage checks of params before any compute (flows.stage.main)."""


def _read(path: str, rev: str) -> str | None:
    """A file (git- or DVC-tracked) as the experiment `rev` left it; None when it has none."""
    try:
        return dvc.api.read(path, repo=".", rev=rev)
    except (FileNotFoundError, PathMissingError):
        return None


def _jsonl(text: str) -> list[EvalRecord]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def collect(exp: str, name: str, arm: str, seed: int, stage: str, init: str) -> StudyRun:
    """What the aggregation needs from one experiment (`exp` a git revision of it, `name` its name):
    the RL stage's metrics and curve, its
    checkpoint's eval metrics and per-prompt greedy records of every eval set, its sampled records
    and those of the checkpoint it started from (where the eval stage sampled them), and the eval of
    the checkpoint it started from (if the DAG evaluates it)."""
    slug = paths.checkpoint_slug(f"rl/{stage}")
    metrics = _read(str(paths.metrics(f"eval-{slug}")), exp)
    if metrics is None:
        raise RuntimeError(
            f"experiment {name}: no {paths.metrics(f'eval-{slug}')}; the study needs the eval_rl@{stage} stage"
        )
    evaluated = EvalResult.model_validate_json(metrics)
    records: dict[str, list[EvalRecord]] = {}
    samples: dict[str, list[EvalRecord]] = {}
    init_samples: dict[str, list[EvalRecord]] = {}
    for name in evaluated.sets:
        text = _read(str(paths.EVAL / slug / f"{name}.jsonl"), exp)
        if text is not None:
            records[name] = _jsonl(text)
        for into, folder in ((samples, slug), (init_samples, paths.checkpoint_slug(init))):
            text = _read(str(paths.EVAL / folder / f"{name}.samples.jsonl"), exp)
            if text is not None:
                into[name] = _jsonl(text)
    init_eval = _read(str(paths.metrics(f"eval-{paths.checkpoint_slug(init)}")), exp)
    return StudyRun(
        samples=samples,
        init_samples=init_samples,
        arm=arm,
        seed=seed,
        eval=evaluated,
        rl=json.loads(_read(str(paths.metrics(f"rl-{stage}")), exp) or "{}"),
        init_eval=EvalResult.model_validate_json(init_eval) if init_eval else None,
        records=records,
        curve=json.loads(_read(str(paths.plot("rl", stage)), exp) or "[]"),
    )


def locate(names: list[str], at: str | None = None) -> dict[str, tuple[str, str]]:
    """Each experiment's git ref and the commit it ran at (its baseline), wherever it ran: the one at
    commit `at` (a prefix is enough) when given, else its only one, else the one at HEAD; an InputError
    naming the experiment when none or several fit."""
    scm = Git(".")
    head = scm.get_rev()
    found = exp_refs_by_names(scm, set(names))
    out = {}
    for name in names:
        refs = found.get(name, [])
        fit = [r for r in refs if r.baseline_sha.startswith(at)] if at else refs
        if len(fit) > 1:
            fit = [r for r in fit if r.baseline_sha == head] or fit
        if len(fit) != 1:
            ran = ", ".join(r.baseline_sha[:12] for r in refs) or "none"
            raise InputError(
                f"experiment {name}: {'no' if not fit else len(fit)} run(s) fit {'commit ' + at if at else 'HEAD'} "
                f"(it ran at: {ran}); pass --experiments-at <commit>"
            )
        out[name] = (str(fit[0]), fit[0].baseline_sha)
    return out


def write_page(
    spec: core.Study, definition: str, stage: str, runs: list[StudyRun], params: config.Params, ran_at: set[str]
) -> tuple[StudyResult, dict[str, Path], dict[str, str]]:
    """Aggregate the runs with this commit's statistics and write the page; `ran_at` the commits the
    experiments ran at (the page says both)."""
    boot = params.eval.bootstrap
    result = core.aggregate(spec, runs, boot.confidence, boot.resamples, params.seed, params.rl.stages[stage].init)
    settings = {
        "definition": definition,
        "RL stage": f"rl/{stage}",
        "seed key": spec.seed_key,
        "seeds": ", ".join(map(str, spec.seeds)),
        "experiments": ", ".join(core.points(spec)),
        "experiments ran at commit": ", ".join(sorted(c[:12] for c in ran_at)),
        "git commit": tracking.git_commit()[:12],
    }
    return result, studypage.write(result, settings), settings


def _track(params: config.Params, result: StudyResult, written: dict[str, Path], exps: dict[str, core.Point]) -> str:
    """The study's MLflow parent run: per-arm means and sds, the comparisons, the three files; each
    experiment's pipeline run is made its child. Returns the run id."""
    tracking.setup(params)
    tags = {"rung.role": "study", "rung.study": result.name, "git.commit": tracking.git_commit(), **tracking.versions()}
    with mlflow.start_run(run_name=f"study {result.name}", tags=tags) as run:
        mlflow.log_params({"seeds": result.seeds, "seed_key": result.seed_key, "arms": list(result.arms)})
        tracking.log_metrics(
            {
                arm: {k: {"mean": v.mean, **({"sd": v.sd} if v.sd is not None else {})} for k, v in a.metrics.items()}
                for arm, a in result.arms.items()
            },
            prefix="study",
        )
        tracking.log_metrics({k: c.dump()["sets"] for k, c in result.comparisons.items()}, prefix="paired")
        for path in written.values():
            mlflow.log_artifact(str(path))
        client = mlflow.MlflowClient()
        for exp, point in exps.items():
            found = mlflow.search_runs(
                experiment_names=[params.tracking.experiment],
                output_format="list",
                filter_string=f"tags.`dvc.exp_name` = '{exp}' and tags.`rung.role` = 'pipeline'",
            )
            for r in found:
                for key, value in {
                    "mlflow.parentRunId": run.info.run_id,
                    "rung.study": result.name,
                    "rung.study.arm": point["arm"],
                    "rung.study.seed": str(point["seed"]),
                }.items():
                    client.set_tag(r.info.run_id, key, value)
        return run.info.run_id


def plan(
    definition: str, params_file: str = str(paths.PARAMS), run: bool = True
) -> tuple[core.Study, str, dict[str, core.Point], dict[str, config.Params]]:
    """The study, its RL stage, its experiments (name -> arm, seed, point) and their params, every
    point checked against the schema and preflighted, and, when it is to `run`, its design checked
    (core.check_design: a study that cannot reach a verdict is refused): an InputError before anything
    is queued. Aggregating experiments that already ran refuses nothing."""
    spec = core.load(definition)
    stage = core.stage_of(spec, config.load(params_file))
    todo = core.points(spec)
    checked = sweep.check({exp: t["point"] for exp, t in todo.items()}, params_file)
    if run:
        core.check_design(spec, definition, list(checked.values()))
    return spec, stage, todo, checked


@flow(name="study")
def study(definition: str, jobs: int = 1, params_file: str = str(paths.PARAMS)) -> StudyResult:
    """Run a study definition (a YAML file) through DVC's experiment queue and write its page."""
    log = get_run_logger()
    spec, stage, todo, checked = plan(definition, params_file)
    params = config.load(params_file)
    done = {exp for exp, r in dvc_tasks.experiments(list(todo)).items() if r.get("state") == "success"}
    if done:
        log.info(
            "study %s: %d experiment(s) already done for this commit: %s", spec.name, len(done), ", ".join(sorted(done))
        )
    pending = {exp: t["point"] for exp, t in todo.items() if exp not in done}
    results = sweep.run(pending, jobs) if pending else {}
    failed = [exp for exp in pending if results.get(exp, {}).get("state") != "success"]
    if failed:
        raise RuntimeError(f"experiment(s) failed: {', '.join(failed)} (see `dvc queue logs <name>`)")
    refs = locate(list(todo), tracking.git_commit())
    runs = [
        collect(ref, exp, t["arm"], t["seed"], stage, checked[exp].rl.stages[stage].init)
        for (exp, t), (ref, _) in zip(todo.items(), refs.values(), strict=True)
    ]
    result, written, settings = write_page(spec, definition, stage, runs, params, {c for _, c in refs.values()})
    run_id = _track(params, result, written, todo)
    text = studypage.markdown(result, settings)
    create_markdown_artifact(key="rung-study", description=f"study {spec.name}", markdown=text)
    print(text)
    log.info("study %s: %s (MLflow run %s)", spec.name, written["html"], run_id)
    return result


@flow(name="study-aggregate")
def aggregate_only(
    definition: str, experiments_at: str | None = None, params_file: str = str(paths.PARAMS)
) -> StudyResult:
    """Write a study's page from experiments that already ran (at any commit), with this commit's
    statistics: nothing is trained or evaluated."""
    log = get_run_logger()
    spec, stage, todo, checked = plan(definition, params_file, run=False)
    params = config.load(params_file)
    refs = locate(list(todo), experiments_at)
    runs = [
        collect(ref, exp, t["arm"], t["seed"], stage, checked[exp].rl.stages[stage].init)
        for (exp, t), (ref, _) in zip(todo.items(), refs.values(), strict=True)
    ]
    result, written, settings = write_page(spec, definition, stage, runs, params, {c for _, c in refs.values()})
    _track(params, result, written, todo)
    print(studypage.markdown(result, settings))
    log.info("study %s aggregated again: %s", spec.name, written["html"])
    return result


def cli(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m flows.study", description=__doc__.splitlines()[0])
    parser.add_argument("definition", help="study definition (YAML): name, seeds, seed_key, params, arms")
    parser.add_argument("--jobs", "-j", type=int, default=1, help="experiments at a time (DVC queue workers)")
    parser.add_argument(
        "--aggregate-only",
        action="store_true",
        help="run nothing: aggregate the study's experiments wherever they ran with this commit's statistics",
    )
    parser.add_argument(
        "--experiments-at", help="with --aggregate-only: the commit the experiments ran at, when they ran at several"
    )
    args = parser.parse_args(argv)

    def checked_then_run() -> None:
        # a bad definition or point, or a design that cannot answer: one line and exit 2, before Prefect starts
        plan(args.definition, run=not args.aggregate_only)
        if args.aggregate_only:
            locate(list(core.points(core.load(args.definition))), args.experiments_at)  # one line when one is missing
            aggregate_only(args.definition, args.experiments_at)
        else:
            study(args.definition, args.jobs)

    main(checked_then_run, checks=CHECKS)


if __name__ == "__main__":
    cli()
