"""This project's side of the benchmark: sampler, learn step, RL step, curriculum overhead and a
short end-to-end run of the trainer."""

import os
import statistics
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

from configs import scratch
from configs import toy
from benchmarks.speed import peak
from benchmarks.speed import timing
from rl_curriculum import curriculum as cur
from rl_curriculum.model import lora as lora_lib
from rl_curriculum.model import pretrained
from rl_curriculum.model import transformer
from rl_curriculum.model.config import ModelConfig
from rl_curriculum.parallel import mesh as mesh_lib
from rl_curriculum.sampling import sampler
from rl_curriculum.train import loop
from rl_curriculum.train import programs as programs_lib
from rl_curriculum.train.learn import examples
from rl_curriculum.train.report.metrics import read_jsonl
from rl_curriculum.types import Feedback

LORA_TARGETS = ("q", "k", "v", "o", "gate", "up", "down")
LORA_RANK = 8
STOP_ID = -1  # outside every vocabulary: no row ever stops early


def load_model(name: str, weights_dir: str):
  """(Policy, HF folder) of a benchmark model; the folder is written once.

  Args:
    name: "tiny" (ModelConfig.tiny(vocab_size=64), seed-0 init) or "smollm2"
      (SmolLM2-135M-Instruct, float32).
    weights_dir: parent of the HF folders every implementation loads.
  """
  if name == "tiny":
    config = ModelConfig.tiny(vocab_size=64)
    graphdef, params = transformer.init_model(config, seed=0)
    policy = pretrained.Policy(config=config, graphdef=graphdef, params=params, tokenizer=None,
                               context_length=1024)
  elif name == "smollm2":
    policy = pretrained.load_pretrained("smollm2-135m-instruct", dtype="float32")
  else:
    raise ValueError(f"unknown model {name!r}; choose tiny or smollm2")
  folder = os.path.join(weights_dir, name)
  if not os.path.exists(os.path.join(folder, "config.json")):
    pretrained.save_pretrained(policy, folder)
  return policy, folder


def sampler_ours(policy, batches, tp: int, n: int, repeats: int) -> dict:
  """Our prefill and decode programs timed apart (greedy, no early stop), per batch size."""
  out = {}
  for b in batches:
    prompts = jnp.asarray(examples.random_prompts(b, tp, policy.config.vocab_size))
    mask = jnp.ones(prompts.shape, bool)
    key = jax.random.PRNGKey(0)

    def once():
      t0 = time.perf_counter()
      state = jax.block_until_ready(sampler.prefill(policy.graphdef, policy.params, prompts,
                                                    mask, key, max_new_tokens=n))
      t1 = time.perf_counter()
      state = jax.block_until_ready(sampler.decode(
          policy.graphdef, policy.params, state, jnp.float32(1.0), greedy=True,
          stop_ids=(STOP_ID,)))
      return t1 - t0, time.perf_counter() - t1, state

    first = once()  # compiles both programs
    runs = [once() for _ in range(repeats)]
    prefill_s = statistics.median(r[0] for r in runs)
    decode_s = statistics.median(r[1] for r in runs)
    assert int(runs[-1][2].step) == n and float(runs[-1][2].mask.sum()) == b * n
    out[str(b)] = {**timing.rates(b, tp, n, prefill_s, decode_s),
                   "compile_s": first[0] + first[1] - prefill_s - decode_s}
    timing.log(f"  ours      B={b:3d}: {out[str(b)]['new_tok_s']:9.1f} new tok/s")
  return out


def learn_flops(config, p: int, g: int, tp: int, t: int, mode: str) -> float:
  """Model FLOPs of one update on P prompts x G completions (PaLM's count, Chowdhery et al.
  (2022), "PaLM: Scaling Language Modeling with Pathways", arXiv:2204.02311, appendix B).

  Each group's prompt runs once; the output head runs on the T completion positions only;
  attention is counted densely. Full fine-tuning is 3 forward passes, LoRA 2 (no weight
  gradients of the base model). `__main__.py` writes out the formula.
  """
  c = config
  attn = c.d_model * c.num_heads * c.head_dim * 2 + 2 * c.d_model * c.num_kv_heads * c.head_dim
  n_body = c.num_layers * (attn + 3 * c.d_model * c.mlp_dim)
  mix = 4 * c.num_layers * c.num_heads * c.head_dim  # scores + mixing, per (query, key) pair
  prompts = p * (2 * n_body * tp + mix * tp * tp)
  completions = p * g * (2 * n_body * t + 2 * c.d_model * c.vocab_size * t + mix * t * (tp + t))
  return (3 if mode == "full" else 2) * (prompts + completions)


def learn_setup(policy, mode: str, p: int, g: int, tp: int, t: int, num_arms: int = 6,
                lr: float = 1e-6):
  """The RL programs as the trainer builds them (`programs.build`), on the scratch config's
  settings.

  One minibatch, T new tokens, no rollback-KL pass (max_kl 0: the peers' steps have none), SEC
  over `num_arms` arms updated inside the step; LoRA (rank 8 on every projection) when `mode` is
  "lora"; a one-device mesh.

  Returns:
    (programs, placed run state, example batch, the policy trained (with adapters under LoRA)).
  """
  config = scratch.get_config()
  if mode == "lora":
    policy = pretrained.attach_lora(policy, lora_lib.LoRAConfig(
        rank=LORA_RANK, alpha=16.0, targets=LORA_TARGETS), seed=1)
    trainable, frozen = policy.params
    config.model.lora_rank, config.model.lora_targets = LORA_RANK, LORA_TARGETS
  else:
    trainable, frozen = policy.params, None
  config.rl.minibatches = 1
  config.rl.max_new_tokens = t
  config.rl.max_kl = 0.0  # no rollback pass after the update: the peers' steps have none
  config.rl.learning_rate = lr
  config.rl.prompts_per_step, config.rl.group_size = p, g
  pool = cur.PromptPool.from_arms(np.arange(num_arms * 100) % num_arms)
  model = programs_lib.Model(graphdef=policy.graphdef, trainable=trainable, frozen=frozen)
  programs = programs_lib.build(config, model, mesh_lib.make_mesh((1, 1, 1)), pool,
                                programs_lib.TokenIds(eos_id=STOP_ID, pad_id=0))
  state = programs_lib.place(programs, programs_lib.init_run_state(
      config, programs, model, pool, jax.random.PRNGKey(0)))
  batch = examples.example_batch(p, g, tp, t, policy.config.vocab_size, num_arms=num_arms)
  return programs, state, batch, policy


def _learn(programs, state, batch, key):
  """The run state after one learn step on `batch`, and the step's metrics."""
  train, curriculum, metrics = programs.learn(*programs_lib.learn_inputs(programs, state, batch, key, None))
  return state._replace(train=train, curriculum=curriculum), metrics


def learn_ours(policy, mode: str, p: int, g: int, tp: int, t: int, repeats: int,
               peak_gflops: float) -> dict:
  """Our learn step: tokens/s and model-FLOPs utilisation against the measured peak."""
  programs, state, batch, _ = learn_setup(policy, mode, p, g, tp, t)
  holder = {"state": state}

  def once():
    holder["state"], metrics = _learn(programs, holder["state"], batch, jax.random.PRNGKey(1))
    return jax.block_until_ready(metrics["loss"])

  peak_before = peak.quick_peak()
  seconds, first, loss = timing.timed(once, repeats)
  peak_after = peak.quick_peak()
  tokens = p * g * (tp + t)
  flops = learn_flops(policy.config, p, g, tp, t, mode)
  out = {"mode": mode, "seconds": seconds, "compile_s": first - seconds, "tokens": tokens,
         "tok_s": tokens / seconds, "model_flops": flops, "gflop_s": flops / seconds / 1e9,
         "mfu": flops / seconds / 1e9 / peak_gflops, "loss_finite": bool(abs(float(loss)) < 1e30),
         "peak_gflops_around": [peak_before, peak_after],
         "flops_formula": ("3 F (forward + backward of activations and weights)" if mode == "full"
                           else "2 F (forward + backward of activations; ~4N not 6N)")}
  timing.log(f"  learn {mode}: {seconds:.3f} s, {out['tok_s']:.0f} tok/s, mfu {out['mfu']:.3f}")
  return out


def rl_step_ours(policy, p: int, g: int, tp: int, t: int, repeats: int) -> dict:
  """Ours end to end at the learn sizes: sample (temperature 1) + score (host) + learn (full)."""
  programs, state, batch, policy = learn_setup(policy, "full", p, g, tp, t)
  holder = {"state": state}
  splits = []

  def once():
    t0 = time.perf_counter()
    rollout = programs_lib.sample(programs, programs_lib.policy(holder["state"]),
                                  batch.prompt_tokens, batch.prompt_mask, jax.random.PRNGKey(2),
                                  temperature=1.0).rollout
    jax.block_until_ready(rollout.tokens)
    t1 = time.perf_counter()
    tokens = np.asarray(rollout.tokens)
    rewards = (tokens[:, 0] % 2).astype(np.float32).reshape(p, g)  # a stand-in verifier
    t2 = time.perf_counter()
    scored = batch._replace(tokens=rollout.tokens, mask=rollout.mask,
                            sampler_logprobs=rollout.logprobs, rewards=jnp.asarray(rewards),
                            correct=jnp.asarray(rewards > 0.5))
    holder["state"], metrics = _learn(programs, holder["state"], scored, jax.random.PRNGKey(1))
    jax.block_until_ready(metrics["loss"])
    t3 = time.perf_counter()
    splits.append({"sample_s": t1 - t0, "score_s": t2 - t1, "learn_s": t3 - t2})
    return t3 - t0

  seconds, first, _ = timing.timed(once, repeats)
  split = {k: statistics.median(s[k] for s in splits[1:]) for k in splits[0]}
  out = {"seconds": seconds, "compile_s": first - seconds, **split,
         "what": f"sample {p}x{g} rows (temperature 1, {t} tokens) + host score + full learn"}
  timing.log(f"  rl step: {seconds:.2f} s ({split})")
  return out


def curriculum_overhead(num_arms: int, p: int, g: int, pool_size: int, repeats: int) -> dict:
  """SEC select and update, each jitted as in the loop (update runs inside learn there)."""
  pool = cur.PromptPool.from_arms(np.arange(pool_size) % num_arms)
  curriculum = cur.sec(pool, batch_size=p, alpha=0.5, temperature=0.2)
  select, update = jax.jit(curriculum.select), jax.jit(curriculum.update)
  holder = {"state": curriculum.init(pool, jax.random.PRNGKey(0)), "i": 0}
  rng = np.random.default_rng(0)
  rewards = jnp.asarray(rng.integers(0, 2, (p, g)), jnp.float32)

  def select_once():
    holder["i"] += 1
    selection, holder["state"] = select(holder["state"], jax.random.PRNGKey(holder["i"]))
    return jax.block_until_ready(selection.prompt_ids)

  select_s, _, _ = timing.timed(select_once, max(repeats, 5))
  selection, _ = select(holder["state"], jax.random.PRNGKey(0))
  feedback = Feedback(prompt_ids=selection.prompt_ids, arms=selection.arms, rewards=rewards,
                      correct=rewards > 0.5, advantages=rewards - rewards.mean(1, keepdims=True),
                      valid=jnp.ones((p, g), bool))

  def update_once():
    holder["state"], _ = update(holder["state"], feedback)
    return jax.block_until_ready(jax.tree.leaves(holder["state"]))

  update_s, _, _ = timing.timed(update_once, max(repeats, 5))
  return {"arms": num_arms, "prompts": p, "group": g, "pool": pool_size, "select_s": select_s,
          "update_s": update_s, "total_s": select_s + update_s}


def end_to_end(steps: int, quick: bool) -> dict:
  """train_and_evaluate on the scratch config (the toy config when `quick`), no SFT warm
  start, for `steps` RL steps; the median split of steps 2.. from metrics.jsonl."""
  config = (toy if quick else scratch).get_config()
  config.sft.steps = 0
  config.rl.steps = steps
  config.task.eval_bins = tuple(config.task.train_bins)
  config.task.eval_per_bin = 4
  if not quick:
    config.task.train_per_bin = 500
  config.eval.every = 10 ** 6
  config.checkpoint.every = 10 ** 6
  with tempfile.TemporaryDirectory() as workdir:
    loop.train_and_evaluate(config, workdir)
    rows = [r for r in read_jsonl(os.path.join(workdir, "metrics.jsonl")) if "time/sample_s" in r]
  rows = rows[1:] if len(rows) > 1 else rows
  split = {k: statistics.median(r[f"time/{k}"] for r in rows)
           for k in ("sample_s", "score_s", "learn_s")}
  total = sum(split.values())
  return {"config": "configs/toy.py" if quick else "configs/scratch.py",
          "overrides": {"sft.steps": 0, "rl.steps": steps},
          "prompts": config.rl.prompts_per_step, "group": config.rl.group_size,
          "max_new_tokens": config.rl.max_new_tokens, "steps_timed": len(rows), **split,
          "step_s": total, **{f"{k[:-2]}_frac": v / total for k, v in split.items()},
          "note": "random-init tiny model (no SFT): rows rarely stop early, so sampling runs "
                  "close to max_new_tokens"}
