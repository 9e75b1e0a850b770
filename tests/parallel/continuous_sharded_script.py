"""Continuous engine on 8 fake CPU devices: rows, prompts and decode slots over the batch axes.

Run by continuous_sharded_test.py as `python continuous_sharded_script.py OUT.json SHAPE...`; for
each mesh shape (data,fsdp,tensor) it samples greedily and with per-row keys on the mesh (8
slots), and with per-row keys on 16 slots halved twice as the rows run out ("shrunk"), against
one device, and writes how far the results are apart and where the caches live; then the same
on the engine's own copy of FSDP-split weights in each rollout layout ("layouts").
"""

import json
import os
import sys

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_force_host_platform_device_count=8")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import jax  # pylint: disable=wrong-import-position
import jax.numpy as jnp  # pylint: disable=wrong-import-position
import numpy as np  # pylint: disable=wrong-import-position

from rl_curriculum.model import transformer  # pylint: disable=wrong-import-position
from rl_curriculum.model.config import ModelConfig  # pylint: disable=wrong-import-position
from rl_curriculum.parallel import distributed  # pylint: disable=wrong-import-position
from rl_curriculum.parallel import mesh as mesh_lib  # pylint: disable=wrong-import-position
from rl_curriculum.parallel import rollout_layout  # pylint: disable=wrong-import-position
from rl_curriculum.sampling import continuous  # pylint: disable=wrong-import-position

P, G, TP, N, V = 8, 2, 6, 7, 64
R = P * G


def _inputs():
  rng = np.random.default_rng(0)
  prompts = np.repeat(rng.integers(1, V, size=(P, TP)).astype(np.int32), G, axis=0)
  mask = np.ones((R, TP), bool)
  mask[::3, :2] = False
  active = np.ones(R, bool)
  active[[1, 6, 7, 12]] = False  # skipped rows, on several shards
  stop_after = rng.integers(1, N + 1, size=R).astype(np.int32)  # long and short rows
  return prompts, mask, active, stop_after


def _sample(params, graphdef, inputs, greedy, mesh=None, slots=8, shrink=0, **paging):
  prompts, mask, active, stop_after = inputs
  if mesh is not None:
    rows = lambda x: distributed.place(jnp.asarray(x), mesh_lib.batch_sharding(mesh, x.ndim))
    prompts, mask, active, stop_after = map(rows, (prompts, mask, active, stop_after))
  return continuous.sample(graphdef, params, prompts, mask, jax.random.PRNGKey(4),
                           max_new_tokens=N, eos_id=V, slots=slots, temperature=0.9,
                           greedy=greedy, group=G, mesh=mesh, active=active,
                           stop_after=stop_after, shrink=shrink, **paging)


def _layouts(params, graphdef, inputs, refs):
  """The engine on its own copy of the weights (`rollout_layout`): the learner's parameters
  under FSDP over the 8 devices, resharded once to each layout's mesh of the same devices, then
  sampled greedily and on a paged cache with per-row keys, against one device."""
  learner = mesh_lib.make_mesh((1, 8, 1))
  placed = distributed.place(params, mesh_lib.param_shardings(params, learner))
  out = {}
  for name, tensor in (("replicated", 1), ("tensor", 2)):
    mesh = rollout_layout.layout_mesh(learner, name, tensor)
    copy = rollout_layout.reshard(mesh_lib.param_shardings(params, mesh), jnp.float32)(placed)
    out[name] = {"mesh": dict(mesh.shape),
                 "same_devices": list(mesh.devices.flat) == list(learner.devices.flat),
                 "weights_whole": all(x.sharding.is_fully_replicated
                                      for x in jax.tree.leaves(copy))}
    for mode, greedy, paging in (("greedy", True, {}), ("paged", False, dict(page_size=2))):
      gen = _sample(copy, graphdef, inputs, greedy, mesh, 16, 2, **paging)
      host, ref = jax.device_get(gen), refs[greedy]
      out[name][mode] = {
          "tokens_equal": bool((host.rollout.tokens == ref.rollout.tokens).all()),
          "mask_equal": bool((host.rollout.mask == ref.rollout.mask).all()),
          "logprobs_diff": float(np.abs(host.rollout.logprobs - ref.rollout.logprobs).max())}
  return out


def main(out_path, shapes):
  config = ModelConfig.tiny(vocab_size=V, d_model=64, num_layers=2, num_heads=4, num_kv_heads=2,
                            mlp_dim=128, scan_layers=True)
  graphdef, params = transformer.init_model(config, seed=0)
  inputs = _inputs()
  results = {"devices": jax.device_count(), "meshes": {}}
  refs = {g: jax.device_get(_sample(params, graphdef, inputs, g)) for g in (True, False)}
  for shape in shapes:
    mesh = mesh_lib.make_mesh(shape)
    placed = distributed.place(params, mesh_lib.param_shardings(params, mesh))
    out = {}
    shards = mesh_lib.batch_size_of(mesh)
    # The fewest pages of 2 tokens 16 slots allow: rows run out of pages and restart.
    tight = dict(page_size=2, kv_pages=shards * (-(-N // 2) + 1 + 16 // shards - 1))
    for name, greedy, slots, shrink, paging in (
        ("greedy", True, 8, 0, {}), ("sampled", False, 8, 0, {}), ("shrunk", False, 16, 2, {}),
        ("paged", False, 16, 2, tight)):
      gen = _sample(placed, graphdef, inputs, greedy, mesh, slots, shrink, **paging)
      host, ref = jax.device_get(gen), refs[greedy]
      out[name] = {
          "tokens_equal": bool((host.rollout.tokens == ref.rollout.tokens).all()),
          "mask_equal": bool((host.rollout.mask == ref.rollout.mask).all()),
          "logprobs_diff": float(np.abs(host.rollout.logprobs - ref.rollout.logprobs).max()),
          "tokens_kept": float(host.rollout.mask.sum()),
          "slot_steps": int(host.slot_steps),
          "rows_sharded": not gen.rollout.tokens.sharding.is_fully_replicated}
    results["meshes"][",".join(map(str, shape))] = out
  results["layouts"] = _layouts(params, graphdef, inputs, refs)
  state = continuous.start(graphdef, placed, *[distributed.place(jnp.asarray(x),
                                                                 mesh_lib.batch_sharding(
                                                                     mesh, x.ndim))
                                               for x in inputs[:2]],
                           jax.random.PRNGKey(0), jnp.float32(1.0), max_new_tokens=N, slots=8,
                           group=G, mesh=mesh)
  paged = continuous.start(graphdef, placed, *[distributed.place(jnp.asarray(x),
                                                                 mesh_lib.batch_sharding(
                                                                     mesh, x.ndim))
                                               for x in inputs[:2]],
                           jax.random.PRNGKey(0), jnp.float32(1.0), max_new_tokens=N, slots=8,
                           group=G, mesh=mesh, page_size=2)
  results["pages"] = {"global": list(paged.cache.pool.shape),
                      "per_device": list(paged.cache.pool.addressable_shards[0].data.shape)}
  shard = state.cache.k.addressable_shards[0].data
  results["cache"] = {"global": list(state.cache.k.shape), "per_device": list(shard.shape),
                      "prompt_per_device": list(
                          state.cache.prompt_k.addressable_shards[0].data.shape)}
  with open(out_path, "w") as f:
    json.dump(results, f, indent=1)


if __name__ == "__main__":
  main(sys.argv[1], [tuple(int(n) for n in s.split(",")) for s in sys.argv[2:]])
