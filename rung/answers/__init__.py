"""Answers: the format a completion must follow (styles, templates, system prompts), extracting the
final answer from it, and grading that answer against the gold (math-verify, reasoning-gym scorers)."""
