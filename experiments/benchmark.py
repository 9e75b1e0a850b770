"""Speed benchmark: our sampler and learn step against transformers, TRL and Tunix on one CPU.

  taskset -c 1 python experiments/benchmark.py                    # tiny + SmolLM2-135M, all peers
  python experiments/benchmark.py --quick --peers= --out_dir=/tmp/bench  # tiny model, no peers

Writes benchmarks/results/speed_cpu.json (every number) and speed_cpu.md (a table and the
targets). Models: the tiny preset (ModelConfig.tiny(vocab_size=64), seed-0 init) and
SmolLM2-135M-Instruct (load_pretrained("smollm2-135m-instruct"), float32). Every implementation
loads the same weights: each model is written once as an HF folder (save_pretrained) under
--weights_dir, and the peers read that folder.

What is measured (times are medians over --repeats calls after one warm-up call; compile time
is reported separately):

  matmul_peak_gflops   best of jnp.dot on square float32 matrices (n = 512, 1024, 2048):
                       2 n^3 / seconds; torch.matmul the same for reference.
  sampler              prompt Tp = 64 random ids in [3, V), N = 64 new tokens, greedy, no early
                       stop (the stop id lies outside the vocabulary, transformers gets
                       min_new_tokens = N), batch 1, 8, 32, 64:
                         prefill_tok_s = B Tp / prefill seconds
                         decode_tok_s  = B N / decode seconds
                         new_tok_s     = B N / (prefill + decode) seconds
                       ours: sampler.prefill and sampler.decode timed apart; transformers: a
                       forward over the prompt with use_cache (prefill), model.generate(...,
                       use_cache=True, do_sample=False, min_new_tokens = max_new_tokens = N)
                       (whole call; decode = generate - prefill).
  learn                rl_step.make_learn as the trainer builds it (RLOO, one epoch, one
                       minibatch, kl_coef 0, no rollback-KL pass (max_kl 0: the peers have
                       none), SEC update inside) on a fixed scored batch of P
                       prompts x G completions, prompt Tp, completion T; full fine-tuning and
                       LoRA (rank 8 on q, k, v, o, gate, up, down). tokens = P G (Tp + T),
                       the sequences trained on (what a peer without prompt sharing computes).
                       Model FLOPs of one update (PaLM, Chowdhery et al. 2022, appendix B), for
                       the work the step does: each group's prompt runs once and its G
                       completions attend to the prompt's shared keys and values,
                         forward F = P [2 N_body Tp + 4 L H d_h Tp^2]
                                   + P G [2 N_body T + 2 D V T + 4 L H d_h T (Tp + T)]
                       with N_body the matmul parameters of the blocks (embedding lookup
                       excluded), the output head only on the T completion positions (the step
                       computes logits only there), and the attention scores and mixing counted
                       densely (no causal halving).
                         full fine-tuning: 3 F   (backward = gradients of activations + weights)
                         LoRA:             2 F   (backward to activations only; adapter weight
                                                  gradients are negligible), i.e. ~4N, not 6N.
                       mfu = model FLOPs / seconds / peak, a fraction, with peak the best
                       jnp.dot rate of the run (at the start and just before and after each
                       learn measurement: on a shared machine one sample can be low).
  trl                  one GRPOTrainer step (TRL 1.16, torch CPU, float32, no gradient
                       checkpointing, beta 0, same P, G, Tp, T, min_new_tokens = T): the whole
                       step, and its learn part = step - _generate_and_score_completions.
  rl_step              ours: sample (temperature 1; each prompt prefilled once for its G rows)
                       + score (host) + learn, same P, G, Tp, T.
  curriculum           SEC select and update (each jitted) at K = 6, P = 32, G = 8 (quickstart)
                       and K = 64, P = 256, G = 16, as a fraction of an RL step.
  end_to_end           train_and_evaluate on the quickstart config (no SFT warm start, few
                       steps): median time/sample_s, time/score_s, time/learn_s of metrics.jsonl.
  tunix                benchmarks/peers/tunix_peer.py in .venv-tunix (its own venv), as a
                       subprocess; skipped with the reason when it is missing or fails.

Ratios are ours / theirs (higher is better) under keys ending in _vs_transformers, _vs_trl,
_vs_tunix. The run records os.sched_getaffinity(0) and the thread counts: a run pinned to one
core (taskset -c 1) is a one-core measurement.
"""

import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

from absl import app
from absl import flags
from absl import logging

_OUT_DIR = flags.DEFINE_string("out_dir", "benchmarks/results", "Where speed_cpu.json/.md go.")
_NAME = flags.DEFINE_string("name", "speed_cpu", "Base name of the result files.")
_WEIGHTS_DIR = flags.DEFINE_string("weights_dir", "workdirs/benchmark/weights",
                                   "HF folders shared by every implementation.")
_MODELS = flags.DEFINE_list("models", ["tiny", "smollm2"], "Models to measure.")
_PEERS = flags.DEFINE_list("peers", ["transformers", "trl", "tunix"], "Peers to measure.")
_QUICK = flags.DEFINE_bool("quick", False, "Tiny sizes for a smoke test (seconds).")
_REPEATS = flags.DEFINE_integer("repeats", 2, "Timed calls per measurement (median).")
_BATCHES = flags.DEFINE_list("batches", ["1", "8", "32", "64"], "Sampler batch sizes.")
_PROMPT_LEN = flags.DEFINE_integer("prompt_len", 64, "Prompt tokens Tp.")
_NEW_TOKENS = flags.DEFINE_integer("new_tokens", 64, "New tokens N (no early stop).")
_LEARN_PROMPTS = flags.DEFINE_integer("learn_prompts", 8, "P of the learn / RL step.")
_LEARN_GROUP = flags.DEFINE_integer("learn_group", 4, "G of the learn / RL step.")
_E2E_STEPS = flags.DEFINE_integer("e2e_steps", 5, "Quickstart RL steps timed end to end (0: skip).")
_TUNIX_PYTHON = flags.DEFINE_string("tunix_python", ".venv-tunix/bin/python", "Tunix venv python.")
_TUNIX_PEER = flags.DEFINE_string("tunix_peer", "benchmarks/peers/tunix_peer.py", "Tunix peer.")
_TUNIX_TIMEOUT = flags.DEFINE_integer("tunix_timeout", 900, "Seconds before the peer is killed.")

LORA_TARGETS = ("q", "k", "v", "o", "gate", "up", "down")
LORA_RANK = 8
STOP_ID = -1  # outside every vocabulary: no row ever stops early


def _log(text):
  print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


def _timed(fn, repeats):
  """(median seconds of `repeats` calls, seconds of the first (compiling) call, last result)."""
  t0 = time.perf_counter()
  out = fn()
  first = time.perf_counter() - t0
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    out = fn()
    times.append(time.perf_counter() - t0)
  return statistics.median(times), first, out


# ---------------------------------------------------------------------------------------------
# Environment and peak.


def environment() -> dict:
  """CPU, affinity, thread counts and package versions."""
  import jax  # pylint: disable=import-outside-toplevel
  info = {"date": datetime.datetime.now().isoformat(timespec="seconds"),
          "python": platform.python_version(), "jax": jax.__version__,
          "jax_backend": jax.default_backend(), "cpu_count": os.cpu_count(),
          "affinity": sorted(os.sched_getaffinity(0)),
          "xla_flags": os.environ.get("XLA_FLAGS", "")}
  try:
    with open("/proc/cpuinfo") as f:
      names = [l.split(":", 1)[1].strip() for l in f if l.startswith("model name")]
    info["cpu_model"] = names[0] if names else platform.processor()
  except OSError:
    info["cpu_model"] = platform.processor()
  for name in ("torch", "transformers", "trl", "peft", "flax", "optax"):
    try:
      module = __import__(name)
      info[name] = module.__version__
    except ImportError:
      info[name] = None
  try:
    import torch  # pylint: disable=import-outside-toplevel
    info["torch_threads"] = torch.get_num_threads()
  except ImportError:
    pass
  return info


def quick_peak(n=1024, repeats=3) -> float:
  """GFLOP/s of the best of `repeats` jnp.dot calls on n x n float32 matrices."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  a = jax.random.normal(jax.random.PRNGKey(0), (n, n), jnp.float32)
  dot = jax.jit(jnp.dot)
  jax.block_until_ready(dot(a, a))
  best = float("inf")
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(dot(a, a))
    best = min(best, time.perf_counter() - t0)
  return 2 * n ** 3 / best / 1e9


def matmul_peak(sizes, repeats) -> dict:
  """Best dense float32 matmul rate, GFLOP/s = 2 n^3 / seconds / 1e9, for jax and torch."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  out = {"sizes": list(sizes), "jax": {}, "torch": {}}
  dot = jax.jit(jnp.dot)
  for n in sizes:
    a = jax.random.normal(jax.random.PRNGKey(0), (n, n), jnp.float32)
    b = jax.random.normal(jax.random.PRNGKey(1), (n, n), jnp.float32)
    seconds, _, _ = _timed(lambda: jax.block_until_ready(dot(a, b)), max(repeats, 3))
    out["jax"][str(n)] = 2 * n ** 3 / seconds / 1e9
  try:
    import torch  # pylint: disable=import-outside-toplevel
    for n in sizes:
      a, b = torch.randn(n, n), torch.randn(n, n)
      seconds, _, _ = _timed(lambda: torch.matmul(a, b), max(repeats, 3))
      out["torch"][str(n)] = 2 * n ** 3 / seconds / 1e9
  except ImportError:
    pass
  out["jax_best"] = max(out["jax"].values())
  out["torch_best"] = max(out["torch"].values()) if out["torch"] else None
  return out


# ---------------------------------------------------------------------------------------------
# Models.


def load_model(name: str, weights_dir: str):
  """(Policy, HF folder) of a benchmark model; the folder is written once."""
  from rl_curriculum.model import pretrained, transformer  # pylint: disable=import-outside-toplevel
  from rl_curriculum.model.config import ModelConfig  # pylint: disable=import-outside-toplevel
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


def random_prompts(batch: int, length: int, vocab: int, seed: int = 0):
  """i32[B, Tp] token ids in [3, vocab) (the peer contract's prompts)."""
  import numpy as np  # pylint: disable=import-outside-toplevel
  return np.random.default_rng(seed).integers(3, vocab, (batch, length)).astype(np.int32)


def _rates(b, tp, n, prefill_s, decode_s):
  return {"prefill_tok_s": b * tp / prefill_s, "decode_tok_s": b * n / decode_s,
          "new_tok_s": b * n / (prefill_s + decode_s), "prefill_s": prefill_s,
          "decode_s": decode_s, "seconds": prefill_s + decode_s}


# ---------------------------------------------------------------------------------------------
# Sampling.


def sampler_ours(policy, batches, tp, n, repeats) -> dict:
  """Our prefill and decode programs timed apart (greedy, no early stop)."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  from rl_curriculum.sampling import sampler  # pylint: disable=import-outside-toplevel
  out = {}
  for b in batches:
    prompts = jnp.asarray(random_prompts(b, tp, policy.config.vocab_size))
    mask = jnp.ones(prompts.shape, bool)
    key = jax.random.PRNGKey(0)

    def once():
      t0 = time.perf_counter()
      state = jax.block_until_ready(sampler.prefill(policy.graphdef, policy.params, prompts,
                                                    mask, key, max_new_tokens=n))
      t1 = time.perf_counter()
      state = jax.block_until_ready(sampler.decode(
          policy.graphdef, policy.params, state, jnp.float32(1.0), use_greedy=True,
          stop_ids=(STOP_ID,)))
      return t1 - t0, time.perf_counter() - t1, state

    first = once()  # compiles both programs
    runs = [once() for _ in range(repeats)]
    prefill_s = statistics.median(r[0] for r in runs)
    decode_s = statistics.median(r[1] for r in runs)
    assert int(runs[-1][2].step) == n and float(runs[-1][2].mask.sum()) == b * n
    out[str(b)] = {**_rates(b, tp, n, prefill_s, decode_s),
                   "compile_s": first[0] + first[1] - prefill_s - decode_s}
    _log(f"  ours      B={b:3d}: {out[str(b)]['new_tok_s']:9.1f} new tok/s")
  return out


def release_memory():
  """Drops compiled programs and returns freed heap pages to the OS between stages: a SmolLM2 run
  that kept TRL's freed torch buffers and every compiled program (13.5 GB resident) was killed
  for memory while the Tunix peer ran beside it."""
  import gc  # pylint: disable=import-outside-toplevel
  import ctypes  # pylint: disable=import-outside-toplevel
  import jax  # pylint: disable=import-outside-toplevel
  gc.collect()
  jax.clear_caches()
  try:
    ctypes.CDLL("libc.so.6").malloc_trim(0)
  except (OSError, AttributeError):
    pass


def _torch_threads():
  import torch  # pylint: disable=import-outside-toplevel
  torch.set_num_threads(len(os.sched_getaffinity(0)))
  return torch.get_num_threads()


def sampler_transformers(folder, vocab, batches, tp, n, repeats) -> dict:
  """transformers' generate with a KV cache (torch CPU, float32, greedy, exactly N tokens)."""
  import torch  # pylint: disable=import-outside-toplevel
  import transformers  # pylint: disable=import-outside-toplevel
  threads = _torch_threads()
  model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
  model.eval()
  out = {"implementation": f"transformers {transformers.__version__} generate, torch "
                           f"{torch.__version__}", "threads": threads}
  for b in batches:
    ids = torch.as_tensor(random_prompts(b, tp, vocab), dtype=torch.long)
    attn = torch.ones_like(ids)

    def prefill():
      with torch.inference_mode():
        return model(input_ids=ids, attention_mask=attn, use_cache=True).logits[:, -1]

    def generate():
      with torch.inference_mode():
        return model.generate(input_ids=ids, attention_mask=attn, do_sample=False, use_cache=True,
                              max_new_tokens=n, min_new_tokens=n, pad_token_id=0,
                              eos_token_id=None)

    prefill_s, _, _ = _timed(prefill, repeats)
    generate_s, _, tokens = _timed(generate, repeats)
    assert tokens.shape == (b, tp + n), tokens.shape
    out[str(b)] = _rates(b, tp, n, prefill_s, max(generate_s - prefill_s, 1e-9))
    _log(f"  transformers B={b:3d}: {out[str(b)]['new_tok_s']:9.1f} new tok/s")
  return out


# ---------------------------------------------------------------------------------------------
# Learn step.


def learn_flops(config, p: int, g: int, tp: int, t: int, mode: str) -> float:
  """Model FLOPs of one update on P prompts x G completions (see the module docstring)."""
  c = config
  attn = c.d_model * c.num_heads * c.head_dim * 2 + 2 * c.d_model * c.num_kv_heads * c.head_dim
  n_body = c.num_layers * (attn + 3 * c.d_model * c.mlp_dim)
  mix = 4 * c.num_layers * c.num_heads * c.head_dim  # scores + mixing, per (query, key) pair
  prompts = p * (2 * n_body * tp + mix * tp * tp)
  completions = p * g * (2 * n_body * t + 2 * c.d_model * c.vocab_size * t + mix * t * (tp + t))
  return (3 if mode == "full" else 2) * (prompts + completions)


def _learn_setup(policy, mode, p, g, tp, t, num_arms=6, lr=1e-6):
  """(learn fn, train_state, cur_state, batch, frozen, ref, graphdef) as the trainer builds them."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  from rl_curriculum import curriculum as cur  # pylint: disable=import-outside-toplevel
  from rl_curriculum.model import lora as lora_lib  # pylint: disable=import-outside-toplevel
  from rl_curriculum.model import pretrained  # pylint: disable=import-outside-toplevel
  from rl_curriculum.train import builders, rl_step  # pylint: disable=import-outside-toplevel
  from configs import quickstart  # pylint: disable=import-outside-toplevel

  if mode == "lora":
    policy = pretrained.attach_lora(policy, lora_lib.LoRAConfig(
        rank=LORA_RANK, alpha=16.0, targets=LORA_TARGETS), seed=1)
    trainable, frozen = policy.params
    ref = None
  else:
    trainable, frozen, ref = policy.params, None, policy.params
  config = quickstart.get_config()
  config.rl.minibatches = 1
  config.rl.max_new_tokens = t
  config.rl.max_kl = 0.0  # no rollback pass after the update: the peers' steps have none
  optimizer = builders.build_optimizer(lr, max_grad_norm=1.0)
  pool = cur.PromptPool.from_arms(np.arange(num_arms * 100) % num_arms)
  curriculum = cur.sec(pool, batch_size=p, alpha=0.5, temperature=0.2)
  learn = rl_step.make_learn(graphdef=policy.graphdef, optimizer=optimizer,
                             curriculum_update=curriculum.update,
                             config=builders.learn_config(config), use_lora=mode == "lora")
  state = rl_step.init_train_state(trainable, optimizer)
  cur_state = curriculum.init(pool, jax.random.PRNGKey(0))
  b = p * g
  rng = np.random.default_rng(0)
  vocab = policy.config.vocab_size
  rewards = rng.integers(0, 2, (p, g)).astype(np.float32)
  batch = rl_step.Batch(
      prompt_tokens=jnp.asarray(np.repeat(random_prompts(p, tp, vocab), g, axis=0)),
      prompt_mask=jnp.ones((b, tp), bool),
      tokens=jnp.asarray(rng.integers(3, vocab, (b, t)), jnp.int32),
      mask=jnp.ones((b, t), jnp.float32),
      sampler_logprobs=jnp.full((b, t), -np.log(vocab), jnp.float32),
      prompt_ids=jnp.arange(p, dtype=jnp.int32), arms=jnp.arange(p, dtype=jnp.int32) % num_arms,
      rewards=jnp.asarray(rewards), correct=jnp.asarray(rewards > 0.5),
      valid=jnp.ones((p, g), bool), train_groups=jnp.arange(p, dtype=jnp.int32),
      train_valid=jnp.ones(p, bool))
  return learn, state, cur_state, batch, frozen, ref, policy


def learn_ours(policy, mode, p, g, tp, t, repeats, peak_gflops) -> dict:
  """Our learn step: tokens/s and model-FLOPs utilisation against the measured peak."""
  import jax  # pylint: disable=import-outside-toplevel
  learn, state, cur_state, batch, frozen, ref, _ = _learn_setup(policy, mode, p, g, tp, t)
  holder = {"state": state}

  def once():
    holder["state"], _, metrics = learn(holder["state"], cur_state, batch, jax.random.PRNGKey(1),
                                        frozen, ref)
    return jax.block_until_ready(metrics["loss"])

  peak_before = quick_peak()
  seconds, first, loss = _timed(once, repeats)
  peak_after = quick_peak()
  tokens = p * g * (tp + t)
  flops = learn_flops(policy.config, p, g, tp, t, mode)
  out = {"mode": mode, "seconds": seconds, "compile_s": first - seconds, "tokens": tokens,
         "tok_s": tokens / seconds, "model_flops": flops, "gflop_s": flops / seconds / 1e9,
         "mfu": flops / seconds / 1e9 / peak_gflops, "loss_finite": bool(abs(float(loss)) < 1e30),
         "peak_gflops_around": [peak_before, peak_after],
         "flops_formula": ("3 F (forward + backward of activations and weights)" if mode == "full"
                           else "2 F (forward + backward of activations; ~4N not 6N)")}
  _log(f"  learn {mode}: {seconds:.3f} s, {out['tok_s']:.0f} tok/s, mfu {out['mfu']:.3f}")
  return out


def rl_step_ours(policy, p, g, tp, t, repeats) -> dict:
  """Ours end to end at the learn sizes: sample (temperature 1) + score (host) + learn (full)."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  from rl_curriculum.sampling import sampler  # pylint: disable=import-outside-toplevel
  learn, state, cur_state, batch, frozen, ref, policy = _learn_setup(policy, "full", p, g, tp, t)
  holder = {"state": state}
  splits = []

  def once():
    t0 = time.perf_counter()
    rollout = sampler.sample(policy.graphdef, holder["state"].params, batch.prompt_tokens,
                             batch.prompt_mask, jax.random.PRNGKey(2), max_new_tokens=t,
                             eos_id=STOP_ID, temperature=1.0, group=g)
    jax.block_until_ready(rollout.tokens)
    t1 = time.perf_counter()
    tokens = np.asarray(rollout.tokens)
    rewards = (tokens[:, 0] % 2).astype(np.float32).reshape(p, g)  # a stand-in verifier
    t2 = time.perf_counter()
    scored = batch._replace(tokens=rollout.tokens, mask=rollout.mask,
                            sampler_logprobs=rollout.logprobs, rewards=jnp.asarray(rewards),
                            correct=jnp.asarray(rewards > 0.5))
    holder["state"], _, metrics = learn(holder["state"], cur_state, scored,
                                        jax.random.PRNGKey(1), frozen, ref)
    jax.block_until_ready(metrics["loss"])
    t3 = time.perf_counter()
    splits.append({"sample_s": t1 - t0, "score_s": t2 - t1, "learn_s": t3 - t2})
    return t3 - t0

  seconds, first, _ = _timed(once, repeats)
  split = {k: statistics.median(s[k] for s in splits[1:]) for k in splits[0]}
  out = {"seconds": seconds, "compile_s": first - seconds, **split,
         "what": f"sample {p}x{g} rows (temperature 1, {t} tokens) + host score + full learn"}
  _log(f"  rl step: {seconds:.2f} s ({split})")
  return out


# ---------------------------------------------------------------------------------------------
# TRL.


def _trl_prompts(tokenizer, count, length):
  """`count` distinct texts of exactly `length` tokens under `tokenizer` (no special tokens)."""
  import numpy as np  # pylint: disable=import-outside-toplevel
  words = ["alpha", "river", "seven", "blue", "cloud", "stone", "apple", "green", "music",
           "table", "light", "paper", "north", "quiet", "bread", "story"]
  rng = np.random.default_rng(0)
  texts = []
  while len(texts) < count:
    ids = tokenizer(" ".join(rng.choice(words, 4 * length)), add_special_tokens=False).input_ids
    text = tokenizer.decode(ids[:length])
    if len(tokenizer(text, add_special_tokens=False).input_ids) == length:
      texts.append(text)
  return texts


def trl_step(folder, p, g, tp, t, steps=2) -> dict:
  """One GRPOTrainer step (after a warm-up step): whole step and its learn part."""
  import datasets  # pylint: disable=import-outside-toplevel
  import torch  # pylint: disable=import-outside-toplevel
  import transformers  # pylint: disable=import-outside-toplevel
  import trl  # pylint: disable=import-outside-toplevel
  threads = _torch_threads()
  tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
  model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
  prompts = _trl_prompts(tokenizer, p * steps, tp)
  dataset = datasets.Dataset.from_dict({"prompt": prompts})

  def reward(completions, **kwargs):
    del kwargs
    return [float(len(c) % 2) for c in completions]

  with tempfile.TemporaryDirectory() as tmp:
    args = trl.GRPOConfig(
        output_dir=tmp, use_cpu=True, report_to=[], bf16=False, gradient_checkpointing=False,
        per_device_train_batch_size=p * g, num_generations=g, max_completion_length=t,
        generation_kwargs={"min_new_tokens": t}, max_steps=steps, learning_rate=1e-6,
        optim="adamw_torch", save_strategy="no", logging_steps=10 ** 6, disable_tqdm=True,
        shuffle_dataset=False, seed=0, beta=0.0, num_iterations=1, dataloader_pin_memory=False)
    trainer = trl.GRPOTrainer(model=model, reward_funcs=reward, args=args,
                              train_dataset=dataset, processing_class=tokenizer)
    marks = {"begin": [], "end": [], "gen": [], "completion_tokens": []}
    generate = trainer._generate_and_score_completions  # pylint: disable=protected-access

    def timed_generate(*a, **kw):
      t0 = time.perf_counter()
      out = generate(*a, **kw)
      marks["gen"].append(time.perf_counter() - t0)
      marks["completion_tokens"].append(int(out["completion_mask"].sum()))
      return out

    trainer._generate_and_score_completions = timed_generate  # pylint: disable=protected-access

    class Clock(transformers.TrainerCallback):

      def on_step_begin(self, *a, **kw):
        marks["begin"].append(time.perf_counter())

      def on_step_end(self, *a, **kw):
        marks["end"].append(time.perf_counter())

    trainer.add_callback(Clock())
    trainer.train()
  step_s = marks["end"][-1] - marks["begin"][-1]
  gen_s = marks["gen"][-1]
  learn_s = step_s - gen_s
  tokens = p * g * (tp + t)
  out = {"implementation": f"trl {trl.__version__} GRPOTrainer, torch {torch.__version__}",
         "threads": threads, "step_s": step_s, "generate_and_score_s": gen_s, "learn_s": learn_s,
         "first_step_s": marks["end"][0] - marks["begin"][0], "tokens": tokens,
         "learn_tok_s": tokens / learn_s, "completion_tokens": marks["completion_tokens"][-1],
         "mode": "full", "what": "step 2 of 2; learn = step - _generate_and_score_completions "
                                 "(forward + backward + AdamW, no old/ref forward: beta 0, one "
                                 "iteration)"}
  _log(f"  trl: step {step_s:.2f} s, generate {gen_s:.2f} s, learn {learn_s:.2f} s")
  return out


# ---------------------------------------------------------------------------------------------
# Curriculum overhead and the end-to-end step.


def curriculum_overhead(num_arms, p, g, pool_size, repeats) -> dict:
  """SEC select and update, each jitted as in the loop (update runs inside learn there)."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  from rl_curriculum import curriculum as cur  # pylint: disable=import-outside-toplevel
  from rl_curriculum.types import Feedback  # pylint: disable=import-outside-toplevel
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

  select_s, _, _ = _timed(select_once, max(repeats, 5))
  selection, _ = select(holder["state"], jax.random.PRNGKey(0))
  feedback = Feedback(prompt_ids=selection.prompt_ids, arms=selection.arms, rewards=rewards,
                      correct=rewards > 0.5, advantages=rewards - rewards.mean(1, keepdims=True),
                      valid=jnp.ones((p, g), bool))

  def update_once():
    holder["state"], metrics = update(holder["state"], feedback)
    return jax.block_until_ready(jax.tree.leaves(holder["state"]))

  update_s, _, _ = _timed(update_once, max(repeats, 5))
  return {"arms": num_arms, "prompts": p, "group": g, "pool": pool_size, "select_s": select_s,
          "update_s": update_s, "total_s": select_s + update_s}


def end_to_end(steps, quick) -> dict:
  """train_and_evaluate on the quickstart config (no SFT warm start) for `steps` RL steps; the
  median split of steps 2.. from metrics.jsonl."""
  from rl_curriculum.train import loop  # pylint: disable=import-outside-toplevel
  from rl_curriculum.train.metrics import read_jsonl  # pylint: disable=import-outside-toplevel
  from configs import quickstart, toy  # pylint: disable=import-outside-toplevel
  config = (toy if quick else quickstart).get_config()
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
  return {"config": "configs/toy.py" if quick else "configs/quickstart.py",
          "overrides": {"sft.steps": 0, "rl.steps": steps},
          "prompts": config.rl.prompts_per_step, "group": config.rl.group_size,
          "max_new_tokens": config.rl.max_new_tokens, "steps_timed": len(rows), **split,
          "step_s": total, **{f"{k[:-2]}_frac": v / total for k, v in split.items()},
          "note": "random-init tiny model (no SFT): rows rarely stop early, so sampling runs "
                  "close to max_new_tokens"}


def tunix_peer(folder, batches, tp, n, p, g, repeats, python, script, timeout) -> dict:
  """Runs the Tunix peer in its own venv; {"skipped": why} when it cannot."""
  if not os.path.exists(python):
    return {"skipped": f"{python} not found (make it with bash benchmarks/peers/setup_tunix.sh)"}
  if not os.path.exists(script):
    return {"skipped": f"{script} not found"}
  with tempfile.TemporaryDirectory() as tmp:
    out = os.path.join(tmp, "tunix.json")
    cmd = [python, script, "--model-dir", folder, "--batches", ",".join(map(str, batches)),
           "--prompt-len", str(tp), "--new-tokens", str(n), "--learn-prompts", str(p),
           "--learn-group", str(g), "--repeats", str(repeats), "--out", out]
    try:
      result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
      return {"skipped": f"timed out after {timeout} s", "command": " ".join(cmd)}
    if result.returncode != 0 or not os.path.exists(out):
      return {"skipped": f"peer failed (exit {result.returncode})",
              "error": (result.stderr or result.stdout)[-3000:], "command": " ".join(cmd)}
    with open(out) as f:
      return json.load(f)


# ---------------------------------------------------------------------------------------------
# Ratios and the summary.


def ratios(model: dict) -> dict:
  """ours / theirs (higher is better) for every peer present."""
  out = {}
  ours = model["sampler"]["ours"]
  for peer in ("transformers", "tunix"):
    theirs = model["sampler"].get(peer) if peer == "transformers" else (
        model.get("tunix", {}).get("sampler"))
    if not theirs:
      continue
    for b, row in ours.items():
      if b in theirs:
        for k in ("new_tok_s", "prefill_tok_s", "decode_tok_s"):
          if theirs[b].get(k):
            out[f"sampler_b{b}_{k}_vs_{peer}"] = row[k] / theirs[b][k]
  trl = model.get("trl", {})
  if "learn_tok_s" in trl:
    out["learn_step_vs_trl"] = model["learn"]["full"]["tok_s"] / trl["learn_tok_s"]
    if "rl_step" in model:
      out["rl_step_vs_trl"] = trl["step_s"] / model["rl_step"]["seconds"]
  learn_tunix = model.get("tunix", {}).get("learn", {})
  if learn_tunix.get("tok_s"):
    mode = learn_tunix.get("mode", "full")
    out["learn_step_vs_tunix"] = model["learn"][mode]["tok_s"] / learn_tunix["tok_s"]
  for mode, row in model["learn"].items():
    out[f"learn_{mode}_mfu"] = row["mfu"]
  return out


TARGETS = [
    ("sampler_b32_new_tok_s_vs_transformers", 2.0, "sampler >= 2x transformers generate at B=32"),
    ("learn_step_vs_trl", 1.5, "learn step >= 1.5x TRL's"),
    ("sampler_b32_new_tok_s_vs_tunix", 1.0, "sampler >= Tunix"),
    ("learn_step_vs_tunix", 1.0, "learn step >= Tunix"),
    ("learn_full_mfu", 0.5, "learn-step utilisation >= 50% of the matmul peak (full FT)"),
    ("learn_lora_mfu", 0.5, "learn-step utilisation >= 50% of the matmul peak (LoRA)"),
]


def targets(results: dict) -> list:
  rows = []
  for name, model in results["models"].items():
    for key, bar, what in TARGETS:
      value = model["ratios"].get(key)
      rows.append({"model": name, "key": key, "target": bar, "value": value, "what": what,
                   "met": None if value is None else bool(value >= bar)})
  return rows


def _num(x) -> str:
  return "-" if x is None else f"{x:.0f}"


def markdown(results: dict) -> str:
  env = results["environment"]
  lines = [f"# Speed on CPU ({env['date']})", "",
           f"CPU {env['cpu_model']}, affinity {env['affinity']} "
           f"({len(env['affinity'])} core(s) of {env['cpu_count']}), jax {env['jax']}, torch "
           f"{env.get('torch')} ({results.get('torch_threads')} threads), transformers "
           f"{env.get('transformers')}, trl {env.get('trl')}. Matmul peak (float32): jax "
           f"{results['matmul_peak_gflops']['jax_run_best']:.1f} GFLOP/s (best in the run; "
           f"{results['matmul_peak_gflops']['jax_best']:.1f} at the start), torch "
           f"{results['matmul_peak_gflops']['torch_best'] or 0:.1f} GFLOP/s.", "",
           f"Command: `{results['command']}`", ""]
  for name, model in results["models"].items():
    lines += [f"## {name}", "", "| batch | ours new tok/s | ours prefill tok/s | ours decode tok/s "
              "| transformers new tok/s | ratio |", "|---|---|---|---|---|---|"]
    theirs = model["sampler"].get("transformers", {})
    for b, row in model["sampler"]["ours"].items():
      t = theirs.get(b, {})
      ratio = row["new_tok_s"] / t["new_tok_s"] if t else None
      lines.append(f"| {b} | {_num(row['new_tok_s'])} | {_num(row.get('prefill_tok_s'))} | "
                   f"{_num(row.get('decode_tok_s'))} | {_num(t.get('new_tok_s'))} | "
                   f"{'-' if ratio is None else f'{ratio:.2f}x'} |")
    lines += ["", "| learn step | seconds | tok/s | mfu |", "|---|---|---|---|"]
    for mode, row in model["learn"].items():
      lines.append(f"| ours {mode} | {row['seconds']:.3f} | {row['tok_s']:.0f} | "
                   f"{row['mfu']:.3f} |")
    if "learn_tok_s" in model.get("trl", {}):
      trl = model["trl"]
      lines.append(f"| TRL full (learn part) | {trl['learn_s']:.3f} | {trl['learn_tok_s']:.0f} "
                   f"| - |")
      lines.append(f"| TRL whole step | {trl['step_s']:.3f} | - | - |")
    if "rl_step" in model:
      r = model["rl_step"]
      lines.append(f"| ours whole RL step (sample {r['sample_s']:.2f} + score {r['score_s']:.3f}"
                   f" + learn {r['learn_s']:.2f}) | {r['seconds']:.3f} | - | - |")
    skipped = {k: v["skipped"] for k, v in model.items()
               if isinstance(v, dict) and "skipped" in v}
    if skipped:
      lines += ["", "Skipped: " + "; ".join(f"{k}: {v}" for k, v in skipped.items())]
    lines.append("")
  if "curriculum" in results:
    lines += ["## Curriculum overhead (SEC select + update)", ""]
    for row in results["curriculum"]:
      lines.append(f"- K={row['arms']}, P={row['prompts']}, G={row['group']}: "
                   f"{1e3 * row['total_s']:.2f} ms"
                   + (f" = {100 * row['fraction_of_step']:.2f}% of a {row['step_ref']} step"
                      if row.get("fraction_of_step") is not None else ""))
    lines.append("")
  if "end_to_end" in results:
    e = results["end_to_end"]
    lines += ["## End-to-end RL step", "",
              f"{e['config']} (P={e['prompts']}, G={e['group']}, {e['max_new_tokens']} new "
              f"tokens), median of {e['steps_timed']} steps: sample {e['sample_s']:.3f} s, score "
              f"{e['score_s']:.3f} s, learn {e['learn_s']:.3f} s "
              f"({100 * e['sample_frac']:.0f} / {100 * e['score_frac']:.0f} / "
              f"{100 * e['learn_frac']:.0f} %).", ""]
  lines += ["## Targets", "", "| model | target | value | met |", "|---|---|---|---|"]
  for t in results["targets"]:
    value = "-" if t["value"] is None else f"{t['value']:.3f}"
    met = "not measured" if t["met"] is None else ("yes" if t["met"] else "no")
    lines.append(f"| {t['model']} | {t['what']} | {value} | {met} |")
  return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------


def run(argv_command: str) -> dict:
  """The whole benchmark with the flags' settings; returns the results dict (also written)."""
  quick = _QUICK.value
  repeats = 1 if quick else _REPEATS.value
  batches = [1, 4] if quick else [int(b) for b in _BATCHES.value]
  tp, n = (16, 8) if quick else (_PROMPT_LEN.value, _NEW_TOKENS.value)
  p, g = (2, 2) if quick else (_LEARN_PROMPTS.value, _LEARN_GROUP.value)
  models = ["tiny"] if quick else list(_MODELS.value)
  peers = [x for x in _PEERS.value if x]
  results = {"command": argv_command, "environment": environment(), "quick": quick,
             "settings": {"repeats": repeats, "batches": batches, "prompt_len": tp,
                          "new_tokens": n, "learn_prompts": p, "learn_group": g,
                          "sampling": "greedy, no early stop", "peers": peers}}
  if "transformers" in peers or "trl" in peers:
    results["torch_threads"] = _torch_threads()
  _log("matmul peak")
  results["matmul_peak_gflops"] = matmul_peak([256, 512] if quick else [512, 1024, 2048],
                                              repeats)
  peak = results["matmul_peak_gflops"]["jax_best"]
  results["models"] = {}
  for name in models:
    _log(f"model {name}")
    policy, folder = load_model(name, _WEIGHTS_DIR.value)
    c = policy.config
    model = {"folder": folder, "params": c.num_params, "config": {
        "d_model": c.d_model, "layers": c.num_layers, "heads": c.num_heads,
        "kv_heads": c.num_kv_heads, "mlp": c.mlp_dim, "vocab": c.vocab_size}}
    model["sampler"] = {"ours": sampler_ours(policy, batches, tp, n, repeats)}
    if "transformers" in peers:
      model["sampler"]["transformers"] = sampler_transformers(folder, c.vocab_size, batches, tp,
                                                              n, repeats)
      release_memory()
    model["learn"] = {mode: learn_ours(policy, mode, p, g, tp, n, repeats, peak)
                      for mode in ("full", "lora")}
    model["rl_step"] = rl_step_ours(policy, p, g, tp, n, repeats)
    release_memory()
    if "trl" in peers:
      if policy.tokenizer is None:
        model["trl"] = {"skipped": "no tokenizer: GRPOTrainer needs text prompts"}
      else:
        try:
          model["trl"] = trl_step(folder, p, g, tp, n)
        except Exception as e:  # pylint: disable=broad-except
          model["trl"] = {"skipped": f"TRL failed: {type(e).__name__}: {e}"[:2000]}
    release_memory()
    if "tunix" in peers:
      _log("  tunix peer")
      model["tunix"] = tunix_peer(os.path.abspath(folder), batches, tp, n, p, g, repeats,
                                  _TUNIX_PYTHON.value, _TUNIX_PEER.value, _TUNIX_TIMEOUT.value)
    results["models"][name] = model
    _write(results)
  if _E2E_STEPS.value:
    _log("end to end")
    results["end_to_end"] = end_to_end(3 if quick else _E2E_STEPS.value, quick)
  _log("curriculum overhead")
  sizes = [(6, 32, 8, 12_000)] + ([] if quick else [(64, 256, 16, 100_000)])
  results["curriculum"] = []
  for k, cp, cg, pool in sizes:
    row = curriculum_overhead(k, cp, cg, pool, repeats)
    ref = None
    if "end_to_end" in results and (k, cp, cg) == (6, 32, 8):
      ref = (f"{results['end_to_end']['config']} RL", results["end_to_end"]["step_s"])
    elif results["models"]:
      last = list(results["models"])[-1]
      ref = (f"{last} P={p} G={g} RL", results["models"][last]["rl_step"]["seconds"])
    if ref:
      row["step_ref"], row["step_s"] = ref
      row["fraction_of_step"] = row["total_s"] / ref[1]
    results["curriculum"].append(row)
  finalize(results)
  _write(results)
  return results


def finalize(results: dict) -> None:
  """MFU against the best matmul rate seen anywhere in the run (the start-of-run peak and the
  checks around every learn measurement: on a shared machine the first one can be low), then the
  ratios and the targets."""
  peak = results["matmul_peak_gflops"]
  around = [x for m in results["models"].values() for row in m["learn"].values()
            for x in row["peak_gflops_around"]]
  peak["jax_run_best"] = max([peak["jax_best"]] + around)
  for model in results["models"].values():
    for row in model["learn"].values():
      row["mfu"] = row["gflop_s"] / peak["jax_run_best"]
    model["ratios"] = ratios(model)
  results["targets"] = targets(results)


def _write(results):
  os.makedirs(_OUT_DIR.value, exist_ok=True)
  base = os.path.join(_OUT_DIR.value, _NAME.value)
  with open(base + ".json", "w") as f:
    json.dump(results, f, indent=1)
  if "targets" in results:
    with open(base + ".md", "w") as f:
      f.write(markdown(results))


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)  # checkpoint chatter of the end-to-end run
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  if root not in sys.path:
    sys.path.insert(0, root)  # configs/
  run("python " + " ".join(sys.argv))
  _log(f"wrote {os.path.join(_OUT_DIR.value, _NAME.value)}.json and .md")


if __name__ == "__main__":
  app.run(main)
