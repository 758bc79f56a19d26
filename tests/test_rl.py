"""RL stages on the tiny model: TRL's trainers with rung's curriculum and dynamic sampling hooks,
checkpoints carrying the curriculum state, and an exact resume."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, TrainerCallback
from trl import GRPOTrainer

from rung import files, models
from rung.answers import formats
from rung.config import DifficultyParams, FormatParams, LaunchParams, RLStageParams, SamplingParams
from rung.eval.evaluate import grade
from rung.generate.api import generate
from rung.generate.completion import render
from rung.generate.decode import shared_prefix
from rung.rl import logprobs, trainers
from rung.train import launch, movement
from rung.train.checkpoints import CURRICULUM_STATE, FINAL
from rung.train.jobs import RLJob
from tests.rows import sums
from tests.tiny_model import job

FMT = FormatParams()
BUCKETS = DifficultyParams().buckets


def parity(completion_ids, **_):
    """A cheap reward; constant where every completion runs to max_completion_length (a random model's do)."""
    return [float(len(ids) % 2) for ids in completion_ids]


def constant(completions, **_):
    return [1.0] * len(completions)


ROWS = sums(12, lambda i: i % 3, graded=True)


@pytest.fixture(autouse=True)
def _mlflow_store(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")


ONE_STEP = dict(max_steps=1, num_generations=4, prompts_per_step=4, max_completion_length=4)
"""One step of 4 groups of 4 short completions: for tests that look at a single generated batch."""


def _stage(**kw) -> RLStageParams:
    base = dict(
        max_steps=3,
        num_generations=2,
        prompts_per_step=2,
        max_completion_length=8,
        learning_rate=1e-3,
        save_steps=1,
        rewards={"parity": {"import": "tests.test_rl:parity"}},
    )
    return RLStageParams.model_validate({**base, **kw})


def _job(tiny_model: Path, work: Path, stage: RLStageParams, resume: str | None = None) -> RLJob:
    data = work.parent / "rows.jsonl"
    files.write_jsonl(data, ROWS)
    curves = work.parent / f"{work.name}.curves.json"
    return job(
        RLJob,
        tiny_model,
        data,
        work,
        key="rl.stages.main",
        params=stage,
        seed=7,
        resume=resume,
        buckets=BUCKETS,
        curves=curves,
    )


def _train(tiny_model: Path, work: Path, stage: RLStageParams, resume: str | None = None, callbacks=()):
    """(summary metrics, per-step curves) of an in-process run."""
    job = _job(tiny_model, work, stage, resume)
    return trainers.train(job, callbacks=list(callbacks)).metrics, files.read_json(job.curves)


def test_dynamic_sampling_refills_zero_variance_groups(tiny_model, tmp_path):
    stage = _stage(curriculum={"type": "pools"}, dynamic_sampling={"max_rounds": 2})
    summary, curves = _train(tiny_model, tmp_path / "w", stage)
    assert [c["step"] for c in curves] == [1, 2, 3]
    assert all(0 <= c["dynamic_sampling_rounds"] <= 2 for c in curves)
    # refilled batches hold fewer zero-variance groups than were generated
    assert summary["frac_zero_std_trained"] <= summary["frac_reward_zero_std"]
    assert all("curriculum/size/normal" in c and any(k.startswith("accuracy_by_bucket/") for k in c) for c in curves)
    assert (tmp_path / "w" / "checkpoint-3" / CURRICULUM_STATE).is_file()


def test_rl_curves_separate_dropped_groups_from_the_trained_ones(tiny_model, tmp_path):
    """With dynamic sampling the logged reward is that of the groups trained on; the reward of all
    generated groups, the share dropped and the completions the refills cost are logged apart."""
    stage = _stage(max_steps=4, curriculum={"type": "pools"}, dynamic_sampling={"max_rounds": 2})
    summary, curves = _train(tiny_model, tmp_path / "w", stage)
    per_batch = stage.prompts_per_step  # groups in one batch (one process)
    for c in curves:
        # parity gives 0/1 rewards: a group has zero variance iff its rewards are all 0 or all 1
        assert c["extra_generations"] == c["dynamic_sampling_rounds"] * per_batch * stage.num_generations
        assert 0 <= c["dropped_share"] <= c["frac_reward_zero_std"] + 1e-9
        assert c["frac_zero_std_trained"] <= c["frac_reward_zero_std"] + 1e-9
        assert 0 <= c["reward_generated"] <= 1 and 0 <= c["reward"] <= 1
        if c["dynamic_sampling_rounds"] == 0:  # nothing dropped: the batch is everything generated
            assert c["reward"] == pytest.approx(c["reward_generated"]) and c["dropped_share"] == 0
    assert summary["extra_generations"] == sum(c["extra_generations"] for c in curves)
    assert any(c["dynamic_sampling_rounds"] > 0 for c in curves)  # the seeded run refills at least once


def test_held_out_curve_every_n_steps_matches_an_evaluation_of_the_model(tiny_model, tmp_path):
    heldout = tmp_path / "test.jsonl"
    files.write_jsonl(heldout, ROWS[:6])
    greedy = SamplingParams(temperature=0.0, max_new_tokens=8, batch_size=4)
    job = _job(tiny_model, tmp_path / "w", _stage(eval_every=2)).model_copy(
        update={"heldout": heldout, "heldout_sampling": greedy}
    )
    trainers.train(job)
    curves = files.read_json(job.curves)
    assert [c["step"] for c in curves if "heldout_accuracy" in c] == [2, 3]  # every 2 steps and the last
    final = tmp_path / "w" / FINAL
    model, tok = AutoModelForCausalLM.from_pretrained(final), models.load_tokenizer(final)
    prompts = render(tok, [formats.prompt(r["prompt"], FMT) for r in ROWS[:6]])
    records = grade(ROWS[:6], generate(model, tok, prompts, greedy), FMT)
    assert curves[-1]["heldout_accuracy"] == pytest.approx(sum(r["samples"][0]["correct"] for r in records) / 6)


def test_all_equal_rewards_use_every_round_then_fill(tiny_model, tmp_path):
    stage = _stage(
        max_steps=2, rewards={"constant": {"import": "tests.test_rl:constant"}}, dynamic_sampling={"max_rounds": 2}
    )
    summary, curves = _train(tiny_model, tmp_path / "w", stage)
    assert [c["dynamic_sampling_rounds"] for c in curves] == [2.0, 2.0]
    assert summary["frac_zero_std_trained"] == 1.0
    # all 6 generated groups have zero variance: 2 top up the batch, 4 are dropped; two refills of a batch each
    assert all(c["dropped_share"] == pytest.approx(2 / 3) and c["extra_generations"] == 2 * 2 * 2 for c in curves)
    assert all(c["reward"] == c["reward_generated"] == 1.0 for c in curves)


def test_rloo_with_a_bandit_curriculum(tiny_model, tmp_path):
    stage = _stage(algorithm="rloo", max_steps=2, curriculum={"type": "bandit", "method": "ucb"})
    summary, curves = _train(tiny_model, tmp_path / "w", stage)
    assert summary["steps"] == 2 and len(curves) == 2


class _Crash(TrainerCallback):
    """Stops training right after the checkpoint of `step` is written, like a killed job."""

    def __init__(self, step: int):
        self.step = step

    def on_save(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            raise KeyboardInterrupt


@pytest.mark.parametrize("curriculum", [{"type": "adaptive"}, {"type": "bandit"}])
def test_resume_continues_model_optimizer_rng_and_curriculum(tiny_model, tmp_path, curriculum):
    # a reward with variance in every group, so that the weights move (parity is constant at 8 tokens)
    stage = _stage(
        curriculum=curriculum,
        dynamic_sampling={"max_rounds": 1},
        rewards={"even": {"import": "tests.rows:even_tokens"}},
    )
    _, whole_curves = _train(tiny_model, tmp_path / "whole", stage)
    with pytest.raises(KeyboardInterrupt):
        _train(tiny_model, tmp_path / "cut", stage, callbacks=[_Crash(2)])
    state = files.read_json(tmp_path / "cut" / "checkpoint-2" / CURRICULUM_STATE)
    _, resumed_curves = _train(tiny_model, tmp_path / "cut", stage, resume=str(tmp_path / "cut" / "checkpoint-2"))
    assert state  # the curriculum state travelled with the checkpoint
    assert resumed_curves[-1] == whole_curves[-1]
    assert movement.since(tiny_model, tmp_path / "whole" / FINAL)["weights_changed_share"] > 0.99  # it trained
    whole, _ = models.load(tmp_path / "whole" / "final")
    resumed, _ = models.load(tmp_path / "cut" / "final")
    for a, b in zip(whole.state_dict().values(), resumed.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b)


class _Weights(TrainerCallback):
    """The trained model's parameters, by name, at the start and at the end of training."""

    def __init__(self) -> None:
        self.begin: dict[str, torch.Tensor] = {}
        self.end: dict[str, torch.Tensor] = {}

    def on_train_begin(self, args, state, control, model=None, **_):
        self.begin = {n: p.detach().clone() for n, p in model.named_parameters()}

    def on_train_end(self, args, state, control, model=None, **_):
        self.end = {n: p.detach().clone() for n, p in model.named_parameters()}


def test_lora_rl_trains_fp32_adapters_on_a_frozen_base_resumes_and_saves_a_merged_model(tiny_model, tmp_path):
    stage = _stage(lora={"r": 4, "alpha": 8, "dropout": 0.0}, rewards={"even": {"import": "tests.rows:even_tokens"}})
    seen = _Weights()
    summary, curves = _train(tiny_model, tmp_path / "whole", stage, callbacks=[seen])
    adapters = [n for n in seen.end if "lora_" in n]
    assert adapters and all(seen.end[n].dtype == torch.float32 for n in adapters)
    assert all(not torch.equal(seen.begin[n], seen.end[n]) for n in adapters if "lora_B" in n)  # B starts at 0
    base = {n: p for n, p in seen.end.items() if "lora_" not in n}
    assert all(torch.equal(seen.begin[n], p) for n, p in base.items())  # the base is frozen
    assert len(curves) == 3 and summary["weights_changed_share_touched"] > 0.99

    # the checkpoint is a plain model: the adapters merged into the linear layers, the rest as it was
    merged, _ = models.load(tmp_path / "whole" / FINAL)
    init, _ = models.load(tiny_model)
    assert not any("lora" in k for k in merged.state_dict())
    moved = {k for k, v in merged.state_dict().items() if not torch.equal(v, init.state_dict()[k])}
    assert moved and all(k.endswith("proj.weight") for k in moved)

    with pytest.raises(KeyboardInterrupt):
        _train(tiny_model, tmp_path / "cut", stage, callbacks=[_Crash(2)])
    assert (tmp_path / "cut" / "checkpoint-2" / "adapter_model.safetensors").is_file()
    _train(tiny_model, tmp_path / "cut", stage, resume=str(tmp_path / "cut" / "checkpoint-2"))
    resumed, _ = models.load(tmp_path / "cut" / FINAL)
    for a, b in zip(merged.state_dict().values(), resumed.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b)


def test_two_process_rl_with_dynamic_sampling(tiny_model, tmp_path):
    """DDP over gloo: both ranks draw the same global batch from the curriculum, train on their
    halves, and take the same dynamic-sampling decisions (else the collectives would hang)."""
    stage = _stage(
        max_steps=2, curriculum={"type": "pools"}, dynamic_sampling={"max_rounds": 2}, launch={"num_processes": 2}
    )
    job = _job(tiny_model, tmp_path / "w", stage)
    result = launch.run(job, stage.launch)
    curves = files.read_json(job.curves)
    assert result.metrics["steps"] == 2 and [c["step"] for c in curves] == [1, 2]
    # prompts_per_step counts over all processes: 2 distinct prompts a step, as with one process
    assert [c["curriculum/prompts"] for c in curves] == [2.0, 2.0]
    _, alone = _train(tiny_model, tmp_path / "one", stage.model_copy(update={"launch": LaunchParams()}))
    assert [c["curriculum/prompts"] for c in alone] == [2.0, 2.0]
    models.load(tmp_path / "w" / "final")


def test_rollouts_take_rungs_generation_seeded_by_step(tiny_model, tmp_path):
    """Default sampling goes through rung.generate.api, reproducibly; a setting rung's sampler lacks
    (top_k) goes to TRL's own model.generate, decided once at stage start (rung.rl.engine)."""
    runs = []
    for name, trl in (("a", {}), ("b", {}), ("top_k", {"top_k": 5})):
        trainer = trainers.trainer_for(_job(tiny_model, tmp_path / name, _stage(max_steps=2, trl=trl)))
        decided, inner = [], trainer.rollout

        def rollout(*a, inner=inner, decided=decided):
            out = inner(*a)
            decided.append(out is not None)  # None: TRL generates
            return out

        trainer.rollout = rollout
        trainer.train()
        runs.append((decided, [p.detach().clone() for p in trainer.model.parameters()]))
    (rung_a, weights_a), (rung_b, weights_b), (rung_k, _) = runs
    assert rung_a == rung_b == [True, True] and rung_k == [False, False]
    assert all(torch.equal(x, y) for x, y in zip(weights_a, weights_b, strict=True))


def _rollout_batch(tok, prompts: list[str], lengths: list[int]):
    """TRL's loss inputs: left-padded prompts + right-padded completions (random tokens)."""
    ids = [tok(p, add_special_tokens=False)["input_ids"] for p in prompts]
    width = max(map(len, ids))
    torch.manual_seed(0)
    completions = [torch.randint(0, tok.vocab_size, (n,)).tolist() for n in lengths]
    rows, masks = [], []
    for p, c in zip(ids, completions, strict=True):
        pad_l, pad_r = width - len(p), max(lengths) - len(c)
        rows.append([0] * pad_l + p + c + [0] * pad_r)
        masks.append([0] * pad_l + [1] * (len(p) + len(c)) + [0] * pad_r)
    return torch.tensor(rows), torch.tensor(masks), max(lengths)


@pytest.mark.parametrize(
    "which, lengths",
    [
        ([0, 1, 2, 3], [5, 3, 5, 2]),  # distinct prompts: the shared prefix once
        ([0, 0, 0, 2, 2, 2, 1, 0], [5, 3, 1, 4, 4, 2, 5, 3]),  # groups, one row apart: each prompt once too
    ],
    ids=["distinct", "groups"],
)
def test_shared_prefix_log_probs_equal_each_row_alone_with_their_gradients(tiny_model, tmp_path, which, lengths):
    """rung's log-probs run the prompts' shared prefix once and each distinct prompt once; each row's
    log-probs, entropies and the gradient of their sum equal TRL's on that row alone (no padding, so no
    position question)."""
    trainer = trainers.trainer_for(_job(tiny_model, tmp_path / "w", _stage()))
    tok, model = trainer.processing_class, trainer.model
    distinct = [formats.prompt(r["prompt"] + " Explain." * (i % 3), FMT) for i, r in enumerate(ROWS[:4])]
    prompts = render(tok, [distinct[i] for i in which])
    input_ids, mask, keep = _rollout_batch(tok, prompts, lengths)
    assert len(shared_prefix([r[m.bool()].tolist() for r, m in zip(input_ids, mask, strict=True)])) >= 8

    def grads(loss):
        model.zero_grad()
        loss.backward()
        return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])

    logps, entropies, _ = trainer._get_per_token_logps_and_entropies(
        model, input_ids, mask, keep, batch_size=3, compute_entropy=True
    )
    comp = mask[:, -keep:].bool()
    ours = grads(logps[comp].sum())
    alone, theirs = [], 0
    for i in range(len(prompts)):
        real = mask[i].bool()
        lp, ent, _ = GRPOTrainer._get_per_token_logps_and_entropies(
            trainer, model, input_ids[i][real][None], mask[i][real][None], int(comp[i].sum()), compute_entropy=True
        )
        alone.append((lp[0], ent[0]))
        theirs = theirs + lp.sum()
    for i, (lp, ent) in enumerate(alone):
        torch.testing.assert_close(logps[i][comp[i]], lp, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(entropies[i][comp[i]], ent, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(ours, grads(theirs), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize(
    "lengths, most", [([5, 3, 5, 2], 3), ([48] * 8 + [10] * 8, 16), ([20] * 16, 16), (list(range(1, 40)), 8)]
)
def test_length_chunks_cover_every_row_once_and_cost_no_more_than_fixed_batches(lengths, most):
    chunks = logprobs.length_chunks(lengths, most)
    assert sorted(i for c in chunks for i in c) == list(range(len(lengths)))
    assert all(0 < len(c) <= most for c in chunks)

    def cost(cs):
        return sum(len(c) * (max(lengths[i] for i in c) + 1) + logprobs.CHUNK_COST for c in cs)

    fixed = [list(range(s, min(s + most, len(lengths)))) for s in range(0, len(lengths), most)]
    assert cost(chunks) <= cost(fixed)
    if lengths == [48] * 8 + [10] * 8:  # two lengths far apart: two chunks, not one padded to 48
        assert sorted(map(sorted, chunks)) == [list(range(8)), list(range(8, 16))]
