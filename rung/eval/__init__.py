"""Evaluation: grading a checkpoint's completions on each held-out set, the metrics (pass@k, maj@k,
avg@n with bootstrap intervals), the paired tests between two checkpoints or arms, the pipeline's
comparisons of checkpoints, and the typed results all of them return (results.py)."""
