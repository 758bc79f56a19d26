"""A seed study's page: data/studies/<name>/study.{json,md,html} and its learning curves as SVG,
rendered from the typed StudyResult of rung.report.study (tables from rung.report.study_tables, HTML
from rung.report.htmlpage)."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from rung import files
from rung.eval.results import Band, StudyResult
from rung.report import htmlpage, study_tables, tables

STUDIES = Path("data/studies")


def band_note(result: StudyResult) -> str:
    """How a claim over several k and the claim family are held to the study's level (rung.report.spectrum)."""
    conf = f"{100 * result.confidence:g}%"
    members = len({(c.claim, c.new, c.eval_set) for c in result.claims})
    return (
        f"The claim family: {members} members (claims × arms × eval sets). The verdicts: the tests over seeds, "
        "Holm's step-down over every k of every member, so that any verdict of the page is reproduced or "
        f"contradicted by chance with probability {result.level:g} at most, not per k or per claim. About these "
        f"checkpoints: within a member, its k share one simultaneous {conf} bootstrap band (sup-t, widened for "
        "small samples; rung.eval.paired.intervals) and one max-T sign-flip test (rung.eval.paired.flip_test); "
        "across members, Holm's step-down adjusts the p."
    )


def markdown(result: StudyResult, settings: Mapping[str, Any]) -> str:
    arms_header, arms = study_tables.arm_table(result)
    tests_header, tests = study_tables.arms_test_table(result)
    first, second = study_tables.study_explanation(result)
    lines = [
        f"# Study {result.name}",
        "",
        ", ".join(f"{k}: {v}" for k, v in settings.items()),
        "",
        first,
        "",
        *tables.md_table(arms_header, arms),
    ]
    if tests:
        lines += ["", "## Paired comparisons between arms", "", second, "", *tables.md_table(tests_header, tests)]
    if result.spectrum:
        spectrum_note, claims_note = study_tables.spectrum_explanation(result)
        lines += ["", "## pass@k spectrum", "", spectrum_note]
        for name in result.spectrum:
            lines += ["", f"On {name}:", "", *tables.md_table(*study_tables.study_spectrum_table(result, name))]
        if result.claims:
            lines += [
                "",
                "## Claims",
                "",
                claims_note,
                "",
                band_note(result),
                "",
                *tables.md_table(*study_tables.claims_table(result)),
            ]
    return "\n".join([*lines, ""])


def plots(result: StudyResult) -> list[htmlpage.Plot]:
    """The study's learning curves per arm (mean over seeds, band from min to max)."""

    def pick(key: str) -> dict[str, list[Band]]:
        return {arm: v[key] for arm, v in result.curves.items()}

    def pct(key: str) -> dict[str, list[Band]]:
        return {arm: [(x, 100 * m, 100 * lo, 100 * hi) for x, m, lo, hi in pts] for arm, pts in pick(key).items()}

    def spectrum(arms: dict[str, list[Band]]) -> Figure | None:
        return htmlpage.pass_at_k_plot(
            {
                arm: {
                    "pass_at_k": {str(int(p[0])): p[1] for p in points},
                    "pass_at_k_band": {str(int(p[0])): [p[2], p[3]] for p in points},
                }
                for arm, points in arms.items()
            }
        )

    spectra: list[htmlpage.Plot] = [
        (
            f"plot-pass-at-k-{name}",
            functools.partial(spectrum, arms),
            f"pass@k on {name} per arm: mean over seeds, band the interval over prompt clusters "
            "(Clopper-Pearson at the effective number of prompts).",
        )
        for name, arms in result.spectrum.items()
    ]
    return [
        *spectra,
        (
            "plot-held-out",
            lambda: htmlpage.band_plot(pct("held_out_accuracy"), "training step", "held-out accuracy (%)"),
            "Held-out greedy accuracy per arm at step 0 (the init checkpoint), every eval_every steps and "
            "after the last step: mean over seeds, band from min to max.",
        ),
        (
            "plot-reward",
            lambda: htmlpage.band_plot(pick("reward"), "training step", "mean reward"),
            "Training reward per step (of the groups trained on): mean over seeds, band from min to max.",
        ),
        (
            "plot-train-accuracy",
            lambda: htmlpage.band_plot(pct("train_accuracy"), "training step", "training-batch accuracy (%)"),
            "Accuracy of the training batch per step: mean over seeds, band from min to max.",
        ),
    ]


def html(result: StudyResult, settings: Mapping[str, Any]) -> str:
    arms_header, arms = study_tables.arm_table(result)
    tests_header, tests = study_tables.arms_test_table(result)
    first, second = study_tables.study_explanation(result)
    figures = htmlpage.figures(plots(result))
    parts = [htmlpage.extra_table(htmlpage.Extra("arms", "Per arm: mean ± sd over seeds", arms_header, arms, [first]))]
    if tests:
        parts.append(
            htmlpage.extra_table(
                htmlpage.Extra(
                    "paired", "Paired comparisons between arms: greedy accuracy", tests_header, tests, [second]
                )
            )
        )
    if result.spectrum:
        spectrum_note, claims_note = study_tables.spectrum_explanation(result)
        for name in result.spectrum:
            header, rows = study_tables.study_spectrum_table(result, name)
            parts.append(
                htmlpage.extra_table(
                    htmlpage.Extra(f"spectrum-{name}", f"pass@k spectrum on {name}", header, rows, [spectrum_note])
                )
            )
        if result.claims:
            parts.append(
                htmlpage.extra_table(
                    htmlpage.Extra(
                        "claims", "Claims", *study_tables.claims_table(result), [claims_note, band_note(result)]
                    )
                )
            )
    parts.append(htmlpage.settings_table(settings))
    return htmlpage.page(f"Study {result.name}", parts, figures)


def write(result: StudyResult, settings: Mapping[str, Any], root: Path = STUDIES) -> dict[str, Path]:
    """data/studies/<name>/study.{json,md,html} and the curves as <plot id>.svg, each replaced
    atomically; returns the paths of the three study files."""
    folder = root / result.name
    paths = {"json": folder / "study.json", "md": folder / "study.md", "html": folder / "study.html"}
    files.write_json(paths["json"], {**result.dump(), "settings": settings})
    for kind, text in (("md", markdown(result, settings)), ("html", html(result, settings))):
        with files.atomic_path(paths[kind]) as tmp:
            tmp.write_text(text, encoding="utf-8")
    htmlpage.save_figures(plots(result), folder)
    return paths
