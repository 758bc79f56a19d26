from __future__ import annotations

import pytest

from rung import io
from rung.config import CurateParams
from rung.data import curate
from rung.errors import InputError


def _params(**over) -> CurateParams:
    src = [
        dict(name="arith", task="basic_arithmetic", size=120, config=dict(min_terms=2, max_terms=2, min_digits=1, max_digits=1)),
        dict(name="chain", task="chain_sum", size=120, config=dict(min_terms=2, max_terms=3, min_digits=1, max_digits=1)),
    ]
    return CurateParams(**{"sources": src, "test_fraction": 0.25, "max_test": 40, **over})


def test_same_seed_gives_byte_identical_files(tmp_path):
    for run in ("a", "b"):
        train, test, _ = curate(_params(), seed=7)
        io.write_jsonl(tmp_path / run / "train.jsonl", train)
        io.write_jsonl(tmp_path / run / "test.jsonl", test)
    for name in ("train.jsonl", "test.jsonl"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    other, _, _ = curate(_params(), seed=8)
    assert [r["id"] for r in other] != [r["id"] for r in train]


def test_schema_split_and_no_overlap():
    train, test, stats = curate(_params(), seed=1)
    assert set(train[0]) == {"id", "source", "task", "prompt", "answer", "solution", "meta"}
    assert stats["train"] == len(train) and stats["test"] == len(test) <= 40
    norm = lambda r: " ".join(r["prompt"].lower().split())  # noqa: E731
    assert not {norm(r) for r in train} & {norm(r) for r in test}
    assert not {r["id"] for r in train} & {r["id"] for r in test}
    assert stats["duplicates_removed"] == stats["generated"] - len({norm(r) for r in train + test}) - _dropped(stats)
    assert all(r["solution"] and r["solution"].split(" = ")[-1] == r["answer"] for r in train if r["task"] == "chain_sum")


def _dropped(stats):
    # rows hashed into the test side beyond max_test are held out of both splits
    return stats["generated"] - stats["duplicates_removed"] - stats["train"] - stats["test"]


def test_split_of_a_row_does_not_depend_on_other_sources():
    both_train, both_test, _ = curate(_params(), seed=3)
    one = _params(sources=[_params().sources[0]], max_test=1000)
    arith_train, arith_test, _ = curate(one, seed=3)
    assert {r["id"] for r in arith_train} == {r["id"] for r in both_train if r["source"] == "arith"}


def test_unknown_task_names_the_source():
    bad = _params(sources=[dict(name="x", task="no_such_task", size=5)])
    with pytest.raises(InputError, match=r"curate.sources.x.task: unknown reasoning-gym task 'no_such_task'"):
        curate(bad, seed=0)


def test_bad_task_config_names_the_source():
    bad = _params(sources=[dict(name="x", task="chain_sum", size=5, config={"bogus_knob": 3})])
    with pytest.raises(InputError, match=r"curate.sources.x.config"):
        curate(bad, seed=0)
