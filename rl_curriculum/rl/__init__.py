"""rl_curriculum.rl."""
