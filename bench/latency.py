"""How long three behaviours take whose outcome the suite checks without a clock (a wall-time assertion fails on
a loaded machine and says nothing a verdict does not):

- refused before any compute (tests/test_vllm.py): a missing or wrong vLLM interpreter, a vLLM outside the
  supported range and bad `generation.vllm` settings, each refused in one line before a model loads;
- a sandbox started ahead counts from its program's delivery (tests/test_sandbox.py): the seconds of a one-line
  program whose sandbox started while another program slept to its wall limit;
- a turn's tool calls stop at its wall budget (tests/test_episodes.py): a turn asking for three 0.3 s naps with
  0.4 s of tool time runs two.

    python bench/latency.py [--repeat 5]

Prints the median and range of --repeat runs; nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import stat
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from transformers import AutoTokenizer  # noqa: E402

from rung import config, sandbox  # noqa: E402
from rung.config import SamplingParams, VllmParams  # noqa: E402
from rung.config.base import ConfigError  # noqa: E402
from rung.envs import template  # noqa: E402
from rung.envs.loop import run  # noqa: E402
from rung.errors import InputError  # noqa: E402
from rung.generate import api  # noqa: E402
from rung.generate import vllm as vllm_backend  # noqa: E402
from tests.tiny_model import build  # noqa: E402
from tests.tools import Sleeper  # noqa: E402


def refusals(model: Path, fake_vllm: Path) -> float:
    """Seconds to refuse tests/test_vllm.py's bad vLLM inputs."""
    start = time.perf_counter()
    refused = [
        lambda: api.load(model, "float32", backend="vllm", vllm_params=VllmParams(python="no/bin/python")),
        lambda: vllm_backend.check(VllmParams(python=sys.executable)),  # rung's own environment: no vllm
        lambda: vllm_backend.check(VllmParams(python=str(fake_vllm))),
        *(
            lambda bad=bad: config.parse({"generation": {"backend": "vllm", "vllm": bad}}, "params.yaml")
            for bad in ({"gpu_memory_utilization": 1.5}, {"gpu_memory_utilization": 0}, {"max_model_len": 0})
        ),
    ]
    for call in refused:
        try:
            call()
        except (InputError, ConfigError):
            continue
        raise SystemExit("a bad vLLM input was not refused: tests/test_vllm.py fails too")
    return time.perf_counter() - start


def started_ahead() -> float:
    """Seconds of a one-line program whose sandbox started while the one before slept to its wall limit."""
    sleeper = sandbox.Program("import time\ndef f():\n    time.sleep(5)\n", "f()\n", "f")
    quick = sandbox.Program("def f():\n    return 1\n", "assert f() == 1\n", "f")
    _, fine = sandbox.run_many([sleeper, quick], workers=1, limits=sandbox.Limits(wall=1))
    if not fine.passed:
        raise SystemExit(f"the program started ahead did not pass: {fine.detail}")
    return fine.seconds


class Scripted:
    """The model's side: each turn says the script's next text, then the end-of-turn token."""

    def __init__(self, tok, script: list[str]):
        self.tok, self.script = tok, script

    def __call__(self, ids, keys, sampling, seed):
        said = [self.tok.encode(self.script[key[-1]], add_special_tokens=False) for key in keys]
        return [([*tokens, self.tok.eos_token_id], False) for tokens in said]


def napping_turn(tok) -> float:
    """Seconds of an episode whose first turn asks for three 0.3 s naps with 0.4 s of tool time."""
    nap = '<tool_call>\n{"name": "nap", "arguments": {"seconds": 0.3}}\n</tool_call>'
    row = {"prompt": [{"role": "user", "content": "What is 17 * 23?"}], "answer": "391"}
    start = time.perf_counter()
    (episode,) = run(
        Scripted(tok, [nap * 3, "Answer: 391"]),
        tok,
        [Sleeper()],
        [row],
        sampling=SamplingParams(temperature=0, max_new_tokens=200),
        seed=0,
        max_turns=2,
        turn_seconds=0.4,
    )
    seconds = time.perf_counter() - start
    if episode.turns[0]["tool_results"][:2] != ["rested", "rested"] or episode.turns[0]["tool_errors"] != 1:
        raise SystemExit(f"the turn did not stop at its tool time: {episode.turns[0]['tool_results']}")
    return seconds


def report(name: str, claim: str, measure: Callable[[], float], repeat: int) -> None:
    times = sorted(measure() for _ in range(repeat))
    print(f"| {name} | {statistics.median(times):.2f} | {times[0]:.2f}-{times[-1]:.2f} | {claim} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    sandbox.check()
    with tempfile.TemporaryDirectory() as tmp:
        model = build(Path(tmp) / "model")
        fake = Path(tmp) / "python"  # an interpreter whose vLLM is too new for the supported range
        fake.write_text("#!/bin/sh\necho 0.33.0\n")
        fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
        tok = template.apply(AutoTokenizer.from_pretrained(model))
        print("| behaviour | median s | range s | the tests asserted before |\n|---|---|---|---|")
        report("bad vLLM inputs refused (6)", "< 10", lambda: refusals(model, fake), args.repeat)
        report("a program started ahead, from its delivery", "< 1", started_ahead, args.repeat)
        report("a turn of 3 naps of 0.3 s, 0.4 s of tool time", "< 1.4", lambda: napping_turn(tok), args.repeat)


if __name__ == "__main__":
    main()
