"""rung.envs: the tool-capable chat template and the parser TRL and rung share, the `retry` and `python`
environments (real sandbox), the environment spec's check, an environment class of one's own by import path,
and a TRL GRPOTrainer step with `environment_factory` on the tiny model."""

from __future__ import annotations

import copy
import json
import textwrap
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer
from trl.chat_template_utils import (
    get_training_chat_template,
    is_chat_template_prefix_preserving,
    qwen2_5_chat_template,
    qwen3_chat_template,
    supports_tool_calling,
)

from rung import sandbox
from rung.answers import verify
from rung.config import FormatParams
from rung.envs import (
    EnvironmentParams,
    FinalAnswer,
    Python,
    PythonSettings,
    Retry,
    RetrySettings,
    check,
    template,
)
from rung.envs.spec import replier, tool_names
from rung.errors import InputError
from tests.memorize import memorize

FMT = FormatParams()
ROW = {  # the columns of an RL dataset row (rung.rl.trainers.prompts), as TRL passes them to reset()
    "prompt": [{"role": "user", "content": "What is 17 * 23?"}],
    "prompt_text": "What is 17 * 23?",
    "answer": "391",
    "task": "basic_arithmetic",
    "meta": json.dumps({"difficulty": {}}),
}


@pytest.fixture(scope="module")
def original(tiny_model: Path):
    """The tiny model's tokenizer with SmolLM2-Instruct's own chat template."""
    return AutoTokenizer.from_pretrained(tiny_model)


@pytest.fixture(scope="module")
def tok(original):
    return template.apply(copy.deepcopy(original))


def _python_tool():
    return Python(FMT, 3).python  # bound, as TRL hands environment methods to the chat template


def _ids(tok, messages, **kwargs) -> list[int]:
    return tok.apply_chat_template(messages, tokenize=True, return_dict=False, tools=[_python_tool()], **kwargs)


CALL = {"type": "function", "function": {"name": "python", "arguments": {"code": "print(17 * 23)"}}}
EPISODE = [
    {"role": "user", "content": "What is 17 * 23?"},
    {"role": "assistant", "content": "", "tool_calls": [CALL]},
    {"role": "tool", "name": "python", "content": "391"},
    {"role": "assistant", "content": "Answer: 391"},
]


# --- the template and the parser -------------------------------------------------------------------------


@pytest.mark.parametrize("generation_prompt", [False, True])
@pytest.mark.parametrize(
    "messages",
    [
        [{"role": "user", "content": "Hi"}],
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "2+2?"},
            {"role": "assistant", "content": "Answer: 4"},
            {"role": "user", "content": "Sure?"},
        ],
    ],
)
def test_without_tools_the_template_renders_as_smollm2s_own(original, tok, messages, generation_prompt):
    kwargs = dict(tokenize=False, add_generation_prompt=generation_prompt)
    assert tok.apply_chat_template(messages, **kwargs) == original.apply_chat_template(messages, **kwargs)


def test_trl_accepts_the_template_and_refuses_smollm2s_own(original, tok):
    assert not supports_tool_calling(original)
    assert template.tool_calling_problem(original) is not None
    assert supports_tool_calling(tok) and is_chat_template_prefix_preserving(tok)
    assert get_training_chat_template(tok) is None  # already prefix-preserving with generation markers
    assert template.tool_calling_problem(tok) is None


def test_the_template_renders_a_tool_call_and_its_response(tok):
    text = tok.apply_chat_template(EPISODE, tokenize=False, tools=[_python_tool()])
    system = text.split("<|im_end|>")[0]
    assert '<tools>\n{"type": "function", "function": {"name": "python", "description": "Run Python' in system
    assert (
        '<|im_start|>assistant\n<tool_call>\n{"name": "python", "arguments": {"code": "print(17 * 23)"}}\n'
        "</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n391\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\nAnswer: 391<|im_end|>\n"
    ) in text


def test_only_the_assistants_tokens_are_marked_for_training(tok):
    out = tok.apply_chat_template(
        EPISODE, tools=[_python_tool()], return_dict=True, return_assistant_tokens_mask=True, tokenize=True
    )
    trained = tok.decode([t for t, m in zip(out["input_ids"], out["assistant_masks"], strict=True) if m])
    assert trained == (
        '<tool_call>\n{"name": "python", "arguments": {"code": "print(17 * 23)"}}\n</tool_call><|im_end|>'
        "Answer: 391<|im_end|>"
    )


@pytest.mark.parametrize(
    "message",
    [
        {"role": "assistant", "content": "", "tool_calls": [CALL]},
        {"role": "assistant", "content": "Let me compute.", "tool_calls": [CALL, CALL]},
        {"role": "assistant", "content": "Answer: 391"},
    ],
)
def test_a_rendered_turn_parses_back_to_its_message(tok, message):
    prefix = _ids(tok, EPISODE[:1], add_generation_prompt=True)
    completion = _ids(tok, [EPISODE[0], message])[len(prefix) :]
    parsed, malformed = template.parse(tok, completion, prefix, tools=[_python_tool()])
    assert malformed is None and parsed["content"] == message["content"]
    assert parsed.get("tool_calls", []) == message.get("tool_calls", [])


def test_a_malformed_call_parses_as_plain_text_and_says_why(tok):
    prefix = _ids(tok, EPISODE[:1], add_generation_prompt=True)
    cut = tok.encode('<tool_call>\n{"name": "pyth')
    message, malformed = template.parse(tok, cut, prefix)
    assert message == {"role": "assistant", "content": '<tool_call>\n{"name": "pyth'}  # as TRL parses it
    assert malformed == "not valid JSON (Unterminated string starting at: line 2 column 10 (char 10))"


def test_template_and_parser_travel_with_save_pretrained(tok, tmp_path):
    tok.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    assert loaded.chat_template == template.TEMPLATE
    assert loaded.response_template == template.RESPONSE_TEMPLATE
    assert (Path(template.__file__).parent / template.TEMPLATE_FILE).is_file()


@pytest.mark.parametrize("model_template", [qwen2_5_chat_template, qwen3_chat_template])
def test_real_model_templates_the_docs_name_work_unchanged(original, model_template):
    other = copy.deepcopy(original)
    other.chat_template = model_template  # Qwen's ChatML tokens are SmolLM2's special tokens too
    assert template.tool_calling_problem(other) is None


# --- retry ---------------------------------------------------------------------------------------------


def test_retry_replies_to_a_wrong_answer_and_records_the_first():
    env = Retry(FMT, max_turns=3)
    assert env.reset(**ROW) is None
    assert env.reply("17 * 23 is 381.\nAnswer: 381") == "Let's try again."
    assert env.reply("Answer: 391") is None  # right: the episode ends
    assert env.episode.answers == ["381", "391"] and env.episode.correct == [False, True]
    assert env.get_reward() == 1.0


def test_retry_stops_at_max_turns_and_discounts_extra_turns():
    env = Retry(FMT, max_turns=2, settings=RetrySettings(feedback="Wrong. Again.", discount=0.5))
    env.reset(**ROW)
    assert env.reply("Answer: 1") == "Wrong. Again."
    assert env.reply("Answer: 2") is None  # the last turn: no more feedback
    assert env.get_reward() == 0.0
    env.reset(**ROW)  # a new episode on the same instance (TRL pools instances)
    assert env.episode.answers == []
    env.reply("Answer: 1")
    env.reply("Answer: 391")
    assert env.get_reward() == 0.5  # right at turn 2: discount**1


def test_retry_without_an_answer_refuses_to_make_up_a_reward():
    # TRL's own loop never shows the environment an answer (the gap rung's episode loop fills)
    env = Retry(FMT, max_turns=3)
    env.reset(**ROW)
    with pytest.raises(RuntimeError, match="episode loop"):
        env.get_reward()


def test_retry_grader_failure_is_unscored_not_wrong(monkeypatch):
    def fails(answer, row):
        raise verify.GraderFailed("math-verify timed out")

    monkeypatch.setattr(verify, "is_correct", fails)
    env = Retry(FMT, max_turns=3)
    env.reset(**ROW)
    assert env.reply("Answer: 391") is None  # no feedback on an answer the grader could not judge
    assert env.get_reward() is None and "math-verify" in env.episode.unscored


# --- python ----------------------------------------------------------------------------------------------


@pytest.fixture
def python_env():
    env = Python(FMT, max_turns=3, settings=PythonSettings(max_output=200))
    env.reset(**ROW)
    return env


def test_python_runs_code_in_the_sandbox(python_env):
    assert python_env.python("print(17 * 23)") == "391\n"
    assert python_env.python("x = 17\nx * 23") == "391\n"  # a last bare expression is shown, as in a notebook
    assert python_env.python("import os\nos.getuid() == 0") == "False\n"  # a uid of no one, not root
    assert python_env.episode.tool_calls == 3 and python_env.episode.tool_errors == 0


def test_python_output_is_cut_to_max_output(python_env):
    out = python_env.python("print('x' * 5000)")
    assert out.startswith("x" * 200) and "[... 4801 more characters]" in out and "x" * 201 not in out


def test_python_errors_are_the_tools_text(python_env):
    out = python_env.python("print('before')\n1 / 0")
    assert out.startswith("before\n") and "ZeroDivisionError" in out
    assert "SyntaxError" in python_env.python("def f(:")
    assert python_env.python(42) == "Error: code must be a string, got int"
    assert python_env.episode.tool_errors == 3 and python_env.episode.unscored is None


@pytest.mark.parametrize(
    "hostile, expect",
    [
        ("print(open('/etc/shadow').read())", "PermissionError"),  # host files: not readable by its uid
        ("import os\nprint(os.listdir('/work'))", "FileNotFoundError"),  # no checkout in the sandbox
        # the runner, the namespace's init: the kernel drops the signal, and its environment is unreadable
        ("import os, signal\nos.kill(1, signal.SIGKILL)\nprint(open('/proc/1/environ').read())", "PermissionError"),
        ("print('y' * 10**8)", "Error (output_limit)"),  # floods the output
        ("import socket\nsocket.create_connection(('1.1.1.1', 80), timeout=2)", "unreachable"),  # no network
    ],
)
def test_a_hostile_call_is_contained_and_the_episode_goes_on(python_env, hostile, expect):
    out = python_env.python(hostile)
    assert expect in out and len(out) <= 200 + 40 + 120  # cut output, its note, the whole error line
    assert python_env.python("print(6 * 7)") == "42\n"  # the next call runs normally
    assert python_env.episode.unscored is None and python_env.episode.tool_errors == 1


@pytest.mark.parametrize(
    "failure",
    [
        sandbox.Result(sandbox.Verdict.ERROR, None, 0.0, "", "", "bwrap did not start: [Errno 2]"),
        sandbox.SandboxUnavailable("code rewards need bubblewrap"),
    ],
)
def test_a_sandbox_failure_leaves_the_episode_unscored(python_env, monkeypatch, failure):
    def run(program, limits):
        if isinstance(failure, Exception):
            raise failure
        return failure

    monkeypatch.setattr(sandbox, "run", run)
    out = python_env.python("print(17 * 23)")
    assert "sandbox failed" in out and python_env.episode.tool_errors == 0
    assert python_env.episode.unscored is not None
    # even a right final answer is then unscored (None), never graded
    assert FinalAnswer()([[{"role": "assistant", "content": "Answer: 391"}]], [python_env]) == [None]


def test_the_final_answer_is_graded_by_the_tasks_verifier():
    envs = [Python(FMT, 3) for _ in range(3)]
    for env in envs:
        env.reset(**ROW)
    completions = [
        [{"role": "assistant", "content": "", "tool_calls": [CALL]}, {"role": "assistant", "content": "Answer: 391"}],
        [{"role": "assistant", "content": "Answer: 390"}],
        [{"role": "assistant", "content": "391"}],  # no answer where the format puts it
    ]
    assert FinalAnswer()(completions, envs) == [1.0, 0.0, 0.0]


# --- the spec and its check ------------------------------------------------------------------------------

BYO = '''
class Guess:
    """An environment written to TRL's contract alone: guess a number, told higher or lower."""

    def __init__(self, low: int = 0):
        self.low = low

    def reset(self, answer: str, **row) -> str:
        self.target, self.tries, self.won = int(answer), 0, False
        return f" (a number from {self.low})"

    def guess(self, number: int) -> str:
        """Guess the number.

        Args:
            number: The guess.
        """
        self.tries += 1
        self.won = number == self.target
        return "right" if self.won else ("higher" if number < self.target else "lower")

    def get_reward(self) -> float:
        return 1.0 / self.tries if self.won else 0.0
'''

NO_RESET = """
class NoReset:
    def step(self, action: str) -> str:
        \"\"\"Act.

        Args:
            action: What to do.
        \"\"\"
"""

UNTYPED = """
class Untyped:
    def reset(self, **row): ...

    def act(self, action):
        \"\"\"Act.

        Args:
            action: What to do.
        \"\"\"
"""

UNDOCUMENTED = """
class Undocumented:
    def reset(self, **row): ...

    def act(self, action: str) -> str:
        return action
"""


@pytest.fixture
def user_modules(tmp_path, monkeypatch):
    for name, source in {"byo_env": BYO, "no_reset": NO_RESET, "untyped": UNTYPED, "undoc": UNDOCUMENTED}.items():
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
    (tmp_path / "broken.py").write_text("import not_a_module_anywhere\n")
    monkeypatch.syspath_prepend(str(tmp_path))


@pytest.mark.parametrize(
    "spec, message",
    [
        ({"name": "retry", "max_turns": 0}, "environment.max_turns: Input should be greater than or equal to 1"),
        ({"name": "tries"}, "environment.name: Value error, 'tries' is neither a built-in"),
        ({"name": "retry", "settings": {"discount": 0}}, "environment.settings.discount: Input should be greater"),
        ({"name": "retry", "settings": {"feedbak": "x"}}, "environment.settings.feedbak: Extra inputs"),
        ({"name": "broken:Env"}, "environment.name: cannot load 'broken:Env': ModuleNotFoundError"),
        ({"name": "byo_env:Missing"}, "environment.name: cannot load 'byo_env:Missing': AttributeError"),
        ({"name": "byo_env:Guess", "settings": {"high": 9}}, "environment.settings: byo_env:Guess does not take"),
        ({"name": "no_reset:NoReset"}, "environment.name: NoReset has no reset() method"),
        ({"name": "untyped:Untyped"}, "environment.name: tool Untyped.act: Argument action is missing a type hint"),
        ({"name": "undoc:Undocumented"}, "environment.name: tool Undocumented.act: Cannot generate JSON schema"),
    ],
)
def test_check_refuses_in_one_line_naming_the_key(tok, user_modules, spec, message):
    with pytest.raises(InputError) as e:
        check(spec, tok)
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_check_refuses_a_template_without_tool_calls_and_names_the_fix(original, user_modules):
    for name in ("python", "byo_env:Guess"):
        with pytest.raises(InputError, match=r"^environment: \w+ has tools .* cannot render a tool call.*fix: "):
            check({"name": name}, original)
    assert check({"name": "retry"}, original).tools == ()  # no tools: any chat template will do


def test_check_gives_what_a_stage_needs(tok):
    env = check(EnvironmentParams(name="python", max_turns=4, settings={"max_output": 64}), tok, key="rl.stages.a.env")
    assert env.tools == ("python",) and env.max_tool_calling_iterations == 3
    instance = env.factory(FMT)()
    assert isinstance(instance, Python) and instance.settings.max_output == 64 and replier(instance) is None
    retry = check({"name": "retry", "max_turns": 2, "settings": {"discount": 0.9}}, tok)
    instance = retry.factory(FMT)()
    assert retry.tools == () and replier(instance) == instance.reply and instance.settings.discount == 0.9


class Replies:
    """An environment with rung's hook, `reply`, which is no tool."""

    def reset(self, **row) -> None:
        pass

    def reply(self, message: str) -> str | None:
        return "again" if message != "Answer: 391" else None


class RepliesByItsFirstName:
    """An environment written before the hook was renamed: `_reply` is still called."""

    def reset(self, **row) -> None:
        pass

    def _reply(self, message: str) -> str | None:
        return "first name"


def test_the_reply_hook_is_called_by_either_name_and_is_never_a_tool(tok):
    for cls, said in ((Replies, "again"), (RepliesByItsFirstName, "first name")):
        env = check({"name": f"{__name__}:{cls.__name__}"}, tok)
        assert env.tools == () and tool_names(cls) == ()
        assert replier(env.factory(FMT)())("Answer: 7") == said


def test_an_environment_of_ones_own_runs_by_import_path(tiny_model, tok, user_modules, tmp_path):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    env = check({"name": "byo_env:Guess", "max_turns": 5, "settings": {"low": 1}}, tok)
    assert env.tools == ("guess",) and not env.builtin
    instance = env.factory(FMT)()
    assert "rung" not in type(instance).__module__
    assert instance.reset(**{**ROW, "answer": "7"}) == " (a number from 1)"
    assert [instance.guess(n) for n in (3, 9, 7)] == ["higher", "lower", "right"]
    assert instance.get_reward() == pytest.approx(1 / 3)
    # TRL takes the same factory: its tools, and its get_reward as the only reward source
    trainer = GRPOTrainer(
        model=str(tiny_model),
        args=GRPOConfig(output_dir=str(tmp_path), max_steps=1, use_cpu=True, report_to=[], num_generations=2),
        train_dataset=Dataset.from_list([{**ROW, "answer": "7"}] * 2),
        processing_class=tok,
        environment_factory=env.factory(FMT),
    )
    assert [tool.__name__ for tool in trainer.tools] == ["guess"] and trainer.reward_func_names == ["Guess"]


# --- TRL end to end -------------------------------------------------------------------------------------


@pytest.fixture
def one_thread():
    """Training on one thread: on 2 shared cores, two torch threads are several times slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _memorize(model_dir: Path, tok, out: Path) -> Path:
    """The tiny model trained to call python(print(17 * 23)) with EPISODE's tool call, then answer 391, so that
    its rollouts call the python tool and TRL's loop runs it in the sandbox."""
    episode = [*EPISODE[:2], {**EPISODE[2], "content": "391\n"}, EPISODE[3]]
    return memorize(model_dir, tok, out, episode, tools=[_python_tool()])


def test_trl_grpo_runs_the_python_environment_with_the_shipped_template(tiny_model, tok, tmp_path, one_thread):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    model_dir = _memorize(tiny_model, tok, tmp_path / "model")
    spec = check({"name": "python", "max_turns": 2}, tok)
    trainer = GRPOTrainer(
        model=str(model_dir),
        reward_funcs=[FinalAnswer()],
        args=GRPOConfig(
            output_dir=str(tmp_path / "out"),
            max_steps=1,
            per_device_train_batch_size=2,
            num_generations=2,
            max_completion_length=96,
            max_tool_calling_iterations=spec.max_tool_calling_iterations,
            temperature=0.1,
            learning_rate=1e-5,
            use_cpu=True,
            report_to=[],
            logging_steps=1,
            save_strategy="no",
            seed=0,
        ),
        train_dataset=Dataset.from_list([ROW] * 2),
        processing_class=AutoTokenizer.from_pretrained(model_dir),  # template + response template, as saved
        environment_factory=spec.factory(FMT),
    )
    assert trainer.chat_template is None  # TRL kept rung's template: no training template swapped in
    trainer.train()
    episodes = [env.episode for env in trainer.environments]
    assert all(e.tool_calls == 1 and e.tool_errors == 0 and e.unscored is None for e in episodes)
    assert all(e.answers == ["391"] and e.correct == [True] for e in episodes)
    logged = trainer.state.log_history[0]
    assert logged["tools/call_frequency"] == 1.0 and logged["tools/failure_frequency"] == 0.0
    assert logged["rewards/final_answer/mean"] == 1.0


def test_params_name_the_builtins_rung_envs_has():
    from rung.config import BUILTIN_ENVIRONMENTS
    from rung.envs import BUILTINS

    assert tuple(BUILTINS) == BUILTIN_ENVIRONMENTS


@pytest.mark.parametrize("chat_template", ["model", "tools"])
def test_the_model_stage_writes_the_tool_template_only_when_asked(tiny_model, tmp_path, chat_template):
    from rung.config import ModelParams
    from rung.envs import template
    from tasks.model import materialize

    out = tmp_path / "base"
    materialize.fn(ModelParams(source=str(tiny_model), chat_template=chat_template), out)
    saved = AutoTokenizer.from_pretrained(out)
    if chat_template == "tools":
        assert saved.chat_template == template.TEMPLATE and template.tool_calling_problem(saved) is None
    else:  # the model's own, untouched: no response template that would make TRL parse single-turn completions
        assert saved.chat_template == AutoTokenizer.from_pretrained(tiny_model).chat_template
        assert getattr(saved, "response_template", None) is None
