"""Step time of the sharded learn step and sampler on 1 to 8 fake CPU devices.

  python -m benchmarks.scaling --out benchmarks/results/scaling_cpu.json

Run from the repository root. Each device count runs in its own process
(`--xla_force_host_platform_device_count=N` must be set before JAX starts), on meshes (N, 1, 1)
(data parallel) and (1, N, 1) (FSDP), with the scratch config's tiny model (about 3M parameters),
16 prompts x 4 completions, 8 prompt and 8 new tokens. Reported: median wall time of one learn
step and of one greedy sampling call, after a compile-and-warm-up call.

Read the numbers for what they are: fake CPU devices share the same cores (2 on the machines
this project is developed on), so more devices cannot be faster; the ratio to one device measures
the partitioning overhead (collectives, smaller per-device kernels, thread contention), not a
speed-up. Real scaling needs real accelerators.
"""

import json
import os
import subprocess
import sys
import time

from absl import app
from absl import flags
import jax
import numpy as np

from configs import scratch
from rl_curriculum import curriculum as cur
from rl_curriculum.model import transformer
from rl_curriculum.model.config import ModelConfig
from rl_curriculum.parallel import distributed
from rl_curriculum.parallel import mesh as mesh_lib
from rl_curriculum.sampling import sampler
from rl_curriculum.train import programs as programs_lib
from rl_curriculum.train.learn import examples

FLAGS = flags.FLAGS


P, G, TP, T, V = 16, 4, 8, 8, 64
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _median_time(fn, repeats):
  jax.block_until_ready(fn())  # compile and warm up
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - t0)
  return sorted(times)[len(times) // 2]


def _batch():
  """P x G rows with a distinct random prompt per row, -4 sampler log-probs, 3 arms."""
  rng = np.random.default_rng(0)
  rewards = rng.integers(0, 2, (P, G)).astype(np.float32)
  prompt_tokens = rng.integers(4, V, (P * G, TP))
  tokens = rng.integers(4, V, (P * G, T))
  return examples.make_batch(prompt_tokens, tokens, rewards, sampler_logprob=-4.0, num_arms=3)


def _config():
  """The scratch config's learn step (clipping, ratio guard, rollback KL) with two minibatches of
  the benchmark's P prompts x G completions of T tokens."""
  config = scratch.get_config()
  config.rl.minibatches = 2
  config.rl.max_new_tokens = T
  config.rl.learning_rate = 1e-4
  config.rl.prompts_per_step, config.rl.group_size = P, G
  return config


def measure(num_devices: int, repeats: int) -> list:
  """[{mesh, learn_s, sample_s}] for the data-parallel and the FSDP mesh of `num_devices`."""
  assert jax.device_count() == num_devices, jax.devices()
  config = _config()
  graphdef, params = transformer.init_model(ModelConfig.tiny(vocab_size=V), seed=0)
  model = programs_lib.Model(graphdef=graphdef, trainable=params, frozen=None)
  pool = cur.PromptPool.from_arms(list(range(3)) * 8)
  b = P * G
  batch = _batch()
  out = []
  shapes = [(num_devices, 1, 1)] + ([(1, num_devices, 1)] if num_devices > 1 else [])
  for shape in shapes:
    mesh = mesh_lib.make_mesh(shape)
    programs = programs_lib.build(config, model, mesh, pool,
                                  programs_lib.TokenIds(eos_id=1, pad_id=0))
    state = programs_lib.place(programs, programs_lib.init_run_state(
        config, programs, model, pool, jax.random.key(0)))
    placed = distributed.place(batch, mesh_lib.batch_shardings(batch, mesh, rows=b))
    weights = distributed.place(params, mesh_lib.param_shardings(params, mesh))
    holder = {"state": state}

    def learn_once():
      train, _, metrics = programs.learn(*programs_lib.learn_inputs(
          programs, holder["state"], placed, jax.random.key(1), None))
      holder["state"] = holder["state"]._replace(train=train)
      return metrics["loss"]

    def sample_once():
      return sampler.sample(graphdef, weights, placed.prompt_tokens, placed.prompt_mask,
                            jax.random.key(2), max_new_tokens=T, eos_id=1, greedy=True).tokens

    out.append({"devices": num_devices, "mesh": list(shape),
                "learn_s": _median_time(learn_once, repeats),
                "sample_s": _median_time(sample_once, repeats)})
  return out


def define_flags() -> None:
  """The command's flags; defined when it runs, so that importing this module defines none."""
  flags.DEFINE_string("out", "benchmarks/results/scaling_cpu.json", "Where the JSON goes.")
  flags.DEFINE_list("devices", ["1", "2", "4", "8"], "Device counts to measure.")
  flags.DEFINE_integer("repeats", 3, "Timed calls per measurement (median reported).")
  flags.DEFINE_integer("child", 0, "Internal: measure with this many devices, print JSON.")


def main(argv):
  del argv
  if FLAGS.child:
    print("RESULT " + json.dumps(measure(FLAGS.child, FLAGS.repeats)), flush=True)
    return
  rows = []
  for n in map(int, FLAGS.devices):
    env = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={n}"}
    result = subprocess.run([sys.executable, "-m", "benchmarks.scaling",
                             f"--child={n}", f"--repeats={FLAGS.repeats}"], cwd=ROOT, env=env,
                            capture_output=True, text=True, check=True)
    line = [l for l in result.stdout.splitlines() if l.startswith("RESULT ")][-1]
    rows.extend(json.loads(line[len("RESULT "):]))
    print(rows[-1], flush=True)
  base = {tuple(r["mesh"]): r for r in rows if r["devices"] == 1}[(1, 1, 1)]
  for r in rows:
    r["learn_vs_1_device"] = r["learn_s"] / base["learn_s"]
    r["sample_vs_1_device"] = r["sample_s"] / base["sample_s"]
  report = {
      "what": "median seconds per learn step / greedy sampling call; fake CPU devices",
      "cpu_cores": os.cpu_count(),
      "workload": {"prompts": P, "group": G, "prompt_len": TP, "new_tokens": T,
                   "model": "ModelConfig.tiny(vocab_size=64)", "minibatches": 2},
      "caveat": "all fake devices share the same CPU cores: ratios above 1 are partitioning "
                "overhead, not a failure to scale; no speed-up is possible here",
      "rows": rows,
  }
  os.makedirs(os.path.dirname(os.path.abspath(FLAGS.out)), exist_ok=True)
  with open(FLAGS.out, "w") as f:
    json.dump(report, f, indent=1)
  print(f"wrote {FLAGS.out}")


if __name__ == "__main__":
  define_flags()
  app.run(main)
