"""Resume with num_iterations > 1: TRL optimises each generated batch num_iterations times, keeping it
between steps (its `_step` counter and buffered inputs); a checkpoint in the middle of that cycle
carries both, so a run killed there and resumed trains on what an unkilled run trains on."""

from __future__ import annotations

import pytest
import torch

from rung import models
from rung.train.checkpoints import generation_state
from tests.test_rl import _Crash, _stage, _train


@pytest.fixture(autouse=True)
def _mlflow_store(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")


def test_a_kill_in_the_middle_of_a_generation_cycle_resumes_exactly(tiny_model, tmp_path):
    # generations at steps 1, 3, 5, each batch trained on twice; checkpoint-3 holds step 3's batch, reused at step 4
    stage = _stage(
        num_iterations=2, max_steps=6, max_completion_length=4, rewards={"even": {"import": "tests.rows:even_tokens"}}
    )
    _, whole = _train(tiny_model, tmp_path / "whole", stage)
    with pytest.raises(KeyboardInterrupt):
        _train(tiny_model, tmp_path / "cut", stage, callbacks=[_Crash(3)])
    assert (tmp_path / "cut" / "checkpoint-3" / generation_state(0)).is_file()
    _, resumed = _train(tiny_model, tmp_path / "cut", stage, resume=str(tmp_path / "cut" / "checkpoint-3"))
    assert [c["step"] for c in whole] == [1, 3, 5]  # the steps that generated (and logged rewards)
    assert resumed == whole
    a, _ = models.load(tmp_path / "whole" / "final")
    b, _ = models.load(tmp_path / "cut" / "final")
    for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True):
        torch.testing.assert_close(x, y)
