"""Rollouts on devices of their own against one mesh for both; run by split_mesh_test.py.

  XLA_FLAGS=--xla_force_host_platform_device_count=N python split_mesh_script.py OUT.json WARM

Runs the toy config with rollouts in flight (k = 1, each batch decoded to its end by one version)
three times on the N fake devices: once on one data-parallel mesh of all N (the learner's
devices sample too), once with N / 2 of them a rollout mesh apart (`parallel.rollout_devices`),
once with the learner's weights split by FSDP over all N and the engine decoding its own copy,
split over a tensor axis of 2 (`parallel.rollout_layout`). Writes how far the parameters moved
and the largest difference between the runs', whether their token-level metrics are equal, and
which devices the meshes and the engine's state hold.
The test asserts on them; this file only measures. (With partial rollouts the step that draws a
token, hence the weights that draw it, depends on the slots a row runs in, so only a whole-batch
schedule is comparable across layouts.)
"""

import json
import os
import shutil
import sys

import jax  # pylint: disable=wrong-import-position
import numpy as np  # pylint: disable=wrong-import-position

jax.config.update("jax_numpy_rank_promotion", "raise")

from configs import toy  # pylint: disable=wrong-import-position
from rl_curriculum.train import loop
from rl_curriculum.train.report.metrics import read_jsonl  # pylint: disable=wrong-import-position
from rl_curriculum.train.setup import prepare  # pylint: disable=wrong-import-position

TOKEN_METRICS = ("reward_mean", "correct_mean", "nonzero_adv_frac", "completion_len",
                 "staleness_max", "staleness_mean", "rollout/tokens")


def config(rollout_devices: int, layout: str = "learner"):
  c = toy.get_config()
  c.rl.steps = 2                   # step 2 learns from a batch one version old
  c.eval.every = 100               # held-out evaluations before and after RL only
  c.rl.prompts_per_step = 8        # whole groups on each of up to 8 shards
  c.rl.group_size = 2
  c.rl.engine = "continuous"
  c.rl.decode_slots = 8
  c.rl.max_staleness = 1
  c.rl.off_policy_correction = "none"  # the split meshes are compared, not the correction
  c.rl.learning_rate = 1e-3        # parameters that move well above float rounding
  c.parallel.rollout_devices = rollout_devices
  if layout != "learner":          # FSDP for the learner, the engine's own copy on its devices
    c.parallel.mesh_shape = (1, -1, 1)
    c.parallel.rollout_layout = layout
    c.parallel.rollout_tensor = 2
  return c


def devices_of(tree) -> list:
  """Ids of the devices holding `tree`'s arrays (or named by its shardings)."""
  shardings = [x.sharding if hasattr(x, "sharding") else x for x in jax.tree.leaves(tree)]
  return sorted({d.id for s in shardings for d in s.device_set})


def main(out: str, warm: str):
  n = jax.device_count()
  runs = {}
  for name, rollout_devices, layout in (("one_mesh", 0, "learner"), ("apart", n // 2, "learner"),
                                        ("own_layout", 0, "tensor")):
    workdir = os.path.join(os.path.dirname(out), name)
    shutil.copytree(warm, workdir)
    c = config(rollout_devices, layout)
    loop.train_and_evaluate(c, workdir)
    run = prepare.prepare(c, workdir, log=lambda _: None)
    runs[name] = (read_jsonl(os.path.join(workdir, "metrics.jsonl"))[1:],
                  loop.restore_params(c, run, workdir)[1])
  (rows_a, params_a), (rows_b, params_b) = runs["one_mesh"], runs["apart"]
  rows_c, params_c = runs["own_layout"]
  c = config(0, "tensor")
  own, _ = loop.fresh_state(c, prepare.prepare(c, workdir, log=lambda _: None),
                            prepare.run_mesh(c))
  c = config(n // 2)
  programs, state = loop.fresh_state(c, prepare.prepare(c, workdir, log=lambda _: None),
                                     prepare.run_mesh(c))
  start = jax.tree.leaves(state.train.params)
  result = {
      "params_moved": max(float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
                          for a, b in zip(jax.tree.leaves(params_a), start)),
      "devices": n, "steps": [len(rows_a), len(rows_b)],
      "params_diff": max(float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
                         for a, b in zip(jax.tree.leaves(params_a), jax.tree.leaves(params_b))),
      "token_metrics_equal": all(a[m] == b[m] for a, b in zip(rows_a, rows_b)
                                 for m in TOKEN_METRICS),
      "staleness_max": max(r["staleness_max"] for r in rows_b),
      "learner_mesh": devices_of(programs.train_shardings),
      "rollout_mesh": devices_of(programs.rollout_shardings),
      "engine": devices_of(state.rollouts.engine),
      "own_layout": {
          "params_diff": max(float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
                             for a, b in zip(jax.tree.leaves(params_a),
                                             jax.tree.leaves(params_c))),
          "token_metrics_equal": all(a[m] == b[m] for a, b in zip(rows_a, rows_c)
                                     for m in TOKEN_METRICS),
          "steps": len(rows_c), "rollout_mesh": dict(own.rollout_mesh.shape),
          "learner_mesh": dict(own.mesh.shape), "resharded": own.reshard is not None}}
  with open(out, "w") as f:
    json.dump(result, f, indent=1)


if __name__ == "__main__":
  main(sys.argv[1], sys.argv[2])
