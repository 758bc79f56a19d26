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
sweep machinery). This module is the part without orchestration: the definition, the points, and
the aggregation of what the experiments wrote (their metrics files, per-prompt eval records and
RL curves) into the study page.

Between two arms, on every eval set, the paired comparison takes the unit of resampling to be the
prompt when every seed answered the same prompts (a seed of RL alone), with its outcomes in all
seeds together, and the (seed, prompt) pair otherwise (the seed also changed the data); then
- the difference in greedy accuracy (new - old, over all seeds and prompts) with a paired
  bootstrap interval: units resampled, stratified by seed when the unit is a (seed, prompt) pair
  (rung.eval.paired.paired_bootstrap);
- an exact sign test over units (units where new does better against units where old does):
  with one seed it is the exact McNemar test of the report, and with shared prompts it does not
  count one prompt's seeds as independent evidence;
- the per-seed differences and a paired t-test over seeds (scipy.stats.ttest_rel), which asks
  whether the arm wins across training runs; with 2-3 seeds it has little power.
The prompt-level tests are conditional on the seeds run: they say whether these trained models
differ on this population of prompts; the spread over seeds is reported next to them.
"""
from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from statistics import mean, stdev
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from scipy.stats import binomtest, ttest_rel

from rung import config

from rung.report import htmlpage

from rung import files

from rung.eval import paired

from rung.report import pipeline
from rung.errors import InputError

NAME = r"^[A-Za-z0-9][A-Za-z0-9_.]*$"  # part of a DVC experiment name (a git ref): no '-' so names split cleanly
STUDIES = Path("data/studies")
# Metrics of an eval set shown in the per-arm table (all numeric headline metrics go to study.json).
_SET_KEYS = ("accuracy", "accuracy_lenient", "format_rate", "mean_tokens", "truncation_rate")
_RL_KEYS = ("reward_last", "frac_reward_zero_std", "frac_zero_std_trained")


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


def load(path: str | Path) -> Study:
    """Read and validate a study definition; InputError with one line naming the file and key."""
    data = config.read_yaml(path)
    try:
        return Study.model_validate(data)
    except ValidationError as e:
        raise InputError(f"{path}: {config._one_line(e)}") from None  # the params file's one-line error format


def points(study: Study) -> dict[str, dict[str, Any]]:
    """Experiment name -> {arm, seed, point}: every arm for every seed, seeds varying slowest. A
    nested mapping is set key by key (merged into params.yaml, as `dvc exp run -S` merges; DVC's
    Hydra overrides cannot take a JSON mapping as one value)."""
    return {f"{study.name}-{arm}-{seed}": {"arm": arm, "seed": seed, "point": {**files.flatten({**study.params, **overrides}), study.seed_key: seed}}
            for seed in study.seeds for arm, overrides in study.arms.items()}


def stage_of(study: Study, params: config.Params) -> str:
    """The RL stage the study compares (InputError when params has no such stage)."""
    stage = study.stage or next(iter(params.rl.stages))
    if stage not in params.rl.stages:
        raise InputError(f"study {study.name}: stage: no RL stage {stage!r} (have {list(params.rl.stages)})")
    return stage


def headline(eval_metrics: dict[str, Any], rl_metrics: dict[str, Any]) -> dict[str, float]:
    """The numbers aggregated over seeds: per eval set its headline metrics, avg@n, pass@k and maj@k
    ('<set>/<metric>'), and the RL stage's scalars ('rl/<metric>')."""
    out: dict[str, float] = {}
    for name, m in eval_metrics["sets"].items():
        for k, v in m.items():
            if k in _SET_KEYS or k.startswith("avg@"):
                out[f"{name}/{k}"] = float(v)
            elif k in ("pass_at_k", "maj_at_k"):
                out.update({f"{name}/{k.split('_')[0]}@{kk}": float(vv) for kk, vv in v.items()})
    out.update({f"rl/{k}": float(v) for k, v in rl_metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)})
    return out


def _spread(values: list[float]) -> dict[str, Any]:
    return {"mean": mean(values), "sd": stdev(values) if len(values) > 1 else None, "values": values}


def _correct(records: Sequence[dict[str, Any]]) -> dict[str, bool]:
    return {r["id"]: bool(r["samples"][0]["correct"]) for r in records}


def compare_arms(old: dict[int, list[dict[str, Any]]], new: dict[int, list[dict[str, Any]]], confidence: float, resamples: int,
                 seed: int, what: str) -> dict[str, Any]:
    """Greedy accuracy of arm `new` against arm `old` on one eval set, from their per-prompt records
    per seed (seeds both have): see the module docstring for the unit, interval and tests."""
    seeds = [s for s in old if s in new]
    if not seeds:
        raise InputError(f"{what}: no seed that both arms ran")
    aligned = {s: paired.align(old[s], new[s], f"{what}, seed {s}") for s in seeds}
    ids = {s: sorted(o["id"] for o, _ in pairs) for s, pairs in aligned.items()}
    shared = all(ids[s] == ids[seeds[0]] for s in seeds)
    a = {s: _correct(old[s]) for s in seeds}
    b = {s: _correct(new[s]) for s in seeds}
    if shared:  # unit: a prompt, with its outcomes in every seed
        x_old = np.array([mean(a[s][i] for s in seeds) for i in ids[seeds[0]]])
        x_new = np.array([mean(b[s][i] for s in seeds) for i in ids[seeds[0]]])
        strata = None
    else:  # unit: a (seed, prompt) pair, resampled within its seed
        x_old = np.array([float(a[s][i]) for s in seeds for i in ids[s]])
        x_new = np.array([float(b[s][i]) for s in seeds for i in ids[s]])
        strata = [s for s in seeds for _ in ids[s]]
    diff, lo, hi = paired.paired_bootstrap(x_old, x_new, confidence, resamples, seed, strata)
    up, down = int((x_new > x_old).sum()), int((x_new < x_old).sum())
    p = float(binomtest(up, up + down, 0.5).pvalue) if up + down else 1.0
    acc_old = [mean(a[s].values()) for s in seeds]
    acc_new = [mean(b[s].values()) for s in seeds]
    diffs = [n - o for n, o in zip(acc_new, acc_old)]
    # the t-test needs differences that vary (scipy gives nan, with a warning, for identical ones)
    t_p = float(ttest_rel(acc_new, acc_old).pvalue) if len(set(diffs)) > 1 else None
    alpha = paired.level(confidence)
    significant = p < alpha
    out = {"seeds": seeds, "unit": "prompt" if shared else "seed, prompt", "units": len(x_old),
           "accuracy_old": float(np.mean(acc_old)), "accuracy_new": float(np.mean(acc_new)),
           "difference": diff, "ci_low": lo, "ci_high": hi, "units_better": up, "units_worse": down, "sign_test_p": p,
           "per_seed_difference": {str(s): d for s, d in zip(seeds, diffs)}, "seed_t_test_p": t_p,
           "significant": significant, "verdict": paired.verdict(significant, alpha)}
    if not significant:
        out["prompts_needed"] = paired.mcnemar_prompts_needed(down, up, len(x_old), alpha)
    return out


def _band(per_seed: list[dict[int, float]]) -> list[tuple[float, float, float, float]]:
    """(step, mean, min, max) over the seeds that logged each step."""
    steps = sorted({s for curve in per_seed for s in curve})
    return [(float(s), mean(v), min(v), max(v)) for s in steps for v in [[c[s] for c in per_seed if s in c]]]


def curves(runs: Sequence[dict[str, Any]]) -> dict[str, dict[str, list[tuple[float, float, float, float]]]]:
    """Per arm: training reward and training-batch accuracy against step, and held-out accuracy at
    step 0 (the init checkpoint, when its eval is there), at every step the stage graded it
    (`eval_every`) and at the last step (the eval stage), as (step, mean, min, max) over seeds."""
    by_arm: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in runs:
        by_arm[r["arm"]].append(r)
    out: dict[str, dict[str, list[tuple[float, float, float, float]]]] = {}
    for arm, rs in by_arm.items():
        held = []
        for r in rs:
            points = {0: r["init_eval"]["sets"]["test"]["accuracy"]} if r.get("init_eval") else {}
            last = int(r["rl"].get("steps") or max((c["step"] for c in r["curve"]), default=0))
            during = {int(c["step"]): c["heldout_accuracy"] for c in r["curve"] if "heldout_accuracy" in c}
            held.append({**points, **during, last: r["eval"]["sets"]["test"]["accuracy"]})
        out[arm] = {"reward": _band([{int(c["step"]): c["reward"] for c in r["curve"] if "reward" in c} for r in rs]),
                    "train_accuracy": _band([{int(c["step"]): c["accuracy"] for c in r["curve"] if "accuracy" in c} for r in rs]),
                    "held_out_accuracy": _band(held)}
    return out


def aggregate(study: Study, runs: Sequence[dict[str, Any]], confidence: float, resamples: int, seed: int) -> dict[str, Any]:
    """The study's result from its runs (each {arm, seed, eval, rl, init_eval, records: {set:
    records}, curve}): per arm the mean and sd over seeds of every headline metric, per pair of arms
    (each later arm against each earlier one) and eval set the paired comparison, and the curves."""
    arms: dict[str, Any] = {}
    for arm in study.arms:
        rs = sorted((r for r in runs if r["arm"] == arm), key=lambda r: r["seed"])
        if not rs:
            continue
        values = [headline(r["eval"], r["rl"]) for r in rs]
        keys = [k for k in values[0] if all(k in v for v in values)]
        arms[arm] = {"seeds": [r["seed"] for r in rs], "metrics": {k: _spread([v[k] for v in values]) for k in keys}}
    records = {(r["arm"], r["seed"]): r["records"] for r in runs}
    names = list(arms)
    comparisons: dict[str, Any] = {}
    for j, new in enumerate(names):
        for old in names[:j]:
            sets = {}
            set_names = [n for n in records[(new, arms[new]["seeds"][0])] if all(n in records[(old, s)] for s in arms[old]["seeds"])]
            for name in sorted(set_names, key=lambda n: (n != "test", n)):
                per = {arm: {s: records[(arm, s)][name] for s in arms[arm]["seeds"]} for arm in (old, new)}
                sets[name] = compare_arms(per[old], per[new], confidence, resamples, seed, f"{new} vs {old} on {name}")
            comparisons[paired.key(new, old)] = {"new": new, "old": old, "sets": sets}
    return {"name": study.name, "seed_key": study.seed_key, "seeds": study.seeds, "definition": study.model_dump(mode="json"),
            "level": paired.level(confidence), "confidence": confidence, "resamples": resamples, "seed": seed,
            "arms": arms, "comparisons": comparisons, "curves": curves(runs)}


def _pm(s: dict[str, Any], pct: bool) -> str:
    """'mean ± sd' (in % for rates, 1 decimal; else 3 decimals); only the mean for one seed."""
    scale, fmt = (100, ".1f") if pct else (1, ".3f")
    return f"{scale * s['mean']:{fmt}}" + (f" ± {scale * s['sd']:{fmt}}" if s["sd"] is not None else "")


def arm_rows(result: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """The per-arm table: mean ± sd over seeds (accuracies and rates in %), the per-seed held-out accuracy."""
    metrics = next(iter(result["arms"].values()))["metrics"]
    sets = list(dict.fromkeys(k.split("/")[0] for k in metrics if not k.startswith("rl/")))
    samples = sorted(k.split("/", 1)[1] for k in metrics if k.startswith("test/avg@"))
    cols = [("test/accuracy", "held-out accuracy %", True)]
    cols += [(f"{s}/accuracy", f"{s} accuracy %", True) for s in sets if s != "test"]
    cols += [("test/format_rate", "format rate %", True), ("test/mean_tokens", "mean tokens", False)]
    cols += [(f"test/{k}", f"{k} %", True) for k in samples]
    cols += [("rl/reward_last", "last reward", False), ("rl/frac_reward_zero_std", "zero-variance groups generated", False),
             ("rl/frac_zero_std_trained", "zero-variance groups trained", False)]
    cols = [c for c in cols if c[0] in metrics]
    header = ["arm", "seeds", *(title for _, title, _ in cols), "held-out accuracy per seed %"]
    rows = []
    for arm, a in result["arms"].items():
        m = a["metrics"]
        cells = [_pm(m[k], pct) for k, _, pct in cols]
        rows.append([arm, str(len(a["seeds"])), *cells, ", ".join(f"{100 * v:.1f}" for v in m["test/accuracy"]["values"])])
    return header, rows


def comparison_rows(result: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """The paired comparisons between arms, one row per pair and eval set."""
    header = ["comparison (new vs old)", "eval set", "seeds", "units", "accuracy old → new",
              f"difference, points [{100 * result['confidence']:g}% CI]", "per-seed differences", "units better / worse",
              "sign test p", "verdict", "t-test over seeds p"]
    rows = []
    for c in result["comparisons"].values():
        for name, g in c["sets"].items():
            t = "—" if g["seed_t_test_p"] is None else pipeline.p_text(g["seed_t_test_p"])
            rows.append([f"{c['new']} vs {c['old']}", name, str(len(g["seeds"])), f"{g['units']} ({g['unit']})",
                         f"{100 * g['accuracy_old']:.1f}% → {100 * g['accuracy_new']:.1f}%",
                         f"{pipeline.signed_points(g['difference'])} [{pipeline.signed_points(g['ci_low'])}, {pipeline.signed_points(g['ci_high'])}]",
                         ", ".join(pipeline.signed_points(v) for v in g["per_seed_difference"].values()), f"{g['units_better']} / {g['units_worse']}",
                         pipeline.p_text(g["sign_test_p"]), g["verdict"] + paired.power_note(g, "units"), t])
    return header, rows


def explanation(result: dict[str, Any]) -> list[str]:
    conf, alpha = result["confidence"], result["level"]
    return [
        f"Mean ± sd over seeds (seeds at params key {result['seed_key']}). The curves show training reward and training-batch "
        "accuracy per step, and held-out greedy accuracy at step 0 (the checkpoint RL starts from), every "
        "rl.stages.<name>.eval_every steps when the stage sets it, and at the last step.",
        "Paired comparisons: each later arm against each earlier one, on the same prompts in each seed. A unit is a prompt with "
        "its outcomes in every seed when all seeds answered the same prompts, else a (seed, prompt) pair. Difference: new minus "
        f"old accuracy in points, with its {100 * conf:g}% paired bootstrap interval ({result['resamples']} resamples of the units, "
        "within each seed for (seed, prompt) units). The exact sign test counts units where the new arm does better against "
        "units where it does worse (with one seed: exact McNemar) and gives the verdict; it is conditional on these seeds. "
        "The t-test over seeds compares the per-seed accuracies (scipy ttest_rel) and asks whether the arm wins across "
        f"training runs. \"Not significant at {alpha:g}\" does not mean the arms are equal; \"needs about N units\": the units at "
        f"which the sign test would find this effect significant with 80% power (rung.eval.paired.mcnemar_prompts_needed).",
    ]


def markdown(result: dict[str, Any], settings: dict[str, Any]) -> str:
    arms_header, arms = arm_rows(result)
    cmp_header, cmps = comparison_rows(result)
    first, second = explanation(result)
    lines = [f"# Study {result['name']}", "", ", ".join(f"{k}: {v}" for k, v in settings.items()), "", first, "",
             *pipeline.md_table(arms_header, arms)]
    if cmps:
        lines += ["", "## Paired comparisons between arms", "", second, "", *pipeline.md_table(cmp_header, cmps)]
    return "\n".join([*lines, ""])


def plots(result: dict[str, Any]) -> list[htmlpage.Plot]:
    """The study's learning curves per arm (mean over seeds, band from min to max)."""
    c = result["curves"]
    pick = lambda key: {arm: v[key] for arm, v in c.items()}  # noqa: E731
    pct = lambda key: {arm: [(x, 100 * m, 100 * lo, 100 * hi) for x, m, lo, hi in pts] for arm, pts in pick(key).items()}  # noqa: E731
    return [
        ("plot-held-out", lambda: htmlpage.band_plot(pct("held_out_accuracy"), "training step", "held-out accuracy (%)"),
         "Held-out greedy accuracy per arm at step 0 (the init checkpoint), every eval_every steps and after the last step: mean over seeds, band from min to max."),
        ("plot-reward", lambda: htmlpage.band_plot(pick("reward"), "training step", "mean reward"),
         "Training reward per step (of the groups trained on): mean over seeds, band from min to max."),
        ("plot-train-accuracy", lambda: htmlpage.band_plot(pct("train_accuracy"), "training step", "training-batch accuracy (%)"),
         "Accuracy of the training batch per step: mean over seeds, band from min to max."),
    ]


def html(result: dict[str, Any], settings: dict[str, Any]) -> str:
    arms_header, arms = arm_rows(result)
    cmp_header, cmps = comparison_rows(result)
    first, second = explanation(result)
    figures = htmlpage.figures(plots(result))
    tables = [htmlpage.extra_table(htmlpage.Extra("arms", "Per arm: mean ± sd over seeds", arms_header, arms, [first]))]
    if cmps:
        tables.append(htmlpage.extra_table(htmlpage.Extra("paired", "Paired comparisons between arms: greedy accuracy", cmp_header, cmps, [second])))
    tables.append(htmlpage.settings_table(settings))
    return htmlpage.page(f"Study {result['name']}", tables, figures)


def write(result: dict[str, Any], settings: dict[str, Any], root: Path = STUDIES) -> dict[str, Path]:
    """data/studies/<name>/study.{json,md,html} and the curves as <plot id>.svg, each replaced
    atomically; returns the paths of the three study files."""
    folder = root / result["name"]
    paths = {"json": folder / "study.json", "md": folder / "study.md", "html": folder / "study.html"}
    files.write_json(paths["json"], {**result, "settings": settings})
    for kind, text in (("md", markdown(result, settings)), ("html", html(result, settings))):
        with files.atomic_path(paths[kind]) as tmp:
            tmp.write_text(text, encoding="utf-8")
    htmlpage.save_figures(plots(result), folder)
    return paths
