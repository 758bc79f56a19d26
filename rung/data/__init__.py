"""Data: the sources (reasoning-gym generators, local files, Hugging Face datasets), the curated row,
filtering and mixing into the train and held-out splits, difficulty labels, and SFT traces."""
