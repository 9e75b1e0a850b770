"""Run with fake CPU devices (tests/plan/planner_test.py): plans the tiny config, then runs one real
learn step with the same shapes and shardings and measures what stays on a device."""

import json
import sys

import jax
import jax.numpy as jnp
import numpy as np

from configs import scratch
from rl_curriculum import curriculum as cur
from rl_curriculum.model import transformer
from rl_curriculum.parallel import distributed
from rl_curriculum.parallel import mesh as mesh_lib
from rl_curriculum.plan import planner as plan
from rl_curriculum.train import programs
from rl_curriculum.train.learn.rl_types import Batch

TP = 12


def _config():
  c = scratch.get_config()
  c.rl.prompts_per_step = 8
  c.rl.group_size = 4
  c.rl.max_new_tokens = 8
  c.rl.minibatches = 2
  c.rl.microbatches = 2
  c.rl.logits_chunk = 4
  c.model.scan_layers = True
  c.model.remat = "block"
  c.task.train_per_bin = 10
  c.rl.decode_slots = 8               # both engines are planned; this one's peak is reported
  c.parallel.mesh_shape = (1, -1, 1)
  return c


def live_bytes_on(device) -> int:
  return sum(s.data.nbytes for x in jax.live_arrays() for s in x.addressable_shards
             if s.device == device)


def main(out):
  config = _config()
  report = plan.plan(config, hbm_gib=1.0, prompt_len=TP, all_engines=True)
  in_flight = _config()
  in_flight.rl.engine = "continuous"
  in_flight.rl.max_staleness = 2      # three batches' prompt slots in the engine
  in_flight.rl.tis_cap = 2.0
  in_flight.rl.decode_budget = 4
  in_flight_report = plan.plan(in_flight, hbm_gib=1.0, prompt_len=TP, programs=("sampler",),
                               all_engines=True)

  # The same learn step, built by the loop's builder and run for real.
  mesh = mesh_lib.make_mesh(tuple(config.parallel.mesh_shape))
  graphdef, params = transformer.init_model(plan.model_shape(config), seed=0)
  model = programs.Model(graphdef=graphdef, trainable=params, frozen=None)
  pool = cur.PromptPool.from_arms(np.repeat(np.arange(len(config.task.train_bins)),
                                            config.task.train_per_bin))
  progs = programs.build(config, model, mesh, pool, programs.TokenIds(eos_id=1, pad_id=0))
  state = programs.place(progs, programs.init_run_state(config, progs, model, pool,
                                                        jax.random.key(0)))
  del params, model
  s, g, n = config.rl.prompts_per_step, config.rl.group_size, config.rl.max_new_tokens
  rows = s * g
  rng = np.random.default_rng(0)
  rewards = rng.integers(0, 2, (s, g)).astype(np.float32)
  batch = Batch(
      prompt_tokens=rng.integers(4, 60, (rows, TP)).astype(np.int32),
      prompt_mask=np.ones((rows, TP), bool),
      tokens=rng.integers(4, 60, (rows, n)).astype(np.int32), mask=np.ones((rows, n), np.float32),
      sampler_logprobs=np.full((rows, n), -4.0, np.float32),
      prompt_ids=np.arange(s, dtype=np.int32), arms=(np.arange(s) % 3).astype(np.int32),
      rewards=rewards, correct=rewards > 0.5, valid=np.ones((s, g), bool),
      train_groups=np.arange(s, dtype=np.int32), train_valid=np.ones(s, bool))
  batch = distributed.place(batch, mesh_lib.batch_shardings(batch, mesh, rows=rows))
  device = jax.devices()[0]
  before = live_bytes_on(device)
  train, curriculum, metrics = progs.learn(*programs.learn_inputs(progs, state, batch,
                                                                   jax.random.key(1), None))
  jax.block_until_ready((train, curriculum, metrics))
  after = live_bytes_on(device)
  learn_plan = report["programs"]["learn"]
  peak = learn_plan["peak_gib"] * plan.GIB
  with open(out, "w") as f:
    json.dump({"report": report, "in_flight": in_flight_report, "live_before": before, "live_after": after,
               "argument_bytes": learn_plan["argument_gib"] * plan.GIB,
               "peak_bytes": peak, "loss_finite": bool(jnp.isfinite(metrics["loss"])),
               "fits_above": plan.plan(config, hbm_gib=1.01 * max(
                   p["peak_gib"] for p in report["programs"].values()), prompt_len=TP)["fits"],
               "fits_below": plan.plan(config, hbm_gib=0.99 * learn_plan["peak_gib"],
                                       prompt_len=TP, programs=("learn",))["fits"]}, f)


if __name__ == "__main__":
  main(sys.argv[1])
