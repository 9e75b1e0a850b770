"""rl_curriculum.model."""
