"""The verdict table of docs/studies/passk/README.md from a study's study.json: one row per claim,
arm pair and eval set, every k with its difference, 95% band and the p that decides (sign-flip test,
max-T over the claim's k, Holm-adjusted over the claim family), then the prompts and the seeds needed
for the study's reference effect.

    python bench/passk_verdicts.py data/studies/passk/study.json
"""

from __future__ import annotations

import json
import sys


def _points(x: float) -> str:
    return f"{x * 100:+.1f}".replace("-", "−")


def rows(study: dict) -> list[str]:
    out = []
    for c in sorted(study["claims"], key=lambda c: (c["claim"], c["eval_set"])):
        tests = c["tests"]
        diffs = "; ".join(
            f"k={t['k']}: {_points(t['test']['difference'])} [{_points(t['test']['ci_low'])}, "
            f"{_points(t['test']['ci_high'])}] (p {t['test']['p']:.2g})"
            for t in tests
        )
        needed = "; ".join(str(t["prompts_needed_reference"] or "—") for t in tests)
        seeds = "; ".join(str(t["seeds_needed_reference"] or "—") for t in tests)
        arms = f"{c['new']} vs {c['old']}"
        out.append(f"| {c['claim']} | {arms} | {c['eval_set']} | **{c['verdict']}** | {diffs} | {needed} | {seeds} |")
    return out


if __name__ == "__main__":
    print("\n".join(rows(json.loads(open(sys.argv[1]).read()))))
