"""Rewards a model learns: a Bradley-Terry reward model on preference pairs and a process reward model on
Monte-Carlo step labels; the pairs and labels they train on, their held-out metrics, and the loaders a later
stage scores completions with (docs/reward_models.md)."""
