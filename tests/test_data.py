from __future__ import annotations

import pytest

from rung import files
from rung.config import CurateParams
from rung.data.curate import curate
from rung.errors import InputError
from tests.rows import generator


def _params(**over) -> CurateParams:
    src = [generator("arith", "basic_arithmetic", 120, (2, 2), 1), generator("chain", "chain_sum", 120, (2, 3), 1)]
    return CurateParams(**{"sources": src, "test_fraction": 0.25, "max_test": 40, **over})


def test_same_seed_gives_byte_identical_files(tmp_path):
    for run in ("a", "b"):
        train, test, _ = curate(_params(), {}, seed=7)
        files.write_jsonl(tmp_path / run / "train.jsonl", train)
        files.write_jsonl(tmp_path / run / "test.jsonl", test)
    for name in ("train.jsonl", "test.jsonl"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    other, _, _ = curate(_params(), {}, seed=8)
    assert [r["id"] for r in other] != [r["id"] for r in train]


def test_schema_split_and_no_overlap():
    train, test, stats = curate(_params(), {}, seed=1)
    assert set(train[0]) == {"id", "source", "task", "prompt", "answer", "solution", "meta"}
    assert stats["train"] == len(train) and stats["test"] == len(test) <= 40
    norm = lambda r: " ".join(r["prompt"].lower().split())  # noqa: E731
    assert not {norm(r) for r in train} & {norm(r) for r in test}
    assert not {r["id"] for r in train} & {r["id"] for r in test}
    removed = {f["filter"]: f["removed"] for f in stats["filters"]}
    assert removed["exact_duplicates"] > 0  # 1-digit arithmetic repeats itself
    generated = sum(s["read"] for s in stats["sources"].values())
    assert generated == 240 and stats["train"] + stats["test"] + sum(removed.values()) <= generated
    assert all(
        r["solution"] and r["solution"].split(" = ")[-1] == r["answer"] for r in train if r["task"] == "chain_sum"
    )


def test_split_of_a_row_does_not_depend_on_other_sources():
    both_train, both_test, _ = curate(_params(), {}, seed=3)
    one = _params(sources=[_params().sources[0]], max_test=1000)
    arith_train, arith_test, _ = curate(one, {}, seed=3)
    assert {r["id"] for r in arith_train} == {r["id"] for r in both_train if r["source"] == "arith"}


def test_unknown_task_names_the_source():
    bad = _params(sources=[dict(name="x", task="no_such_task", size=5)])
    with pytest.raises(InputError, match=r"curate.sources.x.task: unknown reasoning-gym task 'no_such_task'"):
        curate(bad, {}, seed=0)


def test_bad_task_config_names_the_source():
    bad = _params(sources=[dict(name="x", task="chain_sum", size=5, config={"bogus_knob": 3})])
    with pytest.raises(InputError, match=r"curate.sources.x.config"):
        curate(bad, {}, seed=0)


def test_decontamination_against_eval_sets_and_a_filter_that_empties_everything(tmp_path):
    from rung.config import EvalParams
    from rung.data.curate import eval_sets

    bench = tmp_path / "bench.jsonl"
    bench.write_text(
        "".join(files.dumps({"q": f"Calculate {a} + {b}.", "a": a + b}) + "\n" for a in range(3) for b in range(3))
    )
    evals, _ = eval_sets(
        EvalParams(
            sets=[dict(type="file", name="bench", path=str(bench), task="math", columns=dict(prompt="q", answer="a"))]
        ),
        seed=0,
    )
    assert len(evals["bench"]) == 9 and evals["bench"][0]["answer"].isdigit()
    params = _params(filters=dict(decontamination_ngram=8))
    train, test, stats = curate(params, evals, seed=5)
    bench_prompts = {r["prompt"] for r in evals["bench"]}
    assert not bench_prompts & {r["prompt"] for r in train}
    with pytest.raises(InputError, match="curate.filters: the length_bounds filter removed every row"):
        curate(_params(filters=dict(min_chars=500)), {}, seed=0)


def test_composite_and_curriculum_level_sources():
    composite = dict(
        name="mix",
        task="composite",
        size=40,
        config={
            "datasets": [
                {"name": "chain_sum", "weight": 1, "config": {"min_terms": 2, "max_terms": 2}},
                {"name": "basic_arithmetic", "weight": 1, "config": {}},
            ]
        },
    )
    easy, hard = (dict(name=f"l{lvl}", task="chain_sum", size=60, level=lvl) for lvl in (0, 3))
    train, test, _ = curate(_params(sources=[composite, easy, hard], max_test=1000), {}, seed=0)
    rows = train + test
    assert {r["task"] for r in rows if r["source"] == "mix"} == {
        "chain_sum",
        "basic_arithmetic",
    }  # each row keeps its verifier
    terms = lambda src: max(r["meta"]["num_terms"] for r in rows if r["source"] == src)  # noqa: E731
    assert terms("l0") == 2 and terms("l3") > 2
