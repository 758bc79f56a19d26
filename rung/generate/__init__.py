"""Generation: one API (`api`) over rung's seeded decode loop, its compiled static-cache form on CUDA,
the prepacked CPU weights and the vLLM backend; used by difficulty, traces, eval and RL rollouts."""
