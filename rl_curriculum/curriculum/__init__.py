"""rl_curriculum.curriculum."""
