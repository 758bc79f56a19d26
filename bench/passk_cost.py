"""The cost of the sampled evaluation's statistics at n samples per prompt: maj@k
(rung.eval.metrics.maj_at_ks) and the paired bootstrap of pass@k (rung.eval.paired.sampled_test) at
the k of the spectrum (powers of two up to n, and eval.samples.compare_k), against the same two at
every k = 1..n, as rung computed them before (O(prompts * n^2) vote insertions, n bootstraps).

Synthetic records: each prompt's samples are right with its own rate and answer one of a few
strings (so votes are not trivial); the grader is string equality. Seconds on this machine, one
run each; compare the ratio, not seconds across runs.

    python bench/passk_cost.py                  # n = 256, 100 prompts
    python bench/passk_cost.py --n 1024 --prompts 50
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from rung.eval import metrics, paired


def records(prompts: int, n: int, seed: int) -> list[dict[str, Any]]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(prompts):
        right = rng.random(n) < rng.beta(1, 2)
        wrong = rng.integers(1, 6, size=n)
        samples = [
            {"extracted": "0" if ok else str(w), "correct": bool(ok)} for ok, w in zip(right, wrong, strict=True)
        ]
        out.append({"id": str(i), "samples": samples})
    return out


def timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=256, help="samples per prompt")
    parser.add_argument("--prompts", type=int, default=100)
    parser.add_argument("--resamples", type=int, default=1000)
    parser.add_argument("--compare-k", type=int, nargs="*", default=[1], help="eval.samples.compare_k")
    args = parser.parse_args()
    old, new = records(args.prompts, args.n, 0), records(args.prompts, args.n, 1)
    votes = [[(s["extracted"], s["correct"]) for s in r["samples"]] for r in new]
    spectrum = metrics.spectrum_ks(args.n, args.compare_k)
    every = list(range(1, args.n + 1))
    print(f"n = {args.n}, {args.prompts} prompts, {args.resamples} resamples; spectrum k: {spectrum}")
    for what, ks in (("spectrum k", spectrum), ("every k", every)):
        maj = timed(lambda ks=ks: metrics.maj_at_ks(votes, ks))
        # maj_at_ks counts all k in one pass; before, every k recounted its first k samples
        recount = timed(lambda ks=ks: [metrics.maj_at_k(votes, k) for k in ks])
        test = timed(lambda ks=ks: paired.sampled_test(old, new, 0.95, args.resamples, 0, "bench", ks))
        print(
            f"{what:>10} ({len(ks):4d} k): maj@k one pass {maj:7.2f} s, recounted per k {recount:7.2f} s; "
            f"sampled_test {test:7.2f} s"
        )


if __name__ == "__main__":
    main()
