"""One rendering everywhere: a prompt has the same token ids in TRL's SFT and GRPO tokenization and in
rung's generation (difficulty, traces, eval, the held-out curve), also for a tokenizer that adds a BOS
and for a chat template that reads a keyword argument."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError
from transformers import AutoTokenizer
from trl import GRPOConfig, GRPOTrainer, SFTConfig, SFTTrainer

from rung import config, models
from rung.answers import formats
from rung.config import ConfigError, FormatParams, RLStageParams, SamplingParams
from rung.generate import api
from rung.generate.completion import encode, render, stop_ids
from rung.rl.rewards import Accuracy
from rung.rl.trainers import HeldOut, prompts, trl_config
from rung.train.sft import examples, truncated_fraction
from tests.rows import sums
from tests.tiny_model import build

ROWS = sums(3, lambda i: 2, solutions=True)
PLAIN = FormatParams(template="plain")


@pytest.fixture(scope="module")
def bos_model(tiny_model, tmp_path_factory):
    """The tiny model with a tokenizer that puts a BOS before every text it encodes, as Llama 3's does."""
    tokenizer = tmp_path_factory.mktemp("bos") / "tokenizer"
    AutoTokenizer.from_pretrained(tiny_model, add_bos_token=True).save_pretrained(tokenizer)
    return build(tokenizer.parent / "model", tokenizer=tokenizer)


def _trl_ids(model_dir, fmt, tmp_path) -> tuple[list[list[int]], list[list[int]], GRPOTrainer]:
    """Prompt ids as TRL's GRPOTrainer and SFTTrainer tokenize the rows (prompt part of each SFT example)."""
    tok = AutoTokenizer.from_pretrained(model_dir)
    common = dict(report_to=[], use_cpu=True, save_strategy="no")
    grpo = GRPOTrainer(
        model=str(model_dir),
        reward_funcs=[Accuracy(fmt, RLStageParams())],
        args=GRPOConfig(tmp_path / "rl", per_device_train_batch_size=3, num_generations=3, **common),
        train_dataset=prompts(ROWS, fmt),
        processing_class=tok,
    )
    rl = grpo._tokenize_prompts(list(grpo.train_dataset["prompt"]))[0]
    traces = [{"prompt": r["prompt"], "target": formats.target(r["answer"], r["solution"], fmt)} for r in ROWS]
    sft = SFTTrainer(
        model=str(model_dir),
        args=SFTConfig(tmp_path / "sft", max_length=128, completion_only_loss=True, **common),
        train_dataset=examples(traces, fmt, tok),
        processing_class=tok,
    )
    # the prompt: the tokens before the first one with a label (TRL masks the prompt with -100)
    sft_ids = [ex["input_ids"][: next(i for i, x in enumerate(ex["labels"]) if x != -100)] for ex in sft.train_dataset]
    return rl, sft_ids, grpo


@pytest.mark.parametrize("fmt", [PLAIN, FormatParams()], ids=["plain", "chat"])
def test_prompt_ids_are_the_same_in_training_and_generation(bos_model, fmt, tmp_path):
    rl, sft, grpo = _trl_ids(bos_model, fmt, tmp_path)
    model, tok = models.load(bos_model)
    assert rl == sft
    texts = render(tok, [formats.prompt(r["prompt"], fmt) for r in ROWS])
    bos = [tok.bos_token_id] if fmt.template == "plain" else []  # TRL adds it to a plain text, not to a chat's
    assert rl == [bos + ids for ids in tok(texts, add_special_tokens=False)["input_ids"]]
    # rung's generation (transformers backend) samples what it would sample from TRL's ids
    gen = api.load(bos_model, "float32")
    rendered = gen.render([formats.prompt(r["prompt"], fmt) for r in ROWS])
    sampling = SamplingParams(temperature=1.0, max_new_tokens=6)
    want = api.generate_ids(model, rl, sampling, stop_ids(model.generation_config, tok), n=2, seed=1, desc=None)
    got = gen.generate(rendered, sampling, n=2, seed=1, desc=None)
    assert [[c.text for c in row] for row in got] == [
        [tok.decode(t[: len(t) - (not cut)], skip_special_tokens=True) for t, cut in row] for row in want
    ]
    # the ids themselves, which the vLLM backend also sends as they are, and the held-out curve's
    held_out = HeldOut(grpo, ROWS, fmt, SamplingParams(temperature=0), 1, tok)
    assert rendered == rl and held_out.prompts == rl


def test_chat_ids_are_those_the_demo_generated_from(tiny_model):
    """SmolLM2's tokenizer adds no BOS: chat prompts keep the ids of the rendered text, as before."""
    gen = api.load(tiny_model, "float32")
    conversations = [formats.prompt(r["prompt"], FormatParams()) for r in ROWS]
    assert gen.render(conversations) == gen.tok(render(gen.tok, conversations), add_special_tokens=False)["input_ids"]


def test_truncation_counts_the_bos_trl_trains_with(bos_model):
    tok = AutoTokenizer.from_pretrained(bos_model)
    traces = [{"prompt": r["prompt"], "target": formats.target(r["answer"], r["solution"], PLAIN)} for r in ROWS]
    text = formats.prompt(ROWS[0]["prompt"], PLAIN) + traces[0]["target"] + tok.eos_token
    exact = len(tok(text)["input_ids"])  # with the BOS
    assert truncated_fraction(traces[:1], PLAIN, tok, exact) == 0.0
    assert truncated_fraction(traces[:1], PLAIN, tok, exact - 1) == 1.0


# Qwen3's switch, reduced: enable_thinking=False writes an empty think block after the assistant turn opens.
THINKING = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
)


@pytest.fixture(scope="module")
def thinking_model(tiny_model, tmp_path_factory):
    """The tiny model with a chat template that reads `enable_thinking`."""
    tok = AutoTokenizer.from_pretrained(tiny_model)
    tok.chat_template = THINKING
    tokenizer = tmp_path_factory.mktemp("thinking") / "tokenizer"
    tok.save_pretrained(tokenizer)
    return build(tokenizer.parent / "model", tokenizer=tokenizer)


def test_chat_template_kwargs_are_refused_so_rung_and_trl_render_the_same_bytes(thinking_model, tmp_path):
    fmt = FormatParams()
    tok = AutoTokenizer.from_pretrained(thinking_model)
    conversations = [formats.prompt(r["prompt"], fmt) for r in ROWS]

    def trl_ids(args: GRPOConfig) -> list[list[int]]:
        grpo = GRPOTrainer(
            model=str(thinking_model),
            reward_funcs=[Accuracy(fmt, RLStageParams())],
            args=args,
            train_dataset=prompts(ROWS, fmt),
            processing_class=tok,
        )
        return grpo._tokenize_prompts(list(grpo.train_dataset["prompt"]))[0]

    # TRL's config as rung builds it from a stage: the same bytes as rung's rendering
    stage = RLStageParams(num_generations=3, prompts_per_step=1)
    assert trl_ids(trl_config(stage, [1.0], 0, tmp_path / "rl")) == encode(tok, conversations)
    assert "<think>" not in render(tok, conversations)[0]
    # the key would make TRL train on other bytes than rung evaluates ...
    args = trl_config(stage, [1.0], 0, tmp_path / "rl")
    args.chat_template_kwargs = {"enable_thinking": False}
    texts = [f"{text}<think>\n\n</think>\n\n" for text in render(tok, conversations)]
    assert [tok.decode(ids) for ids in trl_ids(args)] == texts
    # ... so it is refused, in one line naming it
    with pytest.raises(ValidationError, match="chat_template_kwargs: not supported"):
        RLStageParams(trl={"chat_template_kwargs": {"enable_thinking": False}})
    data = config.read_yaml(Path(__file__).parent.parent / "params.yaml")
    data["rl"]["stages"]["main"]["trl"] = {"chat_template_kwargs": {"enable_thinking": False}}
    with pytest.raises(ConfigError, match=r"^\S+: rl\.stages\.main\.trl\.chat_template_kwargs: not supported;[^\n]*$"):
        config.parse(data)
