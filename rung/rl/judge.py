"""The `judge` reward: a generative model prompted to grade each completion, its verdict parsed (docs/reward_models.md).
The prompt is the user's turn of the judge model's chat template, and the completion untrusted text inside it: it is
encoded with its special-token strings kept as text (it cannot close the user's turn nor open the judge's), and
only what the judge itself writes is parsed, so a completion that writes "Verdict: correct" forges nothing. A
verdict is one word on the judge's first line, `correct` (1.0) or `incorrect` (0.0); anything else (a hedge,
"not correct", a blank) is no verdict: the completion is unscored."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from rung import paths
from rung.config import FormatParams, RLStageParams, SamplingParams
from rung.envs.template import render_ids
from rung.errors import InputError
from rung.generate import api
from rung.rewardmodels.encoding import text_ids
from rung.rl.completions import text
from rung.rl.learned_rewards import Learned

TEMPLATE = (
    "Problem: {prompt}\nProposed solution: {completion}\n"
    "Is the proposed solution's final answer correct? Reply with one word, correct or incorrect.\nVerdict:"
)
_VERDICT = re.compile(r"\s*(correct|incorrect)\s*\.?\s*", re.IGNORECASE)


def verdict(written: str) -> float | None:
    """1.0 for `correct`, 0.0 for `incorrect` alone on the judge's first line; None otherwise."""
    first = written.strip().split("\n", 1)[0] if written.strip() else ""
    match = _VERDICT.fullmatch(first)
    return None if match is None else float(match.group(1).lower() == "correct")


class Judge(Learned):
    """`model`: a checkpoint name (base, sft) or a model directory; `template`: the judge's prompt, with the
    fields {prompt} and {completion}. Decoded greedily by default (temperature 0), else sampled from `seed`: a
    verdict is a function of its prompt either way; batched on `device`."""

    __name__ = "judge"

    def __init__(
        self,
        fmt: FormatParams,
        stage: RLStageParams,
        model: str = "sft",
        template: str = TEMPLATE,
        max_new_tokens: int = 4,
        temperature: float = 0.0,
        seed: int = 0,
        batch_size: int | None = None,
        device: str = "auto",
    ) -> None:
        if template.count("{completion}") != 1 or "{prompt}" not in template.split("{completion}")[0]:
            raise InputError("rewards.judge.args.template: needs {prompt}, then {completion} once")
        self.before, self.after = template.split("{completion}")
        self.fmt, self.seed = fmt, seed
        self.sampling = SamplingParams(temperature=temperature, max_new_tokens=max_new_tokens, batch_size=batch_size)
        self.gen = api.load(
            paths.checkpoint(model) if model in ("base", "sft") else Path(model), "float32", device=device
        )
        self.tok = self.gen.tok

    def ids(self, prompt: str, completion: str) -> list[int]:
        """The judge's prompt: the template's text with the problem and the completion, as the user's turn of the
        judge's chat template (rung.envs.template.render_ids: the text tokenized as plain text), the judge's turn
        to write next; a model without a chat template reads the text alone."""
        content = self.before.replace("{prompt}", prompt) + completion + self.after
        if self.tok.chat_template is None:
            return text_ids(self.tok, content)
        return render_ids(self.tok, [{"role": "user", "content": content}], add_generation_prompt=True)

    def written(self, prompts: list[list[int]]) -> list[str]:
        """What the judge writes after each prompt (rung's batched generation, seeded)."""
        return [done[0].text for done in self.gen.generate(prompts, self.sampling, seed=self.seed, desc="judge")]

    def score(self, completions: list[Any], prompt_text: list[str], **_: Any) -> list[float | None]:
        prompts = [self.ids(p, text(c)) for c, p in zip(completions, prompt_text, strict=True)]
        return [verdict(w) for w in self.written(prompts)]
