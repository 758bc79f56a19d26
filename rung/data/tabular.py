"""Tabular data sources (local files, Hugging Face datasets) loaded into the curated row schema.

A source names the columns holding the prompt, the reference answer and optionally a worked
solution (each stripped of surrounding whitespace); every other column goes into `meta` verbatim.
The answer is the answer cell itself, or read out of it (`answer_from` boxed / gsm8k, or a regex
`answer_pattern`) the way the field's benchmarks state it.
Loading is deterministic: rows come in file (or dataset) order, and a size cap takes a seeded
sample. Bad input raises InputError with one line naming `curate.sources.<name>.<field>`.
"""

from __future__ import annotations

import csv
import json
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
from datasets.exceptions import DatasetNotFoundError, DatasetsError

from rung import files
from rung.answers.latex import last_boxed
from rung.answers.rows import Row
from rung.answers.verify import is_known_task
from rung.config import FileSource, HFSource, _TabularSource
from rung.data.rows import plain_json, row_id
from rung.errors import InputError
from rung.seeding import derive

_SUFFIXES = {".jsonl": "jsonl", ".ndjson": "jsonl", ".parquet": "parquet", ".pq": "parquet", ".csv": "csv"}
# An answer extraction that yields nothing on this many leading rows is a misconfiguration, not data.
_PROBE = 20
_GSM8K_ANSWER = re.compile(r"^####(.*)$", re.MULTILINE)
_GSM8K_CALCULATOR = re.compile(r"<<[^<>]*>>")  # GSM8K's calculator annotations: "$48/2 = <<48/2=24>>24"


@dataclass(frozen=True)
class Loaded:
    """Rows of one source and what happened to the rest: `stats` has read, dropped_empty
    (null or blank prompt or answer), dropped_where, dropped_no_answer (answer_from / answer_pattern
    found no answer in the cell), dropped_size and rows."""

    rows: list[Row]
    stats: dict[str, int]


def load(source: FileSource | HFSource, seed: int) -> Loaded:
    """Read a source into schema rows; `seed` (the global seed) fixes the size-cap sample."""
    if not is_known_task(source.task):
        raise InputError(
            f"{_key(source, 'task')}: unknown task {source.task!r}: use 'math' or a reasoning-gym task name"
        )
    if isinstance(source, FileSource):
        records, columns, origin = _read_file(source)
    elif isinstance(source, HFSource):
        records, columns, origin = _read_hf(source)
    else:
        raise TypeError(f"not a tabular source: {type(source).__name__}")
    return _to_rows(source, records, columns, origin, seed)


# --- reading ----------------------------------------------------------------------------------


def _key(src: _TabularSource, field: str) -> str:
    return f"curate.sources.{src.name}.{field}"


def _read_file(src: FileSource) -> tuple[list[dict[str, Any]], list[str], str]:
    """(records, column names, origin) of a file.

    Not through pandas or `datasets`: their type inference turns an integer answer column with
    an empty cell into floats (CSV "42" becomes "42.0"; pandas does it to JSON Lines too). Here
    JSON Lines keeps JSON's types, CSV cells stay the file's text, Parquet keeps its schema.
    """
    path = Path(src.path)
    if not path.is_file():
        raise InputError(f"{_key(src, 'path')}: file not found: {path}")
    fmt = src.format or _SUFFIXES.get(path.suffix.lower())
    if fmt is None:
        raise InputError(
            f"{_key(src, 'format')}: cannot infer the format of {path} from its suffix; set jsonl, parquet or csv"
        )
    try:
        if fmt == "parquet":
            table = pq.read_table(path)
            return table.to_pylist(), table.column_names, str(path)
        with path.open(encoding="utf-8", newline="") as f:
            records = _jsonl_records(f, src, path) if fmt == "jsonl" else _csv_records(f, src, path)
    except (UnicodeDecodeError, csv.Error, pa.ArrowException, OSError) as e:
        raise InputError(f"{_key(src, 'path')}: cannot read {path} as {fmt}: {_first_line(e)}") from None
    return records, list(dict.fromkeys(k for r in records for k in r)), str(path)


def _jsonl_records(lines: Any, src: FileSource, path: Path) -> list[dict[str, Any]]:
    records = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise InputError(f"{_key(src, 'path')}: cannot read {path} as jsonl: line {n}: {e.msg}") from None
        if not isinstance(obj, dict):
            raise InputError(f"{_key(src, 'path')}: cannot read {path} as jsonl: line {n} is not a JSON object")
        records.append(obj)
    return records


def _csv_records(lines: Any, src: FileSource, path: Path) -> list[dict[str, Any]]:
    reader = csv.DictReader(lines, strict=True)
    records = []
    for rec in reader:
        # DictReader files surplus cells under the key None instead of failing.
        if None in rec:
            raise InputError(
                f"{_key(src, 'path')}: cannot read {path} as csv: line {reader.line_num} has more cells than the header"
            )
        records.append(rec)
    return records


def _read_hf(src: HFSource) -> tuple[list[dict[str, Any]], list[str], str]:
    local = Path(src.dataset).expanduser()
    is_local = files.is_local_path(src.dataset)
    if is_local and not local.is_dir():
        raise InputError(f"{_key(src, 'dataset')}: directory not found: {src.dataset}")
    if is_local and src.revision is not None:
        raise InputError(f"{_key(src, 'revision')}: applies to hub datasets only; {src.dataset} is a local directory")
    origin = f"{src.dataset}[{src.split}]"
    if is_local and ((local / "state.json").is_file() or (local / "dataset_dict.json").is_file()):
        ds = _from_disk(src, local)
    else:
        try:
            ds = datasets.load_dataset(src.dataset, src.config, split=src.split, revision=src.revision)
        except (DatasetNotFoundError, FileNotFoundError) as e:
            raise InputError(f"{_key(src, 'dataset')}: {_first_line(e)}") from None
        except ValueError as e:
            # datasets reports a bad split or config as a ValueError; its message says which.
            msg = _first_line(e)
            field = "split" if "split" in msg.lower() else "config" if "config" in msg.lower() else "dataset"
            raise InputError(f"{_key(src, field)}: {msg}") from None
        except DatasetsError as e:
            raise InputError(f"{_key(src, 'dataset')}: cannot read {src.dataset}: {_first_line(e)}") from None
        # ConnectionError (no network) propagates on purpose: it is transient, not the user's input,
        # so the pipeline's retries apply to it.
    return ds.to_list(), list(ds.column_names), origin


def _from_disk(src: HFSource, path: Path) -> datasets.Dataset:
    if src.config is not None:
        raise InputError(f"{_key(src, 'config')}: {src.dataset} was written by save_to_disk and has no configs")
    ds = datasets.load_from_disk(str(path))
    if isinstance(ds, datasets.DatasetDict):
        if src.split not in ds:
            raise InputError(f"{_key(src, 'split')}: split {src.split!r} not in {src.dataset} (has: {', '.join(ds)})")
        return ds[src.split]
    return ds  # a saved single Dataset is one split already: `split` does not apply


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


# --- conversion -------------------------------------------------------------------------------


def _text(value: Any, src: _TabularSource, field: str, n: int) -> str | None:
    """A cell as stripped text (integral floats as integers); None for null or blank."""
    if value is None:
        return None
    if isinstance(value, (list, dict)):
        raise InputError(f"{_key(src, field)}: row {n} holds a {type(value).__name__}, expected text or a number")
    if isinstance(value, float) and value.is_integer():
        # A numeric column with one fraction is a float column throughout (Arrow, Parquet):
        # its 42 must still read "42", not "42.0".
        value = int(value)
    return str(value).strip() or None


def _extract(src: _TabularSource, cell: str) -> tuple[str | None, str | None]:
    """(answer, worked solution) read from an answer cell; (None, None) when it holds no answer."""
    if src.answer_pattern is not None:
        matches = list(re.finditer(src.answer_pattern, cell))  # `re` caches the compiled pattern
        return ((matches[-1].group(1) or "").strip() or None) if matches else None, None
    if src.answer_from == "boxed":
        return last_boxed(cell) or None, None
    if src.answer_from == "gsm8k":
        lines = list(_GSM8K_ANSWER.finditer(cell))
        if not lines:
            return None, None
        # lm-eval's gsm8k target: thousands separators, '$' and a final period are not the answer.
        answer = lines[-1].group(1).replace(",", "").replace("$", "").strip().rstrip(".").strip()
        worked = _GSM8K_CALCULATOR.sub("", cell[: lines[-1].start()]).strip()
        return answer or None, worked or None
    return cell, None


def _no_answer(src: _TabularSource, probed: int, origin: str, example: str) -> InputError:
    where = f"the first {probed} rows of {origin} (column {src.columns.answer!r}, e.g. {example[:80]!r})"
    if src.answer_pattern is not None:
        return InputError(f"{_key(src, 'answer_pattern')}: matches none of {where}")
    mark = "a \\boxed{}" if src.answer_from == "boxed" else "a '#### <answer>' line"
    return InputError(f"{_key(src, 'answer_from')}: {src.answer_from}, but none of {where} has {mark}")


def _to_rows(
    src: FileSource | HFSource, records: list[dict[str, Any]], columns: list[str], origin: str, seed: int
) -> Loaded:
    if not records:
        raise InputError(f"{_key(src, 'path' if isinstance(src, FileSource) else 'dataset')}: {origin} has no rows")
    mapped = {"prompt": src.columns.prompt, "answer": src.columns.answer, "solution": src.columns.solution}
    wanted = [(f"columns.{k}", c) for k, c in mapped.items() if c is not None] + [(f"where.{c}", c) for c in src.where]
    for field, col in wanted:
        if col not in columns:
            raise InputError(f"{_key(src, field)}: column {col!r} not in {origin} (has: {', '.join(columns)})")
    allowed = {c: {_text(v, src, f"where.{c}", 0) for v in vs} for c, vs in src.where.items()}
    rows: list[Row] = []
    probed: list[tuple[bool, str]] = []  # (answer found, the answer cell) of the first _PROBE usable records
    empty, unmatched, no_answer = 0, 0, 0
    for n, rec in enumerate(records, 1):
        if any(_text(rec.get(c), src, f"where.{c}", n) not in vs for c, vs in allowed.items()):
            unmatched += 1
            continue
        prompt = _text(rec.get(src.columns.prompt), src, "columns.prompt", n)
        cell = _text(rec.get(src.columns.answer), src, "columns.answer", n)
        if prompt is None or cell is None:
            empty += 1
            continue
        answer, worked = _extract(src, cell)
        if len(probed) < _PROBE:
            probed.append((answer is not None, cell))
        if answer is None:
            no_answer += 1
            continue
        solution = _text(rec.get(mapped["solution"]), src, "columns.solution", n) if mapped["solution"] else worked
        meta = {k: v for k, v in rec.items() if k not in mapped.values()}
        rows.append(
            Row(
                id=row_id(src.task, prompt, answer),
                source=src.name,
                task=src.task,
                prompt=prompt,
                answer=answer,
                solution=solution,
                meta=plain_json(meta),
            )
        )
    if probed and not any(ok for ok, _ in probed):
        raise _no_answer(src, len(probed), origin, probed[0][1])
    if not rows:
        why = f"{unmatched} not matching where, {empty} with an empty prompt or answer"
        raise InputError(
            f"{_key(src, 'where' if unmatched == len(records) else 'columns')}: "
            f"no usable rows in {origin} ({len(records)} read: {why})"
        )
    usable = len(rows)
    if src.size is not None and src.size < usable:
        rng = random.Random(derive(seed, "curate", src.name))
        rows = [rows[i] for i in sorted(rng.sample(range(usable), src.size))]
    stats = dict(
        read=len(records),
        dropped_empty=empty,
        dropped_where=unmatched,
        dropped_no_answer=no_answer,
        dropped_size=usable - len(rows),
        rows=len(rows),
    )
    return Loaded(rows, stats)


# --- mixing -----------------------------------------------------------------------------------


def mix(groups: dict[str, list[Row]], weights: dict[str, float], total: int, seed: int) -> list[Row]:
    """Up to `total` rows drawn from the groups (source label -> rows) in proportion to `weights`.

    Each group's share of `total` is rounded by largest remainder (ties: group order), so shares
    sum to `total`; a group with fewer rows than its share gives all it has and the shortfall is
    not redistributed, which keeps the other groups' shares as weighted. Within a group rows are a
    seeded sample without replacement, kept in their order; groups are concatenated in order.
    """
    key = "curate.mix.weights"
    if set(weights) != set(groups):
        missing, unknown = sorted(set(groups) - set(weights)), sorted(set(weights) - set(groups))
        raise InputError(
            f"{key}: "
            + "; ".join([f"no weight for source {n!r}" for n in missing] + [f"no source named {n!r}" for n in unknown])
        )
    if bad := [n for n in groups if weights[n] < 0]:
        raise InputError(f"{key}.{bad[0]}: weight must be >= 0, got {weights[bad[0]]}")
    if (weight_sum := sum(weights.values())) <= 0:
        raise InputError(f"{key}: weights sum to 0")
    if total <= 0:
        raise InputError(f"curate.mix.total: must be > 0, got {total}")
    order = list(groups)
    exact = {n: total * weights[n] / weight_sum for n in order}
    share = {n: int(exact[n]) for n in order}
    by_remainder = sorted(order, key=lambda n: (share[n] - exact[n], order.index(n)))
    for n in by_remainder[: total - sum(share.values())]:
        share[n] += 1
    out: list[Row] = []
    for n in order:
        rows = groups[n]
        rng = random.Random(derive(seed, "mix", n))
        out += [rows[i] for i in sorted(rng.sample(range(len(rows)), min(share[n], len(rows))))]
    return out
