from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest

from rung.answers.verify import parse_math
from rung.data.filters import (
    decontaminate,
    exact_duplicates,
    jaccard,
    length_bounds,
    near_duplicates,
    normalise,
    shingles,
    unverifiable,
    words,
)


def row(prompt: str, answer: str = "1", source: str = "s") -> dict:
    return dict(id=prompt, source=source, task="math", prompt=prompt, answer=answer, solution=None, meta={})


def prompts(rows: list[dict]) -> list[str]:
    return [r["prompt"] for r in rows]


FARM = "A farmer has 17 cows and buys 5 more at the market on Sunday morning. How many cows does the farmer have now?"
FARM_ONE_WORD = FARM.replace("have now", "own now")  # character 5-gram Jaccard 0.869
FARM_REWORDED = FARM.replace("morning.", "morning!").replace("the farmer", "that farmer")  # 0.764
CHAIN = "State the final answer to the following arithmetic problem: {} ="


def test_normalise_and_words():
    assert normalise("  Calculate\t5 - 3.  ") == normalise("calculate 5 - 3?") == "calculate 5 - 3"
    assert normalise("-5 + 3") != normalise("5 + 3")  # math symbols at the ends are kept
    assert words("What is 5-3?") == words("what is 5 - 3") == ["what", "is", "5", "-", "3"]


def test_report_is_json_ready_and_counts_by_source():
    rows = [row("a", source="x"), row("b", source="y"), row("A.", source="y"), row("a", source="x")]
    kept, report = exact_duplicates(rows)
    assert prompts(kept) == ["a", "b"]
    assert json.loads(json.dumps(report.as_dict())) == {
        "filter": "exact_duplicates",
        "removed": 2,
        "reason": "same normalised prompt as an earlier row",
        "by_source": {"x": 1, "y": 1},
    }


# --- unverifiable ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "answer", ["42", "-4", "1,000", "3.5", "\\frac{1}{2}", "\\sqrt{2}", "x^2+1", "(1, 2)", "\\boxed{7}", "$5$"]
)
def test_parseable_math_answers(answer):
    assert parse_math(answer)


@pytest.mark.parametrize("answer", ["", "   ", "See the proof above.", "---", "?", "\\frac{1}{"])
def test_unparseable_math_answers(answer):
    assert not parse_math(answer)


def test_parsing_works_outside_the_main_thread():
    # math-verify's SIGALRM timeout raises in other threads (as in a Prefect task runner).
    with ThreadPoolExecutor(1) as pool:
        assert pool.submit(parse_math, "\\sqrt{2}").result()


def test_unverifiable_drops_rows_failing_the_check():
    rows = [row("p1", "42"), row("p2", "See the proof above.", source="t"), row("p3", "\\sqrt{2}"), row("p4", "")]
    kept, report = unverifiable(rows, lambda r: bool(parse_math(r["answer"])))
    assert prompts(kept) == ["p1", "p3"] and report.removed == 2 and report.by_source == {"s": 1, "t": 1}


def test_unverifiable_lets_a_broken_check_fail():
    with pytest.raises(KeyError):
        unverifiable([row("p")], lambda r: r["missing"])


# --- length ---------------------------------------------------------------------------------------


def test_length_bounds_are_inclusive():
    rows = [row("x" * n) for n in (0, 3, 4, 10, 11)]
    kept, report = length_bounds(rows, min_chars=3, max_chars=10)
    assert [len(p) for p in prompts(kept)] == [3, 4, 10] and report.removed == 2
    assert length_bounds(rows, min_chars=1)[1].removed == 1  # no upper bound


def test_length_bounds_reject_an_empty_range():
    with pytest.raises(ValueError, match="min_chars <= max_chars"):
        length_bounds([], min_chars=10, max_chars=5)


# --- duplicates -----------------------------------------------------------------------------------


def test_exact_duplicates_first_occurrence_wins():
    rows = [
        row("Calculate 5 - 3.", source="a"),
        row("calculate  5 - 3?", source="b"),
        row(" CALCULATE 5 - 3", source="c"),
        row("Calculate 5 + 3."),
        row("-5 + 3"),
        row("5 + 3"),
    ]
    kept, report = exact_duplicates(rows)
    assert [r["source"] for r in kept[:1]] == ["a"] and report.removed == 2
    assert prompts(kept) == ["Calculate 5 - 3.", "Calculate 5 + 3.", "-5 + 3", "5 + 3"]


def test_near_duplicates_around_the_threshold():
    assert jaccard(shingles(FARM, 5), shingles(FARM_ONE_WORD, 5)) == pytest.approx(0.869, abs=1e-3)
    assert jaccard(shingles(FARM, 5), shingles(FARM_REWORDED, 5)) == pytest.approx(0.764, abs=1e-3)
    rows = [row(FARM, source="a"), row(FARM_ONE_WORD, source="b"), row(FARM_REWORDED, source="c")]
    kept, report = near_duplicates(rows)  # threshold 0.85
    assert [r["source"] for r in kept] == ["a", "c"] and report.removed == 1 and report.by_source == {"b": 1}
    assert near_duplicates(rows, threshold=0.9)[1].removed == 0  # 0.869 is below it
    assert near_duplicates(rows, threshold=0.75)[1].removed == 2  # now 0.764 is above it


def test_near_duplicates_catch_spacing_and_punctuation_variants_exact_dedup_misses():
    rows = [row("Calculate 5 - 3."), row("Calculate 5-3."), row("calculate 5 -3 !")]
    assert exact_duplicates(rows)[1].removed == 0
    assert prompts(near_duplicates(rows)[0]) == ["Calculate 5 - 3."]


def test_near_duplicates_need_the_same_numbers_and_operators():
    rows = [row(CHAIN.format("4 - 1 - 7")), row(CHAIN.format("4 - 1 - 8")), row(CHAIN.format("4 - 1 + 7"))]
    assert [round(jaccard(shingles(rows[0]["prompt"], 5), shingles(r["prompt"], 5)), 2) for r in rows[1:]] == [
        0.93,
        0.89,
    ]
    assert near_duplicates(rows)[1].removed == 0
    assert near_duplicates(rows, same_math=False)[1].removed == 2


def test_numbers_are_normalised_before_grouping():
    assert normalise("It costs $1,000.") == normalise("it costs $1000") == "it costs $1000"
    assert normalise("(1,2) and 1,2345") == "(1,2) and 1,2345"  # not thousands separators
    assert exact_duplicates([row("A bike costs $1,000."), row("A bike costs $1000.")])[1].removed == 1
    priced = FARM.replace("17 cows", "1,700 cows")
    reworded = FARM_ONE_WORD.replace("17 cows", "1700 cows")
    assert prompts(near_duplicates([row(priced), row(reworded)])[0]) == [priced]


def test_numbers_are_written_one_way():
    assert normalise("It costs $2.50.") == normalise("it costs $2.5") == "it costs $2.5"
    assert normalise("3.0 and 10.500") == "3 and 10.5"
    assert normalise("versions 1.2.30 and 2.50.1") == "versions 1.2.30 and 2.50.1"  # not decimals
    assert normalise("1 000 cows") == normalise("1\u202f000 cows") == normalise("1,000 cows") == "1000 cows"
    assert normalise("Calculate \u22125 + 3.") == normalise("calculate -5 + 3") == "calculate -5 + 3"


def test_latex_fractions_number_words_and_scientific_forms_are_written_one_way():
    assert normalise("What is \\frac{3}{4} of twelve?") == normalise("What is 3/4 of 12") == "what is 3/4 of 12"
    assert normalise("Twenty-three and \\dfrac34 and 1.5 \\times 10^{3}") == "23 and 3/4 and 1.5e3"
    assert normalise("Which one is three hundred?") == "which one is 300"  # "one" alone is a pronoun
    assert normalise("often, someone, tenth") == "often, someone, tenth"  # not number words inside words
    assert exact_duplicates([row("Take \\frac{3}{4} of 12."), row("take 3/4 of twelve")])[1].removed == 1


@pytest.mark.parametrize(
    "original, copy",
    [("2.5", "2.50"), ("1000", "1 000"), ("-17", "\u221217"), ("3/4", "\\frac{3}{4}"), ("12", "twelve")],
    ids=["zeros", "spaces", "minus", "latex", "words"],
)
def test_near_duplicates_see_a_number_written_two_ways(original, copy):
    # Rows are compared within groups of equal numbers: a number written two ways put a near-copy
    # (character 5-gram Jaccard 0.87) in another group, never compared.
    first, second = FARM.replace("17", original), FARM_ONE_WORD.replace("17", copy)
    assert prompts(near_duplicates([row(first), row(second)])[0]) == [first]


def test_near_duplicates_are_deterministic():
    rows = [
        row(FARM.replace("17", str(n % 7)).replace("Sunday", day)) for n in range(40) for day in ("Sunday", "Monday")
    ]
    first = near_duplicates(rows, seed=3)
    assert near_duplicates(rows, seed=3) == first
    # 7 numbers: per number, everything after the first Sunday prompt (Monday has Jaccard ~0.86)
    assert first[1].removed == 80 - 7


# --- decontamination ------------------------------------------------------------------------------


def test_short_prompts_are_compared_whole():
    evals = ["Calculate 5 - 3.", "Calculate 7 * 2."]
    rows = [
        row("calculate 5 - 3"),
        row("Calculate 5-3?"),
        row("Calculate 5 - 3 * 2."),
        row("Calculate 5 + 3."),
        row("5 - 3"),
    ]
    kept, report = decontaminate(rows, evals)
    assert prompts(kept) == ["Calculate 5 - 3 * 2.", "Calculate 5 + 3.", "5 - 3"] and report.removed == 2
    assert decontaminate([row("Calculate 5 - 3 * 2.")], evals, n=4)[1].removed == 1  # a 4-token run now counts


def test_long_prompts_share_an_n_token_run():
    evals = [FARM, "What is the capital of France?"]
    copied = "Bob says: a farmer has 17 cows and buys 5 more at the market. Count them."  # 10-token run of FARM
    seven = "He has 17 cows and buys 5 more goats."  # "has 17 cows and buys 5 more": 7 tokens
    kept, report = decontaminate([row(copied, source="x"), row(seven, source="y"), row(FARM.upper())], evals)
    assert prompts(kept) == [seven] and report.removed == 2 and report.by_source == {"s": 1, "x": 1}
    assert decontaminate([row(seven)], evals, n=7)[1].removed == 1


def test_template_ngrams_shared_by_eval_prompts_are_ignored():
    evals = [CHAIN.format("4 - 1 - 7"), CHAIN.format("2 + 2")]
    rows = [row(CHAIN.format("9 - 3")), row(CHAIN.format("4 - 1 - 7 + 5")), row(CHAIN.format("2 + 2"))]
    kept, report = decontaminate(rows, evals)
    # the template is in both eval prompts; "arithmetic problem : 4 - 1 - 7" (8 tokens) in one
    assert prompts(kept) == [CHAIN.format("9 - 3")] and report.removed == 2
    assert decontaminate(rows, evals, ignore_templates=False)[1].removed == 3  # open-r1's rule
    assert decontaminate(rows, [evals[0], *evals])[1].removed == 2  # a repeated eval prompt counts once


def test_short_eval_prompts_are_found_whole_inside_train_prompts():
    evals = ["Calculate 5 - 3.", "What is the capital of France?"]
    rows = [row("Calculate 5 - 3. Show your work."), row("Calculate 5 - 3 * 2."), row("Calculate 5 - 3.5.")]
    rows += [row("Please calculate 5 - 3!"), row("Calculate 15 - 3."), row("Calculate 5 - 3,000.")]
    kept, report = decontaminate(rows, evals)
    assert prompts(kept) == ["Calculate 5 - 3 * 2.", "Calculate 5 - 3.5.", "Calculate 15 - 3.", "Calculate 5 - 3,000."]
    assert report.removed == 2


def test_one_problem_in_several_eval_sets_is_not_template_text():
    # The same problem with different instructions: its n-grams are in 2 eval prompts, yet it is one problem.
    evals = [f"{FARM} Answer with a box.", f"{FARM} Give only the number."]
    copy = row(f"{FARM} Show your work.")
    assert decontaminate([copy], evals[:1])[1].removed == 1
    assert decontaminate([copy], evals)[1].removed == 1
    assert decontaminate([copy], [*evals, FARM.replace("17", "\\(17\\)")])[1].removed == 1  # LaTeX
    # distinct problems filling one template still make it template text
    other = row(FARM.replace("17", "23"))
    assert decontaminate([other], [f"{FARM} Answer with a box.", FARM.replace("17", "19")])[1].removed == 0


# A problem with no numbers, 21 tokens, and one in words (as FARM, which has digits)
PLANET = "Which planet of the solar system has the largest mass and the most known moons, and who named it after a god?"
FARM_WORDS = FARM.replace("17", "seventeen").replace("5", "five")


@pytest.mark.parametrize(
    "evals, copy",
    [
        # no numbers: the problem's own n-grams were in two "problems" (each prompt its own)
        ([f"{PLANET} Answer with a box.", f"Answer briefly. {PLANET}"], f"Quiz: {PLANET[:-1]}; explain."),
        # numbers in words in one set, digits in the other: the words were no numbers
        (
            [FARM_WORDS, f"{FARM} Answer with a box."],
            FARM_WORDS.replace("A farmer", "Farmer Ann").replace("buys five more", "buys five. She got more"),
        ),
        # a digit in one set's instruction made the numbers (2, 17, 5) and (17, 5)
        ([f"{FARM} Answer with a box.", f"{FARM} Solve it in 2 steps."], f"{FARM} Show your work."),
    ],
    ids=["no-digits", "number-words", "digit-in-instruction"],
)
def test_one_problem_put_differently_in_two_eval_sets_decontaminates(evals, copy):
    # Each copy shares with the eval prompts only n-grams found in both: counted as two problems,
    # they were template text and the copy stayed.
    assert decontaminate([row(copy)], evals[:1])[1].removed == 1
    assert decontaminate([row(copy)], evals)[1].removed == 1


def test_an_instruction_shared_by_problems_without_numbers_is_still_template_text():
    instruction = "Answer the following question with a single word and nothing else:"
    evals = [f"{instruction} {PLANET}", f"{instruction} Which ocean is the largest and deepest of all oceans on Earth?"]
    kept = row(f"{instruction} What is the colour of a clear sky at noon in summer?")
    assert decontaminate([kept], evals)[1].removed == 0
    assert decontaminate([kept], evals, ignore_templates=False)[1].removed == 1


def test_decontaminate_is_deterministic_and_rejects_bad_n():
    rows = [row(f"Calculate {i} - 3.") for i in range(20)]
    evals = ["Calculate 4 - 3.", "Calculate 7 - 3."]
    assert decontaminate(rows, evals) == decontaminate(rows, evals)
    with pytest.raises(ValueError, match="n must be >= 1"):
        decontaminate(rows, evals, n=0)
