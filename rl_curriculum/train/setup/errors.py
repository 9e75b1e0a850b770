"""The error a config check raises (`validation`, `rollout_config`): one line naming the field."""

__all__ = ["ConfigError", "fail"]


class ConfigError(ValueError):
  """A config field has a value the run cannot use; the message names the field."""


def fail(field: str, message: str):
  """Raises ConfigError("config.<field>: <message>")."""
  raise ConfigError(f"config.{field}: {message}")
