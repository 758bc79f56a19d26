"""rung: reproducible RL post-training of language models for reasoning."""

__version__ = "0.1.0"
