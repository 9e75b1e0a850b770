"""Will a config fit, and how fast could it run? The run's programs compiled ahead of time for a
TPU slice or for CPU devices, without weights and without the hardware.

  report = planner.plan(config, target="v5e-8", prompt_len=256)   # XLA:TPU, on any host
  report = planner.plan(config, target="cpu:8", hbm_gib=80.0)      # XLA:CPU, 8 fake devices

`plan` builds the run's mesh over the target's devices (`targets.devices`: a TPU slice's from
libtpu's topology, or CPU devices) and the run's programs with the loop's own builder
(`programs.build`), describes every input of each program as an abstract array
(`jax.ShapeDtypeStruct` with the sharding the loop places it with, `programs.abstract`;
`plan.abstract`), compiles
it with `jit(...).lower(...).compile()` and reads the compiler's memory analysis and optimised HLO
(`measure.measure`). Nothing is allocated and no checkpoint is read: the model's shape comes from
`config.model.preset`, a named checkpoint's preset, or the `config.json` of an HF folder in
`config.model.source`.

The programs, in the order a step runs them: select (the curriculum picks the step's prompts),
reshard (the engine's copy of the weights, with `parallel.rollout_layout` other than the
learner's: one program per array, their row summed), prefill and decode (the configured engine's two programs: the static sampler's prefill and decode
loop; with the continuous engine, admit and a step's run, W = k + 1 generations), learn.

Per program (all per device, GiB):
  argument   inputs (parameters, optimizer state, batch, cache)
  output     outputs
  alias      outputs written into donated inputs (counted once)
  temp       the compiler's temporaries (activations, logits chunks, gradients, collectives')
  peak       argument + output - alias + temp, plus `resident`
  resident   what the run keeps on the device during the program without passing it in: while
             selecting and sampling, the run state but the program's own inputs, and the KL
             reference's weights when the run keeps them (`programs.needs_reference`); the
             learn step takes everything as an argument
A program FITS when it compiled and its peak is at most the budget; the config fits when every
program does. For a TPU target the numbers are XLA:TPU's, the compiler that would run the
program; for CPU devices they are XLA:CPU's, which fuses and schedules differently (it
under-counted the paper setting's learn step by 2.5 GiB a chip; docs/scaling.md). Each program's
cost, its loops counted, and its roofline time on the target's chip: `roofline`, `report`.
"""

import dataclasses
import json
import os
from typing import Any, Optional

import jax
import jax.numpy as jnp
import ml_collections
from flax import nnx

from rl_curriculum.model import hf_io
from rl_curriculum.model import lora as lora_lib
from rl_curriculum.model import transformer
from rl_curriculum.model import pretrained
from rl_curriculum.model.config import PRESETS, ModelConfig
from rl_curriculum.parallel import mesh as mesh_lib
from rl_curriculum.plan import measure
from rl_curriculum.plan.abstract import (Inputs, abstract_batch, abstract_inputs, engine_policy,
                                         measure_program, not_compiled, row_array,
                                         small_array)
from rl_curriculum.plan import report as report_lib
from rl_curriculum.plan import targets
from rl_curriculum.sampling import continuous
from rl_curriculum.sampling import inflight
from rl_curriculum.sampling import sampler
from rl_curriculum.train import programs as programs_lib
from rl_curriculum.train import state as state_lib
from rl_curriculum.train.rollout import budget, pipeline
from rl_curriculum.train.rollout import checks as rollout_checks
from rl_curriculum.train.setup import builders
from rl_curriculum.train.setup import validation

GIB = targets.GIB


def model_shape(config: ml_collections.ConfigDict, vocab_size: Optional[int] = None
                ) -> ModelConfig:
  """The ModelConfig of the run, read without weights: an HF folder's config.json when
  `config.model.source` is one, a named checkpoint's preset (`pretrained.NAMED_CHECKPOINTS`),
  else `config.model.preset` (the tiny preset takes `vocab_size`, default the config's tokenizer
  size)."""
  source = os.path.expanduser(config.model.source or "")
  if source and os.path.isfile(os.path.join(source, "config.json")):
    with open(os.path.join(source, "config.json")) as f:
      shape, _ = hf_io.config_from_hf(json.load(f))
    return dataclasses.replace(shape, **builders.model_numerics(config))
  if source in pretrained.NAMED_CHECKPOINTS:
    preset = PRESETS[pretrained.NAMED_CHECKPOINTS[source].preset]
    return dataclasses.replace(preset(), **builders.model_numerics(config))
  if source:
    raise validation.ConfigError(
        f"config.model.source: {config.model.source!r} has no config.json; planning reads an HF "
        "folder's config.json or a named checkpoint's shape (for other sources set model.preset "
        "to the model's shape and source to '')")
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


def _sampler_inputs(config: ml_collections.ConfigDict, inputs: Inputs):
  """(static options, policy, abstract prompts, abstract mask, resident bytes) of the sampler.
  Resident while sampling: the run state and the reference, but for the policy when the engine
  decodes the state's own (`engine_policy`: a copy leaves the learner's resident)."""
  options = inputs.programs.sampler
  rows = builders.sampled_prompts(config) * options["group"]
  policy = engine_policy(config, inputs)
  resident = mesh_lib.shard_bytes(inputs.state) + mesh_lib.shard_bytes(inputs.ref)
  if inputs.programs.rollout_mesh is inputs.programs.mesh:
    resident -= mesh_lib.shard_bytes(policy)
  mesh = options["mesh"]
  prompts = row_array(inputs, rows, inputs.prompt_len, dtype=jnp.int32, mesh=mesh)
  prompt_mask = row_array(inputs, rows, inputs.prompt_len, dtype=jnp.bool_, mesh=mesh)
  return options, policy, prompts, prompt_mask, resident


def _plan_programs(inputs: Inputs, policy, prompts, prompt_mask, resident: int, first, second,
                   first_options: dict, second_options: dict, names: tuple, trips: float,
                   first_extra: tuple = ()) -> dict:
  """An engine's two programs: `first` (prompts, key, *first_extra -> state) lowered on the
  abstract prompts, then `second` (state, temperature -> state, its loop run `trips` times) on
  the state it returns; their rows and the KV cache per device."""
  graphdef = inputs.programs.graphdef
  pre, pre_compiled = measure_program(inputs, names[0], lambda: first.lower(
      graphdef, policy, prompts, prompt_mask, inputs.key, *first_extra, **first_options),
      resident)
  out_state = jax.eval_shape(
      lambda p, t, m, k, *extra: first(graphdef, p, t, m, k, *extra, **first_options),
      policy, prompts, prompt_mask, inputs.key, *first_extra)
  if pre_compiled is None:
    return {"prefill": pre, "decode": not_compiled(names[1], names[0]), "cache_gib": None}
  cache_bytes = mesh_lib.shard_bytes(programs_lib.abstract_tree(
      out_state.cache, pre_compiled.output_shardings.cache))
  out_state = programs_lib.abstract_tree(out_state, pre_compiled.output_shardings)
  dec, _ = measure_program(inputs, names[1], lambda: second.lower(
      graphdef, policy, out_state, small_array(inputs, (), jnp.float32, prompts.sharding.mesh),
      **second_options),
      resident, trips, _decode_context(inputs))
  return {"prefill": pre, "decode": dec, "cache_gib": cache_bytes / GIB}


def _decode_context(inputs: Inputs) -> float:
  """Keys a decoding row attends over on average when every completion runs to max_new_tokens:
  its prompt and half its completion (what a paged-attention kernel reads, `kernels`)."""
  return inputs.prompt_len + (inputs.programs.sampler["max_new_tokens"] + 1) / 2


def _decode_trips(config: ml_collections.ConfigDict, rows: int, engine: str) -> float:
  """Decode-loop iterations when every completion runs to max_new_tokens: N for the static
  engine, R x N / slots for the continuous one (every slot busy), a step's decode budget for
  rows in flight."""
  n = config.rl.max_new_tokens
  if engine == "static":
    return float(n)
  if pipeline.persists(config) and config.rl.decode_budget:
    return float(config.rl.decode_budget)
  return float(-(-rows * n // config.rl.decode_slots))


def _plan_engines(config: ml_collections.ConfigDict, inputs: Inputs, names: tuple) -> dict:
  """Engines' programs by name: "static", the sampler's prefill and decode; "continuous", the
  continuous engine's start and run (config.rl.decode_slots slots, halved up to
  config.rl.decode_shrink times)."""
  options, policy, prompts, prompt_mask, resident = _sampler_inputs(config, inputs)
  stop_ids = tuple(sorted({options["eos_id"], *options["stop_ids"]}))
  shared = dict(max_new_tokens=options["max_new_tokens"], pad_id=options["pad_id"],
                group=options["group"], mesh=options["mesh"], chunk=options["prefill_chunk"])
  loop = dict(stop_ids=stop_ids, pad_id=options["pad_id"], mesh=options["mesh"])
  args = (inputs, policy, prompts, prompt_mask, resident)
  rows, out = prompts.shape[0], {}
  if "static" in names:
    out["static"] = _plan_programs(*args, sampler.prefill, sampler.decode, shared, loop,
                                   ("sampler.prefill", "sampler.decode"),
                                   _decode_trips(config, rows, "static"))
  if "continuous" in names:
    out["continuous"] = _plan_programs(
        *args, continuous.start, continuous.run,
        {**shared, "slots": config.rl.decode_slots, "stop_ids": stop_ids,
         **inputs.programs.paging},
        {**loop, "group": options["group"], "shrink": config.rl.decode_shrink},
        ("continuous.start", "continuous.run"), _decode_trips(config, rows, "continuous"),
        first_extra=(small_array(inputs, (), jnp.float32, options["mesh"]),))
  return out


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
                            chunk=options["prefill_chunk"], **inputs.programs.paging, **shared)
  i32 = lambda: small_array(inputs, (), jnp.int32, options["mesh"])
  f32 = lambda: small_array(inputs, (), jnp.float32, options["mesh"])
  stop_ids = tuple(sorted({options["eos_id"], *options["stop_ids"]}))
  admit, _ = measure_program(inputs, "inflight.admit", lambda: inflight.admit.lower(
      graphdef, policy, state, prompts, prompt_mask, inputs.key, i32(),
      f32(), i32(), row_array(inputs, rows, dtype=jnp.bool_, mesh=options["mesh"]),
      chunk=options["prefill_chunk"], stop_ids=stop_ids, **shared), resident)
  budget = config.rl.decode_budget if pipeline.persists(config) else 0
  loop = dict(stop_ids=stop_ids, pad_id=options["pad_id"], group=options["group"],
              mesh=options["mesh"], shrink=0 if budget else config.rl.decode_shrink,
              fed=bool(budget) and config.rl.admission == "wait")
  decode, _ = measure_program(inputs, "continuous.run", lambda: continuous.run.lower(
      graphdef, policy, state, f32(), i32(),
      i32() if budget else None, None, **loop), resident,
      _decode_trips(config, rows, "continuous"), _decode_context(inputs))
  return {"prefill": admit, "decode": decode,
          "cache_gib": mesh_lib.shard_bytes(state.cache) / GIB}


def _plan_sampler(config: ml_collections.ConfigDict, inputs: Inputs, all_engines: bool
                  ) -> tuple[dict, dict]:
  """(the programs of the engine the run decodes with, {"prefill", "decode", "cache_gib"}; and
  by engine, the programs planned: with `all_engines` both engines' ("static": prefill and
  decode; "continuous": start and run), and with the continuous engine "in_flight", the
  programs the loop runs it with: admit and a step's run, W = k + 1 generations)."""
  static = config.rl.engine == "static"
  engines = _plan_engines(config, inputs, ("static", "continuous") if all_engines
                          else ("static",) if static else ())
  if static:
    return engines["static"], engines
  engines["in_flight"] = _plan_in_flight(config, inputs)
  return engines["in_flight"], engines


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
        chunk=options["prefill_chunk"], **inputs.programs.paging)
    records = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=inputs.programs.replicated),
        pipeline.empty_records(config, rollout_checks.turn_width(config,
                                                                 builders.build_task(config))))
    state = state._replace(rollouts=pipeline.InFlight(engine=engine, records=records))
  return state_lib.checkpoint_tree(config, state)


def _plan_learn(config: ml_collections.ConfigDict, inputs: Inputs) -> dict:
  """The run's learn step (every input is an argument; resident beside it only the engine's
  copy of a LoRA run's frozen base, kept between steps when the engine has a layout of its own:
  the copy of the whole policy is dropped before the learn step)."""
  learn_args = programs_lib.learn_inputs(inputs.programs, inputs.state,
                                         abstract_batch(config, inputs),
                                         inputs.key, inputs.ref)
  resident = 0
  if inputs.programs.reshard is not None and inputs.state.base is not None:
    resident = mesh_lib.shard_bytes(engine_policy(config, inputs)[1])
  row, _ = measure_program(inputs, "learn", lambda: inputs.programs.learn.lower(*learn_args), resident)
  row["argument_bytes"] = mesh_lib.shard_bytes(learn_args)
  return row


def _plan_reshard(inputs: Inputs) -> dict:
  """The programs that make the engine's copy of the policy on the learner's devices
  (`programs.to_rollout`, one program per array: `rollout_layout.Reshard`), by name: "reshard",
  what runs every step (the whole policy, or under LoRA the adapters), and under LoRA
  "reshard_base", the frozen base's (the first step and after a merge). Each row is that of its
  array programs together: their bytes, FLOPs and bounds summed; its peak the largest of any one
  program's with the run state, the reference and the copy's other arrays resident."""
  programs = inputs.programs
  if programs.reshard is None:
    return {}
  resident = mesh_lib.shard_bytes(inputs.state) + mesh_lib.shard_bytes(inputs.ref)
  policy = programs_lib.policy(inputs.state)
  if inputs.state.base is None:
    parts = {"reshard": (programs.reshard, policy)}
  else:
    parts = {"reshard": (programs.reshard[0], policy[0]),
             "reshard_base": (programs.reshard[1], policy[1])}
  out = {}
  for name, (move, tree) in parts.items():
    arrays = move.programs(tree)
    outputs = [mesh_lib.shard_bytes(made) for _, _, made in arrays]
    copy, compiled, rows = sum(outputs), {}, []
    for (program, x, _), output in zip(arrays, outputs):
      key = (program, x.shape, x.dtype, x.sharding)
      if key not in compiled:
        compiled[key], _ = measure_program(inputs, f"rollout_layout.{name}",
                                    lambda p=program, a=x: p.lower(a),
                                    resident - mesh_lib.shard_bytes(x) + copy - output)
      rows.append(compiled[key])
    worst = max(rows, key=lambda r: r["peak_gib"])
    row = dict(worst, arrays=len(rows), compile_s=sum(r["compile_s"] for r in compiled.values()))
    for field in ("flops", "bytes", "xla_flops", "bound_s"):
      if all(field in r for r in rows):
        row[field] = sum(r[field] for r in rows)
    out[name] = row
  return out


def _plan_select(inputs: Inputs) -> dict:
  """The curriculum's select program (curriculum state, key -> the step's prompts); the rest of
  the run state stays on the device beside it."""
  select = inputs.programs.select   # functools.partial of the jitted program, options bound
  resident = (mesh_lib.shard_bytes(inputs.state) + mesh_lib.shard_bytes(inputs.ref)
              - mesh_lib.shard_bytes(inputs.state.curriculum))
  row, _ = measure_program(inputs, "select", lambda: select.func.lower(
      inputs.state.curriculum, inputs.key, **select.keywords), resident)
  return row


def plan(config: ml_collections.ConfigDict, *, target: Any = None,
         hbm_gib: Optional[float] = None, prompt_len: int = 256,
         vocab_size: Optional[int] = None, programs=("select", "sampler", "learn"),
         num_layers: Optional[int] = None, all_engines: bool = False) -> dict:
  """Compiles the config's programs for `target` and reports their memory per device and, for
  a TPU target, their roofline times (module docstring).

  Args:
    config: a run config (validated first).
    target: a `targets.Target` or its name ("v5e-8", "cpu:4", ...); None: the devices JAX
      sees (`experiments.train --plan_only` on the machine that would run; on TPU chips
      `targets.chip_of` knows, with their roofline bounds).
    hbm_gib: memory per device (default: the TPU chip's; required for CPU devices).
    prompt_len: Tp, prompt tokens per row (the data decides it in a run; pass the longest).
    vocab_size: the tiny preset's vocabulary (default: config.tokenizer.vocab_size).
    programs: which of "select", "sampler" and "learn" to compile.
    num_layers: plan a copy of the model with this many layers (None: the model's own), e.g. to
      see how compile time and memory grow with depth.
    all_engines: also plan the engine the run does not use (`_plan_sampler`).

  Returns:
    {"target", "devices", "mesh", "hbm_gib", "fits", "model", "workload", "programs",
     "sampler_engines", "state_gib", "policy_gib", "checkpoint", "roofline"}: "programs" maps
    "select", "prefill", "decode" (the run's engine's two programs, `_plan_sampler`) and
    "learn" to their rows (`measure.measure`; the learn step's also "argument_bytes", the bytes
    per device of its inputs as `programs.learn_inputs` lays them out); "sampler_engines" the
    engines' programs with their KV cache per device; "checkpoint" the bytes a checkpoint holds
    ("gib") and the most one host writes ("gib_per_host"), the engine's rows in flight included
    when k > 0; "roofline" the bounds on a step (`report.roofline`). A program fits when it
    compiled and its peak is at most hbm_gib.

  Raises:
    validation.ConfigError: the config is invalid, its rows do not split over the mesh, or
      `model.source` names something without a config.json.
  """
  validation.validate(config, check_source=False)
  if target is None:   # the devices this process sees, whatever their platform
    devices = jax.devices()
    target = targets.Target(name=f"{devices[0].platform}:{len(devices)}", chips=len(devices),
                            chip=targets.chip_of(devices[0]))
  else:
    target = targets.parse(target) if isinstance(target, str) else target
    devices = targets.devices(target)
  hbm_gib = target.chip.hbm_gib if hbm_gib is None and target.is_tpu else hbm_gib
  if hbm_gib is None:
    raise ValueError(f"{target.name}: pass hbm_gib, the memory of a device")
  mesh = mesh_lib.make_mesh(tuple(config.parallel.mesh_shape), devices)
  shape = model_shape(config, vocab_size)
  if num_layers:
    shape = dataclasses.replace(shape, num_layers=num_layers)
  if shape.attention == "auto" and target.is_tpu:  # what the run would pick on that TPU
    shape = dataclasses.replace(shape, attention="tpu")
  s, g = builders.sampled_prompts(config), budget.group_slots(config)
  rows, n_new = s * g, config.rl.max_new_tokens
  shards = mesh_lib.batch_size_of(mesh)
  if rows % shards:
    raise validation.ConfigError(
        f"config.parallel.mesh_shape: {rows} rollout rows do not split over data x fsdp = "
        f"{shards} devices")
  rollout_checks.check_decode_slots(config, shards)
  rollout_checks.check_prefill_chunk(config, prompt_len)
  inputs = abstract_inputs(config, abstract_model(config, shape), mesh, prompt_len=prompt_len,
                           chip=target.chip, hbm_gib=hbm_gib)
  rollout_mesh = inputs.programs.rollout_mesh
  report = {"target": target.name, "chip": target.chip and dataclasses.asdict(target.chip),
            "devices": mesh.devices.size, "mesh": dict(mesh.shape), "hbm_gib": hbm_gib,
            "rollout_mesh": (None if rollout_mesh is mesh else dict(rollout_mesh.shape)),
            "model": {"layers": shape.num_layers, "d_model": shape.d_model,
                      "vocab": shape.vocab_size, "params": shape.num_params,
                      "matmul_params": shape.num_params - (
                          0 if shape.tie_embeddings else shape.vocab_size * shape.d_model),
                      "attention_width": shape.num_heads * shape.head_dim,
                      "kv_width": shape.num_kv_heads * shape.head_dim,
                      "itemsize": jnp.dtype(shape.dtype).itemsize,
                      "cache_itemsize": jnp.dtype(shape.cache_dtype).itemsize,
                      "dtype": shape.dtype, "param_dtype": shape.param_dtype,
                      "scan_layers": shape.scan_layers, "remat": shape.remat,
                      "attention": shape.attention, "attention_block": shape.attention_block,
                      "lora_rank": config.model.lora_rank},
            "workload": {"prompts": s, "group": g, "rows": rows, "prompt_len": prompt_len,
                         "new_tokens": n_new, "trained_prompts": config.rl.prompts_per_step,
                         "epochs": config.rl.epochs, "minibatches": config.rl.minibatches,
                         "microbatches": config.rl.microbatches,
                         "logits_chunk": config.rl.logits_chunk, "engine": config.rl.engine,
                         "page_size": config.rl.page_size, "kv_pages": config.rl.kv_pages},
            "programs": {}}
  if "select" in programs:
    report["programs"]["select"] = _plan_select(inputs)
  if "sampler" in programs:
    report["programs"].update(_plan_reshard(inputs))
    mine, report["sampler_engines"] = _plan_sampler(config, inputs, all_engines)
    report["programs"].update(prefill=mine["prefill"], decode=mine["decode"])
    report["cache_gib"] = mine["cache_gib"]
  if "learn" in programs:
    report["programs"]["learn"] = _plan_learn(config, inputs)
  report["state_gib"] = mesh_lib.shard_bytes(inputs.state.train) / GIB
  report["policy_gib"] = mesh_lib.shard_bytes(programs_lib.policy(inputs.state)) / GIB
  report["engine_policy_gib"] = mesh_lib.shard_bytes(engine_policy(config, inputs)) / GIB
  total, per_host = measure.checkpoint_bytes(_checkpoint_tree(config, inputs))
  report["checkpoint"] = {"gib": total / GIB, "gib_per_host": per_host / GIB}
  report["fits"] = all(report_lib.fits(p, hbm_gib) for p in report["programs"].values())
  report["roofline"] = report_lib.roofline(report)
  return report
