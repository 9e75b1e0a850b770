"""What an RL run carries from one step to the next, and what of it a checkpoint holds.

  train = init_train_state(trainable, optimizer, value_head, temperature=rl.temperature)
  state = RunState(train=train, curriculum=..., base=frozen, prompts=..., health=...)
  tree = checkpoint_tree(config, state)          # the arrays a checkpoint saves
  state = with_checkpoint(state, restored_tree)  # the same state after a restore

`RunState` is the one value the loop threads through its steps: checkpointing, resume, the
rollback to a healthy checkpoint (`recovery`) and ReLoRA's merges (`relora`) take it and return it
whole, so a part of the state cannot be restored without the others.
"""

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import optax

from rl_curriculum.rl import stability

__all__ = ["TrainState", "init_value_head", "init_train_state", "RunState", "checkpoint_tree",
           "with_checkpoint"]


class TrainState(NamedTuple):
  """Everything the optimizer owns; saved in every checkpoint."""
  step: jax.Array                        # i32[] RL updates attempted
  params: Any                            # trainable parameters (full model or LoRA adapters)
  opt_state: Any                         # optax state of `params` (of (params, value) with PPO)
  whitening: stability.WhiteningState    # running reward statistics
  skipped: jax.Array                     # i32[] updates discarded by the stability checks
  value: Any = None                      # PPO value head {"w": f32[D], "b": f32[]}, else None
  temperature: Any = None                # f32[] the next rollout's sampling temperature
                                         # (`init_train_state` sets rl.temperature; it moves
                                         # only under the adaptive controller), or None


def init_value_head(width: int) -> dict:
  """PPO's value head on the policy's final hidden states f32[..., D = width]: v = h . w + b,
  starting at 0."""
  return {"w": jnp.zeros((width,), jnp.float32), "b": jnp.zeros((), jnp.float32)}


def init_train_state(params: Any, optimizer: optax.GradientTransformation,
                     value: Any = None, temperature: float = 1.0) -> TrainState:
  """A fresh train state (`value`: a value head for PPO; `temperature`: the first rollout's
  sampling temperature, rl.temperature). Every leaf is a private copy: the learn step donates the
  whole state, so it must share no buffer with anything else (the KL reference is often the same
  weights)."""
  trained = params if value is None else (params, value)
  state = TrainState(step=jnp.zeros((), jnp.int32), params=params,
                     opt_state=optimizer.init(trained), whitening=stability.whitening_init(),
                     skipped=jnp.zeros((), jnp.int32), value=value,
                     temperature=stability.temperature_init(temperature).temperature)
  return jax.tree.map(lambda x: jnp.array(x, copy=True), state)


class RunState(NamedTuple):
  """Everything an RL run carries from one step to the next."""
  train: TrainState   # parameters, optimizer state, reward whitening, counters, temperature
  curriculum: Any     # the curriculum's state, its data cursors included
  base: Any           # the frozen weights under LoRA (ReLoRA merges into them), else None
  prompts: Any        # per-prompt statistics (`prompt_stats.PromptStats`) when a method reads
                      # them (`budget.needs_prompt_stats`), else None
  health: Any         # `recovery.Health`: host-side skip streak, origin and rollbacks
  rollouts: Any = None  # rollouts in flight across steps (`pipeline.InFlight`: the engine's
                        # rows and each batch's records); None: each step samples its own
  horizon: Any = None   # episodes: the horizon curriculum's state (`curriculum.horizon`), else
                        # None


def checkpoint_tree(config: ml_collections.ConfigDict, state: RunState) -> dict:
  """The arrays a checkpoint holds: the train and curriculum states; the per-prompt statistics
  when the run keeps them; the base weights under LoRA merging (`model.lora_merge_every` > 0),
  which changes them (otherwise the base is the warm start's, which a resumed run rebuilds); and
  the rollouts in flight, when there are any. `health` goes into the checkpoint's metadata
  (`recovery.meta`)."""
  tree = {"train": state.train, "curriculum": state.curriculum}
  if state.prompts is not None:
    tree["prompts"] = state.prompts
  if config.model.lora_merge_every > 0:
    tree["base"] = state.base
  if state.rollouts is not None:
    tree["rollouts"] = state.rollouts
  if state.horizon is not None:
    tree["horizon"] = state.horizon
  return tree


def with_checkpoint(state: RunState, tree: dict) -> RunState:
  """`state` with the parts a restored `checkpoint_tree` holds put back (health unchanged)."""
  return state._replace(train=tree["train"], curriculum=tree["curriculum"],
                        prompts=tree.get("prompts", state.prompts),
                        base=tree.get("base", state.base),
                        rollouts=tree.get("rollouts", state.rollouts),
                        horizon=tree.get("horizon", state.horizon))
