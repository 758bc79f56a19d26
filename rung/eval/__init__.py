"""Evaluation: grading a checkpoint's completions on each held-out set, the metrics (pass@k, maj@k,
avg@n with bootstrap intervals) and the paired statistics between two checkpoints or arms."""
