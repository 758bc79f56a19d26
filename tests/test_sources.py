from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import datasets
import huggingface_hub
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pydantic import ValidationError

from rung.config import BenchmarkSource
from rung.data.rows import row_id
from rung.data.tabular import FileSource, HFSource, load, mix
from rung.errors import InputError
from tests.rows import generator

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
        id=row_id("math", "What is 40 + 2?", "42"),
        source="ext",
        task="math",
        prompt="What is 40 + 2?",
        answer="42",
        solution="40 + 2 = 42",
        meta={"level": "1" if suffix == ".csv" else 1},  # CSV cells are text
    )
    assert loaded.stats == dict(read=3, dropped_empty=0, dropped_where=0, dropped_no_answer=0, dropped_size=0, rows=3)


def test_explicit_format_overrides_the_suffix(tmp_path):
    path = write(tmp_path / "d.jsonl", RECORDS).rename(tmp_path / "d.txt")
    assert len(load(file_source(path, format="jsonl"), seed=0).rows) == 3
    with pytest.raises(
        InputError, match=r"^curate.sources.ext.format: cannot infer the format of .*d.txt from its suffix"
    ):
        load(file_source(path), seed=0)


def test_task_and_default_columns(tmp_path):
    path = write(tmp_path / "d.jsonl", [{"prompt": "Calculate 5 - 3.", "answer": 2}])
    [row] = load(FileSource(name="arith", path=str(path), task="basic_arithmetic"), seed=0).rows
    assert (row["task"], row["answer"], row["solution"], row["meta"]) == ("basic_arithmetic", "2", None, {})
    assert row["id"] == row_id("basic_arithmetic", "Calculate 5 - 3.", "2")


def test_unknown_task(tmp_path):
    with pytest.raises(
        InputError, match=r"^curate.sources.ext.task: unknown task 'algebra': use 'math' or a reasoning-gym task name$"
    ):
        load(file_source(write(tmp_path / "d.jsonl", RECORDS), task="algebra"), seed=0)


def test_empty_prompts_and_answers_are_dropped_and_counted(tmp_path):
    records = [
        *RECORDS,
        {"q": "", "a": 1},
        {"q": "  ", "a": 1},
        {"q": "ok?", "a": None},
        {"q": "ok?", "a": " "},
        {"a": 3},
    ]
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
    assert first.stats == dict(read=50, dropped_empty=0, dropped_where=0, dropped_no_answer=0, dropped_size=40, rows=10)
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
    with pytest.raises(
        InputError,
        match=r"^curate.sources.ext.columns: no usable rows in .*"
        r"\(2 read: 0 not matching where, 2 with an empty prompt or answer\)$",
    ):
        load(file_source(blank), seed=0)
    with pytest.raises(
        InputError, match=r"^curate.sources.ext.where: no usable rows in .*\(3 read: 3 not matching where"
    ):
        load(file_source(write(tmp_path / "d.jsonl", RECORDS), where={"level": [9]}), seed=0)


@pytest.mark.parametrize(
    "name, content, message",
    [
        (
            "bad.jsonl",
            '{"q": "x", "a": 1}\n{"q": oops}\n',
            r"cannot read .*bad.jsonl as jsonl: line 2: Expecting value",
        ),
        (
            "list.jsonl",
            '{"q": "x", "a": 1}\n[1, 2]\n',
            r"cannot read .*list.jsonl as jsonl: line 2 is not a JSON object",
        ),
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
    with pytest.raises(
        InputError, match=r"^curate.sources.ext.columns.answer: row 1 holds a list, expected text or a number$"
    ):
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
    with pytest.raises(
        InputError,
        match=r"^curate.sources.hub.columns.answer: column 'ans' not in .*ds\[train\] \(has: q, a, why, level\)$",
    ):
        load(hf_source(tmp_path / "ds", columns={"prompt": "q", "answer": "ans"}), seed=0)


def test_hf_saved_dataset_and_dataset_dict(tmp_path, hf_cache):
    ds = datasets.Dataset.from_list(RECORDS)
    ds.save_to_disk(str(tmp_path / "one"))
    datasets.DatasetDict(train=ds, test=ds.select([0])).save_to_disk(str(tmp_path / "dict"))
    assert [r["answer"] for r in load(hf_source(tmp_path / "one"), seed=0).rows] == ["42", "42", "1.5"]
    assert len(load(hf_source(tmp_path / "dict", split="test"), seed=0).rows) == 1
    with pytest.raises(
        InputError, match=re.escape("curate.sources.hub.split: split 'dev' not in") + r".*\(has: train, test\)$"
    ):
        load(hf_source(tmp_path / "dict", split="dev"), seed=0)
    with pytest.raises(
        InputError, match=r"^curate.sources.hub.config: .* was written by save_to_disk and has no configs$"
    ):
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


# --- answers read out of a column: answer_from boxed / gsm8k, answer_pattern ----------------------

FIXTURES = Path(__file__).parent / "fixtures" / "benchmarks"
MATH500 = FIXTURES / "math500" / "test.jsonl"


def test_boxed_reads_the_last_box_of_the_answer_column():
    # MATH style: the answer is the last \boxed{} of the worked solution, nested braces kept.
    src = FileSource(
        name="math",
        path=str(MATH500),
        answer_from="boxed",
        columns={"prompt": "problem", "answer": "solution", "solution": "solution"},
    )
    loaded = load(src, seed=0)
    assert [r["answer"] for r in loaded.rows] == ["\\frac{14}{3}", "\\sqrt{2}", "6", "[-3, 7]", "10"]
    assert loaded.rows[0]["solution"].endswith("$\\boxed{\\frac{14}{3}}$.")  # the column is also the solution
    assert loaded.rows[0]["meta"]["answer"] == "\\frac{14}{3}"  # the unmapped answer column stays in meta
    assert loaded.stats["dropped_no_answer"] == 1 and loaded.stats["rows"] == 5  # the proof has no box


def test_gsm8k_answer_line_and_worked_solution(tmp_path):
    cell = "He buys 3 * 400 = <<3*400=1200>>1,200 pencils.\nThen 1,200 + 34 = <<1200+34=1234>>1,234.\n#### $1,234."
    path = write(
        tmp_path / "g.jsonl", [{"question": "How many?", "answer": cell}, {"question": "No line?", "answer": "42"}]
    )
    loaded = load(FileSource(name="g", path=str(path), answer_from="gsm8k", columns={"prompt": "question"}), seed=0)
    [row] = loaded.rows
    assert row["answer"] == "1234"  # commas, '$' and the final period removed, as lm-eval does
    assert row["solution"] == "He buys 3 * 400 = 1,200 pencils.\nThen 1,200 + 34 = 1,234."  # no calculator annotations
    assert loaded.stats["dropped_no_answer"] == 1
    own = load(
        FileSource(
            name="g", path=str(path), answer_from="gsm8k", columns={"prompt": "question", "solution": "question"}
        ),
        seed=0,
    )
    assert own.rows[0]["solution"] == "How many?"  # a mapped solution column wins over the worked part


def test_answer_pattern_takes_the_group_of_the_last_match(tmp_path):
    records = [
        {"q": "a?", "a": "Answer: 3. Check: fine. Answer: 4"},
        {"q": "b?", "a": "answer: 7"},
        {"q": "c?", "a": "no idea"},
    ]
    loaded = load(
        file_source(
            write(tmp_path / "d.jsonl", records),
            columns={"prompt": "q", "answer": "a"},
            answer_pattern=r"(?i)answer:\s*(\S+)",
        ),
        seed=0,
    )
    assert [r["answer"] for r in loaded.rows] == ["4", "7"] and loaded.stats["dropped_no_answer"] == 1


def test_an_extraction_that_finds_nothing_in_the_first_rows_is_refused(tmp_path):
    columns = {"prompt": "problem", "answer": "answer"}
    with pytest.raises(
        InputError,
        match=r"^curate.sources.m.answer_from: gsm8k, but none of the first 6 rows of .*test.jsonl "
        r"\(column 'answer', e.g. '\\\\frac\{14\}\{3\}'\) has a '#### <answer>' line$",
    ):
        load(FileSource(name="m", path=str(MATH500), answer_from="gsm8k", columns=columns), seed=0)
    with pytest.raises(
        InputError, match=r"^curate.sources.m.answer_from: boxed, but none of the first 6 rows .* has a \\boxed\{\}$"
    ):
        load(FileSource(name="m", path=str(MATH500), answer_from="boxed", columns=columns), seed=0)
    many = write(tmp_path / "d.jsonl", [{"q": f"{i}?", "a": "none here"} for i in range(30)] + [{"q": "x?", "a": "#5"}])
    with pytest.raises(InputError, match=r"^curate.sources.ext.answer_pattern: matches none of the first 20 rows of"):
        load(file_source(many, columns={"prompt": "q", "answer": "a"}, answer_pattern=r"#(\d+)"), seed=0)


@pytest.mark.parametrize(
    "over, message",
    [
        ({"answer_pattern": r"(\d+"}, r"answer_pattern: does not compile: missing \), unterminated subpattern"),
        ({"answer_pattern": r"\d+"}, r"answer_pattern: needs exactly one capturing group \(\.\.\.\), has 0"),
        (
            {"answer_pattern": r"(\d+)", "answer_from": "boxed"},
            r"answer_pattern: set answer_pattern or answer_from: boxed, not both",
        ),
        ({"answer_from": "last_line"}, r"answer_from"),
    ],
)
def test_answer_settings_are_checked_with_the_params(over, message):
    with pytest.raises(ValidationError, match=message):
        FileSource(name="x", path="d.jsonl", **over)


# --- benchmarks by name: the hub's id, split and columns; a local copy in the same layout -----------


@pytest.fixture
def offline(hf_cache, monkeypatch) -> None:
    # Any hub access would fail instead of reaching the network.
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


def test_a_benchmark_name_fills_in_the_hub_dataset():
    src = BenchmarkSource(name="gsm8k")
    assert (src.dataset, src.config, src.split, src.answer_from, src.columns.prompt) == (
        "openai/gsm8k",
        "main",
        "test",
        "gsm8k",
        "question",
    )
    assert isinstance(src, HFSource) and src.task == "math"
    mine = BenchmarkSource(
        name="math500_l5", benchmark="math500", revision="abc123", columns={"solution": None}, where={"level": [5]}
    )
    assert (mine.dataset, mine.split, mine.revision, mine.columns.prompt, mine.columns.solution) == (
        "HuggingFaceH4/MATH-500",
        "test",
        "abc123",
        "problem",
        None,
    )
    with pytest.raises(
        ValidationError, match=r"benchmark: unknown benchmark 'math5000'; known: math500, gsm8k, aime24, amc"
    ):
        BenchmarkSource(name="math5000")


@pytest.mark.parametrize(
    "name, answers, with_solution",
    [
        (
            "math500",
            ["\\frac{14}{3}", "\\sqrt{2}", "6", "[-3,7]", "Proof omitted.", "10"],
            True,
        ),  # the answer column as it is
        ("gsm8k", ["36", "1200", "8.5", "180", "8"], True),  # '####' line, worked part as the solution
        ("aime24", ["24", "9", "23"], True),
        ("amc", ["55", "18", "10"], False),  # float column: 55.0 reads "55"
    ],
)
def test_each_benchmark_loads_from_a_copy_in_its_hub_layout(offline, name, answers, with_solution):
    # The fixtures have each benchmark's columns and folder layout (README configs, data/ or main/),
    # read by the same load_dataset call as the hub.
    loaded = load(BenchmarkSource(name=name, dataset=str(FIXTURES / name)), seed=0)
    assert [r["answer"] for r in loaded.rows] == answers
    assert all((r["solution"] is not None) == with_solution for r in loaded.rows)
    assert all(r["source"] == name and r["task"] == "math" and r["prompt"] for r in loaded.rows)


def test_benchmark_overrides_apply_to_the_local_copy(offline):
    train = load(
        BenchmarkSource(name="gsm8k_train", benchmark="gsm8k", dataset=str(FIXTURES / "gsm8k"), split="train"), seed=0
    )
    assert [r["answer"] for r in train.rows] == ["24", "800"]
    level = load(
        BenchmarkSource(name="m", benchmark="math500", dataset=str(FIXTURES / "math500"), where={"level": [2]}), seed=0
    )
    assert [r["meta"]["subject"] for r in level.rows] == ["Algebra", "Number Theory", "Counting & Probability"]
    with pytest.raises(InputError, match=r"^curate.sources.g.config: BuilderConfig 'socratic' not found"):
        load(BenchmarkSource(name="g", benchmark="gsm8k", dataset=str(FIXTURES / "gsm8k"), config="socratic"), seed=0)


def test_curate_writes_benchmark_eval_sets_and_counts_skipped_golds(offline, tmp_path, monkeypatch):
    # End to end through the curate stage's core: params -> data/curated/eval/<name>.jsonl and the
    # counts of data/metrics/curate.json. A gold math-verify cannot parse is skipped and counted.
    from rung import files
    from rung.config import CurateParams, EvalParams
    from rung.data.curate import run

    monkeypatch.chdir(tmp_path)
    curate = CurateParams(
        sources=[
            generator("arith", "basic_arithmetic", 60, (2, 2), 2),
            dict(type="file", name="math", path=str(MATH500), columns={"prompt": "problem", "answer": "answer"}),
        ],
        test_fraction=0.25,
    )
    evals = EvalParams(sets=[dict(type="benchmark", name=n, dataset=str(FIXTURES / n)) for n in ("math500", "gsm8k")])
    stats = run(curate, evals, seed=0)
    assert (
        stats["sources"]["math"]["dropped_unverifiable"] == 1 and stats["sources"]["arith"]["dropped_unverifiable"] == 0
    )
    math500 = stats["eval_sets"]["math500"]
    assert math500.pop("read") == 6 and math500.pop("rows") == 5 and math500.pop("dropped_unverifiable") == 1
    assert set(math500.values()) == {0}  # every other drop counter: empty, where, no answer, size, duplicate
    assert stats["eval_sets"]["gsm8k"]["rows"] == 5 and stats["eval_sets"]["gsm8k"]["dropped_unverifiable"] == 0
    written = {p.stem: files.read_jsonl(p) for p in (tmp_path / "data" / "curated" / "eval").glob("*.jsonl")}
    assert {n: sorted(r["answer"] for r in rows) for n, rows in written.items()} == {
        "math500": sorted(["\\frac{14}{3}", "\\sqrt{2}", "6", "[-3,7]", "10"]),
        "gsm8k": sorted(["36", "1200", "8.5", "180", "8"]),
    }
    train = files.read_jsonl(tmp_path / "data" / "curated" / "train.jsonl")
    assert not {r["prompt"] for r in train} & {
        r["prompt"] for r in written["math500"]
    }  # decontaminated against the eval sets
    # The eval stage grades these rows as any other: the model's "1,200" is GSM8K's "1200".
    from rung.config import FormatParams
    from rung.eval.evaluate import grade
    from rung.generate.completion import Completion

    by_answer = {r["answer"]: r for rows in written.values() for r in rows}
    rows = [by_answer["1200"], by_answer["\\frac{14}{3}"], by_answer["180"]]
    said = [[Completion(f"Steps.\nAnswer: {a}", tokens=5, truncated=False)] for a in ("1,200", "14/3", "18")]
    assert [r["samples"][0]["correct"] for r in grade(rows, said, FormatParams())] == [True, True, False]
