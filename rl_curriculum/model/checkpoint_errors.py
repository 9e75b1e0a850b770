"""The error both checkpoint formats (`hf_io`, `gguf_io`) raise for what the transformer lacks."""

from typing import Iterable


class UnsupportedCheckpointError(ValueError):
  """The checkpoint's architecture or one of its options is not implemented here."""


def unsupported_architecture(name: str, supported: Iterable[str]) -> UnsupportedCheckpointError:
  """The error for an architecture outside `supported`; the message lists the supported ones."""
  return UnsupportedCheckpointError(
      f"architecture {name!r} is not supported; supported: {', '.join(supported)} "
      "(Llama incl. SmolLM2 and Llama 3, Qwen2/Qwen2.5, Qwen3).")
