"""The pipeline's comparisons of checkpoints: which pairs are compared (sft against base, each RL
stage against its init and against base, each episode-trained RL stage against its single-turn
control) and their paired tests (rung.eval.paired) on the per-prompt eval records under data/eval.
The report stage writes and renders the result (rung.report.pipeline); nothing here formats text."""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING, cast

from rung import files, paths
from rung.eval import paired
from rung.eval.results import Comparison, Comparisons, EvalRecord, GreedyTest

if TYPE_CHECKING:
    from rung.config import Params


def episode_trained(params: Params) -> list[str]:
    """The RL stages that trained episodes (params.environment_of(stage) is set), in params order."""
    return [name for name in params.rl.stages if params.environment_of(name)]


def single_turn_controls(rl_inits: dict[str, str], episodic: Collection[str]) -> list[tuple[str, str]]:
    """(episode-trained, single-turn) RL checkpoints with the same init: each RL stage that trained episodes
    (`episodic`: episode_trained) against every stage that trained single-turn from the same checkpoint, its
    control (in an experiment with an environment, a stage with `rl.stages.<name>.environment: false`); in
    params order."""
    return [
        (f"rl/{name}", f"rl/{other}")
        for name, init in rl_inits.items()
        if name in episodic
        for other, other_init in rl_inits.items()
        if other not in episodic and other_init == init
    ]


def same_init_rivals(rl_inits: dict[str, str], preference: Collection[str]) -> list[tuple[str, str]]:
    """(preference-trained, other) RL checkpoints with the same init: each dpo / kto / online_dpo stage
    (`preference`) against every other RL stage that started from the same checkpoint (is GRPO better than DPO on
    the same samples?); two preference stages once, the later against the earlier; in params order."""
    names = list(rl_inits)
    return [
        (f"rl/{name}", f"rl/{other}")
        for name in names
        if name in preference
        for other in names
        if other != name
        and rl_inits[other] == rl_inits[name]
        and not (other in preference and names.index(other) > names.index(name))
    ]


def pairs(
    rl_inits: dict[str, str], episodic: Collection[str] = (), preference: Collection[str] = ()
) -> list[tuple[str, str]]:
    """(new, old) checkpoints to compare: sft against base, every RL stage against the checkpoint it
    started from and against base, each episode-trained RL stage (`episodic`) against its single-turn
    controls (single_turn_controls), and each preference-trained one (`preference`) against the other RL stages
    of its init (same_init_rivals); each pair once, in pipeline order."""
    out = [("sft", "base")]
    for name, init in rl_inits.items():
        out += [(f"rl/{name}", init), (f"rl/{name}", "base")]
    out += single_turn_controls(rl_inits, episodic)
    out += same_init_rivals(rl_inits, preference)
    return list(dict.fromkeys(out))


ANSWERS = "Holm over 2: final and first answers"
"""The family of an episode comparison's two McNemar tests on one set (same prompts, same checkpoints)."""


def one_family(tests: list[GreedyTest], alpha: float, family: str) -> list[GreedyTest]:
    """Tests of one set held to `alpha` together (Holm): each its adjusted p, verdict and, when not
    significant, prompts needed at the family's strictest level."""
    strict = alpha / len(tests)
    out = []
    for t, p in zip(tests, paired.holm([t.mcnemar_p for t in tests]), strict=True):
        significant = p < alpha
        fields = {k: v for k, v in t.dump().items() if k != "prompts_needed"}
        fields |= {"p_adjusted": p, "family": family, "significant": significant}
        fields["verdict"] = paired.verdict(significant, alpha, t.test)
        if not significant:
            fields["prompts_needed"] = paired.mcnemar_prompts_needed(t.right_to_wrong, t.wrong_to_right, t.n, strict)
        out.append(GreedyTest.model_validate(fields))
    return out


def _records(checkpoint: str, name: str) -> list[EvalRecord] | None:
    path = paths.EVAL / paths.checkpoint_slug(checkpoint) / name
    return cast(list[EvalRecord], files.read_jsonl(path)) if path.is_file() else None


def comparisons(
    pairs: list[tuple[str, str]], confidence: float, resamples: int, seed: int, compare_k: list[int] | None = None
) -> Comparisons:
    """Paired comparisons of each (new, old) pair on every eval set both were evaluated on, from
    the per-prompt records under data/eval: greedy accuracy (paired bootstrap, flips, exact
    McNemar; with episodes also of the first answers, the two one family: one_family) and, where
    both have samples, avg@n and pass@k (paired bootstrap) and the coverage boundary; `compare_k`
    (eval.samples.compare_k) are the k the report's tables show."""
    out: dict[str, Comparison[GreedyTest]] = {}
    for new, old in pairs:
        sets: dict[str, GreedyTest] = {}
        names = sorted(
            p.stem for p in (paths.EVAL / paths.checkpoint_slug(new)).glob("*.jsonl") if not p.stem.endswith(".samples")
        )
        for name in sorted(names, key=lambda n: (n != "test", n)):  # the held-out split first
            greedy_old, greedy_new = _records(old, f"{name}.jsonl"), _records(new, f"{name}.jsonl")
            if greedy_old is None or greedy_new is None:
                continue
            what = f"{new} vs {old} on {name}"
            sets[name] = paired.greedy_test(greedy_old, greedy_new, confidence, what)
            if all("episode" in r["samples"][0] for r in [*greedy_old, *greedy_new]):
                first = paired.first_answer_test(greedy_old, greedy_new, confidence, f"{what} (first answers)")
                # two tests of one pair on one set: held to the level together
                sets[name], first = one_family([sets[name], first], paired.level(confidence), ANSWERS)
                sets[name].first_answer = first
            sampled_old, sampled_new = _records(old, f"{name}.samples.jsonl"), _records(new, f"{name}.samples.jsonl")
            if sampled_old and sampled_new:
                sets[name].sampled = paired.sampled_test(
                    sampled_old, sampled_new, confidence, resamples, seed, f"{what} (samples)", compare_k or ()
                )
        out[paired.key(new, old)] = Comparison[GreedyTest](new=new, old=old, sets=sets)
    return Comparisons(
        level=paired.level(confidence),
        confidence=confidence,
        resamples=resamples,
        seed=seed,
        **({"compare_k": compare_k} if compare_k else {}),  # unset stays out of the file (Result.dump)
        comparisons=out,
    )
