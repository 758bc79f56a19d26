"""The seam to TRL (rung.train.trl_seam and rung.train.trl_private): each private method it overrides and each
private attribute it touches, checked against the installed TRL on the tiny model, signatures and return shapes
alike, so that a TRL release that moves one fails here, naming it, rather than training with a hook that no
longer applies; and no other module of rung touches them."""

from __future__ import annotations

import ast
import importlib.util
import inspect
import textwrap
from collections import defaultdict
from itertools import islice

import pytest
import torch
from datasets import Dataset
from trl import DPOTrainer, GRPOTrainer, KTOTrainer, RLOOTrainer, SFTConfig, SFTTrainer

from rung.rl import trainers
from rung.train import trl_private, trl_seam
from rung.train.trl_private import train_metrics
from tests import imports
from tests.test_rl import _job, _stage

TRL = {"grpo": GRPOTrainer, "rloo": RLOOTrainer}


def declines(completions, **_):
    """A reward that scores nothing (TRL: NaN)."""
    return [None] * len(completions)


@pytest.mark.parametrize("trainer", [GRPOTrainer, RLOOTrainer])
@pytest.mark.parametrize("method", sorted(trl_seam.OVERRIDDEN))
def test_overridden_methods_keep_their_signatures(trainer, method):
    expected = trl_seam.OVERRIDDEN[method]
    assert list(inspect.signature(getattr(trainer, method)).parameters)[: len(expected)] == expected


def test_the_seam_overrides_the_listed_methods_and_no_others():
    assert {name for name in vars(trl_seam.Seam) if name.startswith("_") and not name.startswith("__")} == set(
        trl_seam.OVERRIDDEN
    )


@pytest.mark.parametrize("trainer", [DPOTrainer, KTOTrainer])
def test_prepare_dataset_keeps_the_signature_the_pretokenized_trainers_override(trainer):
    """Its return, the ids and columns TRL trains on, is checked against rung's in tests/test_preference.py."""
    assert list(inspect.signature(trainer._prepare_dataset).parameters) == trl_private.PREPARE_DATASET
    rungs = {DPOTrainer: trl_private.PretokenizedDPO, KTOTrainer: trl_private.PretokenizedKTO}[trainer]
    assert list(inspect.signature(rungs._prepare_dataset).parameters) == trl_private.PREPARE_DATASET
    assert "tokenize_fn" in inspect.getsource(trainer._prepare_dataset)  # TRL still tokenizes there


def test_generate_single_turn_takes_what_each_trainer_passes():
    """GRPO's tool loop calls it per turn with num_generations=1 (the seam passes the rest through); RLOO's has none."""
    extra = {
        cls: list(inspect.signature(cls._generate_single_turn).parameters)[4:] for cls in (GRPOTrainer, RLOOTrainer)
    }
    assert extra == {GRPOTrainer: ["num_generations", "has_tool_images"], RLOOTrainer: []}


@pytest.mark.parametrize("method", sorted(trl_seam.EPISODE_HOOKS))
def test_the_episode_hook_points_are_those_the_seam_documents(method):
    assert list(inspect.signature(getattr(GRPOTrainer, method)).parameters) == trl_seam.EPISODE_HOOKS[method]


def _reads(tree: ast.Module, names: set[str]) -> list[str]:
    """Where a module reads one of `names` off an object, except a class's own attribute of that name
    (a method it defines, or one its `__init__` sets, as rung.train.run_log's `_metrics`)."""
    found = []

    def visit(node: ast.AST, own: set[str]) -> None:
        if isinstance(node, ast.ClassDef):
            init = [f for f in node.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"]
            own = {f.name for f in node.body if isinstance(f, ast.FunctionDef)} | {
                t.attr
                for n in (ast.walk(init[0]) if init else ())
                if isinstance(n, ast.Assign | ast.AnnAssign)
                for target in (n.targets if isinstance(n, ast.Assign) else [n.target])
                for t in (target.elts if isinstance(target, ast.Tuple) else [target])
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"
            }
        if isinstance(node, ast.Attribute) and node.attr in names:
            if not (isinstance(node.value, ast.Name) and node.value.id == "self" and node.attr in own):
                found.append(f".{node.attr} (line {node.lineno})")
        for child in ast.iter_child_nodes(node):
            visit(child, own)

    visit(tree, set())
    return found


PRIVATE = (
    set(trl_seam.OVERRIDDEN)
    | set(trl_private.PRIVATE_STATE)
    | set(trl_seam.EPISODE_HOOKS)
    | {m for m in trl_private.PHASES.values() if m.startswith("_")}
    | {"aux_loss_enabled", trl_private.FUSED_LM_HEAD, "_prepare_dataset"}
)


def _by_string(tree: ast.Module, names: set[str]) -> list[str]:
    """Where a module names one of `names` by a string (setattr / getattr / mock.patch.object) or a keyword."""
    return [
        f"{node.value!r} (line {node.lineno})"
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and node.value in names
    ] + [
        f"{node.arg}= (line {node.value.lineno})"
        for node in ast.walk(tree)
        if isinstance(node, ast.keyword) and node.arg in names
    ]


SEAM = {imports.ROOT / "rung" / "train" / f"{module}.py" for module in ("trl_seam", "trl_private")}
"""The seam's two modules: the overriding trainer class, and the accessors of TRL's private state."""


def test_only_the_seam_touches_trls_private_methods_and_state():
    paths = [*imports.modules().values(), *sorted((imports.ROOT / "bench").rglob("*.py"))]
    assert SEAM <= set(paths)
    elsewhere = {
        str(path.relative_to(imports.ROOT)): hits
        for path in paths
        if path not in SEAM
        and (hits := _reads(tree := ast.parse(path.read_text()), PRIVATE) + _by_string(tree, PRIVATE))
    }
    assert elsewhere == {}
    assert all(_reads(ast.parse(path.read_text()), PRIVATE) for path in SEAM)  # the scan sees each seam module's own


def test_the_scan_sees_a_private_name_by_string_and_by_keyword():
    tree = ast.parse("setattr(t, '_generate', f)\nmodel(x, fused_lm_head=True)\nt.aux_loss_enabled")
    assert _by_string(tree, PRIVATE) == ["'_generate' (line 1)", "fused_lm_head= (line 2)"]
    assert _reads(tree, PRIVATE) == [".aux_loss_enabled (line 3)"]


def test_the_phase_methods_and_the_sft_trainers_fused_call_are_trls():
    """bench/'s timers wrap TRL's methods of each phase; rung.train.prefix's stand-in model answers SFTTrainer's
    fused-head call and steps aside for its router loss."""
    for trl in (GRPOTrainer, RLOOTrainer):
        missing = {p: m for p, m in trl_private.PHASES.items() if not hasattr(trl, m)}
        assert missing == {}
    source = inspect.getsource(SFTTrainer.compute_loss)
    assert f"{trl_private.FUSED_LM_HEAD}=True" in source and "self.aux_loss_enabled" in source


@pytest.mark.parametrize("cls", [trainers.GRPO, trainers.RLOO])
def test_of_rungs_classes_only_the_seam_overrides_trls_private_methods(cls):
    overriding = {
        f"{c.__module__}.{c.__name__}": sorted(PRIVATE & set(vars(c)))
        for c in cls.__mro__
        if c.__module__.startswith("rung.") and PRIVATE & set(vars(c))
    }
    assert overriding == {"rung.train.trl_seam.Seam": sorted(trl_seam.OVERRIDDEN)}


@pytest.fixture(scope="module", params=sorted(TRL))
def trainer(request, tiny_model, tmp_path_factory):
    """rung's trainer of each algorithm; num_iterations 2, so that batches are reused (TRL's generation cycle)."""
    stage = _stage(
        algorithm=request.param,
        num_generations=2,
        num_iterations=2,
        max_completion_length=4,
        rewards={"parity": {"import": "tests.test_rl:parity"}, "none": {"import": "tests.test_trl_seam:declines"}},
    )
    t = trainers.trainer_for(_job(tiny_model, tmp_path_factory.mktemp(request.param) / "w", stage))
    t.model.train()
    return t


def _inputs(trainer, prompts: int = 2) -> list[dict]:
    """A generation batch as TRL's sampler makes one: each prompt num_generations times in a row."""
    return [trainer.train_dataset[i] for i in range(prompts) for _ in range(trainer.num_generations)]


def _trl(trainer) -> type:
    return GRPOTrainer if isinstance(trainer, GRPOTrainer) else RLOOTrainer


def test_the_batch_sources_reward_names_and_weights_are_trls(trainer):
    """rung builds its reward log from what it hands TRL: TRL must name and weigh the functions alike."""
    log = trainer.batch_source.log
    assert log.names == trainer.reward_func_names == ["parity", "none"]
    assert torch.equal(log.weights, trainer.reward_weights)


def test_the_sampler_yields_whole_groups_of_a_generation_batch(trainer):
    g, args = trainer.num_generations, trainer.args
    indices = list(islice(iter(trainer._get_train_sampler(trainer.train_dataset)), 4 * g))
    assert all(len(set(indices[i : i + g])) == 1 for i in range(0, len(indices), g))
    batch = next(iter(trainer.get_train_dataloader()))
    assert len(batch) == args.per_device_train_batch_size * args.steps_per_generation


def test_generate_and_score_completions_returns_the_batch_rung_reads(trainer):
    n = len(inputs := _inputs(trainer))
    torch.manual_seed(0)
    batch = trainer.trl_generation_batch(inputs)
    grpo = _trl(trainer) is GRPOTrainer
    assert {"prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "advantages"} <= batch.keys()
    assert ("num_items_in_batch" in batch) == grpo and ("old_logps" in batch) == (not grpo)
    assert batch["advantages"].shape == (n,)
    assert all(v.shape[0] == n for k, v in batch.items() if isinstance(v, torch.Tensor) and k != "num_items_in_batch")
    assert batch["prompt_mask"][:, -1].all() and batch["completion_mask"][:, 0].all()  # left / right padding
    if grpo:
        assert batch["num_items_in_batch"] == (batch["completion_mask"] * batch.get("tool_mask", 1)).sum()
    # the completions table got the (gathered: one process) advantages last
    assert list(trainer._logs["advantages"])[-n:] == batch["advantages"].tolist()
    trainer.relog_advantages([9.0] * n)
    assert list(trainer._logs["advantages"])[-n:] == [9.0] * n


def test_calculate_rewards_is_rows_by_functions_with_nan_where_one_declined(trainer):
    inputs = _inputs(trainer)
    completions = [[{"role": "assistant", "content": "7"}]] * len(inputs)
    ids = [[1] * (i + 1) for i in range(len(inputs))]
    rewards = _trl(trainer)._calculate_rewards(trainer, inputs, [x["prompt"] for x in inputs], completions, ids)
    assert rewards.shape == (len(inputs), 2) and rewards.dtype == torch.float32
    assert rewards[:, 0].tolist() == [float(len(i) % 2) for i in ids]
    assert rewards[:, 1].isnan().all()


def test_generate_single_turn_returns_each_trainers_shape_on_both_paths(trainer):
    prompt_ids = trainer.processing_class(["Hello there", "Hello there"], add_special_tokens=False)["input_ids"]
    trl = _trl(trainer)
    extra = (1,) if trl is GRPOTrainer else ()
    theirs = trl._generate_single_turn(trainer, prompt_ids, None, {}, *extra)
    ours = trainer._generate_single_turn(prompt_ids, None, {}, *extra)  # rung's rollouts
    for out in (theirs, ours):
        if trl is GRPOTrainer:
            assert isinstance(out, tuple) and len(out) == 2 and out[1] is None
            out = out[0]
        assert len(out) == 2 and all(isinstance(t, int) for ids in out for t in ids)


def test_the_rollout_settings_are_each_trainers_attributes(trainer):
    """What rung's rollouts read of a trainer (`ROLLOUT_ATTRIBUTES` and its args), through `rollout_settings`, is
    there on both trainers with the stage's values."""
    assert [name for name in trl_private.ROLLOUT_ATTRIBUTES if not hasattr(trainer, name)] == []
    settings = trl_private.rollout_settings(trainer)
    assert (settings.temperature, settings.max_completion_length, settings.num_generations) == (1.0, 4, 2)
    assert settings.eos_token_ids == list(trainer.eos_token_ids) and settings.eos_token_ids and not settings.use_vllm
    assert not settings.top_k and settings.min_p is None and settings.repetition_penalty == 1.0
    assert trainer.rollouts.generator == "rung" and trainer.rollouts.settings == settings
    with trl_private.generation_context(trainer) as model:
        assert model is trainer.model


def test_per_token_logps_return_three_on_both_paths(trainer):
    batch = trainer.trl_generation_batch(_inputs(trainer))
    input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
    mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1)
    keep = batch["completion_ids"].shape[1]
    theirs = _trl(trainer)._get_per_token_logps_and_entropies(
        trainer, trainer.model, input_ids, mask, keep, compute_entropy=True
    )
    ours = trainer._get_per_token_logps_and_entropies(trainer.model, input_ids, mask, keep, compute_entropy=True)
    for logps, entropies, aux in (theirs, ours):
        assert logps.shape == entropies.shape == (len(input_ids), keep) and aux is None
    comp = batch["completion_mask"].bool()
    torch.testing.assert_close(ours[0][comp], theirs[0][comp], atol=1e-5, rtol=1e-4)
    logps, entropies = trainer.fused_logps(trainer.model, input_ids=input_ids, attention_mask=mask, labels=input_ids)
    assert logps.shape == entropies.shape == (len(input_ids), input_ids.shape[1] - 1)  # of each next token


def test_compute_loss_takes_the_batch_and_its_groups_concatenated(trainer):
    batch = trainer.trl_generation_batch(_inputs(trainer, prompts=3))
    trainer.current_gradient_accumulation_steps = 1
    loss = trainer._compute_loss(trainer.model, batch)
    assert loss.dim() == 0 and loss.requires_grad
    groups = len(batch["advantages"]) // trainer.num_generations
    again = trainer.concat_groups([(batch, j) for j in range(groups)])
    assert again.keys() == {k for k, v in batch.items() if isinstance(v, torch.Tensor) or k == "num_items_in_batch"}
    torch.testing.assert_close(trainer._compute_loss(trainer.model, again), loss)


def test_metrics_appended_are_logged_as_their_mean(trainer):
    metrics = train_metrics(trainer)
    assert isinstance(metrics, defaultdict)
    metrics["seam/probe"].extend([1.0, 3.0])
    trainer.log({"loss": 0.0})
    assert trainer.state.log_history[-1]["seam/probe"] == 2.0


def test_the_generation_cycle_reuses_the_buffer_and_survives_a_checkpoint(trainer, tmp_path):
    trainer._step, trainer._buffered_inputs = 0, None
    first = trainer._prepare_inputs(_inputs(trainer))  # generates: a new cycle
    assert isinstance(first, dict) and len(trainer._buffered_inputs) == trainer.args.steps_per_generation
    trainer._step = 1  # mid-cycle (num_iterations 2): the buffered batch again, nothing generated
    marker = {"advantages": torch.zeros(1)}
    trainer._buffered_inputs = [marker] * trainer.args.steps_per_generation
    assert trainer._prepare_inputs(None) is marker
    # saved mid-cycle and restored by the seam's checkpoint overrides
    trainer.args.output_dir = str(tmp_path)
    assert trainer._get_output_dir(trial=None) == str(tmp_path)
    trainer.create_optimizer_and_scheduler(num_training_steps=2)
    trainer.state.global_step = 1
    trainer._buffered_inputs = [{"advantages": torch.arange(3.0)}] * trainer.args.steps_per_generation
    trainer._save_checkpoint(trainer.model, None)
    trainer._step, trainer._buffered_inputs = 0, None
    trainer._load_optimizer_and_scheduler(str(tmp_path / "checkpoint-1"))
    assert trainer._step == 1 and trainer._buffered_inputs[0]["advantages"].tolist() == [0.0, 1.0, 2.0]


def test_load_checkpoint_restores_the_weights(trainer, tmp_path):
    trainer.save_model(str(tmp_path))
    before = [p.detach().clone() for p in trainer.model.parameters()]
    with torch.no_grad():
        for p in trainer.model.parameters():
            p.add_(1.0)
    trl_private.load_checkpoint(trainer, str(tmp_path))
    assert all(torch.equal(a, b) for a, b in zip(before, trainer.model.parameters(), strict=True))


def test_the_sft_trainer_logs_appended_metrics_too(tiny_model, tmp_path):
    """rung.train.movement logs each step's update size through SFTTrainer's metrics as through GRPO's."""
    rows = [{"messages": [{"role": "user", "content": "1+1?"}, {"role": "assistant", "content": "2"}]}] * 2
    sft = SFTTrainer(
        model=str(tiny_model),
        args=SFTConfig(output_dir=str(tmp_path), report_to="none", use_cpu=True, bf16=False),
        train_dataset=Dataset.from_list(rows),
    )
    sft.model.train()  # as in training: TRL logs its "train" metrics then, "eval" ones otherwise
    train_metrics(sft)["seam/probe"].extend([2.0, 4.0])
    sft.log({"loss": 0.0})
    assert sft.state.log_history[-1]["seam/probe"] == 3.0


def test_colocated_vllm_is_an_engine_whose_generate_the_seam_wraps():
    """The CPU cannot start vLLM (tests/test_vllm_rl.py runs it on a GPU): TRL's source still names the
    attribute `wrap_vllm_generate` replaces."""
    for trl in (GRPOTrainer, RLOOTrainer):
        assert "self.vllm_generation = VLLMGeneration(" in inspect.getsource(trl.__init__)
    engine = importlib.util.find_spec("trl.generation.vllm_generation").origin  # imports vllm: read, not loaded
    assert "self.llm = LLM(" in open(engine).read()


def _self_assigned(cls: type) -> set[str]:
    """The attributes `cls`'s own source assigns on `self` (in any method: transformers' Trainer sets some,
    as `objective` in hyperparameter search, outside __init__)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    return {
        t.attr
        for n in ast.walk(tree)
        if isinstance(n, ast.Assign | ast.AnnAssign | ast.AugAssign)
        for target in (n.targets if isinstance(n, ast.Assign) else [n.target])
        for t in (target.elts if isinstance(target, ast.Tuple) else [target])
        if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"
    }


def _names(classes: list[type]) -> set[str]:
    return {n for c in classes for n in {*vars(c), *_self_assigned(c)} if not n.startswith("__")}


@pytest.mark.parametrize("cls", [trainers.GRPO, trainers.RLOO])
def test_no_name_rung_adds_to_a_trainer_is_one_transformers_or_trl_uses(cls):
    """A name of transformers' Trainer or TRL's trainer that rung also defines changes what their code (or a
    script calling `trainer.save_state()`, as open-r1's do) gets: only the seam's listed overrides and the
    private state it restores may."""
    ours = [c for c in cls.__mro__ if c.__module__.startswith("rung.")]
    theirs = [c for c in cls.__mro__ if c not in ours and c is not object]
    clashes = (_names(ours) & _names(theirs)) - set(trl_seam.OVERRIDDEN) - set(trl_private.PRIVATE_STATE)
    assert clashes == set()
