"""The RL run's device programs and the layout of its state, built once from a config, a model and
a mesh.

  programs = build(config, model, mesh, pool, tokens)
  state = place(programs, init_run_state(config, programs, model, pool, key))
  ref = place_reference(programs, reference(config, model))
  selection, curriculum_state = programs.select(state.curriculum, key)
  generation = sample(programs, policy(state), prompt_tokens, prompt_mask, key, temperature)
  train, curriculum_state, metrics = programs.learn(*learn_inputs(programs, state, batch, key, ref))

The training loop (`loop`), the memory planner (`plan.planner`) and the speed benchmarks all build
their programs here, so the programs the planner compiles from abstract shapes are the programs
the loop runs, with the same inputs: `model` may hold arrays or `jax.ShapeDtypeStruct`s, and
`shardings` lays out a concrete run state (`place`) and an abstract one (`abstract`) alike.
select and learn are made from a `ProgramSpec` (`program_spec`): runs whose specs are equal share
them, and with them the programs JAX compiled; the learn step takes the run's `LearnConfig`, whose
coefficients it traces. `sample` runs the configured engine on one batch (the static sampler of a
synchronous step, the overlap benchmark's sampler process); the loop runs the continuous engine
through `rollout.pipeline` and its generations of rows.

What lives on the devices during a run:

  state.train       parameters (LoRA adapters or every weight), optimizer state, value head:
                    by their logical axes (`mesh.tree_shardings`)
  state.base        the frozen base under LoRA, by its logical axes; None otherwise
  state.curriculum, state.prompts     replicated
  ref               the KL reference's weights: only under full fine-tuning with a KL term (a
                    loss `rl.kl_coef` or a reward penalty `rl.kl_reward_coef`), a copy of the
                    starting weights; under LoRA the reference is the policy with its adapters
                    off, and without a KL term nothing reads one (`needs_reference`)
  a step's rollout  rows over the batch axes (`rows`)
  the engine's copy of the policy (`parallel.rollout_layout` other than "learner"): the same
                    devices as a mesh of the engine's layout (`rollout_mesh`), made once a step
                    by `reshard` (`to_rollout`), so the decode loop never gathers a weight
"""

import functools
import hashlib
from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from rl_curriculum import curriculum as cur
from rl_curriculum.model import transformer
from rl_curriculum.parallel import distributed
from rl_curriculum.parallel import mesh as mesh_lib
from rl_curriculum.parallel import rollout_layout
from rl_curriculum.sampling import continuous
from rl_curriculum.sampling import sampler
from rl_curriculum.train.durable import recovery
from rl_curriculum.train.learn import forward, rl_step, rl_types
from rl_curriculum.train.learn.rl_types import Batch
from rl_curriculum.train.rollout import budget
from rl_curriculum.train.setup import builders
from rl_curriculum.train.state import RunState, init_train_state, init_value_head

__all__ = ["Model", "TokenIds", "Programs", "needs_reference", "reference", "value_head",
           "ProgramSpec", "program_spec", "build", "to_rollout", "init_run_state", "shardings",
           "place", "abstract_tree", "abstract", "place_reference", "policy", "sample",
           "learn_inputs"]

# The fields of a RunState that hold device arrays (health is host-side).
_ARRAY_FIELDS = ("train", "curriculum", "base", "prompts", "rollouts")


class Model(NamedTuple):
  """A policy as the programs take it: arrays, or their abstract shapes."""
  graphdef: Any    # the model's graph (with LoRA adapters when config.model.lora_rank > 0)
  trainable: Any   # what the optimizer updates: the adapters under LoRA, else every weight
  frozen: Any      # what stays fixed: the base weights under LoRA, else None


class TokenIds(NamedTuple):
  """The tokenizer's ids the sampler needs."""
  eos_id: int
  pad_id: int
  stop_ids: tuple = ()   # ids besides EOS that end a completion


class Programs(NamedTuple):
  """The run's jitted programs and where their inputs live."""
  graphdef: Any
  optimizer: optax.GradientTransformation
  curriculum: cur.Curriculum
  select: Callable         # (curriculum state, key) -> (Selection, curriculum state), replicated
  learn: Callable          # rl_step.make_learn: (train, curriculum, batch, key, base, ref,
                           # learn config) -> (train, curriculum, metrics)
  learn_config: Any        # the run's `rl_types.LearnConfig` (`learn_inputs` passes it)
  spec: Any                # the `ProgramSpec` select and learn are made from
  sampler: dict            # static arguments of sampler.sample (max_new_tokens, eos_id,
                           # stop_ids, pad_id, group, mesh, prefill_chunk)
  engine: str              # config.rl.engine: static | continuous
  slots: int               # the continuous engine's decode slots (config.rl.decode_slots)
  shrink: int              # and their halvings as the rows run out (config.rl.decode_shrink)
  paging: dict             # its KV cache: page_size (0 = dense) and kv_pages (config.rl)
  train_shardings: Any     # of the train state, by logical axes
  base_shardings: Any      # of the frozen base (None without LoRA)
  ref_shardings: Any       # of the KL reference's weights (None without one)
  rows: Any                # a rollout's [R, ...] arrays: rows over the batch axes
  replicated: Any          # curriculum state, per-prompt statistics, metrics
  mesh: Any
  rollout_mesh: Any = None     # where the engine decodes: `mesh`, the same devices as a mesh
                               # of the engine's layout, or the rollout devices'
  rollout_shardings: Any = None  # the policy's parameters on it (`policy`'s structure)
  reshard: Any = None          # on the learner's devices in a layout of their own: the jitted
                               # program(s) making the engine's copy (`to_rollout`), else None


def needs_reference(config: ml_collections.ConfigDict) -> bool:
  """Whether the run keeps the KL reference's weights: full fine-tuning with a KL loss or a KL
  penalty in the reward (under LoRA the reference is the policy with its adapters off)."""
  kl = config.rl.kl_coef != 0 or config.rl.kl_reward_coef != 0
  return config.model.lora_rank <= 0 and kl


def reference(config: ml_collections.ConfigDict, model: Model) -> Any:
  """The KL reference's weights (the starting policy's, `model.trainable`) when
  `needs_reference`, else None."""
  return model.trainable if needs_reference(config) else None


def value_head(config: ml_collections.ConfigDict, model: Model) -> Optional[dict]:
  """PPO's value head on the policy's final hidden states (None for critic-free algorithms)."""
  if config.rl.algorithm != "ppo":
    return None
  width = jax.eval_shape(
      lambda params: transformer.forward_hidden(model.graphdef, params,
                                                jnp.zeros((1, 1), jnp.int32),
                                                jnp.ones((1, 1), bool)),
      forward.model_params(model.trainable, model.frozen)).shape[-1]
  return init_value_head(width)


def _init_train(config: ml_collections.ConfigDict, optimizer, model: Model):
  return init_train_state(model.trainable, optimizer, value_head(config, model),
                          temperature=config.rl.temperature)


def _digest(tree: Any) -> str:
  """SHA-256 of the structure, shapes, dtypes and values of a pytree of arrays."""
  leaves, treedef = jax.tree.flatten(tree)
  h = hashlib.sha256(str(treedef).encode())
  for leaf in leaves:
    x = np.asarray(leaf)
    h.update(f"{x.shape}{x.dtype}".encode())
    h.update(np.ascontiguousarray(x).tobytes())
  return h.hexdigest()


class ByValue:
  """A value compared and hashed by its contents (`_digest`): a pool of arrays in a cache key."""

  def __init__(self, value: Any):
    self.value = value
    self.key = (value.num_arms, _digest(value)) if isinstance(value, cur.PromptPool) else value

  def __eq__(self, other) -> bool:
    return isinstance(other, ByValue) and self.key == other.key

  def __hash__(self) -> int:
    return hash(self.key)


class ProgramSpec(NamedTuple):
  """Everything the jitted select and learn functions are made from and close over: their cache
  key, and the one argument of `_jitted`, so nothing of a config reaches the compiled programs
  but through this and the `LearnConfig` they take (whose static fields jit keys them by)."""
  makers: tuple         # the functions that make the optimizer, the curriculum and the learn
                        # step (a replaced one, as a test's stand-in, makes other programs)
  graphdef: Any         # the model's graph
  use_lora: bool        # the trained parameters are LoRA adapters
  curriculum: tuple     # (name, its options the programs do not trace as sorted items, S)
  pool: ByValue         # the RL pool the curriculum selects from
  shardings: tuple      # the learn step's output layout: (treedef, leaves)
  mesh: Any


def program_spec(config: ml_collections.ConfigDict, model: Model, pool: Any,
                 out_shardings: Any, mesh) -> ProgramSpec:
  """The `ProgramSpec` of a run of `config` (see `build`)."""
  name = config.curriculum.name
  traced = builders.TRACED_OPTIONS.get(name, ())
  options = tuple(sorted((k, _frozen(v)) for k, v in config.curriculum.options.items()
                         if k not in traced))
  leaves, treedef = jax.tree.flatten(out_shardings)
  return ProgramSpec(
      makers=(builders.build_optimizer, builders.CURRICULA[name], rl_step.make_learn,
              rl_step.learn),
      graphdef=model.graphdef, use_lora=config.model.lora_rank > 0,
      curriculum=(name, options, builders.sampled_prompts(config)), pool=ByValue(pool),
      shardings=(treedef, tuple(leaves)), mesh=mesh)


def _frozen(value: Any) -> Any:
  """A config value as a hashable one (lists and dicts of options as tuples)."""
  if isinstance(value, (list, tuple)):
    return tuple(_frozen(v) for v in value)
  if isinstance(value, (dict, ml_collections.ConfigDict)):
    return tuple(sorted((k, _frozen(v)) for k, v in dict(value).items()))
  return value


def _rl_optimizer(make: Callable, config: rl_types.LearnConfig) -> optax.GradientTransformation:
  """The RL optimizer of `config`'s (traced) learning rate and gradient clipping."""
  return make(config.learning_rate, max_grad_norm=config.max_grad_norm)


@functools.lru_cache(maxsize=8)
def _jitted(spec: ProgramSpec) -> tuple[Callable, Callable]:
  """(select, learn) jitted for `spec`: select(curriculum state, key, options) and the learn
  step (`rl_step.make_learn`), the curriculum built inside each from its traced `options`
  (`LearnConfig.curriculum`). Runs whose programs are made from an equal spec (a resumed run,
  another seed or length of one, the planner's build before the loop's, a sweep over
  coefficients) share these functions and with them JAX's traced and compiled programs."""
  make_optimizer, constructor, make_learn, _ = spec.makers
  name, options, batch_size = spec.curriculum
  of = lambda traced: constructor(spec.pool.value, batch_size=batch_size, **dict(options),
                                  **traced)
  treedef, leaves = spec.shardings
  out_shardings = jax.tree.unflatten(treedef, leaves)
  select = jax.jit(lambda state, key, traced: of(traced).select(state, key),
                   out_shardings=out_shardings[1])
  learn = make_learn(graphdef=spec.graphdef,
                     optimizer=functools.partial(_rl_optimizer, make_optimizer),
                     curriculum_update=lambda state, feedback, traced: of(traced).update(
                         state, feedback),
                     use_lora=spec.use_lora, out_shardings=out_shardings, mesh=spec.mesh)
  return select, learn


def build(config: ml_collections.ConfigDict, model: Model, mesh, pool: cur.PromptPool,
          tokens: TokenIds, rollout_mesh=None) -> Programs:
  """The programs of a run of `config` (checked by `validation.validate`) on `mesh`.

  Args:
    config: the run's config.
    model: the policy (arrays or abstract shapes).
    mesh: the run's (learner's) device mesh.
    pool: the RL pool the curriculum selects from (for PCL, with the prompts' features).
    tokens: the tokenizer's ids the sampler stops and pads with.
    rollout_mesh: the mesh the sampler decodes on (`prepare.rollout_mesh`); None: `mesh`.
  """
  rollout_mesh = mesh if rollout_mesh is None else rollout_mesh
  optimizer = builders.build_optimizer(config.rl.learning_rate,
                                       max_grad_norm=config.rl.max_grad_norm)
  curriculum = builders.build_curriculum(config, pool, builders.sampled_prompts(config))
  train_like = jax.eval_shape(
      lambda trainable, frozen: _init_train(config, optimizer,
                                            model._replace(trainable=trainable, frozen=frozen)),
      model.trainable, model.frozen)
  train_shardings = mesh_lib.tree_shardings(train_like, mesh)
  rep = mesh_lib.replicated(mesh)
  ref = reference(config, model)
  learn_config = builders.learn_config(config)
  spec = program_spec(config, model, pool, (train_shardings, rep, rep), mesh)
  select, learn = _jitted(spec)
  rollout_shardings = mesh_lib.param_shardings(
      forward.model_params(model.trainable, model.frozen), rollout_mesh)
  return Programs(
      graphdef=model.graphdef, optimizer=optimizer, curriculum=curriculum,
      select=functools.partial(select, traced=learn_config.curriculum), learn=learn,
      learn_config=learn_config, spec=spec,
      sampler=dict(max_new_tokens=config.rl.max_new_tokens, eos_id=tokens.eos_id,
                   stop_ids=tuple(tokens.stop_ids), pad_id=tokens.pad_id,
                   group=budget.group_slots(config), mesh=rollout_mesh,
                   prefill_chunk=config.rl.prefill_chunk),
      engine=config.rl.engine, slots=config.rl.decode_slots, shrink=config.rl.decode_shrink,
      paging=dict(page_size=config.rl.page_size, kv_pages=config.rl.kv_pages),
      train_shardings=train_shardings,
      base_shardings=(None if model.frozen is None
                      else mesh_lib.param_shardings(model.frozen, mesh)),
      ref_shardings=None if ref is None else mesh_lib.param_shardings(ref, mesh),
      rows=mesh_lib.batch_sharding(mesh, 2), replicated=rep, mesh=mesh,
      rollout_mesh=rollout_mesh, rollout_shardings=rollout_shardings,
      reshard=_reshard(config, model, mesh, rollout_mesh, rollout_shardings))


def _reshard(config: ml_collections.ConfigDict, model: Model, mesh, rollout_mesh,
             rollout_shardings: Any) -> Any:
  """The program(s) that make the engine's copy of the policy when it decodes on the learner's
  devices in a layout of its own (`rollout_layout.reshard`: one for the whole policy, or under
  LoRA one for the adapters and one for the frozen base); None otherwise."""
  if rollout_mesh is mesh or set(rollout_mesh.devices.flat) != set(mesh.devices.flat):
    return None
  if model.frozen is None:
    return rollout_layout.reshard(rollout_shardings, config.model.dtype)
  return tuple(rollout_layout.reshard(s, config.model.dtype) for s in rollout_shardings)


def to_rollout(programs: Programs, tree: Any, part: Optional[int] = None) -> Any:
  """`tree` (the policy; under LoRA its `part`: 0 the adapters, 1 the frozen base) laid out where
  the engine decodes: by the reshard program on the learner's devices (`Programs.reshard`), or
  sent to rollout devices apart (their matrices then keep the learner's dtype)."""
  shardings = programs.rollout_shardings if part is None else programs.rollout_shardings[part]
  if programs.reshard is None:
    return jax.device_put(tree, shardings)
  return (programs.reshard if part is None else programs.reshard[part])(tree)


def init_run_state(config: ml_collections.ConfigDict, programs: Programs, model: Model,
                   pool: cur.PromptPool, key: jax.Array) -> RunState:
  """A fresh run state (not yet placed on the mesh: `place`): the train state of
  `model.trainable` (with PPO's value head and the first sampling temperature), the curriculum's
  initial state drawn with `key`, the frozen base, empty per-prompt statistics when a method
  reads them, and a healthy record."""
  return RunState(train=_init_train(config, programs.optimizer, model),
                  curriculum=programs.curriculum.init(pool, key), base=model.frozen,
                  prompts=budget.init_prompt_stats(config, pool.size),
                  health=recovery.Health(streak=0, origin=0, rollbacks=0))


def shardings(programs: Programs, state: RunState) -> RunState:
  """A RunState whose array fields hold the shardings of `state`'s arrays (module docstring);
  `health` as in `state`."""
  rep = lambda tree: jax.tree.map(lambda _: programs.replicated, tree)
  return state._replace(train=programs.train_shardings, curriculum=rep(state.curriculum),
                        base=programs.base_shardings, prompts=rep(state.prompts),
                        rollouts=jax.tree.map(lambda x: x.sharding, state.rollouts))


def _lay_out(programs: Programs, state: RunState, lay: Callable) -> RunState:
  layout = shardings(programs, state)
  return state._replace(**{name: lay(getattr(state, name), getattr(layout, name))
                           for name in _ARRAY_FIELDS})


def place(programs: Programs, state: RunState) -> RunState:
  """`state` placed on the mesh as the programs expect it (`shardings`)."""
  return _lay_out(programs, state, distributed.place)


def abstract_tree(tree: Any, tree_shardings: Any) -> Any:
  """`jax.ShapeDtypeStruct`s of `tree`'s arrays (or shapes) carrying `tree_shardings` (a tree of
  the same structure; nnx Variables kept)."""
  return jax.tree.map(
      lambda x, s: None if x is None else jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
      tree, tree_shardings, is_leaf=lambda x: x is None)


def abstract(programs: Programs, state: RunState) -> RunState:
  """The shapes of `state` (arrays or shapes) carrying the shardings the programs expect
  (`shardings`): what the planner lowers the programs with."""
  return _lay_out(programs, state, abstract_tree)


def place_reference(programs: Programs, ref: Any) -> Any:
  """The KL reference's weights (`reference`) placed by their logical axes, or None."""
  return None if ref is None else distributed.place(ref, programs.ref_shardings)


def policy(state: RunState) -> Any:
  """What the sampler and the forward passes take as the policy's parameters: the trainable
  parameters, or (adapters, frozen base) under LoRA."""
  return forward.model_params(state.train.params, state.base)


def sample(programs: Programs, params: Any, prompt_tokens: jax.Array, prompt_mask: jax.Array,
           key: jax.Array, temperature: Any,
           active: Optional[jax.Array] = None) -> continuous.Generation:
  """The run's engine (`sampler.sample` or `continuous.sample`) with its static arguments: the
  `Rollout` of the rows i32[R, Tp] (whole groups of G rows, over the batch axes), sampled at
  `temperature` (a float, or the adaptive controller's f32[]), and the call's decode slot-steps
  (slots x loop iterations: R x the longest completion for the static engine); rows where
  `active` bool[R] is False get no tokens."""
  if programs.engine == "continuous":
    return continuous.sample(programs.graphdef, params, prompt_tokens, prompt_mask, key,
                             temperature=temperature, active=active, slots=programs.slots,
                             shrink=programs.shrink, **programs.paging, **programs.sampler)
  rollout = sampler.sample(programs.graphdef, params, prompt_tokens, prompt_mask, key,
                           temperature=temperature, active=active, **programs.sampler)
  steps = jnp.max(jnp.sum(rollout.mask, axis=1)).astype(jnp.int32)
  return continuous.Generation(rollout=rollout, slot_steps=steps * prompt_tokens.shape[0])


def learn_inputs(programs: Programs, state: RunState, batch: Batch, key: jax.Array,
                 ref: Any) -> tuple:
  """The positional inputs of `programs.learn` for one step: (train state, curriculum state,
  batch, key, frozen base, reference weights, learn config)."""
  return state.train, state.curriculum, batch, key, state.base, ref, programs.learn_config
