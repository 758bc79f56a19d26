"""The code task family: the fenced-code format, HumanEval and the procedural functions as sources, grading
in the sandbox, SFT targets, and the preflight that refuses code problems where the sandbox cannot isolate."""

from __future__ import annotations

import json
import random
import shutil

import pytest

from rung import sandbox
from rung.answers import formats, verify
from rung.checks import sources
from rung.config import CodeSource, FileSource, FormatParams, Params, RLStageParams
from rung.data import code, curate, filters
from rung.rl import rewards

FMT = FormatParams(style="code")


@pytest.mark.parametrize(
    "completion, strict, lenient",
    [
        ("Sure:\n```python\ndef f(x):\n    return x\n```\n", "def f(x):\n    return x", "def f(x):\n    return x"),
        (
            "```python\ndef f(x):\n    return 1\n```\nor\n```py\ndef f(x):\n    return 2\n```",
            "def f(x):\n    return 2",
            None,
        ),
        ("```\ndef f(x): return 3\n```", "def f(x): return 3", None),
        ("```python\ndef f(x):\n    return", None, "def f(x):\n    return"),  # the closing fence cut off
        ("def f(x):\n    return 4", None, "def f(x):\n    return 4"),  # no fence at all
        ("```python\n```", None, None),
    ],
)
def test_the_last_fenced_block_is_the_answer(completion, strict, lenient):
    assert formats.extract(completion, FMT) == strict
    assert formats.extract_lenient(completion, FMT) == (lenient if lenient is not None else strict)
    assert formats.follows_format(completion, FMT) == (strict is not None)


def test_sft_targets_are_the_reference_solution_in_a_fence():
    target = formats.target("def f(x):\n    return x\n", None, FMT)
    assert target == "```python\ndef f(x):\n    return x\n```"
    assert formats.extract(target, FMT) == "def f(x):\n    return x"


def test_generated_functions_are_seeded_verified_and_graded_by_their_steps():
    src = CodeSource(type="code", name="fn", problems="functions", size=12, min_steps=1, max_steps=3)
    rows = code.load(src, 7)
    assert rows == code.load(src, 7) and rows != code.load(src, 8)
    assert {r["meta"]["steps"] for r in rows} <= {1, 2, 3} and len({r["meta"]["steps"] for r in rows}) > 1
    assert all(curate.verifiable(r) for r in rows)  # every reference solution passes its own tests
    row = rows[0]
    wrong = row["answer"].replace("return x", "return x + 1")
    assert not verify.is_correct(wrong, row) and not verify.is_correct("def g(x):\n    return x", row)
    assert formats.extract(formats.target(row["answer"], None, FMT), FMT) is not None


def test_humaneval_rows_run_after_their_prompt_so_a_completion_may_use_its_imports():
    rows = code.humaneval()
    assert len(rows) == 164 and len({r["id"] for r in rows}) == 164
    row = next(r for r in rows if r["meta"]["task_id"] == "HumanEval/0")  # typing's List in the signature
    body = (
        "def has_close_elements(numbers: List[float], threshold: float) -> bool:\n"
        "    return any(abs(a - b) < threshold for i, a in enumerate(numbers) for b in numbers[i + 1 :])"
    )
    assert verify.is_correct(body, row)
    assert not verify.is_correct("def has_close_elements(numbers, threshold):\n    return True", row)
    sample = code.load(CodeSource(type="code", name="he", problems="humaneval", size=5), 3)
    assert len(sample) == 5 and all(r["source"] == "he" and curate.verifiable(r) for r in sample)


def test_a_functions_source_needs_a_size():
    with pytest.raises(ValueError, match="size: the functions generator needs a number of problems"):
        CodeSource(type="code", name="fn", problems="functions")


def test_code_problems_are_refused_in_one_line_where_the_sandbox_cannot_isolate(monkeypatch):
    params = Params.model_validate(
        {
            "format": {"style": "code"},
            "curate": {"sources": [{"type": "code", "name": "fn", "problems": "functions", "size": 4}]},
            "rl": {"stages": {"main": {}}},
        }
    )
    sources.sources(params)  # bwrap here: accepted
    sandbox._setup.cache_clear()
    monkeypatch.setattr(shutil, "which", lambda name: f"/nonexistent/{name}")
    try:
        with pytest.raises(sandbox.SandboxUnavailable, match=r"^curate.sources.fn: code rewards need bubblewrap"):
            sources.sources(params)
    finally:
        sandbox._setup.cache_clear()


def test_a_grader_failure_is_unscored_not_wrong(monkeypatch):
    row = code.function_problem(random.Random(0), CodeSource(type="code", name="fn", problems="functions", size=1))
    verify.passes_tests.cache_clear()
    monkeypatch.setattr(verify, "CODE_LIMITS", sandbox.Limits(wall=0.001))  # bwrap cannot even start
    with pytest.raises(verify.GraderFailed, match="the code sandbox failed twice"):
        verify.is_correct(row["answer"], row)
    verify.passes_tests.cache_clear()


def test_tests_passed_is_the_share_of_asserts_and_all_or_nothing_for_a_check_function():
    row = code.function_problem(random.Random(3), CodeSource(type="code", name="fn", problems="functions", size=1))
    meta = row["meta"]
    inputs = [int(line.split("(")[1].split(")")[0]) for line in meta["test"].splitlines()]
    # right on the first two inputs only
    expected = {x: int(line.rsplit("== ", 1)[1]) for x, line in zip(inputs, meta["test"].splitlines(), strict=True)}
    lookup = {x: expected[x] for x in inputs[:2]}
    partial = f"def f(x):\n    return {lookup!r}.get(x, 10**9)\n"
    reward = rewards.TestsPassed(FMT, RLStageParams())
    fenced = [formats.target(c, None, FMT) for c in (row["answer"], partial, "def f(x):\n    return 10**9\n")]
    n = len(fenced)
    got = reward(
        fenced,
        answer=[row["answer"]] * n,
        task=["code"] * n,
        prompt_text=[row["prompt"]] * n,
        meta=[json.dumps(meta)] * n,
    )
    assert got == [1.0, 2 / len(inputs), 0.0]
    he = next(r for r in code.humaneval() if r["meta"]["task_id"] == "HumanEval/0")
    m = he["meta"]
    assert verify.tests_passed_share(he["answer"], m["test"], m["entry_point"], m["context"]) == 1.0
    assert (
        verify.tests_passed_share(
            "def has_close_elements(n, t):\n    return True", m["test"], m["entry_point"], m["context"]
        )
        == 0.0
    )


def test_your_own_problems_from_a_jsonl_file_in_humaneval_columns(tmp_path):
    problems = [
        {
            "prompt": "Write a function `add(a, b)` returning the sum.",
            "answer": "def add(a, b):\n    return a + b",
            "test": "assert add(1, 2) == 3\nassert add(-1, 1) == 0",
            "entry_point": "add",
        },
        {  # MBPP-style, with a context the solution and tests run after
            "prompt": "Write `gcd_all(xs)`: the gcd of a list.",
            "answer": "def gcd_all(xs):\n    return reduce(gcd, xs)",
            "test": "assert gcd_all([12, 18, 24]) == 6",
            "entry_point": "gcd_all",
            "context": "from functools import reduce\nfrom math import gcd",
        },
        {  # a reference solution that fails its own tests: dropped by curate
            "prompt": "Write `neg(x)`.",
            "answer": "def neg(x):\n    return x",
            "test": "assert neg(2) == -2",
            "entry_point": "neg",
        },
    ]
    path = tmp_path / "mine.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in problems))
    rows, _ = curate.load_source(FileSource(type="file", name="mine", path=str(path), task="code"), 0)
    kept, report = filters.unverifiable(rows, curate.verifiable)
    assert [r["meta"]["entry_point"] for r in kept] == ["add", "gcd_all"] and report.removed == 1
    assert verify.is_correct("def gcd_all(xs):\n    return reduce(gcd, xs)", kept[1])  # the context's imports
    assert verify.tests_passed_share("def add(a, b):\n    return 3", problems[0]["test"], "add") == 0.5
