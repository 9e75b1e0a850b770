"""The prompt features PCL's value model reads: the policy's view of each pool prompt.

  pool = curriculum_pool(config, run)        # the RL pool, with the features under PCL
  state = refresh_features(config, run, step, state, replicated)   # every features_every steps

Reference: Gao et al. (2025), "Prompt Curriculum Learning for Efficient LLM Post-Training",
arXiv:2510.01135. The features are the policy's mean-pooled final hidden states; they are computed
at the start of a run and, so that the value model follows the policy rather than the warm start,
recomputed every `curriculum.features_every` steps.
"""

from typing import Any

import jax.numpy as jnp
import ml_collections
import numpy as np

from rl_curriculum import curriculum as cur
from rl_curriculum.parallel import distributed
from rl_curriculum.train.learn import forward
from rl_curriculum.train.setup.prepare import Prepared
from rl_curriculum.train.state import RunState

__all__ = ["pool_features", "curriculum_pool", "refresh_features"]


def pool_features(config: ml_collections.ConfigDict, run: Prepared, trainable: Any,
                  frozen: Any) -> np.ndarray:
  """f32[N, D] the pool prompts' features under the policy (trainable, frozen): its mean-pooled
  final hidden states, computed `config.curriculum.features_batch_size` prompts at a time."""
  return forward.prompt_features(run.model.graphdef, forward.model_params(trainable, frozen),
                                 run.pool.tokens, run.pool.mask,
                                 batch_size=config.curriculum.features_batch_size)


def curriculum_pool(config: ml_collections.ConfigDict, run: Prepared) -> cur.PromptPool:
  """The pool the curriculum selects from: the RL pool's prompts and arms, with PCL's features
  of the starting policy."""
  pool = run.pool.prompt_pool()
  if config.curriculum.name == "pcl":
    pool = pool.with_features(pool_features(config, run, run.model.trainable, run.model.frozen))
  return pool


def refresh_features(config: ml_collections.ConfigDict, run: Prepared, step: int,
                     state: RunState, replicated: Any) -> RunState:
  """`state` with PCL's features of the current policy every `curriculum.features_every` steps
  (0: never; other curricula: never)."""
  every = config.curriculum.features_every
  if config.curriculum.name != "pcl" or every <= 0 or step % every:
    return state
  features = pool_features(config, run, state.train.params, state.base)
  curriculum = state.curriculum._replace(
      features=distributed.place(jnp.asarray(features), replicated))
  return state._replace(curriculum=curriculum)
