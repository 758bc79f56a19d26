"""The `majority` reward, label-free (TTRL, Zuo et al. 2025; "Right Question is Already Half the Answer"): 1.0 for a
completion whose answer agrees with its group's majority answer, 0.0 otherwise; no reference answer is read.
Answers are compared the way the grader compares them (rung.answers.verify.answer_class: `1,000` and `1e3` are one
answer), so the majority is the maj@n vote of evaluation. A completion without an answer agrees with nothing (0.0);
a group whose most frequent answers tie has no majority, so all of it scores 0.0 (no signal, no gradient). The
verifier still grades every completion against the reference, never to train on: the gold accuracy logged beside
the agreement (rung.rl.gold), which is where a label-free reward's gap shows."""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable
from typing import Any

from rung.answers import formats
from rung.answers.rows import problem
from rung.answers.verify import answer_class
from rung.config import FormatParams, RLStageParams
from rung.rl.completions import groups, text
from rung.rl.learned_rewards import Learned


def agreement(classes: list[Hashable | None]) -> list[float]:
    """1.0 where a completion's answer class is the group's unique most frequent one (None: no answer)."""
    counts = Counter(c for c in classes if c is not None).most_common(2)
    if not counts or (len(counts) == 2 and counts[0][1] == counts[1][1]):
        return [0.0] * len(classes)
    return [float(c is not None and c == counts[0][0]) for c in classes]


class Majority(Learned):
    __name__ = "majority"

    def __init__(self, fmt: FormatParams, stage: RLStageParams) -> None:
        self.fmt, self.group = fmt, stage.num_generations

    def score(self, completions: list[Any], prompt_text: list[str], **columns: Any) -> list[float | None]:
        out: list[float | None] = []
        for group in groups(len(completions), self.group):
            i = group.start  # the answer is never read: a placeholder keeps the row a Problem
            row = dict(task=columns["task"][i], prompt_text=prompt_text[i], meta=columns["meta"][i], answer="")
            classify = answer_class(problem(row))
            answers = [formats.extract(text(completions[j]), self.fmt) for j in group]
            out += agreement([None if a is None else classify(a) for a in answers])
        return out
