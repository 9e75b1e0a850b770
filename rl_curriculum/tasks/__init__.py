"""rl_curriculum.tasks."""
