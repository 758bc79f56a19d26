"""The response format, defined once: how a problem is put to the model, what an SFT target looks
like, where the final answer is read from, and what counts as following the format.

`format.style` picks one of four dialects of the field, each a class below holding everything
about it; SFT targets, reward functions, difficulty scoring, evaluation and the report all go
through these functions, so a model is trained, rewarded and graded on the same format.

- `answer_line` (rung's default): steps, then a line `Answer: <x>`.
- `boxed` (MATH, Qwen2.5-Math, DAPO, Dr. GRPO, SimpleRL-Zoo): the answer in the last `\\boxed{}`.
- `tags` (DeepSeek-R1 / R1-Zero, open-r1): `<think> ... </think> <answer> ... </answer>`.
- `code` (code tasks, HumanEval-style): a Python function in a fenced ```python block.

`format.template` picks how a prompt is put: `chat` (the tokenizer's chat template, the
instruction as a system message or after the question) or `plain` (one string with `{prompt}`,
for base models without a chat template, e.g. the R1-Zero prompt).
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from functools import cache

from rung.answers.latex import last_boxed
from rung.config import FormatParams

Prompt = list[dict[str, str]] | str
"""A conversation for a chat template, or the finished text of a plain template."""

_NUMBER = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:/\d+)?")


def _clean(answer: str | None) -> str | None:
    """An extracted answer without surrounding space, math delimiters or a sentence's final period."""
    if answer is None:
        return None
    answer = answer.strip().removesuffix(".").strip()
    if len(answer) >= 2 and answer[0] == answer[-1] == "$":
        answer = answer[1:-1].strip().removesuffix(".").strip()
    return answer or None


def last_number(text: str) -> str | None:
    """The last number of a text, thousands separators removed: the fallback of lenient extraction."""
    numbers = _NUMBER.findall(text)
    return numbers[-1].replace(",", "") if numbers else None


class Style(ABC):
    """One answer dialect. Subclasses define the instruction, the target and the strict extraction."""

    name: str
    description: str
    """How the answer is given, in a few words (for reports)."""
    instruction: str

    def __init__(self, fmt: FormatParams):
        self.fmt = fmt

    @abstractmethod
    def target(self, answer: str, solution: str | None) -> str:
        """The SFT target for a worked solution (may be None) and the reference answer."""

    @abstractmethod
    def extract(self, completion: str) -> str | None:
        """The final answer where the format puts it, else None (strict: what rewards and headline accuracy read)."""

    def extract_lenient(self, completion: str) -> str | None:
        """The formatted answer if present, else the last number of the text (for models that do not
        follow the format yet: difficulty scoring, 'accuracy in any format')."""
        return self.extract(completion) or last_number(completion)

    def follows(self, completion: str) -> bool:
        """The strict format check: the completion states a non-empty answer where the format puts it."""
        return self.extract(completion) is not None

    def partial_credit(self, completion: str) -> float:
        """A format reward with partial credit in [0, 1]; the strict check where the format has no parts."""
        return float(self.follows(completion))

    @abstractmethod
    def appended(self, text: str, answer: str) -> str:
        """A correct sample given outside the format, with the answer added in the format (traces)."""


class AnswerLine(Style):
    """Steps, then `<prefix> <answer>`: the answer is the rest of the line after the last prefix
    (also in mid-line: "so the Answer: 12")."""

    name = "answer_line"
    description = "a final 'Answer: x' line"

    @property
    def instruction(self) -> str:  # type: ignore[override]
        return f"Show your steps, then end with '{self.fmt.answer_prefix} <result>'."

    def target(self, answer: str, solution: str | None) -> str:
        final = f"{self.fmt.answer_prefix} {answer}"
        return f"{solution.strip()}\n{final}" if solution else final

    def extract(self, completion: str) -> str | None:
        at = completion.rfind(self.fmt.answer_prefix)
        if at < 0:
            return None
        return _clean(completion[at + len(self.fmt.answer_prefix) :].split("\n", 1)[0])

    def appended(self, text: str, answer: str) -> str:
        return f"{text}\n{self.fmt.answer_prefix} {answer}"


class Boxed(Style):
    """The answer in the last `\\boxed{...}` (nested braces kept); MATH solutions already end in one."""

    name = "boxed"
    description = "the answer in the last \\boxed{}"
    instruction = "Please reason step by step, and put your final answer within \\boxed{}."

    def target(self, answer: str, solution: str | None) -> str:
        if solution and last_boxed(solution) is not None:
            return solution.strip()
        final = f"The final answer is $\\boxed{{{answer}}}$."
        return f"{solution.strip()}\n{final}" if solution else final

    def extract(self, completion: str) -> str | None:
        return _clean(last_boxed(completion))

    def appended(self, text: str, answer: str) -> str:
        return f"{text}\nThe final answer is $\\boxed{{{answer}}}$."


class Tags(Style):
    """DeepSeek-R1's `<think> reasoning </think> <answer> answer </answer>`.

    Whitespace between and inside the tags is free: open-r1's format_reward demands exact newlines
    (`^<think>\\n.*?\\n</think>\\n<answer>\\n.*?\\n</answer>$`), but the R1 prompt itself shows the
    tags separated by spaces, so a model that follows the prompt literally would fail it. Targets
    use open-r1's newline layout, so they pass either check.
    """

    name = "tags"
    description = "<think> ... </think> <answer> ... </answer>"
    instruction = (
        "A conversation between User and Assistant. The user asks a question, and the Assistant solves it. "
        "The assistant first thinks about the reasoning process in the mind and then provides the user "
        "with the answer. "
        "The reasoning process and answer are enclosed within <think> </think> and <answer> </answer> tags, "
        "respectively, i.e., <think> reasoning process here </think> <answer> answer here </answer>"
    )
    _ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
    _STRUCTURE = re.compile(r"\s*<think>.*?</think>\s*<answer>.*?</answer>\s*", re.DOTALL)
    TAGS = ("<think>", "</think>", "<answer>", "</answer>")

    def target(self, answer: str, solution: str | None) -> str:
        return f"<think>\n{(solution or '').strip()}\n</think>\n<answer>\n{answer}\n</answer>"

    def extract(self, completion: str) -> str | None:
        found = self._ANSWER.findall(completion)
        return _clean(found[-1]) if found else None

    def follows(self, completion: str) -> bool:
        # Each tag exactly once as well: open-r1's regex alone accepts "<answer>1</answer><answer>2</answer>".
        once = all(completion.count(tag) == 1 for tag in self.TAGS)
        return once and self._STRUCTURE.fullmatch(completion) is not None and self.extract(completion) is not None

    def extract_lenient(self, completion: str) -> str | None:
        strict = self.extract(completion)
        if strict is not None:
            return strict
        opened = completion.rfind("<answer>")  # an answer whose closing tag was cut off
        return _clean(completion[opened + len("<answer>") :]) if opened >= 0 else last_number(completion)

    def partial_credit(self, completion: str) -> float:
        # open-r1's tag_count_reward: 0.25 for each of the four tags present exactly once.
        return sum(0.25 for tag in self.TAGS if completion.count(tag) == 1)

    def appended(self, text: str, answer: str) -> str:
        return self.target(answer, text)


class Code(Style):
    """A Python function in a fenced code block (```python ... ```); the last closed block is the answer,
    graded by the problem's tests in the sandbox (rung.answers.verify). Lenient extraction also takes a
    block whose closing fence was cut off, else the whole completion as code."""

    name = "code"
    description = "a Python function in a ```python code block"
    instruction = "Write the complete Python function in one ```python code block."
    _BLOCK = re.compile(r"```[ \t]*(?:python|py|python3)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)
    _OPEN = re.compile(r"```[ \t]*(?:python|py|python3)?[ \t]*\n", re.IGNORECASE)

    def target(self, answer: str, solution: str | None) -> str:
        return f"```python\n{answer.strip()}\n```"

    def extract(self, completion: str) -> str | None:
        blocks = self._BLOCK.findall(completion)
        return (blocks[-1].strip("\n") or None) if blocks else None

    def extract_lenient(self, completion: str) -> str | None:
        if self._BLOCK.search(completion):  # closed blocks, the last one empty
            return self.extract(completion)
        opened = list(self._OPEN.finditer(completion))
        return (completion[opened[-1].end() :] if opened else completion).strip("\n") or None

    def appended(self, text: str, answer: str) -> str:
        return self.target(answer, None)


STYLES: dict[str, type[Style]] = {"answer_line": AnswerLine, "boxed": Boxed, "tags": Tags, "code": Code}


@cache
def style(fmt: FormatParams) -> Style:
    """The style object of a format (FormatParams is frozen, hence hashable)."""
    return STYLES[fmt.style](fmt)


def instruction(fmt: FormatParams) -> str:
    """The text telling the model the format: `format.instruction`, else the style's own."""
    return fmt.instruction if fmt.instruction is not None else style(fmt).instruction


def prompt(problem: str, fmt: FormatParams) -> Prompt:
    """How one problem is put to the model: chat messages (rendered later by the tokenizer's chat
    template) or, with the plain template, the finished text."""
    text = instruction(fmt)
    if fmt.template == "plain":
        return fmt.plain_template.replace("{instruction}", text).replace("{prompt}", problem)
    if not text:
        return [{"role": "user", "content": problem}]
    if fmt.system_message:
        return [{"role": "system", "content": text}, {"role": "user", "content": problem}]
    return [{"role": "user", "content": f"{problem}\n{text}"}]


def target(answer: str, solution: str | None, fmt: FormatParams) -> str:
    """The SFT target: the worked solution (when there is one) and the answer, in the style."""
    return style(fmt).target(answer, solution)


def extract(completion: str, fmt: FormatParams) -> str | None:
    """The final answer where the style puts it, else None."""
    return style(fmt).extract(completion)


def extract_lenient(completion: str, fmt: FormatParams) -> str | None:
    """The formatted answer if present, else the last number in the text (for unformatted models)."""
    return style(fmt).extract_lenient(completion)


def follows_format(completion: str, fmt: FormatParams) -> bool:
    """The style's strict format check."""
    return style(fmt).follows(completion)
