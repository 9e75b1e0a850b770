"""rl_curriculum.parallel."""
