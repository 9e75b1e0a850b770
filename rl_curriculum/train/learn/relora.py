"""LoRA merged into the base and restarted every `model.lora_merge_every` RL steps (ReLoRA).

Reference: Lialin et al. (2023), "ReLoRA: High-Rank Training Through Low-Rank Updates",
arXiv:2307.05695. Each merge folds the adapters' rank-r update into the base weights and starts
new adapters, so the updates of successive periods add up to a change of rank above r.

  merge = relora.make_merge(optimizer, state_shardings, base_shardings)
  state, metrics = relora.maybe_merge(config, step, root, state, merge)   # state: a RunState

What a merge changes, and what it keeps:

  function    unchanged: W x + s (x A) B with W' = W + s A B and B = 0 afterwards
              (`lora.merge_and_reinit`); A is redrawn from its initial distribution.
  base        the targeted kernels hold the merged weights. Checkpoints then hold the base
              (`state.checkpoint_tree`), and a resumed run restores it instead of rebuilding it
              from the warm start.
  optimizer   restarted, as in ReLoRA: the Adam moments of the old A and B describe directions
              that no longer exist, so the whole optax state (step count included) is
              `optimizer.init` again. With PPO the value head shares that state and restarts too.
              (ReLoRA prunes 99% of the moments and warms the learning rate up again; here the
              moments are reset and the learning rate is unchanged.)
  reference   under LoRA the KL reference is the model with its adapters off, which after a
              merge is the merged base: `rl.kl_coef` and `rl.kl_reward_coef` then measure the
              distance to the policy at the last merge, not to the warm start. Keeping the warm
              start as the reference would need a second copy of the base weights, which LoRA's
              reference exists to avoid.
  keys        A is drawn from fold_in(fold_in(root, step), MERGE_STREAM), which no other draw of
              the step uses (the step's four keys are `split`, not `fold_in`, of the same key).
"""

from typing import Any, Callable

import jax
import ml_collections
import optax
from flax import nnx

from rl_curriculum.model import lora as lora_lib
from rl_curriculum.train.state import RunState, TrainState

__all__ = ["MERGE_STREAM", "due", "merge_key", "merge", "make_merge", "maybe_merge"]

MERGE_STREAM = 0x4D455247  # fold_in data of the merge keys ("MERG")


def due(config: ml_collections.ConfigDict, step: int) -> bool:
  """Whether RL step `step` (counted from 1) ends with a merge: every `lora_merge_every` steps."""
  every = config.model.lora_merge_every
  return every > 0 and step % every == 0


def merge_key(root: jax.Array, step: int) -> jax.Array:
  """The key the merge after step `step` redraws A with."""
  return jax.random.fold_in(jax.random.fold_in(root, step), MERGE_STREAM)


def merge(train_state: TrainState, base: Any, key: jax.Array, *,
          optimizer: optax.GradientTransformation) -> tuple[TrainState, Any]:
  """(train_state, base) after merging the adapters `train_state.params` into `base`.

  The adapters keep their tree (B f32[..., r, *out] = 0, A f32[..., *in, r] redrawn with `key`,
  `lora.merge_and_reinit`), the base its tree with the targeted kernels W + (alpha / r) A . B; the
  optimizer state is `optimizer.init` of the trained parameters (with a PPO value head, of
  (adapters, value)). The step and skip counters, the reward whitening and the value head are
  kept.
  """
  merged = lora_lib.merge_and_reinit(nnx.merge_state(train_state.params, base), key)
  adapters, base = nnx.split_state(merged, lora_lib.LoRAWeight, ...)
  trained = adapters if train_state.value is None else (adapters, train_state.value)
  return train_state._replace(params=adapters, opt_state=optimizer.init(trained)), base


def make_merge(optimizer: optax.GradientTransformation, state_shardings: Any,
               base_shardings: Any) -> Callable:
  """`merge` jitted: fn(train_state, base, key) -> (train_state, base), both donated, the
  results laid out as the loop keeps them (`state_shardings`, `base_shardings`)."""

  def fn(train_state, base, key):
    return merge(train_state, base, key, optimizer=optimizer)

  return jax.jit(fn, donate_argnums=(0, 1), out_shardings=(state_shardings, base_shardings))


def maybe_merge(config: ml_collections.ConfigDict, step: int, root: jax.Array, state: RunState,
                merge_fn: Callable) -> tuple[RunState, dict]:
  """(state, metrics) after step `step`: the train state and the base merged by `merge_fn` when
  `due`. The metric "lora_merged" (1.0 on a step that merged, else 0.0) exists when merging is
  configured."""
  if config.model.lora_merge_every <= 0:
    return state, {}
  merged = due(config, step)
  if merged:
    train, base = merge_fn(state.train, state.base, merge_key(root, step))
    state = state._replace(train=train, base=base)
  return state, {"lora_merged": float(merged)}
