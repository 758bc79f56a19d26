"""Training learns in every compute dtype: SFT and RL on the tiny model with `dtype: bfloat16` forced
on the CPU move the weights as the float32 run does, and their loss curves agree with it.

With bf16 weights (rung before issue 36: `model.dtype: auto` loaded them so on every GPU) AdamW's
update of ~lr rounds back to the old weight wherever the weight is larger than lr / 2^-8, and only
the smallest weights move: at these settings, 8-15% of them against 100% in fp32. Each stage
run logs the update size per step and the movement since init, which these tests read back from
its MLflow run."""

from __future__ import annotations

import mlflow
import pytest

from rung import files
from rung.config import DifficultyParams, FormatParams, SFTParams, SolutionTraces
from rung.data import traces
from rung.report import health
from rung.rl import trainers
from rung.train import sft
from rung.train.jobs import RLJob, SFTJob
from tests.rows import sums
from tests.test_rl import _stage
from tests.tiny_model import job

ROWS = sums(16, lambda i: i % 7, solutions=True, graded=True)
# Stated tolerances of a bf16-compute run against the fp32 one (same seed, same data):
SHARE_RATIO = 0.95  # its share of changed weights is at least 95% of fp32's
RELATIVE_CHANGE = (0.8, 1.25)  # ‖w - w_init‖/‖w_init‖ within this factor of fp32's
LOSS_ATOL = 0.05  # each logged loss within this of fp32's (bf16 logits differ by ~1e-2)


@pytest.fixture(autouse=True)
def _mlflow_store(tmp_path, monkeypatch):
    # an earlier test's set_tracking_uri or active experiment would otherwise keep this test's runs on its store
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    mlflow.set_tracking_uri(uri)
    mlflow.set_experiment("learning")


def _history(run_id: str, key: str) -> list[float]:
    return [m.value for m in sorted(mlflow.MlflowClient().get_metric_history(run_id, key), key=lambda m: m.step)]


def _run(train, training_job) -> tuple[dict[str, float], dict[str, list[float]]]:
    """(summary metrics, per-step loss and update figures from the run's MLflow store)."""
    with mlflow.start_run() as run:  # the trainer's logs go to the active run (rung.train.run_log)
        metrics = train(training_job).metrics
    keys = ("loss", "update/relative", "update/changed_share")
    return metrics, {k: _history(run.info.run_id, k) for k in keys}


def _assert_learns_like_fp32(fp32, bf16, loss_atol: float | None = LOSS_ATOL) -> None:
    (m32, h32), (m16, h16) = fp32, bf16
    assert m32["weights_changed_share"] > 0.99  # fp32: nearly every weight moved
    assert m16["weights_changed_share"] >= SHARE_RATIO * m32["weights_changed_share"], (m16, m32)
    low, high = RELATIVE_CHANGE
    assert low <= m16["weights_relative_change"] / m32["weights_relative_change"] <= high, (m16, m32)
    # every step logged its update size, and bf16 compute moved the sampled weights as fp32 did
    assert len(h16["update/relative"]) == len(h32["update/relative"]) == len(h32["loss"]) > 0
    assert all(x > 0 for x in h16["update/relative"])
    assert min(h16["update/changed_share"]) >= SHARE_RATIO * min(h32["update/changed_share"])
    if loss_atol is not None:
        assert h16["loss"] == pytest.approx(h32["loss"], abs=loss_atol)
    assert not health.warnings("sft", m16) and not health.warnings("rl-main", m16)


def test_sft_in_bf16_compute_learns_like_fp32(tiny_model, tmp_path):
    data = tmp_path / "traces.jsonl"
    files.write_jsonl(data, traces.from_solutions(ROWS, SolutionTraces(), FormatParams()))
    params = SFTParams(max_steps=6, per_device_train_batch_size=4, learning_rate=3e-5, warmup_ratio=0.0, save_steps=100)

    def one(dtype: str):
        j = job(SFTJob, tiny_model, data, tmp_path / dtype, key="sft", params=params, seed=0, device="cpu")
        return _run(sft.train, j.model_copy(update={"dtype": dtype}))

    fp32, bf16 = one("float32"), one("bfloat16")
    _assert_learns_like_fp32(fp32, bf16)
    assert fp32[1]["loss"][-1] < fp32[1]["loss"][0]  # and it learned: the loss fell


def test_rl_in_bf16_compute_learns_like_fp32(tiny_model, tmp_path):
    data = tmp_path / "rows.jsonl"
    files.write_jsonl(data, ROWS)
    stage = _stage(
        max_steps=4,
        num_generations=4,
        learning_rate=3e-5,
        save_steps=100,
        rewards={"even": {"import": "tests.rows:even_tokens"}},
    )

    def one(dtype: str):
        j = job(
            RLJob,
            tiny_model,
            data,
            tmp_path / dtype,
            key="rl.stages.main",
            params=stage,
            seed=0,
            device="cpu",
            buckets=DifficultyParams().buckets,
            curves=tmp_path / f"{dtype}.json",
        )
        return _run(trainers.train, j.model_copy(update={"dtype": dtype}))

    # bf16 rollouts sample other tokens than fp32's, so the policy-gradient losses are not compared
    # step by step; the movement of the weights is
    _assert_learns_like_fp32(one("float32"), one("bfloat16"), loss_atol=None)


def test_health_warns_when_a_stage_barely_moved():
    frozen = {"weights_changed_share": 0.06, "weights_changed_share_touched": 0.06, "weights_relative_change": 1e-4}
    (line,) = health.warnings("sft", frozen)
    assert line.startswith("sft: only 6.0% of the weights") and "1.0e-04" in line
    assert health.warnings("rl-main", {**frozen, "weights_changed_share": 0.0})[0].startswith("rl-main: no weight")
    lora = {"weights_changed_share": 0.1, "weights_changed_share_touched": 0.998, "weights_relative_change": 0.01}
    assert health.warnings("sft", lora) == []
