from __future__ import annotations

from collections import Counter

import pytest
import torch

from rung import config, models, onednn
from rung.answers import formats
from rung.config import DifficultyParams, EvalParams, FormatParams, SamplingParams, VllmParams
from rung.data.curate import curate
from rung.data.difficulty import bucket, histogram, keep, pass_rates, summarize
from rung.errors import InputError
from rung.eval.evaluate import evaluate
from rung.generate import api, compiled, prepacked
from rung.generate.api import generate
from rung.generate.completion import Completion, Generator, render
from tests.conftest import ROOT
from tests.rows import sums

FMT = FormatParams()
ROWS = sums(5, lambda i: 1)


@pytest.fixture(scope="module")
def loaded(tiny_model):
    return models.load(tiny_model)


def test_sampling_is_seeded_and_in_input_order(loaded):
    model, tok = loaded
    prompts = render(tok, [[{"role": "user", "content": r["prompt"] * (1 + i % 3)}] for i, r in enumerate(ROWS)])
    sampling = SamplingParams(temperature=1.0, max_new_tokens=6, batch_size=4)
    a = generate(model, tok, prompts, sampling, n=3, seed=1)
    b = generate(model, tok, prompts, sampling, n=3, seed=1)
    c = generate(model, tok, prompts, sampling, n=3, seed=2)
    assert [len(x) for x in a] == [3] * 5
    assert a == b and a != c
    assert all(0 < s.tokens <= 6 and s.truncated == (s.tokens == 6) for x in a for s in x)
    # each prompt's samples do not depend on the batch it shares with others
    solo = generate(model, tok, prompts[:1], SamplingParams(temperature=0, max_new_tokens=6), n=1)
    batched = generate(model, tok, prompts, SamplingParams(temperature=0, max_new_tokens=6), n=1)
    assert solo[0][0].text == batched[0][0].text


def _reference(model, tok, prompts, max_new_tokens):
    """Greedy completions of one batched, left-padded model.generate call, as rung reports them."""
    enc = tok(prompts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)
    with torch.inference_mode():
        seqs = model.generate(**enc, do_sample=False, max_new_tokens=max_new_tokens, pad_token_id=tok.pad_token_id)
    eos = model.generation_config.eos_token_id
    out = []
    for ids in seqs[:, enc["input_ids"].shape[1] :].tolist():
        kept = ids[: ids.index(eos)] if eos in ids else ids
        out.append([Completion(tok.decode(kept, skip_special_tokens=True), len(kept), eos not in ids)])
    return out


@pytest.fixture
def eos_model(tiny_model):
    """The tiny model with larger random weights (the fixture's greedy output is one repeated token)
    and an end token that it emits in some rows only, so that rows end at different steps."""
    model, tok = models.load(tiny_model)
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" not in name:
                p.normal_(0, 0.3)
    prompts = render(tok, [[{"role": "user", "content": r["prompt"] * (1 + i % 4)}] for i, r in enumerate(ROWS * 2)])
    enc = tok(prompts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)
    with torch.inference_mode():
        rows = model.generate(**enc, do_sample=False, max_new_tokens=12)[:, enc["input_ids"].shape[1] :].tolist()
    counts = Counter(t for row in rows for t in set(row[1:]))
    model.generation_config.eos_token_id = next(t for t, c in counts.most_common() if c < len(rows))
    return model, tok, prompts


def test_greedy_is_batched_model_generate(eos_model):
    model, tok, prompts = eos_model
    want = _reference(model, tok, prompts, 12)
    assert {c[0].truncated for c in want} == {True, False}  # some rows end early, some run to the limit
    sampling = SamplingParams(temperature=0, max_new_tokens=12, batch_size=3)  # fewer slots than prompts: rows refill
    assert generate(model, tok, prompts, sampling) == want


def test_eos_and_truncation_accounting(eos_model):
    """A completion stops before its end token and is truncated exactly when it used all its tokens."""
    model, tok, prompts = eos_model
    greedy = generate(model, tok, prompts, SamplingParams(temperature=0, max_new_tokens=12, batch_size=4))
    sampled = generate(
        model, tok, prompts, SamplingParams(temperature=1.0, max_new_tokens=12, batch_size=8), n=3, seed=0
    )
    assert all(len(x) == 3 for x in sampled)
    completions = [c for x in greedy + sampled for c in x]
    assert all(c.truncated == (c.tokens == 12) for c in completions)
    assert {c.truncated for c in completions} == {True, False}


def test_samples_do_not_depend_on_the_other_prompts(loaded):
    model, tok = loaded
    prompts = render(tok, [[{"role": "user", "content": r["prompt"] * (1 + i % 3)}] for i, r in enumerate(ROWS)])
    sampling = SamplingParams(temperature=1.0, max_new_tokens=8, batch_size=4)
    assert (
        generate(model, tok, prompts[:1], sampling, n=3, seed=5)[0]
        == generate(model, tok, prompts, sampling, n=3, seed=5)[0]
    )


def test_top_p_keeps_the_nucleus(loaded):
    model, tok = loaded
    prompts = render(tok, [[{"role": "user", "content": r["prompt"]}] for r in ROWS])
    greedy = generate(model, tok, prompts, SamplingParams(temperature=0, max_new_tokens=6))
    nucleus = generate(model, tok, prompts, SamplingParams(temperature=1.0, top_p=1e-6, max_new_tokens=6), n=2, seed=3)
    assert all(s == g[0] for g, x in zip(greedy, nucleus, strict=True) for s in x)  # only the top token survives


def test_greedy_with_several_samples_is_refused(loaded):
    model, tok = loaded
    with pytest.raises(ValueError, match="temperature"):
        generate(model, tok, ["x"], SamplingParams(temperature=0), n=2)


def test_difficulty_and_eval_records(loaded):
    gen = Generator(loaded[1], lambda *a, **k: api.generate(*loaded, *a, **k))
    params = DifficultyParams(num_generations=2, sampling=SamplingParams(max_new_tokens=4))
    scores = pass_rates(gen, ROWS, FMT, params, seed=0)
    assert [s["id"] for s in scores] == [r["id"] for r in ROWS] and all(len(s["scores"]) == 2 for s in scores)
    stats = summarize(scores, kept=len(keep(scores, params)))
    assert stats["prompts"] == 5 and stats["kept"] == 5 and 0 <= stats["zero_variance_fraction"] <= 1
    assert sum(stats["buckets"].values()) == 5 and sum(h["prompts"] for h in histogram(scores)) == 5
    params = EvalParams(
        sampling=SamplingParams(temperature=0, max_new_tokens=4), samples=dict(n=3, max_new_tokens=4, max_prompts=2)
    )
    greedy, sampled, metrics = evaluate(gen, ROWS, FMT, params, seed=0)
    assert len(greedy) == 5 and metrics.n == 5 and metrics.truncation_rate == 1.0
    assert len(sampled) == 2 and all(len(r["samples"]) == 3 for r in sampled)
    assert set(metrics.pass_at_k) == {"1", "2", "3"} and metrics.accuracy_by_difficulty == {"unknown": metrics.accuracy}


def test_keep_window():
    scores = [{"id": "a", "pass_rate": 0.0}, {"id": "b", "pass_rate": 0.5}, {"id": "c", "pass_rate": 1.0}]
    assert keep(scores, DifficultyParams(pass_rate_min=0.1, pass_rate_max=0.6)) == {"b"}


def test_buckets_use_inclusive_upper_bounds():
    b = DifficultyParams().buckets
    assert [bucket(r, b) for r in (0.0, 0.125, 0.25, 0.5, 0.875, 1.0)] == [
        "unsolved",
        "hard",
        "hard",
        "medium",
        "easy",
        "solved",
    ]
    shuffled = dict(sorted(b.items()))  # params order does not matter (YAML dumps sort keys)
    assert [bucket(r, shuffled) for r in (0.0, 0.25, 1.0)] == ["unsolved", "hard", "solved"]
    with pytest.raises(ValueError, match="the largest 1.0"):
        DifficultyParams(buckets={"a": 0.5, "b": 0.9})


def test_generator_loads_the_transformers_backend(tiny_model):
    gen = api.load(tiny_model, "float32")
    out = gen.generate(
        gen.render([[{"role": "user", "content": "hi"}]]), SamplingParams(temperature=0, max_new_tokens=3)
    )
    assert len(out) == 1 and out[0][0].tokens <= 3


def test_vllm_backend_fails_with_a_clear_error_where_unavailable(tiny_model):
    with pytest.raises(InputError, match=r"^generation.vllm.python: no/bin/python not found"):
        api.load(tiny_model, "float32", backend="vllm", vllm_params=VllmParams(python="no/bin/python"))


def test_prepacked_linears_match_and_are_restored(loaded):
    """Inside the block every Linear runs oneDNN's prepacked matmul (equal up to summation order);
    after it, and whenever gradients are on, the class's own forward."""
    model, _ = loaded
    linears = [m for m in model.modules() if type(m) is torch.nn.Linear]
    x = torch.randn(3, 5, linears[0].in_features)
    want = linears[0](x)
    assert onednn.available()
    with torch.no_grad(), prepacked.prepacked(model, 4):
        assert all("forward" in vars(m) for m in linears)
        got = linears[0](x)
    assert all("forward" not in vars(m) for m in linears)
    torch.testing.assert_close(got, want.detach())
    with prepacked.prepacked(model, 4):  # gradients on: TRL's training forward must not see it
        assert all("forward" not in vars(m) for m in linears)


def test_greedy_on_the_default_heldout_is_model_generate(smollm):
    """The embedded model in fp32 on the default experiment's held-out prompts: rung's generation
    (continuous batching, prepacked weights) gives batched model.generate's greedy completions."""
    model, tok = models.load(smollm)
    params = config.load(ROOT / "params.yaml")
    _, test, _ = curate(params.curate, {}, params.seed)
    prompts = render(tok, [formats.prompt(r["prompt"], params.format) for r in test[:24]])
    sampling = params.eval.sampling.model_copy(update={"batch_size": 16})
    assert generate(model, tok, prompts, sampling) == _reference(model, tok, prompts, sampling.max_new_tokens)


def _cpu_compile_config():
    """A torch.compile backend that runs on the CPU (AOT autograd, no code generation), one graph
    or an error; transformers compiles generate's decode step off CUDA only when told to."""
    from transformers import CompileConfig

    cc = CompileConfig(backend="aot_eager", fullgraph=True, mode=None)
    cc._compile_all_devices = True
    return cc


@pytest.mark.parametrize(
    "sampling, n",
    [
        (SamplingParams(temperature=0, max_new_tokens=12, batch_size=4), 1),
        (SamplingParams(temperature=1.0, top_p=0.9, max_new_tokens=12, batch_size=8), 3),
    ],
    ids=["greedy", "sampled"],
)
def test_compiled_static_cache_path_equals_the_loop(eos_model, sampling, n):
    """CUDA's engine (static cache, compiled decode step, row and width buckets, rung's seeded pick
    as a logits processor) gives the loop's tokens, truncation and seeded samples exactly (fp32)."""
    from torch._dynamo.utils import counters

    model, tok, prompts = eos_model
    ids = tok(prompts, add_special_tokens=False)["input_ids"]
    eos = [model.generation_config.eos_token_id]
    loop = api.generate_ids(model, ids, sampling, eos, n, seed=4, desc=None, engine="loop")
    static = api.generate_ids(
        model, ids, sampling, eos, n, seed=4, desc=None, engine="compiled", compile_config=_cpu_compile_config()
    )
    # the decode step really ran compiled (a graph may come from dynamo's cache of an earlier test)
    assert hasattr(model, "_compiled_call") and counters["stats"]["unique_graphs"] > 0
    assert static == loop
    if n == 1:  # greedy rows end at different steps: some at the end token, some at the limit
        assert {cut for row in loop for _, cut in row} == {True, False}


def test_out_of_memory_halves_the_batch_and_redraws_the_same_samples(tiny_model):
    """An out-of-memory error at more than 2 rows (raised by a hook, as CUDA would) empties the cache,
    halves the batch for the rest of the stage and redoes the unfinished prompts: the same samples."""
    model, tok = models.load(tiny_model)
    prompts = render(tok, [[{"role": "user", "content": r["prompt"]}] for r in ROWS])
    sampling = SamplingParams(temperature=1.0, max_new_tokens=5, batch_size=8)
    want = generate(model, tok, prompts, sampling, n=2, seed=9)
    seen = []

    def oom(module, args, kwargs):
        seen.append(kwargs["input_ids"].shape[0])
        if kwargs["input_ids"].shape[0] > 2:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")

    handle = model.register_forward_pre_hook(oom, with_kwargs=True)
    try:
        got = generate(model, tok, prompts, sampling, n=2, seed=9)
        assert api.batch_rows(model, sampling, 10) == 2  # kept for the rest of the stage
    finally:
        handle.remove()
    assert got == want and max(seen) > 2 and seen[-1] <= 2


def test_the_loop_refuses_in_one_line_when_one_prompts_samples_do_not_fit(tiny_model):
    """The loop decodes a prompt's n samples in one batch, so halving below n rows cannot help: it
    says so instead of retrying at the same size forever."""
    model, tok = models.load(tiny_model)
    prompts = render(tok, [[{"role": "user", "content": r["prompt"]}] for r in ROWS])

    def oom(module, args, kwargs):
        if kwargs["input_ids"].shape[0] > 1:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")

    handle = model.register_forward_pre_hook(oom, with_kwargs=True)
    try:
        with pytest.raises(InputError, match=r"^generation: out of memory with one prompt's 2 samples in a batch"):
            generate(model, tok, prompts, SamplingParams(temperature=1.0, max_new_tokens=5, batch_size=8), n=2)
    finally:
        handle.remove()
        api._backed_off.pop(model, None)


def test_compiled_calls_pad_every_chunk_to_one_bucket_and_remember_the_longest_cache(eos_model):
    """A call of 6 rows at capacity 4 decodes 4 + 2 rows: the last chunk is padded to the first's
    bucket (one compilation per process, not one per chunk size); the static cache's length is kept
    for sizing later batches (transformers keeps the longest cache a process has allocated)."""
    model, tok, prompts = eos_model
    ids = tok(prompts[:6], add_special_tokens=False)["input_ids"]
    sampling = SamplingParams(temperature=0, max_new_tokens=12, batch_size=4)
    rows, generate_, before = [], model.generate, api._longest.get(model, 0)

    def recording(**kw):
        rows.append(kw["input_ids"].shape[0])
        return generate_(**kw)

    model.generate = recording
    try:
        api.generate_ids(
            model,
            ids,
            sampling,
            [model.generation_config.eos_token_id],
            desc=None,
            engine="compiled",
            compile_config=_cpu_compile_config(),
        )
    finally:
        del model.generate
    assert rows == [4, 4]
    assert api._longest[model] == max(before, compiled.round_up(max(map(len, ids)) + 12))
