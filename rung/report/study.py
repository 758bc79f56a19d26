"""Seed studies: arms x seeds of one experiment, aggregated over seeds and compared prompt by prompt.

A study definition (YAML) names the arms (each a set of dotted params overrides), the seeds, the
params key the seed goes to, and overrides shared by every arm:

    name: curriculum
    stage: main                      # the RL stage whose checkpoint is compared (default: the first)
    seed_key: rl.stages.main.seed    # default `seed` (then data, SFT and RL all change with it)
    seeds: [1, 2, 3]
    params: {rl.stages.main.max_steps: 20}
    arms:
      uniform: {rl.stages.main.curriculum: {type: uniform}}
      pools: {rl.stages.main.curriculum: {type: pools}}

Each (arm, seed) is one DVC experiment `<name>-<arm>-<seed>` (flows/study.py runs them through the
sweep machinery). This module is the part without orchestration and without rendering: the
definition, the points, and the aggregation of what the experiments wrote (their metrics files,
per-prompt eval records and RL curves) into a typed StudyResult (rung.eval.results): per arm the
spread of every headline metric over seeds, the learning curves, and between arms the paired test
of rung.eval.arms.arms_test (its docstring says which unit is resampled and which tests are
run; the pairs of arms x eval sets are one family, Holm-corrected). rung.report.studypage renders
and writes the study page.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from statistics import mean, stdev
from typing import Any, TypedDict

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from rung import config, files
from rung.errors import InputError
from rung.eval import arms, paired
from rung.eval.results import ArmResult, ArmsTest, Band, Comparison, EvalResult, Spread, StudyResult, StudyRun
from rung.report import spectrum

NAME = r"^[A-Za-z0-9][A-Za-z0-9_.]*$"  # part of a DVC experiment name (a git ref): no '-' so names split cleanly
# Metrics of an eval set shown in the per-arm table (all numeric headline metrics go to study.json).
_SET_KEYS = ("accuracy", "accuracy_lenient", "format_rate", "mean_tokens", "truncation_rate")


class Study(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=NAME)
    """Prefix of the experiment names and the folder data/studies/<name>."""
    stage: str | None = None
    """The RL stage whose checkpoint the arms are compared on; None: the first of rl.stages."""
    seed_key: str = "seed"
    """The dotted params key each seed is set at: `seed` changes every stage; `rl.stages.<stage>.seed` only RL."""
    seeds: list[int] = Field(min_length=1)
    params: dict[str, Any] = {}
    """Dotted params overrides shared by every arm."""
    arms: dict[str, dict[str, Any]] = Field(min_length=1)
    """Arm name -> dotted params overrides."""
    claims: list[spectrum.Claim] = []
    """Published claims about the pass@k curve checked on the sampled evaluations (rung.report.spectrum);
    they may name the arms and the checkpoint the RL stage starts from (its `init`, e.g. 'sft')."""
    reference_effect: float = Field(0.05, gt=0, le=1)
    """The effect (a difference of pass@k, 0.05 = 5 points) the power statement of every claim also
    gives the prompts needed for."""
    margin: float = Field(0.02, ge=0, lt=1)
    """The non-inferiority margin of a >= or <= claim (a difference of pass@k, 0.02 = 2 points): such a claim
    is reproduced when its test over seeds puts the difference above -margin (below +margin), contradicted
    when below (above). Without one a >= claim could never be shown, only fail to be contradicted. 2 points:
    about the run-to-run sd of a checkpoint's accuracy seen in the curriculum study (1-2 points), so a
    difference inside it is one no rerun of the procedure could tell from none."""

    @model_validator(mode="after")
    def _check(self) -> Study:
        if len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"seeds: repeated seeds in {self.seeds}")
        for arm, overrides in self.arms.items():
            if not re.match(NAME, arm):
                raise ValueError(f"arms.{arm}: an arm name is letters, digits, '_' and '.'")
            if self.seed_key in overrides or self.seed_key in self.params:
                raise ValueError(f"arms.{arm}: sets {self.seed_key}, the seed key; the study sets it per seed")
        return self


CLAIM_SETTINGS = {"claims", "reference_effect", "margin"}
"""A study's settings that only its claims read."""


def load(path: str | Path) -> Study:
    """Read and validate a study definition; InputError with one line naming the file and key."""
    data = config.read_yaml(path)
    try:
        return Study.model_validate(data)
    except ValidationError as e:
        raise InputError(f"{path}: {config._one_line(e)}") from None  # the params file's one-line error format


class Point(TypedDict):
    """One experiment of a study: its arm, seed and the dotted params overrides it runs with."""

    arm: str
    seed: int
    point: dict[str, Any]


def points(study: Study) -> dict[str, Point]:
    """Experiment name -> {arm, seed, point}: every arm for every seed, seeds varying slowest. A
    nested mapping is set key by key (merged into params.yaml, as `dvc exp run -S` merges; DVC's
    Hydra overrides cannot take a JSON mapping as one value)."""
    return {
        f"{study.name}-{arm}-{seed}": {
            "arm": arm,
            "seed": seed,
            "point": {**files.flatten({**study.params, **overrides}), study.seed_key: seed},
        }
        for seed in study.seeds
        for arm, overrides in study.arms.items()
    }


def _claim_members(study: Study, params: config.Params) -> int:
    """The claim family's size: claims x their arms x the eval sets each is checked on (its `sets`, else
    every sampled set: the held-out split and eval.sets)."""
    sampled = 1 + len(params.eval.sets)
    return sum(len(c.new) * (len(c.sets) if c.sets else sampled) for c in study.claims)


def check_design(study: Study, path: str | Path, params: Sequence[config.Params]) -> None:
    """Refuse, before any compute, a study whose design cannot give a verdict (InputError, one line naming
    the file): arms compared over fewer than 2 seeds (the procedure's test is over seeds), or claims whose
    sign-flip test over `eval.samples.max_prompts` prompts cannot reach the level after Holm over the
    claim family, whatever the effect: its smallest p (paired.flip_floor) times the family's size. `params`
    are the experiments' (the largest floor counts)."""
    if len(study.arms) > 1 and len(study.seeds) < 2:
        raise InputError(
            f"{path}: seeds: {len(study.seeds)} seed gives the arms no test over seeds (the verdict about the "
            "training procedure); a study needs 2 or more (3-5 give the t-test power)"
        )
    if not study.claims:
        return
    if len(study.seeds) < 2:
        raise InputError(
            f"{path}: seeds: {len(study.seeds)} seed gives the claims no test over seeds (their verdict); "
            "claims need 2 or more (3-5 give the t-test power)"
        )
    for p in params:
        samples = p.eval.samples
        if samples is None:
            raise InputError(f"{path}: claims: need sampled evaluations, and eval.samples is null")
        if samples.max_prompts is None:  # every prompt of the set: its size is known only after curate
            continue
        members, alpha, resamples = (
            _claim_members(study, p),
            paired.level(p.eval.bootstrap.confidence),
            p.eval.bootstrap.resamples,
        )
        smallest = members * paired.flip_floor(samples.max_prompts, resamples)
        if smallest >= alpha:
            raise InputError(
                f"{path}: claims: {members} members (claims x arms x eval sets) on {samples.max_prompts} prompts "
                f"(eval.samples.max_prompts): the smallest p after Holm is {smallest:.3g}, not below {alpha:g}, "
                f"whatever the effect; {_reach(members, samples.max_prompts, alpha)} "
                "(power needs more: docs/studies.md)"
            )


def _reach(members: int, prompts: int, alpha: float) -> str:
    """What lets a claim family of `members` reach `alpha`: more prompts while the sign-flip test enumerates
    (floor 2 / 2^m), past that more random flips (floor 1 / (1 + resamples))."""
    exact = range(prompts, paired.ENUMERATE + 1)
    need = next((m for m in exact if members * paired.flip_floor(m, 0) < alpha), None)
    if need:
        return f"{need} prompts can reach it"
    return f"over {paired.ENUMERATE} prompts, eval.bootstrap.resamples {int(members / alpha)} can reach it"


def stage_of(study: Study, params: config.Params) -> str:
    """The RL stage the study compares (InputError when params has no such stage)."""
    stage = study.stage or next(iter(params.rl.stages))
    if stage not in params.rl.stages:
        raise InputError(f"study {study.name}: stage: no RL stage {stage!r} (have {list(params.rl.stages)})")
    return stage


def flat_metrics(eval_metrics: EvalResult, rl_metrics: Mapping[str, Any]) -> dict[str, float]:
    """The numbers aggregated over seeds: per eval set its headline metrics, avg@n, pass@k and maj@k
    ('<set>/<metric>'), and the RL stage's scalars ('rl/<metric>')."""
    out: dict[str, float] = {}
    for name, m in eval_metrics.sets.items():
        for k, v in m.dump().items():
            if k in _SET_KEYS or k.startswith("avg@"):
                out[f"{name}/{k}"] = float(v)
            elif k in ("pass_at_k", "maj_at_k"):
                out.update({f"{name}/{k.split('_')[0]}@{kk}": float(vv) for kk, vv in v.items()})
    out.update(
        {f"rl/{k}": float(v) for k, v in rl_metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    )
    return out


def _spread(values: list[float]) -> Spread:
    return Spread(mean=mean(values), sd=stdev(values) if len(values) > 1 else None, values=values)


def _band(per_seed: list[dict[int, float]]) -> list[Band]:
    """(step, mean, min, max) over the seeds that logged each step."""
    steps = sorted({s for curve in per_seed for s in curve})
    return [(float(s), mean(v), min(v), max(v)) for s in steps for v in [[c[s] for c in per_seed if s in c]]]


def curves(runs: Sequence[StudyRun]) -> dict[str, dict[str, list[Band]]]:
    """Per arm: training reward and training-batch accuracy against step, and held-out accuracy at
    step 0 (the init checkpoint, when its eval is there), at every step the stage graded it
    (`eval_every`) and at the last step (the eval stage), as (step, mean, min, max) over seeds."""
    by_arm: dict[str, list[StudyRun]] = defaultdict(list)
    for r in runs:
        by_arm[r["arm"]].append(r)
    out: dict[str, dict[str, list[Band]]] = {}
    for arm, rs in by_arm.items():
        held = []
        for r in rs:
            init = r["init_eval"]
            points = {0: init.sets["test"].accuracy} if init else {}
            last = int(r["rl"].get("steps") or max((c["step"] for c in r["curve"]), default=0))
            during = {int(c["step"]): c["heldout_accuracy"] for c in r["curve"] if "heldout_accuracy" in c}
            held.append({**points, **during, last: r["eval"].sets["test"].accuracy})
        out[arm] = {
            "reward": _band([{int(c["step"]): c["reward"] for c in r["curve"] if "reward" in c} for r in rs]),
            "train_accuracy": _band(
                [{int(c["step"]): c["accuracy"] for c in r["curve"] if "accuracy" in c} for r in rs]
            ),
            "held_out_accuracy": _band(held),
        }
    return out


def aggregate(
    study: Study, runs: Sequence[StudyRun], confidence: float, resamples: int, seed: int, init: str = "init"
) -> StudyResult:
    """The study's result from its runs (each {arm, seed, eval, rl, init_eval, records: {set:
    records}, curve}, and sampled records where evaluated): per arm the mean and sd over seeds of
    every headline metric, per pair of arms (each later arm against each earlier one) and eval set
    the paired comparison, and the curves; with sampled records, the pass@k spectrum of every arm and
    of the init checkpoint (named `init`), coverage, and the study's claims checked."""
    by_arm: dict[str, ArmResult] = {}
    for arm in study.arms:
        rs = sorted((r for r in runs if r["arm"] == arm), key=lambda r: r["seed"])
        if not rs:
            continue
        values = [flat_metrics(r["eval"], r["rl"]) for r in rs]
        keys = [k for k in values[0] if all(k in v for v in values)]
        by_arm[arm] = ArmResult(
            seeds=[r["seed"] for r in rs], metrics={k: _spread([v[k] for v in values]) for k in keys}
        )
    records = {(r["arm"], r["seed"]): r["records"] for r in runs}
    names = list(by_arm)
    tested: dict[tuple[str, str], dict[str, ArmsTest]] = {}
    for j, new in enumerate(names):
        for old in names[:j]:
            sets: dict[str, ArmsTest] = {}
            set_names = [
                n
                for n in records[(new, by_arm[new].seeds[0])]
                if all(n in records[(old, s)] for s in by_arm[old].seeds)
            ]
            for name in sorted(set_names, key=lambda n: (n != "test", n)):
                per = {arm: {s: records[(arm, s)][name] for s in by_arm[arm].seeds} for arm in (old, new)}
                sets[name] = arms.arms_test(
                    per[old], per[new], confidence, resamples, seed, f"{new} vs {old} on {name}"
                )
            tested[(new, old)] = sets
    # every pair of arms on every eval set is one family, held to the study's level together
    flat = [(pair, name, t) for pair, sets in tested.items() for name, t in sets.items()]
    family = f"Holm over {len(flat)}: pairs of arms x eval sets"
    held = arms.correct([t for *_, t in flat], paired.level(confidence), family)
    comparisons: dict[str, Comparison[ArmsTest]] = {
        paired.key(new, old): Comparison[ArmsTest](
            new=new,
            old=old,
            sets={name: t for (pair, name, _), t in zip(flat, held, strict=True) if pair == (new, old)},
        )
        for new, old in tested
    }
    sampled = spectrum.sampled_records(runs, init)
    extra: dict[str, Any] = {}
    if sampled:
        extra["spectrum"], extra["coverage"] = spectrum.curves(sampled, confidence)
        extra["claims"] = spectrum.check_claims(
            study.claims, sampled, confidence, resamples, seed, study.reference_effect, init, study.margin
        )
    return StudyResult(
        **extra,
        name=study.name,
        seed_key=study.seed_key,
        seeds=study.seeds,
        # a study without claims keeps the definition it wrote before claims existed
        definition=study.model_dump(mode="json", exclude=None if study.claims else CLAIM_SETTINGS),
        level=paired.level(confidence),
        confidence=confidence,
        resamples=resamples,
        seed=seed,
        arms=by_arm,
        comparisons=comparisons,
        curves=curves(runs),
    )
