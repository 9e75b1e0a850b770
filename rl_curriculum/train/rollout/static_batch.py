"""The static sampler's batch in the one rollout path: a synchronous step's prompts, sampled
whole when the step comes to finish it (`engines.run`), with the engine counters it adds."""

from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from rl_curriculum.parallel import distributed
from rl_curriculum.sampling import inflight
from rl_curriculum.train import programs as programs_lib

__all__ = ["StaticBatch", "sample"]


class StaticBatch(NamedTuple):
  """The static sampler's batch of a synchronous step: its prompts until `finish` samples it."""
  prompt_tokens: jax.Array          # i32[R, Tp] over the rows' batch axes
  prompt_mask: jax.Array            # bool[R, Tp]
  key: jax.Array                    # the step's sampling key
  active: Optional[jax.Array]       # bool[R] rows sampled (None: all)
  rows: Optional[inflight.Harvest]  # the sampled rows (None until `finish`)
  counters: np.ndarray              # i64[4] as `pipeline.engine_counters`


def sample(programs, engine: StaticBatch, params: Any, temperature,
           version: int = 0) -> StaticBatch:
  """The static batch sampled whole (`programs.sample`) by weights of `version`, with the engine
  counters it adds."""
  generation = programs_lib.sample(programs, params, engine.prompt_tokens,
                                   engine.prompt_mask, engine.key, temperature, engine.active)
  rollout = generation.rollout
  rows = inflight.Harvest(tokens=rollout.tokens, logprobs=rollout.logprobs, mask=rollout.mask,
                          versions=jnp.full(rollout.tokens.shape, version, jnp.int32),
                          done=jnp.ones(rollout.tokens.shape[0], bool))
  rows = jax.block_until_ready(rows)
  tokens = int(distributed.to_host(jnp.sum(rollout.mask)))
  slot_steps = int(distributed.to_host(generation.slot_steps))
  added = np.asarray([tokens, slot_steps, slot_steps // max(rollout.tokens.shape[0], 1), tokens],
                     np.int64)
  return engine._replace(rows=rows, counters=engine.counters + added)
