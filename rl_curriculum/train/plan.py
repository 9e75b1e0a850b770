"""Will a config fit? The run's device programs compiled ahead of time, without weights.

  report = plan.plan(config, hbm_gib=80.0, prompt_len=256)   # on N devices (fake CPU ones too)

`plan` builds the run's mesh over the devices JAX sees, describes every input of the sampler
(prefill and decode) and of the learn step as an abstract array (`jax.ShapeDtypeStruct` with the
sharding the run gives it), compiles each program with `jit(...).lower(...).compile()`, and reads
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
  resident   what the run keeps on the device during the program without passing it in: the
             optimizer state, the reference model and the frozen base weights while sampling
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
from typing import Any, Callable, NamedTuple, Optional

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
from rl_curriculum.sampling import sampler
from rl_curriculum.train import budget, builders, rl_step

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
    raise builders.ConfigError(
        f"config.model.source: {config.model.source!r} has no config.json; planning reads an HF "
        "folder's config.json (for other sources set model.preset to the model's shape and "
        "source to '')")
  return builders.model_config(config, vocab_size or config.tokenizer.vocab_size)


def _abstract(tree: Any, shardings: Any) -> Any:
  """ShapeDtypeStructs of `tree` carrying `shardings` (same structure, nnx Variables kept)."""
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                      tree, shardings)


def _bytes_per_device(tree: Any) -> int:
  total = 0
  for x in jax.tree.leaves(tree):
    shape = x.sharding.shard_shape(x.shape) if x.sharding is not None else x.shape
    total += int(np.prod(shape, dtype=np.int64)) * jnp.dtype(x.dtype).itemsize
  return total


def abstract_model(config: ml_collections.ConfigDict, shape: ModelConfig):
  """(graphdef, trainable, frozen): abstract parameters (the LoRA adapters and the frozen base
  under LoRA; all parameters and None without)."""

  def build():
    model = transformer.Transformer(shape, rngs=nnx.Rngs(0))
    if config.model.lora_rank > 0:
      lora_cfg = lora_lib.LoRAConfig(rank=config.model.lora_rank, alpha=config.model.lora_alpha,
                                     targets=tuple(config.model.lora_targets))
      model = lora_lib.attach(model, lora_cfg, rngs=nnx.Rngs(1))
    return model

  model = nnx.eval_shape(build)
  if config.model.lora_rank > 0:
    graphdef, trainable, frozen = lora_lib.split(model)
    return graphdef, trainable, frozen
  graphdef, params = nnx.split(model)
  return graphdef, params, None


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
  """A stand-in RL pool: train_per_bin prompts in each of the config's arms."""
  arms = builders.num_arms(config)
  return cur.PromptPool.from_arms(np.repeat(np.arange(arms), config.task.train_per_bin))


class _Abstract(NamedTuple):
  """A planned run's abstract inputs (shapes and shardings, no values)."""
  graphdef: Any
  policy: Any        # what the sampler reads: the parameters, or (adapters, frozen base)
  frozen: Any
  ref: Any
  state: Any         # the train state
  key: Any
  row: Callable      # row(*dims, dtype): a [rows, *dims] array over the batch axes
  small: Callable    # small(dims, dtype): a replicated array
  mesh: Any


def _plan_sampler(config: ml_collections.ConfigDict, a: _Abstract, *, prompt_len: int,
                  other_bytes: int) -> tuple[dict, dict]:
  """(the larger-peak of prefill and decode, both) of the run's sampler."""
  n_new, g = config.rl.max_new_tokens, budget.group_slots(config)
  prompts = a.row(prompt_len, dtype=jnp.int32)
  prompt_mask = a.row(prompt_len, dtype=jnp.bool_)
  pre, pre_compiled = _measure(lambda: sampler.prefill.lower(
      a.graphdef, a.policy, prompts, prompt_mask, a.key, max_new_tokens=n_new, pad_id=0,
      group=g, mesh=a.mesh),
      other_bytes)
  out_state = jax.eval_shape(lambda p, t, m, k: sampler.prefill(
      a.graphdef, p, t, m, k, max_new_tokens=n_new, pad_id=0, group=g, mesh=a.mesh),
      a.policy, prompts, prompt_mask, a.key)
  out_state = _abstract(out_state, pre_compiled.output_shardings)
  dec, _ = _measure(lambda: sampler.decode.lower(
      a.graphdef, a.policy, out_state, a.small((), jnp.float32), stop_ids=(1,), pad_id=0,
      mesh=a.mesh),
      other_bytes)
  parts = {"prefill": pre, "decode": dec}
  return max(parts.values(), key=lambda p: p["peak_gib"]), parts


def _plan_learn(config: ml_collections.ConfigDict, a: _Abstract, optimizer, *, use_lora: bool,
                prompt_len: int) -> dict:
  """The memory of the run's learn step."""
  s, g = builders.sampled_prompts(config), budget.group_slots(config)
  n_new = config.rl.max_new_tokens
  rep = mesh_lib.replicated(a.mesh)
  pool = _pool(config)  # with stand-in features for PCL (other curricula ignore them)
  pool = pool.with_features(np.zeros((len(pool.arms), 1), np.float32))
  curriculum = builders.build_curriculum(config, pool, s)
  cur_state = jax.eval_shape(curriculum.init, pool, jax.random.key(0))
  cur_state = _abstract(cur_state, jax.tree.map(lambda _: rep, cur_state))
  p = config.rl.prompts_per_step
  row, small = a.row, a.small
  batch = rl_step.Batch(
      prompt_tokens=row(prompt_len, dtype=jnp.int32), prompt_mask=row(prompt_len,
                                                                      dtype=jnp.bool_),
      tokens=row(n_new, dtype=jnp.int32), mask=row(n_new, dtype=jnp.float32),
      sampler_logprobs=row(n_new, dtype=jnp.float32),
      prompt_ids=small((s,), jnp.int32), arms=small((s,), jnp.int32),
      rewards=small((s, g), jnp.float32), correct=small((s, g), jnp.bool_),
      valid=small((s, g), jnp.bool_), train_groups=small((p,), jnp.int32),
      train_valid=small((p,), jnp.bool_), truncated=small((s, g), jnp.bool_),
      baseline=(small((s,), jnp.float32) if config.rl.algorithm == "counterfactual" else None))
  state_shardings = jax.tree.map(lambda x: x.sharding, a.state)
  learn = rl_step.make_learn(graphdef=a.graphdef, optimizer=optimizer,
                             curriculum_update=curriculum.update,
                             config=builders.learn_config(config), use_lora=use_lora,
                             out_shardings=(state_shardings, rep, rep), mesh=a.mesh)
  measured, _ = _measure(lambda: learn.lower(a.state, cur_state, batch, a.key, a.frozen, a.ref))
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
     "programs": {"sampler": {...}, "learn": {...}}} (numbers in GiB and seconds); the sampler
    entry is the larger-peak of prefill and decode, both listed under "sampler_parts".

  Raises:
    builders.ConfigError: the config is invalid, its rows do not split over the mesh, or
      `model.source` names something without a config.json.
  """
  builders.validate(config, check_source=False)
  mesh = mesh_lib.make_mesh(tuple(config.parallel.mesh_shape))
  shape = model_shape(config, vocab_size)
  if num_layers:
    shape = dataclasses.replace(shape, num_layers=num_layers)
  s, g = builders.sampled_prompts(config), budget.group_slots(config)
  rows, n_new = s * g, config.rl.max_new_tokens
  shards = mesh_lib.batch_size_of(mesh)
  if rows % shards:
    raise builders.ConfigError(
        f"config.parallel.mesh_shape: {rows} rollout rows do not split over data x fsdp = "
        f"{shards} devices")
  graphdef, trainable, frozen = abstract_model(config, shape)
  use_lora = frozen is not None
  optimizer = builders.build_optimizer(config.rl.learning_rate,
                                       max_grad_norm=config.rl.max_grad_norm)
  value = rl_step.init_value_head(shape.d_model) if config.rl.algorithm == "ppo" else None
  state = jax.eval_shape(lambda p, v: rl_step.init_train_state(p, optimizer, v), trainable, value)
  state = _abstract(state, mesh_lib.tree_shardings(state, mesh))
  frozen = None if frozen is None else _abstract(frozen, mesh_lib.param_shardings(frozen, mesh))
  policy = state.params if frozen is None else (state.params, frozen)
  ref = None
  if config.rl.kl_coef and not use_lora:
    ref = state.params  # same shapes and layout as the policy
  rep = mesh_lib.replicated(mesh)
  row = lambda *dims, dtype: jax.ShapeDtypeStruct(
      (rows,) + dims, dtype, sharding=mesh_lib.batch_sharding(mesh, 1 + len(dims)))
  small = lambda dims, dtype: jax.ShapeDtypeStruct(dims, dtype, sharding=rep)
  key = jax.eval_shape(lambda: jax.random.key(0))
  key = jax.ShapeDtypeStruct(key.shape, key.dtype, sharding=rep)

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
  state_bytes = _bytes_per_device(state)
  other_bytes = _bytes_per_device(state.opt_state) + _bytes_per_device(ref)
  args = _Abstract(graphdef=graphdef, policy=policy, frozen=frozen, ref=ref, state=state,
                   key=key, row=row, small=small, mesh=mesh)
  if "sampler" in programs:
    report["programs"]["sampler"], report["sampler_parts"] = _plan_sampler(
        config, args, prompt_len=prompt_len, other_bytes=other_bytes)
  if "learn" in programs:
    report["programs"]["learn"] = _plan_learn(config, args, optimizer, use_lora=use_lora,
                                              prompt_len=prompt_len)
  report["state_gib"] = state_bytes / GIB
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
           f"train state: {report['state_gib']:.2f} GiB per device"]
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
