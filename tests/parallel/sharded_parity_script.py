"""Sharded learn step and sampling against one device; run by sharded_test.py in a subprocess.

  XLA_FLAGS=--xla_force_host_platform_device_count=8 python sharded_parity_script.py OUT.json \
      8,1,1 2,4,1 ...

Writes, per mesh shape, the largest differences from the single-device run (loss, parameters and
optimizer state after one learn step, sampler log-probs), whether the curriculum states and the
greedy tokens are identical, the output parameter layout, and parameter bytes per device. The test
asserts on them; this file only measures.
"""

import dataclasses
import json
import os
import sys

if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                             + " --xla_force_host_platform_device_count=8")

import jax  # pylint: disable=wrong-import-position
import jax.numpy as jnp  # pylint: disable=wrong-import-position
import numpy as np  # pylint: disable=wrong-import-position

jax.config.update("jax_numpy_rank_promotion", "raise")
jax.config.update("jax_default_matmul_precision", "highest")

from configs import scratch  # pylint: disable=wrong-import-position
from rl_curriculum import curriculum as cur  # pylint: disable=wrong-import-position
from rl_curriculum.model import transformer  # pylint: disable=wrong-import-position
from rl_curriculum.model.config import ModelConfig  # pylint: disable=wrong-import-position
from rl_curriculum.parallel import distributed  # pylint: disable=wrong-import-position
from rl_curriculum.parallel import mesh as mesh_lib  # pylint: disable=wrong-import-position
from rl_curriculum.sampling import sampler  # pylint: disable=wrong-import-position
from rl_curriculum.train.learn import forward, rl_step  # pylint: disable=wrong-import-position
from rl_curriculum.train.learn.rl_types import Batch
from rl_curriculum.train.setup import builders
from rl_curriculum.train.state import init_train_state

P, G, TP, T, V, K = 4, 2, 6, 5, 64, 3
B = P * G



def bytes_per_device(tree) -> dict:
  """{device: bytes of `tree`'s shards it holds}, read off the addressable shards."""
  out = {}
  for x in jax.tree.leaves(tree):
    for shard in x.addressable_shards:
      out[shard.device] = out.get(shard.device, 0) + shard.data.nbytes
  return out

def setup():
  config = ModelConfig.tiny(vocab_size=V, d_model=32, num_layers=2, num_heads=4, num_kv_heads=2,
                            mlp_dim=64, tie_embeddings=False)
  graphdef, params = transformer.init_model(config, seed=0)
  optimizer = builders.build_optimizer(1e-3, max_grad_norm=1.0)
  curriculum = cur.sec(K, batch_size=P, alpha=0.5)
  cur_state = curriculum.init(cur.PromptPool.from_arms([0, 1, 2, 0, 1, 2, 0, 1]),
                              jax.random.PRNGKey(0))
  rng = np.random.default_rng(0)
  lengths = rng.integers(2, TP + 1, B)
  prompt_mask = np.arange(TP)[None, :] >= (TP - lengths)[:, None]    # left padding
  # Every group has one right and one wrong completion, so every gradient entry a token touches
  # is far above float32 noise: Adam divides by sqrt(v) + 1e-8, which turns the summation-order
  # noise of a gradient that is zero in exact arithmetic into a full learning-rate step.
  rewards = np.array([[1, 0], [0, 1], [0, 1], [1, 0]], np.float32)
  batch = Batch(
      prompt_tokens=np.where(prompt_mask, rng.integers(4, V, (B, TP)), 0).astype(np.int32),
      prompt_mask=prompt_mask, tokens=rng.integers(4, V, (B, T)).astype(np.int32),
      mask=(np.arange(T)[None, :] < rng.integers(1, T + 1, B)[:, None]).astype(np.float32),
      sampler_logprobs=np.full((B, T), -3.0, np.float32),
      prompt_ids=np.arange(P, dtype=np.int32), arms=np.array([0, 1, 2, 0], np.int32),
      rewards=rewards, correct=rewards > 0.5, valid=np.ones((P, G), bool),
      train_groups=np.arange(P, dtype=np.int32), train_valid=np.ones(P, bool))
  learn_config = dataclasses.replace(builders.learn_config(scratch.get_config()),
                                     minibatches=2, kl_coef=0.1, max_tokens=T)
  return graphdef, params, optimizer, curriculum, cur_state, batch, learn_config


def run(graphdef, params, optimizer, curriculum, cur_state, batch, learn_config, mesh=None):
  """One learn step and one greedy sampling call, on one device (mesh None) or sharded."""
  state = init_train_state(params, optimizer)
  ref = jax.tree.map(jnp.asarray, params)
  out_shardings = None
  if mesh is not None:
    state_sh = mesh_lib.tree_shardings(state, mesh)
    rep = mesh_lib.replicated(mesh)
    state = distributed.place(state, state_sh)
    ref = distributed.place(ref, mesh_lib.param_shardings(ref, mesh))
    cur_state = distributed.place(cur_state, jax.tree.map(lambda _: rep, cur_state))
    batch = distributed.place(batch, mesh_lib.batch_shardings(batch, mesh, rows=B))
    out_shardings = (state_sh, rep, rep)
  else:
    batch = jax.tree.map(jnp.asarray, batch)
  learn = rl_step.make_learn(graphdef=graphdef, optimizer=lambda _: optimizer,
                             curriculum_update=lambda s, f, _: curriculum.update(s, f),
                             use_lora=False, out_shardings=out_shardings)
  new_state, new_cur, metrics = learn(state, cur_state, batch, jax.random.PRNGKey(3), None, ref,
                                      learn_config)
  rollout = sampler.sample(graphdef, ref, batch.prompt_tokens, batch.prompt_mask,
                           jax.random.PRNGKey(4), max_new_tokens=6, eos_id=1, greedy=True)
  return new_state, new_cur, metrics, rollout


def max_diff(a, b):
  return max(float(np.max(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64))))
             for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def head_gradient(shape):
  """The chunked output head's parameter gradient on a mesh of `shape` (a tied 4096-entry
  vocabulary): per-device temporary bytes of the compiled gradient, vocabulary-parallel and with
  the rows split over the batch axes (the FSDP layout, which gathers the head), and the largest
  difference of each gradient from the one-device gradient."""
  config = ModelConfig.tiny(vocab_size=4096, d_model=64, num_layers=1, num_heads=2,
                            num_kv_heads=1, mlp_dim=64, tie_embeddings=True)
  graphdef, params = transformer.init_model(config, seed=0)
  rng = np.random.default_rng(1)
  hidden = jnp.asarray(rng.normal(size=(8, 16, 64)), jnp.float32)
  tokens = jnp.asarray(rng.integers(0, 4096, (8, 16)), jnp.int32)
  weights = jnp.asarray(rng.normal(size=(8, 16)), jnp.float32)

  def grad_fn(**layout):
    return jax.jit(jax.grad(lambda prm, h: jnp.sum(weights * forward.head_logprobs(
        graphdef, prm, h, tokens, temperature=0.7, chunk_size=2, **layout)[0])))

  with jax.default_device(jax.devices()[0]):
    expected = jax.device_get(grad_fn()(params, hidden))
  mesh = mesh_lib.make_mesh(shape)
  placed = distributed.place(params, mesh_lib.param_shardings(params, mesh))
  rows = distributed.place(hidden, mesh_lib.batch_sharding(mesh, 3))
  out = {"whole_gradient_bytes": int(np.prod(params["embed"].get_value().shape)) * 4}
  for name, layout in (("vocab_parallel", {"vocab_mesh": mesh}),
                       ("rows", {"constrain": forward.row_constraint(mesh)})):
    fn = grad_fn(**layout)
    out[name + "_temp_bytes"] = fn.lower(placed, rows).compile().memory_analysis(
        ).temp_size_in_bytes
    out[name + "_diff"] = max_diff(jax.device_get(fn(placed, rows)), expected)
  return out


def main(out_path, shapes):
  parts = setup()
  with jax.default_device(jax.devices()[0]):
    ref_state, ref_cur, ref_metrics, ref_rollout = run(*parts)
  ref_state, ref_cur, ref_metrics, ref_rollout = jax.device_get(
      (ref_state, ref_cur, ref_metrics, ref_rollout))
  params = parts[1]
  total_bytes = sum(np.asarray(x).nbytes for x in jax.tree.leaves(params))
  results = {"total_param_bytes": total_bytes, "devices": jax.device_count(),
             "loss": float(ref_metrics["loss"]), "meshes": {}}
  for shape in shapes:
    mesh = mesh_lib.make_mesh(shape)
    state, cur_state, metrics, rollout = run(*parts, mesh=mesh)
    wanted = mesh_lib.tree_shardings(state, mesh)
    layout_kept = all(x.sharding.is_equivalent_to(s, x.ndim)
                      for x, s in zip(jax.tree.leaves(state), jax.tree.leaves(wanted)))
    per_device = bytes_per_device(state.params)
    host = jax.device_get((state, cur_state, metrics, rollout))
    results["meshes"][",".join(map(str, shape))] = {
        "loss_diff": abs(float(host[2]["loss"]) - float(ref_metrics["loss"])),
        "params_diff": max_diff(host[0].params, ref_state.params),
        "opt_state_diff": max_diff(host[0].opt_state, ref_state.opt_state),
        "params_changed": max_diff(host[0].params, params),
        "curriculum_equal": all(np.array_equal(np.asarray(x), np.asarray(y))
                                for x, y in zip(jax.tree.leaves(host[1]),
                                                jax.tree.leaves(ref_cur))),
        "metrics_diff": max_diff({k: v for k, v in host[2].items() if k != "curriculum"},
                                 {k: v for k, v in ref_metrics.items() if k != "curriculum"}),
        "tokens_equal": bool(np.array_equal(host[3].tokens, ref_rollout.tokens)),
        "mask_equal": bool(np.array_equal(host[3].mask, ref_rollout.mask)),
        "logprobs_diff": max_diff(host[3].logprobs, ref_rollout.logprobs),
        "layout_kept": bool(layout_kept),
        "max_param_bytes_per_device": max(per_device.values()),
        "embed_spec": str(state.params["embed"].get_value().sharding.spec),
    }
  results["head_gradient"] = head_gradient((1, 8, 1))
  with open(out_path, "w") as f:
    json.dump(results, f, indent=1)


if __name__ == "__main__":
  main(sys.argv[1], [tuple(int(s) for s in arg.split(",")) for arg in sys.argv[2:]])
