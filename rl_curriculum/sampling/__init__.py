"""rl_curriculum.sampling."""
