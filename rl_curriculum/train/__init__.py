"""rl_curriculum.train."""
