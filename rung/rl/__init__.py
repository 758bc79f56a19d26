"""RL: TRL's GRPO / RLOO trainers with rung's curriculum sampling and dynamic-sampling refill, the
shared-prefix rollouts, the reward functions and the curricula."""
