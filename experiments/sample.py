"""Sampling demo: `python -m experiments.sample --config configs/sample.py`.

Random-weight tiny transformer over bytes; prints completions and decode speed (see the config's
docstring for what to expect).
"""

import time

from absl import app
from absl import flags
from absl import logging
import jax
import jax.numpy as jnp
from ml_collections import config_flags
import numpy as np

from experiments import cli
from rl_curriculum.model import transformer
from rl_curriculum.model.config import PRESETS
from rl_curriculum.sampling import sampler

FLAGS = flags.FLAGS

# Byte-level vocabulary: ids 0..255 are bytes, then three specials.
PAD_ID, BOS_ID, EOS_ID = 256, 257, 258
VOCAB_SIZE = 259


def encode_batch(texts, width=None):
  """Left-padded [BOS] + UTF-8 bytes: (tokens i32[B, T], mask bool[B, T])."""
  rows = [[BOS_ID] + list(text.encode("utf-8")) for text in texts]
  width = width or max(len(r) for r in rows)
  tokens = np.full((len(rows), width), PAD_ID, np.int32)
  mask = np.zeros((len(rows), width), bool)
  for b, row in enumerate(rows):
    tokens[b, width - len(row):] = row
    mask[b, width - len(row):] = True
  return tokens, mask


def decode(tokens, mask) -> str:
  """Bytes of the counted tokens up to EOS, as printable text."""
  data = bytes(int(t) for t, m in zip(tokens, mask) if m and t < 256)
  text = data.decode("utf-8", errors="replace")
  return "".join(ch if ch.isprintable() else "." for ch in text)


def run(config) -> None:
  """Builds the model, samples twice (compile, then timed), prints completions and speed."""
  if config.preset not in PRESETS:
    raise ValueError(f"unknown preset {config.preset!r}; choose from {sorted(PRESETS)}")
  kwargs = dict(dtype=config.dtype, param_dtype=config.param_dtype)
  if config.preset == "tiny":
    kwargs["vocab_size"] = VOCAB_SIZE
  model_config = PRESETS[config.preset](**kwargs)
  if model_config.vocab_size < VOCAB_SIZE:
    raise ValueError(f"preset {config.preset!r} has fewer than {VOCAB_SIZE} tokens.")
  graphdef, params = transformer.init_model(model_config, seed=config.seed)
  print(f"model: {config.preset}, {model_config.num_params / 1e6:.2f}M parameters, "
        f"{config.dtype} activations, {config.param_dtype} parameters")

  prompts = list(config.prompts)
  rows = [prompts[i % len(prompts)] for i in range(config.batch_size)]
  tokens, mask = encode_batch(rows)
  settings = dict(max_new_tokens=config.max_new_tokens, eos_id=EOS_ID, pad_id=PAD_ID,
                  temperature=config.temperature, top_k=config.top_k, top_p=config.top_p,
                  greedy=config.greedy)
  root = jax.random.key(config.seed)

  start = time.perf_counter()
  rollout = sampler.sample(graphdef, params, jnp.asarray(tokens), jnp.asarray(mask),
                           jax.random.fold_in(root, 0), **settings)
  jax.block_until_ready(rollout)
  compile_s = time.perf_counter() - start
  start = time.perf_counter()
  rollout = sampler.sample(graphdef, params, jnp.asarray(tokens), jnp.asarray(mask),
                           jax.random.fold_in(root, 1), **settings)
  jax.block_until_ready(rollout)
  run_s = time.perf_counter() - start

  out_tokens, out_mask = np.asarray(rollout.tokens), np.asarray(rollout.mask)
  for p, prompt in enumerate(prompts):
    print(f"\nprompt {prompt!r}")
    for b in range(p, config.batch_size, len(prompts))[:config.show_per_prompt]:
      logp = float(np.asarray(rollout.logprobs)[b].sum())
      print(f"  [{int(out_mask[b].sum()):3d} tokens, log-prob {logp:8.2f}] "
            f"{decode(out_tokens[b], out_mask[b])}")
  new_tokens = int(out_mask.sum())
  print(f"\nfirst call (compiles prefill and decode): {compile_s:.2f} s")
  print(f"decode: {new_tokens} new tokens in {run_s:.3f} s = {new_tokens / run_s:.0f} tokens/s "
        f"(batch {config.batch_size}, prompt length {tokens.shape[1]}, "
        f"max_new_tokens {config.max_new_tokens})")


def define_flags() -> None:
  """The command's flags; defined when it runs, so that importing this module defines none."""
  config_flags.DEFINE_config_file("config", None, "Sampling demo config file.",
                                  lock_config=True)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  logging.set_verbosity(logging.WARNING)  # keeps backend-probing INFO lines out of the output
  run(FLAGS.config)


if __name__ == "__main__":
  define_flags()
  app.run(main, flags_parser=cli.parse_flags)
