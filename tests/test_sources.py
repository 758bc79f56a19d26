from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pydantic import ValidationError

from rung.data import row_id
from rung.errors import InputError
from rung.sources import FileSource, HFSource, load, mix

RECORDS = [
    {"q": "What is 40 + 2?", "a": 42, "why": "40 + 2 = 42", "level": 1},
    {"q": "What is 7 * 6?", "a": 42, "why": None, "level": 2},
    {"q": "Half of 3?", "a": 1.5, "why": "3 / 2 = 1.5", "level": 1},
]
COLUMNS = {"prompt": "q", "answer": "a", "solution": "why"}


def write(path: Path, records: list[dict]) -> Path:
    """Write records as jsonl, parquet or csv, chosen by the suffix."""
    if path.suffix == ".parquet":
        pq.write_table(pa.Table.from_pylist(records), path)
    elif path.suffix == ".csv":
        with path.open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(records[0]))
            w.writeheader()
            w.writerows({k: "" if v is None else v for k, v in r.items()} for r in records)
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def file_source(path: Path, **over) -> FileSource:
    return FileSource(**{"name": "ext", "path": str(path), "columns": COLUMNS, **over})


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet", ".csv"])
def test_each_format_gives_the_schema_rows(tmp_path, suffix):
    loaded = load(file_source(write(tmp_path / f"d{suffix}", RECORDS)), seed=0)
    rows = loaded.rows
    assert [r["prompt"] for r in rows] == [r["q"] for r in RECORDS]
    assert [r["answer"] for r in rows] == ["42", "42", "1.5"]  # numbers become text, never "42.0"
    assert [r["solution"] for r in rows] == ["40 + 2 = 42", None, "3 / 2 = 1.5"]
    assert rows[0] == dict(
        id=row_id("math", "What is 40 + 2?", "42"), source="ext", task="math", prompt="What is 40 + 2?",
        answer="42", solution="40 + 2 = 42", meta={"level": "1" if suffix == ".csv" else 1},  # CSV cells are text
    )
    assert loaded.stats == dict(read=3, dropped_empty=0, dropped_where=0, dropped_size=0, rows=3)


def test_explicit_format_overrides_the_suffix(tmp_path):
    path = write(tmp_path / "d.jsonl", RECORDS).rename(tmp_path / "d.txt")
    assert len(load(file_source(path, format="jsonl"), seed=0).rows) == 3
    with pytest.raises(InputError, match=r"^curate.sources.ext.format: cannot infer the format of .*d.txt from its suffix"):
        load(file_source(path), seed=0)


def test_task_and_default_columns(tmp_path):
    path = write(tmp_path / "d.jsonl", [{"prompt": "Calculate 5 - 3.", "answer": 2}])
    [row] = load(FileSource(name="arith", path=str(path), task="basic_arithmetic"), seed=0).rows
    assert (row["task"], row["answer"], row["solution"], row["meta"]) == ("basic_arithmetic", "2", None, {})
    assert row["id"] == row_id("basic_arithmetic", "Calculate 5 - 3.", "2")


def test_unknown_task(tmp_path):
    with pytest.raises(InputError, match=r"^curate.sources.ext.task: unknown task 'algebra': use 'math' or a reasoning-gym task name$"):
        load(file_source(write(tmp_path / "d.jsonl", RECORDS), task="algebra"), seed=0)


def test_empty_prompts_and_answers_are_dropped_and_counted(tmp_path):
    records = [*RECORDS, {"q": "", "a": 1}, {"q": "  ", "a": 1}, {"q": "ok?", "a": None}, {"q": "ok?", "a": " "}, {"a": 3}]
    loaded = load(file_source(write(tmp_path / "d.jsonl", records)), seed=0)
    assert len(loaded.rows) == 3 and loaded.stats["dropped_empty"] == 5 and loaded.stats["read"] == 8


def test_where_keeps_matching_values_compared_as_text(tmp_path):
    for suffix in (".jsonl", ".csv"):  # int 1 in JSON and "1" in CSV both match where: [1]
        loaded = load(file_source(write(tmp_path / f"d{suffix}", RECORDS), where={"level": [1]}), seed=0)
        assert [r["answer"] for r in loaded.rows] == ["42", "1.5"] and loaded.stats["dropped_where"] == 1


def test_size_takes_a_seeded_sample_in_source_order(tmp_path):
    records = [{"q": f"What is {i} + 1?", "a": i + 1} for i in range(50)]
    src = file_source(write(tmp_path / "d.jsonl", records), columns={"prompt": "q", "answer": "a"}, size=10)
    first, again, other = load(src, seed=7), load(src, seed=7), load(src, seed=8)
    assert first.rows == again.rows
    assert [r["id"] for r in first.rows] != [r["id"] for r in other.rows]
    numbers = [int(r["answer"]) for r in first.rows]
    assert len(numbers) == 10 and numbers == sorted(numbers) and numbers != list(range(1, 11))  # not the first 10
    assert first.stats == dict(read=50, dropped_empty=0, dropped_where=0, dropped_size=40, rows=10)
    assert len(load(src.model_copy(update={"size": 500}), seed=7).rows) == 50  # a cap, not a demand


# --- errors: one line naming the source and the field --------------------------------------------


def test_missing_file(tmp_path):
    with pytest.raises(InputError, match=r"^curate.sources.ext.path: file not found: .*nope.jsonl$"):
        load(file_source(tmp_path / "nope.jsonl"), seed=0)


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet", ".csv"])
def test_missing_column_lists_the_columns(tmp_path, suffix):
    path = write(tmp_path / f"d{suffix}", RECORDS)
    with pytest.raises(InputError) as e:
        load(file_source(path, columns={"prompt": "q", "answer": "ans"}), seed=0)
    assert str(e.value) == f"curate.sources.ext.columns.answer: column 'ans' not in {path} (has: q, a, why, level)"
    with pytest.raises(InputError, match=r"^curate.sources.ext.columns.solution: column 'steps' not in"):
        load(file_source(path, columns={"prompt": "q", "answer": "a", "solution": "steps"}), seed=0)
    with pytest.raises(InputError, match=r"^curate.sources.ext.where.topic: column 'topic' not in"):
        load(file_source(path, where={"topic": ["algebra"]}), seed=0)


def test_empty_sources(tmp_path):
    (tmp_path / "empty.jsonl").write_text("\n")
    (tmp_path / "header.csv").write_text("q,a,why\n")
    for name in ("empty.jsonl", "header.csv"):
        with pytest.raises(InputError, match=rf"^curate.sources.ext.path: .*{name} has no rows$"):
            load(file_source(tmp_path / name), seed=0)
    blank = write(tmp_path / "blank.jsonl", [{"q": " ", "a": 1, "why": None}, {"q": "x", "a": None, "why": None}])
    with pytest.raises(InputError, match=r"^curate.sources.ext.columns: no usable rows in .*\(2 read: 0 not matching where, 2 with an empty prompt or answer\)$"):
        load(file_source(blank), seed=0)
    with pytest.raises(InputError, match=r"^curate.sources.ext.where: no usable rows in .*\(3 read: 3 not matching where"):
        load(file_source(write(tmp_path / "d.jsonl", RECORDS), where={"level": [9]}), seed=0)


@pytest.mark.parametrize(
    "name, content, message",
    [
        ("bad.jsonl", '{"q": "x", "a": 1}\n{"q": oops}\n', r"cannot read .*bad.jsonl as jsonl: line 2: Expecting value"),
        ("list.jsonl", '{"q": "x", "a": 1}\n[1, 2]\n', r"cannot read .*list.jsonl as jsonl: line 2 is not a JSON object"),
        ("bad.parquet", "not parquet at all", r"cannot read .*bad.parquet as parquet: "),
        ("ragged.csv", "q,a\nx,1\ny,2,3\n", r"cannot read .*ragged.csv as csv: line 3 has more cells than the header"),
        ("latin1.csv", b"q,a\n\xe9t\xe9,1\n", r"cannot read .*latin1.csv as csv: 'utf-8' codec can't decode"),
    ],
)
def test_unreadable_files(tmp_path, name, content, message):
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(InputError, match=rf"^curate.sources.ext.path: {message}") as e:
        load(file_source(path, columns={"prompt": "q", "answer": "a"}), seed=0)
    assert "\n" not in str(e.value)


def test_nested_answer_is_an_input_error(tmp_path):
    path = write(tmp_path / "d.jsonl", [{"q": "Roots of x^2 = 1?", "a": [1, -1]}])
    with pytest.raises(InputError, match=r"^curate.sources.ext.columns.answer: row 1 holds a list, expected text or a number$"):
        load(file_source(path, columns={"prompt": "q", "answer": "a"}), seed=0)


def test_params_reject_unknown_keys_and_bad_values(tmp_path):
    with pytest.raises(ValidationError, match="colums"):
        FileSource(name="x", path="d.jsonl", colums={"prompt": "q"})
    with pytest.raises(ValidationError, match="format"):
        FileSource(name="x", path="d.jsonl", format="xlsx")
    with pytest.raises(ValidationError, match="size"):
        HFSource(name="x", dataset="org/data", size=0)
    with pytest.raises(ValidationError, match="columns.answr"):
        HFSource(name="x", dataset="org/data", columns={"answr": "a"})


# --- Hugging Face datasets (local directories: the hub goes through the same load_dataset call) --


@pytest.fixture
def hf_cache(tmp_path, monkeypatch) -> None:
    # load_dataset writes an Arrow cache; keep it out of the user's ~/.cache.
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf-cache"))


def hf_source(dataset: Path | str, **over) -> HFSource:
    return HFSource(**{"name": "hub", "dataset": str(dataset), "columns": COLUMNS, **over})


def test_hf_data_file_directory(tmp_path, hf_cache):
    (tmp_path / "ds").mkdir()
    write(tmp_path / "ds" / "train.jsonl", RECORDS)
    write(tmp_path / "ds" / "test.jsonl", RECORDS[:1])
    rows = load(hf_source(tmp_path / "ds"), seed=0).rows
    assert [(r["source"], r["answer"]) for r in rows] == [("hub", "42"), ("hub", "42"), ("hub", "1.5")]
    assert rows[0]["id"] == row_id("math", "What is 40 + 2?", "42")
    assert len(load(hf_source(tmp_path / "ds", split="test"), seed=0).rows) == 1
    with pytest.raises(InputError, match=r"^curate.sources.hub.split: Unknown split \"validation\""):
        load(hf_source(tmp_path / "ds", split="validation"), seed=0)
    with pytest.raises(InputError, match=r"^curate.sources.hub.config: BuilderConfig 'main' not found"):
        load(hf_source(tmp_path / "ds", config="main"), seed=0)
    with pytest.raises(InputError, match=r"^curate.sources.hub.revision: applies to hub datasets only"):
        load(hf_source(tmp_path / "ds", revision="v1"), seed=0)
    with pytest.raises(InputError, match=r"^curate.sources.hub.columns.answer: column 'ans' not in .*ds\[train\] \(has: q, a, why, level\)$"):
        load(hf_source(tmp_path / "ds", columns={"prompt": "q", "answer": "ans"}), seed=0)


def test_hf_saved_dataset_and_dataset_dict(tmp_path, hf_cache):
    ds = datasets.Dataset.from_list(RECORDS)
    ds.save_to_disk(str(tmp_path / "one"))
    datasets.DatasetDict(train=ds, test=ds.select([0])).save_to_disk(str(tmp_path / "dict"))
    assert [r["answer"] for r in load(hf_source(tmp_path / "one"), seed=0).rows] == ["42", "42", "1.5"]
    assert len(load(hf_source(tmp_path / "dict", split="test"), seed=0).rows) == 1
    with pytest.raises(InputError, match=re.escape("curate.sources.hub.split: split 'dev' not in") + r".*\(has: train, test\)$"):
        load(hf_source(tmp_path / "dict", split="dev"), seed=0)
    with pytest.raises(InputError, match=r"^curate.sources.hub.config: .* was written by save_to_disk and has no configs$"):
        load(hf_source(tmp_path / "one", config="main"), seed=0)


def test_hf_missing_directory(tmp_path, hf_cache):
    with pytest.raises(InputError, match=r"^curate.sources.hub.dataset: directory not found: .*nope$"):
        load(hf_source(tmp_path / "nope"), seed=0)


# --- mixing -------------------------------------------------------------------------------------


def _rows(label: str, n: int) -> list[dict]:
    return [dict(id=f"{label}{i}", source=label, prompt=f"{label} {i}") for i in range(n)]


def test_mix_follows_weights_and_caps_at_what_is_available():
    groups = {"a": _rows("a", 100), "b": _rows("b", 100), "c": _rows("c", 5)}
    out = mix(groups, {"a": 2, "b": 1, "c": 1}, total=40, seed=3)
    counts = {k: sum(r["source"] == k for r in out) for k in groups}
    assert counts == {"a": 20, "b": 10, "c": 5}  # c's share is 10, it has 5: not redistributed
    assert len({r["id"] for r in out}) == len(out)  # without replacement
    a_ids = [int(r["id"][1:]) for r in out if r["source"] == "a"]
    assert a_ids == sorted(a_ids)  # source order kept
    assert out == mix(groups, {"a": 2, "b": 1, "c": 1}, total=40, seed=3)
    assert out != mix(groups, {"a": 2, "b": 1, "c": 1}, total=40, seed=4)


def test_mix_rounds_shares_to_the_total():
    groups = {k: _rows(k, 10) for k in "abc"}
    assert len(mix(groups, {"a": 1, "b": 1, "c": 1}, total=10, seed=0)) == 10  # 3.33 each -> 4, 3, 3
    assert [r["source"] for r in mix(groups, {"a": 1, "b": 0, "c": 1}, total=4, seed=0)] == ["a", "a", "c", "c"]


@pytest.mark.parametrize(
    "weights, total, message",
    [
        ({"a": 1}, 5, r"curate.mix.weights: no weight for source 'b'"),
        ({"a": 1, "b": 1, "z": 1}, 5, r"curate.mix.weights: no source named 'z'"),
        ({"a": 1, "b": -1}, 5, r"curate.mix.weights.b: weight must be >= 0, got -1"),
        ({"a": 0, "b": 0}, 5, r"curate.mix.weights: weights sum to 0"),
        ({"a": 1, "b": 1}, 0, r"curate.mix.total: must be > 0, got 0"),
    ],
)
def test_mix_errors(weights, total, message):
    with pytest.raises(InputError, match=rf"^{message}$"):
        mix({"a": _rows("a", 3), "b": _rows("b", 3)}, weights, total, seed=0)
