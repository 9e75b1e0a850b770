"""One sampler call and one learn step of a random-init Qwen2.5 model on one GPU (benchmarks/gpu/run.sh).

For each model (0.5B, then 1.5B while the time budget lasts), at 64 prompts x 8 completions,
prompt 256 and 512 new tokens (the SEC paper's batch shape, scaled to one device), bfloat16
compute on float32 master weights and Adam moments, scanned layers, block remat, 4 microbatches,
logits in chunks of 128 positions:
  - wall time of one sampler call (prefill + decode of all 512 new tokens: no stop token can
    occur, the stop id lies outside the vocabulary) and of one learn step, each after a compile
    call;
  - model-FLOPs utilisation: 2 N per generated token for sampling, 6 N per trained token (+ 2 N
    per token of the old-policy pass) for learning, N = parameters without the embedding, against
    the chip's dense bfloat16 peak;
  - memory: XLA's analysis of the compiled learn step (what `experiments/plan.py` reports, here
    from the GPU compiler and from the CPU compiler of the same programs) and the device's
    measured peak (`memory_stats()["peak_bytes_in_use"]`).
Before that, both rollout engines (`benchmarks/rollout.py`'s long-tailed workload:
completion lengths log-normal, p90 about 4.7x the median) on the same models in bfloat16, static
against continuous at equal cache memory, `ROLLOUT` sizes: slot utilisation, tokens/s and the
speed-up, as in benchmarks/results/rollout_engine.json; and the paged engine (reference
attention) against the dense one and at twice the slots on the same pool (`benchmarks.paged`).

Writes one JSON, after every part (a part that fails records its error and the next one runs).
"""

import argparse
import dataclasses
import json
import os
import time
import traceback

import jax
import jax.numpy as jnp
import numpy as np
import optax

from benchmarks import paged
from benchmarks import rollout
from rl_curriculum import curriculum as cur
from rl_curriculum.model import pretrained
from rl_curriculum.model import transformer
from rl_curriculum.model.config import PRESETS
from rl_curriculum.sampling import sampler
from rl_curriculum.train.learn import rl_step
from rl_curriculum.train.learn.rl_types import Batch, LearnConfig
from rl_curriculum.train.state import init_train_state

GIB = 1024 ** 3
# Dense bfloat16 peak, FLOP/s, by device kind (vendor data sheets).
PEAKS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L4": 121e12, "TPU v5p": 459e12,
         "TPU v4": 275e12}
P, G, TP, T = 64, 8, 256, 512
SMOKE = (8, 2, 8, 8)   # --smoke: the tiny model at these sizes, to check the script on a CPU
# Rollout engines: prompts (x 8 rows), prompt length, max new tokens, decode slots, halvings. The
# static engine's rows per call at equal cache memory come to 240, a divisor of the 960 rows.
ROLLOUT = (120, 128, 1024, 256, 3)
ROLLOUT_SMOKE = (4, 16, 32, 8, 2)
PAGE_SIZE = 16  # tokens a KV page of the paged engine (`benchmarks.paged`)


def _peak_flops(kind: str):
  for name, peak in PEAKS.items():
    if name.lower() in kind.lower():
      return peak
  return None


def _learn_config(T):
  """The scratch config's learn settings with this benchmark's batch split and length cap, no
  ratio guard and no KL rollback."""
  from configs import scratch  # pylint: disable=import-outside-toplevel
  return dataclasses.replace(
      LearnConfig.from_config(scratch.get_config()), minibatches=2, microbatches=4,
      logits_chunk=128, max_tokens=T, learning_rate=1e-6, ratio_guard=0.0, max_kl=0.0)


def _memory(compiled):
  m = compiled.memory_analysis()
  return {"argument_gib": m.argument_size_in_bytes / GIB, "output_gib": m.output_size_in_bytes / GIB,
          "temp_gib": m.temp_size_in_bytes / GIB,
          "peak_gib": (m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes
                       + m.temp_size_in_bytes) / GIB}


def _peak_in_use(device):
  """GiB the device's allocator has held at most so far (None where it does not say: CPU)."""
  stats = device.memory_stats()
  return None if not stats else stats.get("peak_bytes_in_use", 0) / GIB


def _timed(fn):
  jax.block_until_ready(fn())   # compile and warm up
  t0 = time.perf_counter()
  jax.block_until_ready(fn())
  return time.perf_counter() - t0


def _on(device, tree):
  """The arrays of `tree` as abstract arrays on `device` (Python numbers, the learn config's
  coefficients, as they are)."""
  return jax.tree.map(lambda x: x if not hasattr(x, "shape") else jax.ShapeDtypeStruct(
      x.shape, x.dtype, sharding=jax.sharding.SingleDeviceSharding(device)), tree)


def measure(preset: str, sizes=(P, G, TP, T)) -> dict:
  P, G, TP, T = sizes  # pylint: disable=redefined-outer-name,invalid-name
  extra = {"vocab_size": 256} if preset == "tiny" else {}
  config = PRESETS[preset](dtype="bfloat16", param_dtype="float32", scan_layers=True,
                           remat="block", **extra)
  gpu = jax.devices()[0]
  graphdef, params = transformer.init_model(config, seed=0)
  optimizer = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-6, b1=0.9, b2=0.99,
                                                                       weight_decay=0.0))
  state = init_train_state(params, optimizer)
  del params
  curriculum = cur.sec(3, batch_size=P)
  pool = cur.PromptPool.from_arms(np.arange(3 * 64) % 3)
  cur_state = curriculum.init(pool, jax.random.key(0))
  rng = np.random.default_rng(0)
  rows = P * G
  prompts = jnp.asarray(rng.integers(10, config.vocab_size, (rows, TP)), jnp.int32)
  prompt_mask = jnp.ones((rows, TP), bool)
  stop = config.vocab_size + 1   # never sampled: every row decodes all T tokens

  def sample(params=state.params):
    return sampler.sample(graphdef, params, prompts, prompt_mask, jax.random.key(1),
                          max_new_tokens=T, eos_id=stop, group=G).tokens

  sample_s = _timed(sample)
  sample_peak = _peak_in_use(gpu)
  rewards = rng.integers(0, 2, (P, G)).astype(np.float32)
  batch = Batch(
      prompt_tokens=prompts, prompt_mask=prompt_mask,
      tokens=jnp.asarray(rng.integers(10, config.vocab_size, (rows, T)), jnp.int32),
      mask=jnp.ones((rows, T), jnp.float32), sampler_logprobs=jnp.full((rows, T), -3.0),
      prompt_ids=jnp.arange(P, dtype=jnp.int32), arms=jnp.arange(P, dtype=jnp.int32) % 3,
      rewards=jnp.asarray(rewards), correct=jnp.asarray(rewards > 0.5),
      valid=jnp.ones((P, G), bool), train_groups=jnp.arange(P, dtype=jnp.int32),
      train_valid=jnp.ones(P, bool))
  learn = rl_step.make_learn(graphdef=graphdef, optimizer=lambda _: optimizer,
                             curriculum_update=lambda s, f, _: curriculum.update(s, f),
                             use_lora=False)
  args = (state, cur_state, batch, jax.random.key(2), None, None, _learn_config(T))
  planned = {"device": _memory(learn.lower(*args).compile())}
  if jax.devices("cpu"):
    planned["cpu"] = _memory(learn.lower(*_on(jax.devices("cpu")[0], args)).compile())
  holder = {"state": state}
  del state

  def learn_once():
    holder["state"], _, metrics = learn(holder["state"], cur_state, batch, jax.random.key(2),
                                        None, None, args[-1])
    return metrics["loss"]

  learn_s = _timed(learn_once)
  learn_peak = _peak_in_use(gpu)
  n = config.num_params - config.vocab_size * config.d_model
  peak = _peak_flops(gpu.device_kind)
  sample_flops = 2 * n * (P * TP + rows * T)          # prefill once per prompt, then decode
  learn_flops = (6 + 2) * n * (P * TP + rows * T)     # forward + backward, plus the old policy
  return {
      "model": preset, "params": config.num_params, "rows": rows, "prompt_len": TP,
      "new_tokens": T, "sample_s": sample_s, "learn_s": learn_s,
      "sample_tokens_per_s": rows * T / sample_s,
      "sample_mfu": None if peak is None else sample_flops / sample_s / peak,
      "learn_mfu": None if peak is None else learn_flops / learn_s / peak,
      "measured_peak_gib": {"after_sampling": sample_peak, "after_learn": learn_peak},
      "planned_learn": planned,
  }


def rollout_engines(preset: str, sizes=ROLLOUT) -> dict:
  """Static and continuous engines on the long-tailed rows of a random-init `preset` (bfloat16
  weights and caches), as `benchmarks.rollout` measures them on the CPU."""
  prompts, tp, n, slots, shrink = sizes
  extra = {"vocab_size": 256} if preset == "tiny" else {}
  config = PRESETS[preset](dtype="bfloat16", param_dtype="bfloat16", scan_layers=True, **extra)
  graphdef, params = transformer.init_model(config, seed=0)
  policy = pretrained.Policy(config=config, graphdef=graphdef, params=params, tokenizer=None,
                             context_length=tp + n)
  rows = rollout.long_tail(policy, prompts, tp, n)
  out = rollout.compare(policy, rows, slots, shrink, repeats=1)
  # The paged engine, its attention by the reference (`auto` off a TPU), against the dense one.
  out["paged"] = paged.compare(policy, rows, slots, PAGE_SIZE, repeats=1)
  out["model"], out["params"] = preset, config.num_params
  return out


def _write(report, out):
  with open(out, "w") as f:
    json.dump(report, f, indent=1)


def _part(report, key, out, fn, *args):
  """Runs one measurement into report[key] (its error message if it fails), then writes."""
  t0 = time.time()
  try:
    result = fn(*args)
  except Exception as e:  # pylint: disable=broad-except
    traceback.print_exc()
    result = {"error": f"{type(e).__name__}: {e}"[:2000]}
  result["wall_s"] = time.time() - t0
  report[key].append(result)
  print(json.dumps(result), flush=True)
  _write(report, out)


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--out", default="")
  parser.add_argument("--budget_s", type=float, default=420.0)
  parser.add_argument("--smoke", action="store_true", help="tiny model, tiny batch (any device)")
  args = parser.parse_args()
  start = time.time()
  device = jax.devices()[0]
  report = {"device": device.device_kind, "platform": device.platform,
            "bf16_peak_flops": _peak_flops(device.device_kind), "jax": jax.__version__,
            "rollout_engines": [], "runs": []}
  out = args.out or os.path.join("benchmarks", "results",
                                 f"gpu_{device.device_kind.replace(' ', '_')}.json")
  presets = ("tiny",) if args.smoke else ("qwen2_5_0_5b", "qwen2_5_1_5b")
  for preset in presets:
    if report["rollout_engines"] and time.time() - start > args.budget_s / 4:
      break
    _part(report, "rollout_engines", out, rollout_engines, preset,
          ROLLOUT_SMOKE if args.smoke else ROLLOUT)
  for preset in presets:
    if report["runs"] and time.time() - start > args.budget_s * 2 / 3:
      break   # the second model takes about as long as the first
    _part(report, "runs", out, measure, preset, SMOKE if args.smoke else (P, G, TP, T))
  print(f"wrote {out}")


if __name__ == "__main__":
  main()
