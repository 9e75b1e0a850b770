"""The peers: transformers' generate, TRL's GRPOTrainer (torch, CPU) and Tunix (its own venv).

torch, transformers, datasets and trl are imported inside the functions that use them: they are
optional (the `bench` extra), and a run without torch peers (`--peers=` or `--peers=tunix`) must
work without them installed.
"""

import json
import os
import subprocess
import tempfile
import time

import numpy as np

from benchmarks.speed import timing
from rl_curriculum.train.learn import examples


def torch_threads() -> int:
  """Lets torch use every core this process may run on; returns the thread count."""
  import torch  # pylint: disable=import-outside-toplevel
  torch.set_num_threads(len(os.sched_getaffinity(0)))
  return torch.get_num_threads()


def sampler_transformers(folder: str, vocab: int, batches, tp: int, n: int, repeats: int) -> dict:
  """transformers' generate with a KV cache (torch CPU, float32, greedy, exactly N tokens)."""
  import torch  # pylint: disable=import-outside-toplevel
  import transformers  # pylint: disable=import-outside-toplevel
  threads = torch_threads()
  model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
  model.eval()
  out = {"implementation": f"transformers {transformers.__version__} generate, torch "
                           f"{torch.__version__}", "threads": threads}
  for b in batches:
    ids = torch.as_tensor(examples.random_prompts(b, tp, vocab), dtype=torch.long)
    attn = torch.ones_like(ids)

    def prefill():
      with torch.inference_mode():
        return model(input_ids=ids, attention_mask=attn, use_cache=True).logits[:, -1]

    def generate():
      with torch.inference_mode():
        return model.generate(input_ids=ids, attention_mask=attn, do_sample=False, use_cache=True,
                              max_new_tokens=n, min_new_tokens=n, pad_token_id=0,
                              eos_token_id=None)

    prefill_s, _, _ = timing.timed(prefill, repeats)
    generate_s, _, tokens = timing.timed(generate, repeats)
    assert tokens.shape == (b, tp + n), tokens.shape
    out[str(b)] = timing.rates(b, tp, n, prefill_s, max(generate_s - prefill_s, 1e-9))
    timing.log(f"  transformers B={b:3d}: {out[str(b)]['new_tok_s']:9.1f} new tok/s")
  return out


def trl_prompts(tokenizer, count: int, length: int) -> list[str]:
  """`count` distinct texts of exactly `length` tokens under `tokenizer` (no special tokens)."""
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


def trl_step(folder: str, p: int, g: int, tp: int, t: int, steps: int = 2) -> dict:
  """One GRPOTrainer step (after a warm-up step): whole step and its learn part."""
  import datasets  # pylint: disable=import-outside-toplevel
  import torch  # pylint: disable=import-outside-toplevel
  import transformers  # pylint: disable=import-outside-toplevel
  import trl  # pylint: disable=import-outside-toplevel
  threads = torch_threads()
  tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
  model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
  prompts = trl_prompts(tokenizer, p * steps, tp)
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
  timing.log(f"  trl: step {step_s:.2f} s, generate {gen_s:.2f} s, learn {learn_s:.2f} s")
  return out


def tunix_peer(folder: str, batches, tp: int, n: int, p: int, g: int, repeats: int, python: str,
               script: str, timeout: int) -> dict:
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
