"""Where each stage writes, relative to the DVC workspace; dvc.yaml lists the same paths."""

from __future__ import annotations

from pathlib import Path

PARAMS = Path("params.yaml")
MODELS = Path("data/models")
BASE = MODELS / "base"
SFT = MODELS / "sft"
CURATED = Path("data/curated")
TRAIN = CURATED / "train.jsonl"
TEST = CURATED / "test.jsonl"
EVAL_SETS = CURATED / "eval"  # extra eval sets: <name>.jsonl
DIFFICULTY = Path("data/difficulty")
SCORES = DIFFICULTY / "scores.jsonl"
FILTERED = DIFFICULTY / "train.jsonl"
TRACES = Path("data/sft/traces.jsonl")  # SFT targets
EVAL = Path("data/eval")
METRICS = Path("data/metrics")
REPORTS = Path("data/reports")
REPORT = REPORTS / "report.md"
HTML_REPORT = REPORTS / "report.html"
PLOTS = Path("data/plots")
WORK = Path("data/work")  # trainer scratch space (checkpoints in progress); not a DVC output
TIMINGS = Path("data/timings")  # each stage's wall time in the last run: records, not DVC outputs (rung.report.timings)


def learned_reward(section: str, name: str) -> Path:
    """Model directory of a learned reward: section 'reward_models' or 'process_reward_models', its name."""
    return MODELS / section / name


PRM_SETTINGS = "process_reward_model.json"
"""Beside a process reward model's weights: the splitter and answer format it was trained with, which scoring reuses."""


def learned_reward_data(section: str, name: str) -> Path:
    """What a learned reward trains and is held out on (pairs, graded samples, step labels): data/<section>/<name>."""
    return Path("data") / section / name


def checkpoint(name: str) -> Path:
    """Model directory of a checkpoint name: 'base', 'sft' or 'rl/<stage>'."""
    return MODELS / name


def checkpoint_slug(name: str) -> str:
    """'rl/main' -> 'rl-main': a flat name for files and metric keys."""
    return name.replace("/", "-")


def metrics(stage: str) -> Path:
    return METRICS / f"{stage}.json"


def eval_set(name: str) -> Path:
    """Rows of an eval set: 'test' is the held-out in-domain split."""
    return TEST if name == "test" else EVAL_SETS / f"{name}.jsonl"


def plot(kind: str, name: str) -> Path:
    """DVC plot data, e.g. plot('pass_at_k', 'sft') -> data/plots/pass_at_k/sft.json."""
    return PLOTS / kind / f"{name}.json"
