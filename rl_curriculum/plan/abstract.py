"""The abstract inputs of a run's programs, as the planner lowers them: shapes and shardings, no
values (`Inputs`, from the loop's own builder, `programs.build`), and the measure of one program
(`measure_program`: `measure.measure` with the target's chip).

  inputs = abstract_inputs(config, model, mesh, prompt_len=256, chip=chip, hbm_gib=15.75)
  batch = abstract_batch(config, inputs)          # the learn step's batch
  policy = engine_policy(config, inputs)          # what the engine decodes with
"""

from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from rl_curriculum import curriculum as cur
from rl_curriculum.parallel import mesh as mesh_lib
from rl_curriculum.parallel import rollout_layout
from rl_curriculum.plan import measure
from rl_curriculum.plan import targets
from rl_curriculum.train import programs as programs_lib
from rl_curriculum.train.learn.rl_types import Batch
from rl_curriculum.train.rollout import budget, pipeline
from rl_curriculum.train.rollout import checks as rollout_checks
from rl_curriculum.train.setup import builders
from rl_curriculum.train.setup import prepare

GIB = targets.GIB


def _pool(config: ml_collections.ConfigDict) -> cur.PromptPool:
  """A stand-in RL pool: train_per_bin prompts in each of the config's arms, with one stand-in
  feature per prompt (PCL's value model reads features; other curricula ignore them)."""
  arms = builders.num_arms(config)
  pool = cur.PromptPool.from_arms(np.repeat(np.arange(arms), config.task.train_per_bin))
  return pool.with_features(np.zeros((len(pool.arms), 1), np.float32))


class Inputs(NamedTuple):
  """A planned run's abstract inputs (shapes and shardings, no values)."""
  programs: programs_lib.Programs
  state: Any         # the run state (`programs.abstract`)
  ref: Any           # the KL reference's weights, or None
  key: Any
  prompt_len: int
  chip: Optional[targets.Chip] = None   # the TPU chip compiled for (None: CPU devices)


def abstract_inputs(config: ml_collections.ConfigDict, model: programs_lib.Model, mesh, *,
                    prompt_len: int, chip: Optional[targets.Chip] = None,
                    hbm_gib: Optional[float] = None) -> Inputs:
  """The run's programs (`programs.build`, as the loop builds them, the rollout layout resolved
  for devices of `hbm_gib`) and the abstract run state and reference they take, laid out as the
  loop places them."""
  pool = _pool(config)
  device_bytes = None if hbm_gib is None else int(hbm_gib * GIB)
  programs = programs_lib.build(config, model, mesh, pool,
                                programs_lib.TokenIds(eos_id=1, pad_id=0),
                                prepare.rollout_mesh(config, mesh, model, device_bytes))
  state = jax.eval_shape(
      lambda trainable, frozen: programs_lib.init_run_state(
          config, programs, model._replace(trainable=trainable, frozen=frozen), pool,
          jax.random.key(0))._replace(health=None),
      model.trainable, model.frozen)
  ref = programs_lib.reference(config, model)
  key = jax.eval_shape(lambda: jax.random.key(0))
  return Inputs(programs=programs, state=programs_lib.abstract(programs, state),
                ref=programs_lib.abstract_tree(ref, programs.ref_shardings),
                key=jax.ShapeDtypeStruct(key.shape, key.dtype, sharding=programs.replicated),
                prompt_len=prompt_len, chip=chip)


def row_array(inputs: Inputs, rows: int, *dims, dtype, mesh=None) -> jax.ShapeDtypeStruct:
  """An abstract [rows, *dims] array with its rows over the batch axes of `mesh` (default: the
  learner's)."""
  mesh = inputs.programs.mesh if mesh is None else mesh
  return jax.ShapeDtypeStruct((rows,) + dims, dtype, sharding=mesh_lib.batch_sharding(
      mesh, 1 + len(dims)))


def small_array(inputs: Inputs, dims: tuple, dtype, mesh=None) -> jax.ShapeDtypeStruct:
  sharding = (inputs.programs.replicated if mesh is None else mesh_lib.replicated(mesh))
  return jax.ShapeDtypeStruct(dims, dtype, sharding=sharding)


def engine_policy(config: ml_collections.ConfigDict, inputs: Inputs) -> Any:
  """The abstract policy the engine decodes with: the run state's, or its copy in the engine's
  layout (`programs.to_rollout`: on the learner's devices its matrices in the compute dtype)."""
  programs = inputs.programs
  policy = programs_lib.policy(inputs.state)
  if programs.rollout_mesh is programs.mesh:
    return policy
  copy = programs_lib.abstract_tree(policy, programs.rollout_shardings)
  if programs.reshard is None:
    return copy
  return rollout_layout.cast_shapes(copy, config.model.dtype)


def abstract_batch(config: ml_collections.ConfigDict, inputs: Inputs) -> Batch:
  """The learn step's abstract batch: S sampled prompts x G completion slots, P trained groups,
  each turn's reward (H turns: the run's turn width; with rows in flight, each token's
  version)."""
  s, g, p = builders.sampled_prompts(config), budget.group_slots(config), config.rl.prompts_per_step
  h = rollout_checks.turn_width(config, builders.build_task(config))
  rows, n_new, tp = s * g, config.rl.max_new_tokens, inputs.prompt_len
  row = lambda *dims, dtype: row_array(inputs, rows, *dims, dtype=dtype)
  small = lambda dims, dtype: small_array(inputs, dims, dtype)
  return Batch(
      prompt_tokens=row(tp, dtype=jnp.int32), prompt_mask=row(tp, dtype=jnp.bool_),
      tokens=row(n_new, dtype=jnp.int32), mask=row(n_new, dtype=jnp.float32),
      sampler_logprobs=row(n_new, dtype=jnp.float32),
      prompt_ids=small((s,), jnp.int32), arms=small((s,), jnp.int32),
      rewards=small((s, g), jnp.float32), correct=small((s, g), jnp.bool_),
      valid=small((s, g), jnp.bool_), train_groups=small((p,), jnp.int32),
      train_valid=small((p,), jnp.bool_), truncated=small((s, g), jnp.bool_),
      baseline=(small((s,), jnp.float32) if config.rl.algorithm == "counterfactual" else None),
      versions=row(n_new, dtype=jnp.int32) if pipeline.persists(config) else None,
      turn_rewards=small((s, g, h), jnp.float32))


def measure_program(inputs: Inputs, name: str, lower, resident: int = 0, trips: float = 1.0,
                    kv_tokens: Optional[float] = None):
  row, compiled = measure.measure(lower, resident, chip=inputs.chip, trips=trips,
                                  kv_tokens=kv_tokens)
  return {"program": name, **row}, compiled


def not_compiled(name: str, before: str) -> dict:
  return {"program": name, "error": f"not compiled: it runs on what {before} returns, and "
          f"{before} did not compile", "peak_gib": float("nan")}
