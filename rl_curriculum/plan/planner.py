"""Will a config fit? The run's device programs compiled ahead of time, without weights.

  report = plan.plan(config, hbm_gib=80.0, prompt_len=256)   # on N devices (fake CPU ones too)

`plan` builds the run's mesh over the devices JAX sees and the run's programs with the loop's own
builder (`programs.build`), describes every input of the sampler (prefill and decode) and of the
learn step as an abstract array (`jax.ShapeDtypeStruct` with the sharding the loop places it
with, `programs.abstract`), compiles each program with `jit(...).lower(...).compile()`, and reads
XLA's per-device memory analysis. Nothing is allocated and no checkpoint is read: the model's
shape comes from `config.model.preset`, or from the `config.json` of an HF folder in
`config.model.source`. On a laptop, `--xla_force_host_platform_device_count=N` gives N fake CPU
devices, and the per-device numbers are those of an N-device mesh (`experiments/plan.py`).

Per program (all per device, GiB):
  argument   inputs (parameters, optimizer state, batch, cache)
  output     outputs
  alias      outputs written into donated inputs (counted once)
  temp       XLA's temporaries (activations, logits chunks, gradients, collectives' buffers)
  peak       argument + output - alias + temp, plus `resident`
  resident   what the run keeps on the device during the program without passing it in: while
             sampling, the run state but the policy (optimizer state, curriculum state) and the
             KL reference's weights when the run keeps them (`programs.needs_reference`); the
             learn step takes everything as an argument
A program FITS when its peak is at most the budget; the config fits when every program does.
XLA's CPU memory analysis is what is measured; an accelerator's compiler fuses and schedules
differently, so the numbers are an estimate of the same program's needs (`docs/scaling.md`
compares them with a GPU's measured peak).
"""

import dataclasses
import json
import os
import re
import time
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx

from rl_curriculum import curriculum as cur
from rl_curriculum.model import hf_io
from rl_curriculum.model import lora as lora_lib
from rl_curriculum.model import transformer
from rl_curriculum.model.config import ModelConfig
from rl_curriculum.parallel import mesh as mesh_lib
from rl_curriculum.sampling import continuous
from rl_curriculum.sampling import inflight
from rl_curriculum.sampling import sampler
from rl_curriculum.train import programs as programs_lib
from rl_curriculum.train import state as state_lib
from rl_curriculum.train.learn.rl_types import Batch
from rl_curriculum.train.rollout import budget, pipeline
from rl_curriculum.train.rollout import checks as rollout_checks
from rl_curriculum.train.setup import builders
from rl_curriculum.train.setup import validation

GIB = 1024 ** 3


def model_shape(config: ml_collections.ConfigDict, vocab_size: Optional[int] = None
                ) -> ModelConfig:
  """The ModelConfig of the run, read without weights: an HF folder's config.json when
  `config.model.source` is one, else the preset (the tiny preset takes `vocab_size`, default
  the config's tokenizer size)."""
  source = os.path.expanduser(config.model.source or "")
  if source and os.path.isfile(os.path.join(source, "config.json")):
    with open(os.path.join(source, "config.json")) as f:
      shape, _ = hf_io.config_from_hf(json.load(f))
    return dataclasses.replace(shape, **builders.model_numerics(config))
  if source:
    raise validation.ConfigError(
        f"config.model.source: {config.model.source!r} has no config.json; planning reads an HF "
        "folder's config.json (for other sources set model.preset to the model's shape and "
        "source to '')")
  return builders.model_config(config, vocab_size or config.tokenizer.vocab_size)


def abstract_model(config: ml_collections.ConfigDict, shape: ModelConfig) -> programs_lib.Model:
  """The policy's abstract parameters (the LoRA adapters and the frozen base under LoRA; all
  parameters and no frozen part without)."""

  def build():
    model = transformer.Transformer(shape, rngs=nnx.Rngs(0))
    if config.model.lora_rank > 0:
      lora_cfg = lora_lib.LoRAConfig(rank=config.model.lora_rank, alpha=config.model.lora_alpha,
                                     targets=tuple(config.model.lora_targets))
      model = lora_lib.attach(model, lora_cfg, rngs=nnx.Rngs(1))
    return model

  model = nnx.eval_shape(build)
  if config.model.lora_rank > 0:
    return programs_lib.Model(*lora_lib.split(model))
  graphdef, params = nnx.split(model)
  return programs_lib.Model(graphdef=graphdef, trainable=params, frozen=None)


_HLO_VALUE = re.compile(r"^\s*(?:ROOT\s+)?(%?[\w.\-]+) = ((?:f32|bf16|f16|s32|u32|pred|s8|u8)"
                        r"\[[\d,]*\])")
_ITEMSIZE = {"f32": 4, "bf16": 2, "f16": 2, "s32": 4, "u32": 4, "pred": 1, "s8": 1, "u8": 1}


def largest_values(hlo_text: str, top: int = 5) -> list:
  """The `top` largest array values the optimised (per-device) HLO computes, as
  "name f32[...] (X GiB)": the candidates for the largest temporaries (parameters excluded)."""
  sizes = {}
  for line in hlo_text.splitlines():
    if " parameter(" in line:
      continue
    m = _HLO_VALUE.match(line)
    if not m:
      continue
    kind, dims = m.group(2).split("[")
    dims = [int(d) for d in dims.rstrip("]").split(",") if d]
    nbytes = int(np.prod(dims, dtype=np.int64)) * _ITEMSIZE[kind]
    key = m.group(2)
    if nbytes > sizes.get(key, (0, ""))[0]:
      sizes[key] = (nbytes, m.group(1))
  ranked = sorted(sizes.items(), key=lambda kv: -kv[1][0])[:top]
  return [f"{name} {shape} ({nbytes / GIB:.2f} GiB)" for shape, (nbytes, name) in ranked]


def _measure(lowered_fn, resident_bytes: int = 0) -> tuple[dict, Any]:
  t0 = time.perf_counter()
  compiled = lowered_fn().compile()
  compile_s = time.perf_counter() - t0
  mem = compiled.memory_analysis()
  argument, output = mem.argument_size_in_bytes, mem.output_size_in_bytes
  alias, temp = mem.alias_size_in_bytes, mem.temp_size_in_bytes
  peak = argument + output - alias + temp + resident_bytes
  report = {"argument_gib": argument / GIB, "output_gib": output / GIB, "alias_gib": alias / GIB,
            "temp_gib": temp / GIB, "resident_gib": resident_bytes / GIB, "peak_gib": peak / GIB,
            "compile_s": compile_s, "largest": largest_values(compiled.as_text())}
  return report, compiled


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


def abstract_inputs(config: ml_collections.ConfigDict, model: programs_lib.Model, mesh, *,
                    prompt_len: int) -> Inputs:
  """The run's programs (`programs.build`, as the loop builds them) and the abstract run state
  and reference they take, laid out as the loop places them."""
  pool = _pool(config)
  programs = programs_lib.build(config, model, mesh, pool,
                                programs_lib.TokenIds(eos_id=1, pad_id=0))
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
                prompt_len=prompt_len)


def _rows(inputs: Inputs, rows: int, *dims, dtype) -> jax.ShapeDtypeStruct:
  """An abstract [rows, *dims] array with its rows over the batch axes."""
  return jax.ShapeDtypeStruct((rows,) + dims, dtype, sharding=mesh_lib.batch_sharding(
      inputs.programs.mesh, 1 + len(dims)))


def _small(inputs: Inputs, dims: tuple, dtype) -> jax.ShapeDtypeStruct:
  return jax.ShapeDtypeStruct(dims, dtype, sharding=inputs.programs.replicated)


def abstract_batch(config: ml_collections.ConfigDict, inputs: Inputs) -> Batch:
  """The learn step's abstract batch: S sampled prompts x G completion slots, P trained groups
  (with rows in flight, each token's version)."""
  s, g, p = builders.sampled_prompts(config), budget.group_slots(config), config.rl.prompts_per_step
  rows, n_new, tp = s * g, config.rl.max_new_tokens, inputs.prompt_len
  row = lambda *dims, dtype: _rows(inputs, rows, *dims, dtype=dtype)
  small = lambda dims, dtype: _small(inputs, dims, dtype)
  return Batch(
      prompt_tokens=row(tp, dtype=jnp.int32), prompt_mask=row(tp, dtype=jnp.bool_),
      tokens=row(n_new, dtype=jnp.int32), mask=row(n_new, dtype=jnp.float32),
      sampler_logprobs=row(n_new, dtype=jnp.float32),
      prompt_ids=small((s,), jnp.int32), arms=small((s,), jnp.int32),
      rewards=small((s, g), jnp.float32), correct=small((s, g), jnp.bool_),
      valid=small((s, g), jnp.bool_), train_groups=small((p,), jnp.int32),
      train_valid=small((p,), jnp.bool_), truncated=small((s, g), jnp.bool_),
      baseline=(small((s,), jnp.float32) if config.rl.algorithm == "counterfactual" else None),
      versions=row(n_new, dtype=jnp.int32) if pipeline.persists(config) else None)


def _sampler_inputs(config: ml_collections.ConfigDict, inputs: Inputs):
  """(static options, policy, abstract prompts, abstract mask, resident bytes) of the sampler.
  Resident while sampling: the run state and the reference, but for the policy it takes."""
  options = inputs.programs.sampler
  rows = builders.sampled_prompts(config) * options["group"]
  policy = programs_lib.policy(inputs.state)
  resident = (mesh_lib.shard_bytes(inputs.state) + mesh_lib.shard_bytes(inputs.ref)
              - mesh_lib.shard_bytes(policy))
  prompts = _rows(inputs, rows, inputs.prompt_len, dtype=jnp.int32)
  prompt_mask = _rows(inputs, rows, inputs.prompt_len, dtype=jnp.bool_)
  return options, policy, prompts, prompt_mask, resident


def _plan_programs(inputs: Inputs, policy, prompts, prompt_mask, resident: int, first, second,
                   first_options: dict, second_options: dict, first_extra: tuple = ()) -> dict:
  """An engine's two programs: `first` (prompts, key, *first_extra -> state) lowered on the
  abstract prompts, then `second` (state, temperature -> state) on the state it returns; their
  memory and the KV cache per device."""
  graphdef = inputs.programs.graphdef
  pre, pre_compiled = _measure(lambda: first.lower(
      graphdef, policy, prompts, prompt_mask, inputs.key, *first_extra, **first_options),
      resident)
  out_state = jax.eval_shape(
      lambda p, t, m, k, *extra: first(graphdef, p, t, m, k, *extra, **first_options),
      policy, prompts, prompt_mask, inputs.key, *first_extra)
  cache_bytes = mesh_lib.shard_bytes(programs_lib.abstract_tree(
      out_state.cache, pre_compiled.output_shardings.cache))
  out_state = programs_lib.abstract_tree(out_state, pre_compiled.output_shardings)
  dec, _ = _measure(lambda: second.lower(graphdef, policy, out_state,
                                         _small(inputs, (), jnp.float32), **second_options),
                    resident)
  return {"prefill": pre, "decode": dec, "cache_gib": cache_bytes / GIB}


def _plan_engines(config: ml_collections.ConfigDict, inputs: Inputs) -> dict:
  """Both engines' programs: the static sampler's prefill and decode, the continuous engine's
  start and run (with config.rl.decode_slots slots, halved up to config.rl.decode_shrink
  times)."""
  options, policy, prompts, prompt_mask, resident = _sampler_inputs(config, inputs)
  stop_ids = tuple(sorted({options["eos_id"], *options["stop_ids"]}))
  shared = dict(max_new_tokens=options["max_new_tokens"], pad_id=options["pad_id"],
                group=options["group"], mesh=options["mesh"], chunk=options["prefill_chunk"])
  loop = dict(stop_ids=stop_ids, pad_id=options["pad_id"], mesh=options["mesh"])
  args = (inputs, policy, prompts, prompt_mask, resident)
  return {"static": _plan_programs(*args, sampler.prefill, sampler.decode, shared, loop),
          "continuous": _plan_programs(*args, continuous.start, continuous.run,
                                       {**shared, "slots": config.rl.decode_slots,
                                        "stop_ids": stop_ids},
                                       {**loop, "group": options["group"],
                                        "shrink": config.rl.decode_shrink},
                                       first_extra=(_small(inputs, (), jnp.float32),))}


def _plan_in_flight(config: ml_collections.ConfigDict, inputs: Inputs) -> dict:
  """The continuous engine as the loop runs it (`rollout.pipeline`), W = rl.max_staleness + 1
  generations: `admit` (a batch prefilled into its generation and its first tokens drawn, as
  "prefill") and a step's `run` (as "decode": at k = 0 the batch decoded to its end, its slots
  halving; with rows in flight the step's decoding, with its budget), on the engine state they
  carry (its KV cache per device, every generation's prompt slots included)."""
  options, policy, prompts, prompt_mask, resident = _sampler_inputs(config, inputs)
  graphdef, rows = inputs.programs.graphdef, prompts.shape[0]
  shared = dict(max_new_tokens=options["max_new_tokens"], pad_id=options["pad_id"],
                group=options["group"], mesh=options["mesh"])
  state = inflight.abstract(graphdef, policy, inputs.key, rows=rows,
                            generations=config.rl.max_staleness + 1,
                            prompt_len=inputs.prompt_len, slots=config.rl.decode_slots,
                            chunk=options["prefill_chunk"], **shared)
  i32 = lambda: _small(inputs, (), jnp.int32)
  stop_ids = tuple(sorted({options["eos_id"], *options["stop_ids"]}))
  admit, _ = _measure(lambda: inflight.admit.lower(
      graphdef, policy, state, prompts, prompt_mask, inputs.key, i32(),
      _small(inputs, (), jnp.float32), i32(), _rows(inputs, rows, dtype=jnp.bool_),
      chunk=options["prefill_chunk"], stop_ids=stop_ids, **shared), resident)
  budget = config.rl.decode_budget if pipeline.persists(config) else 0
  loop = dict(stop_ids=stop_ids, pad_id=options["pad_id"], group=options["group"],
              mesh=options["mesh"], shrink=0 if budget else config.rl.decode_shrink,
              fed=bool(budget) and config.rl.admission == "wait")
  decode, _ = _measure(lambda: continuous.run.lower(
      graphdef, policy, state, _small(inputs, (), jnp.float32), i32(),
      i32() if budget else None, None, **loop), resident)
  return {"prefill": admit, "decode": decode,
          "cache_gib": mesh_lib.shard_bytes(state.cache) / GIB}


def _plan_sampler(config: ml_collections.ConfigDict, inputs: Inputs) -> tuple[dict, dict]:
  """(the larger-peak program of the engine the run decodes with, both engines' programs and KV
  cache per device: {"static": {"prefill", "decode", "cache_gib"}, "continuous": {...}}, and
  with the continuous engine "in_flight", the programs the loop runs it with: W = k + 1
  generations, k = 0 included)."""
  engines = _plan_engines(config, inputs)
  mine = engines[config.rl.engine]
  if config.rl.engine == "continuous":
    mine = engines["in_flight"] = _plan_in_flight(config, inputs)
  return max((mine["prefill"], mine["decode"]), key=lambda p: p["peak_gib"]), engines


def checkpoint_bytes(tree: Any) -> tuple[int, int]:
  """(bytes a checkpoint of `tree` holds, the most bytes any one process writes) of a pytree of
  arrays or `jax.ShapeDtypeStruct`s with shardings: each distinct shard of an array is written
  once, by the process of the first device holding it (a replicated array by one process)."""
  total, by_process = 0, {}
  for leaf in jax.tree.leaves(tree):
    itemsize = leaf.dtype.itemsize
    total += int(np.prod(leaf.shape, dtype=np.int64)) * itemsize
    written = set()
    for device, index in leaf.sharding.devices_indices_map(leaf.shape).items():
      bounds = tuple((s.start, s.stop) for s in index)
      if bounds in written:
        continue
      written.add(bounds)
      size = int(np.prod([len(range(*s.indices(n))) for s, n in zip(index, leaf.shape)],
                         dtype=np.int64)) * itemsize
      by_process[device.process_index] = by_process.get(device.process_index, 0) + size
  return total, max(by_process.values(), default=0)


def _checkpoint_tree(config: ml_collections.ConfigDict, inputs: Inputs) -> Any:
  """The abstract arrays a checkpoint of the run holds (`state.checkpoint_tree`): with rows in
  flight (k > 0) the engine state of W generations and each generation's records besides."""
  state = inputs.state
  if pipeline.persists(config):
    options = inputs.programs.sampler
    engine = inflight.abstract(
        inputs.programs.graphdef, programs_lib.policy(inputs.state), inputs.key,
        rows=builders.sampled_prompts(config) * options["group"],
        generations=pipeline.generations(config), prompt_len=inputs.prompt_len,
        slots=config.rl.decode_slots, max_new_tokens=options["max_new_tokens"],
        pad_id=options["pad_id"], group=options["group"], mesh=options["mesh"],
        chunk=options["prefill_chunk"])
    records = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=inputs.programs.replicated),
        pipeline.empty_records(config))
    state = state._replace(rollouts=pipeline.InFlight(engine=engine, records=records))
  return state_lib.checkpoint_tree(config, state)


def _plan_learn(config: ml_collections.ConfigDict, inputs: Inputs) -> dict:
  """The memory of the run's learn step (every input is an argument: nothing else resident)."""
  learn_args = programs_lib.learn_inputs(inputs.programs, inputs.state,
                                         abstract_batch(config, inputs),
                                         inputs.key, inputs.ref)
  measured, _ = _measure(lambda: inputs.programs.learn.lower(*learn_args))
  measured["argument_bytes"] = mesh_lib.shard_bytes(learn_args)
  return measured


def plan(config: ml_collections.ConfigDict, *, hbm_gib: float, prompt_len: int = 256,
         vocab_size: Optional[int] = None, programs=("sampler", "learn"),
         num_layers: Optional[int] = None) -> dict:
  """Compiles the config's sampler and learn step for the devices JAX sees and reports per-device
  memory (module docstring) against a budget of `hbm_gib` GiB per device.

  Args:
    config: a run config (validated first).
    hbm_gib: memory per device.
    prompt_len: Tp, prompt tokens per row (the data decides it in a run; pass the longest).
    vocab_size: the tiny preset's vocabulary (default: config.tokenizer.vocab_size).
    programs: which programs to compile.
    num_layers: plan a copy of the model with this many layers (None: the model's own), e.g. to
      see how compile time and memory grow with depth.

  Returns:
    {"devices", "mesh", "hbm_gib", "fits", "model": {...}, "workload": {...},
     "programs": {"sampler": {...}, "learn": {...}}} (numbers in GiB and seconds; the learn
    step's "argument_bytes", the bytes per device of its inputs, as `programs.learn_inputs` lays
    them out); the sampler entry is the larger-peak program of the configured engine
    (config.rl.engine), and "sampler_engines" lists both engines' programs (static: prefill,
    decode; continuous: start as "prefill", run as "decode") with their KV cache per device;
    with the continuous engine also "in_flight", the programs the loop runs it with (admit as
    "prefill", a step's run as "decode", the cache of every generation), then the sampler
    entry's engine; "checkpoint": the bytes a checkpoint holds ("gib") and the most one host
    writes ("gib_per_host"), the engine's rows in flight included when k > 0.

  Raises:
    validation.ConfigError: the config is invalid, its rows do not split over the mesh, or
      `model.source` names something without a config.json.
  """
  validation.validate(config, check_source=False)
  mesh = mesh_lib.make_mesh(tuple(config.parallel.mesh_shape))
  shape = model_shape(config, vocab_size)
  if num_layers:
    shape = dataclasses.replace(shape, num_layers=num_layers)
  s, g = builders.sampled_prompts(config), budget.group_slots(config)
  rows, n_new = s * g, config.rl.max_new_tokens
  shards = mesh_lib.batch_size_of(mesh)
  if rows % shards:
    raise validation.ConfigError(
        f"config.parallel.mesh_shape: {rows} rollout rows do not split over data x fsdp = "
        f"{shards} devices")
  rollout_checks.check_decode_slots(config, shards)
  rollout_checks.check_prefill_chunk(config, prompt_len)
  inputs = abstract_inputs(config, abstract_model(config, shape), mesh, prompt_len=prompt_len)
  report = {"devices": jax.device_count(), "mesh": dict(mesh.shape), "hbm_gib": hbm_gib,
            "model": {"layers": shape.num_layers, "d_model": shape.d_model,
                      "vocab": shape.vocab_size, "params": shape.num_params,
                      "dtype": shape.dtype, "param_dtype": shape.param_dtype,
                      "scan_layers": shape.scan_layers, "remat": shape.remat,
                      "lora_rank": config.model.lora_rank},
            "workload": {"prompts": s, "group": g, "rows": rows, "prompt_len": prompt_len,
                         "new_tokens": n_new, "minibatches": config.rl.minibatches,
                         "microbatches": config.rl.microbatches,
                         "logits_chunk": config.rl.logits_chunk},
            "programs": {}}
  if "sampler" in programs:
    report["programs"]["sampler"], report["sampler_engines"] = _plan_sampler(config, inputs)
  if "learn" in programs:
    report["programs"]["learn"] = _plan_learn(config, inputs)
  report["state_gib"] = mesh_lib.shard_bytes(inputs.state.train) / GIB
  total, per_host = checkpoint_bytes(_checkpoint_tree(config, inputs))
  report["checkpoint"] = {"gib": total / GIB, "gib_per_host": per_host / GIB}
  report["fits"] = all(p["peak_gib"] <= hbm_gib for p in report["programs"].values())
  return report


def describe(report: dict) -> str:
  """The report as a few lines for a terminal."""
  m, w = report["model"], report["workload"]
  lines = [f"{report['devices']} devices, mesh {report['mesh']}, budget "
           f"{report['hbm_gib']:.1f} GiB per device",
           f"model: {m['layers']} layers, d {m['d_model']}, vocab {m['vocab']}, "
           f"{m['params'] / 1e6:,.1f}M parameters, {m['dtype']} compute on {m['param_dtype']} "
           f"parameters, scan_layers={m['scan_layers']}, remat={m['remat']}",
           f"step: {w['prompts']} prompts x {w['group']} = {w['rows']} rows, prompt "
           f"{w['prompt_len']} + {w['new_tokens']} new tokens, {w['minibatches']} minibatches x "
           f"{w['microbatches']} microbatches, logits chunk {w['logits_chunk']}",
           f"train state: {report['state_gib']:.2f} GiB per device; a checkpoint "
           f"{report['checkpoint']['gib']:.2f} GiB, at most "
           f"{report['checkpoint']['gib_per_host']:.2f} GiB written by one host"]
  for name, p in report["programs"].items():
    verdict = "FITS" if p["peak_gib"] <= report["hbm_gib"] else "DOES NOT FIT"
    lines.append(f"{name:8s} peak {p['peak_gib']:8.2f} GiB  (argument {p['argument_gib']:.2f}, "
                 f"output {p['output_gib']:.2f}, alias {p['alias_gib']:.2f}, temp "
                 f"{p['temp_gib']:.2f}, resident {p['resident_gib']:.2f})  compile "
                 f"{p['compile_s']:.1f} s  {verdict}")
    for value in p["largest"][:3]:
      lines.append(f"           largest: {value}")
  lines.append("FITS" if report["fits"] else "DOES NOT FIT")
  return "\n".join(lines)
