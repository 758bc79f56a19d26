"""`python`: a `python(code)` tool that runs the model's code in rung.sandbox, with the limits code rewards
run under (rung.answers.verify.CODE_LIMITS), and returns what it printed, cut to `max_output` characters.

- The model's errors (an exception, a syntax error, a time-out, memory, an output flood, a hostile call) come
  back as the tool's text and the episode goes on: the sandbox contains them.
- The sandbox's own failure (bwrap did not start, the sandbox module raised) is the grader's: the episode is
  unscored (left out of training and evaluation), never a wrong answer.
- The final answer (the last assistant message) is graded by the task's own verifier: rung.envs.FinalAnswer
  as a reward function (TRL shows an environment its tool calls only, never the final answer).
"""

from __future__ import annotations

import ast
from typing import Any

from pydantic import Field

from rung import sandbox
from rung.answers import verify
from rung.answers.rows import problem
from rung.config import FormatParams
from rung.config.base import Section
from rung.envs.episode import Episode

ENTRY = "_rung_tool"
"""The sandbox grades a program by calling a function of it; the tool's program defines this empty one."""


class PythonSettings(Section):
    """environment.settings of `python`."""

    max_output: int = Field(1000, ge=16, le=10_000)
    """Characters of a tool result the model reads back (stdout, stderr and the error); more is cut off,
    with a note saying how much. Every character is paid again in the rest of the episode's context: up to
    about 3 tokens each (1,000 emoji are 3,022 tokens); a result past the episode's token budget ends it."""


def _program(code: str) -> str:
    """The code with its last bare expression's value printed, as a notebook cell shows it (models write
    `17 * 23` and expect 391); the code unchanged if it does not parse (the sandbox reports the error)."""
    try:
        tree = ast.parse(code)
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            show = ast.parse("if _ is not None:\n    print(repr(_))").body
            tree.body[-1:] = [ast.Assign([ast.Name("_", ast.Store())], tree.body[-1].value), *show]
            code = ast.unparse(ast.fix_missing_locations(tree))
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        pass
    return f"{code}\n\n\ndef {ENTRY}():\n    return None\n"


class Python:
    """The python tool's environment; one instance per rollout (TRL's contract), reused through `reset`."""

    def __init__(self, fmt: FormatParams, max_turns: int, settings: PythonSettings | None = None):
        self.fmt, self.max_turns = fmt, max_turns
        self.settings = settings or PythonSettings()
        self.episode: Episode | None = None

    def reset(self, **columns: Any) -> None:
        """A new episode for one dataset row (TRL passes the row's columns); nothing is added to the prompt."""
        self.episode = Episode(problem(columns), self.fmt)

    def python(self, code: str) -> str:
        """Run Python code in a sandbox and return what it prints. The value of a last bare expression is
        printed too, as in a notebook.

        Args:
            code: The Python code to run, for example `print(17 * 23)`.

        Returns:
            The printed output, then the error if the code failed.
        """
        episode = self.episode
        assert episode is not None, "reset() starts an episode before any tool call"
        episode.tool_calls += 1
        if not isinstance(code, str):  # a model's call may carry any JSON
            episode.tool_errors += 1
            return f"Error: code must be a string, got {type(code).__name__}"
        try:
            result = sandbox.run(sandbox.Program(_program(code), "", ENTRY), verify.CODE_LIMITS)
            why = result.detail
        except Exception as e:  # noqa: BLE001 - whatever the sandbox itself raises is the grader's failure
            result = None
            why = f"{type(e).__name__}: {e}"
        if result is None or not result.scored:
            episode.unscored = episode.unscored or f"the code sandbox failed: {why}"
            return "Error: the sandbox failed to run the code (not the code's fault)"
        output = result.stdout + result.stderr
        if result.passed:
            return self._cut(output)
        episode.tool_errors += 1
        error = f"Error ({result.verdict}): {result.detail}"
        # the error line is kept whole: the output before it is what gets cut
        output = self._cut(output, self.settings.max_output - len(error) - 1)
        sep = "" if not output or output.endswith("\n") else "\n"
        return f"{output}{sep}{error}"

    def _cut(self, text: str, limit: int | None = None) -> str:
        limit = max(0, self.settings.max_output if limit is None else limit)
        return text if len(text) <= limit else f"{text[:limit]}\n[... {len(text) - limit} more characters]\n"
