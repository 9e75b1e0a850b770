"""Tunix (google-tunix 0.1.7) peer of the speed benchmark: its sampler and its GRPO learner step.

Runs in .venv-tunix (made by `bash benchmarks/peers/setup_tunix.sh`), never in the project's
.venv, and imports nothing from rl_curriculum. benchmarks/speed/peers.py calls it as

  .venv-tunix/bin/python benchmarks/peers/tunix_peer.py --model-dir DIR --batches 1,8,32,64 \
      --prompt-len 64 --new-tokens 64 --learn-prompts P --learn-group G --repeats R --out FILE.json

Model. DIR is an HF Llama checkpoint folder (config.json + float32 model.safetensors, tied
embeddings) as written by rl_curriculum.model.pretrained.save_pretrained. It is loaded into
Tunix's own Llama3 (tunix.models.llama3) with tunix.models.llama3.params.
create_model_from_safe_tensors; config.json is mapped to tunix's ModelConfig (weight_tying from
tie_word_embeddings). Tunix 0.1.7's Llama3 attention calls apply_rope without the configured
rope_theta (it always uses its default 1e6); the module function is wrapped here so that the
checkpoint's rope_theta is used, otherwise the logits differ from transformers'.
`--logits-out FILE.npy` writes the f32[1, T, V] logits of `--logits-prompt` and exits
(benchmarks/peers/compare_logits.py compares them with transformers').

Token ids. Prompts are random ids in [3, V) drawn with numpy's default_rng(0) (one draw of shape
[B, prompt_len] per batch size, one of [P, prompt_len] for the learner), no padding. Tunix's
sampler takes strings, so a small tokenizer maps "12 7 33" <-> [12, 7, 33]; its eos id is -1 and
its pad id is V, so no generated token ever stops a row or is masked: every row makes exactly
--new-tokens tokens.

What is timed (time.perf_counter around calls that end in jax.block_until_ready; medians over
--repeats after one warm-up call whose extra time over the median is reported as compile_s):
- sampler[B]: tunix.generate.sampler.Sampler on B prompts, greedy by default (--temperature T > 0:
  categorical sampling over the full vocabulary, Tunix's top_p=1.0 path), KV cache of
  prompt_len + new_tokens. The warm-up is one public `Sampler.__call__`; each timed repeat runs
  the same compiled programs the call runs, split in two: the prefill program (prompt forward,
  KV cache fill and the first new token) and the decode program (a while loop making the other
  new_tokens - 1 tokens). prefill_tok_s = B * prompt_len / prefill_s, decode_tok_s =
  B * (new_tokens - 1) / decode_s, new_tok_s = B * new_tokens / (prefill_s + decode_s),
  seconds = prefill_s + decode_s. With --time-call, call_s is one timed public
  `Sampler.__call__` after the repeats (adds tokenising strings and host post-processing; it
  came within noise of `seconds` on both benchmark models).
- learn: one GRPO step of tunix.rl.grpo.grpo_learner.GRPOLearner (full fine-tuning, adamw,
  beta=0 so no reference model, num_iterations=1, epsilon 0.2, vanilla rollout engine sampling
  at temperature 1 (or --temperature), one global batch of P prompts x G completions, rewards
  from a cheap host function of the completion ids). step_s is the learner's whole global step (rollout of P*G sequences,
  rewards, advantages, policy update); update_s is `RLCluster.update_actor` alone (Tunix's
  trainer loop around one jitted train step: forward and backward over every position of the
  P*G sequences of prompt_len + new_tokens tokens, and the optimizer update) and
  tok_s = P*G*(prompt_len + new_tokens) / update_s. The first step is the warm-up; --repeats
  more steps are timed.

Cost on one core (taskset -c 1, shared with other work): the tiny model with batches 1,8,32,64,
P=G=4 and 5 repeats takes about 2 minutes; SmolLM2-135M with 3 repeats about 20 minutes (the
batch-64 sampler about 7, the learner about 6) with --time-call, about half that on an idle
core; each compile takes 10-50 s.

JSON written to --out: see the "Tunix peer contract" of the benchmark spec; extra keys:
"affinity", "sampling", "rope_fix", per-batch "prefill_s", "decode_s", "compile_s", "call_s"
(with --time-call), the process CPU seconds "prefill_cpu_s"/"decode_cpu_s" (medians; near the wall seconds when the
core was not shared with other work) and every repeat's wall seconds; learn "step_s",
"update_s", "update_cpu_s", "compile_s", every timed step and "what".
"""

import argparse
import functools
import json
import os
import statistics
import sys
import time
import traceback


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--model-dir", required=True)
  p.add_argument("--batches", default="1,8,32,64")
  p.add_argument("--prompt-len", type=int, default=64)
  p.add_argument("--new-tokens", type=int, default=64)
  p.add_argument("--learn-prompts", type=int, default=4, help="P; 0 skips the learner")
  p.add_argument("--learn-group", type=int, default=4, help="G (>= 2 for GRPO)")
  p.add_argument("--repeats", type=int, default=3)
  p.add_argument("--temperature", type=float, default=0.0,
                 help="sampler benchmark: 0 greedy (as python -m benchmarks.speed); > 0 "
                      "categorical sampling (Tunix top_p=1.0). The learner's rollout always "
                      "samples, at this temperature or 1.0 when it is 0")
  p.add_argument("--time-call", action="store_true",
                 help="also time one public Sampler.__call__ per batch (call_s)")
  p.add_argument("--learning-rate", type=float, default=1e-6)
  p.add_argument("--out", default=None, help="results JSON (default: stdout only)")
  p.add_argument("--logits-out", default=None,
                 help="write f32[1, T, V] logits of --logits-prompt to this .npy and exit")
  p.add_argument("--logits-prompt", default="3,17,42,5,9,11,30,2,8,61",
                 help="comma-separated token ids for --logits-out")
  p.add_argument("--no-rope-fix", action="store_true",
                 help="keep Tunix 0.1.7's rope_theta=1e6 in attention (for the logit check)")
  return p.parse_args(argv)


# ---------------------------------------------------------------------------------------------
# Model.


def tunix_config(hf: dict):
  """tunix.models.llama3.model.ModelConfig for an HF LlamaForCausalLM config.json dict."""
  from tunix.models.llama3 import model as llama

  if hf.get("model_type", "llama") != "llama":
    raise ValueError(f"only Llama checkpoints are supported, got {hf.get('model_type')!r}")
  for key in ("attention_bias", "mlp_bias"):
    if hf.get(key):
      raise ValueError(f"{key}=true is not supported by tunix's Llama3")
  if hf.get("rope_scaling"):
    raise ValueError("rope_scaling is not supported by tunix's Llama3")
  d = hf["hidden_size"]
  heads = hf["num_attention_heads"]
  rope = hf.get("rope_theta") or (hf.get("rope_parameters") or {}).get("rope_theta", 10000.0)
  return llama.ModelConfig(
      num_layers=hf["num_hidden_layers"],
      vocab_size=hf["vocab_size"],
      embed_dim=d,
      hidden_dim=hf["intermediate_size"],
      num_heads=heads,
      head_dim=hf.get("head_dim") or d // heads,
      num_kv_heads=hf.get("num_key_value_heads", heads),
      rope_theta=rope,
      norm_eps=hf["rms_norm_eps"],
      weight_tying=bool(hf.get("tie_word_embeddings", False)),
  )


def use_rope_theta(rope_theta: float) -> None:
  """Makes tunix's Llama3 attention rotate with rope_theta (0.1.7 passes none: 1e6 always)."""
  from tunix.models.llama3 import model as llama

  original = getattr(llama.apply_rope, "__wrapped_rope__", llama.apply_rope)
  wrapped = functools.partial(original, rope_theta=rope_theta)
  wrapped.__wrapped_rope__ = original
  llama.apply_rope = wrapped


def load_model(model_dir: str, rope_fix: bool = True):
  import jax.numpy as jnp
  from tunix.models.llama3 import params as llama_params

  with open(os.path.join(model_dir, "config.json")) as f:
    hf = json.load(f)
  config = tunix_config(hf)
  if rope_fix:
    use_rope_theta(config.rope_theta)
  model = llama_params.create_model_from_safe_tensors(model_dir, config, dtype=jnp.float32)
  return model, config


class IdTokenizer:
  """Strings of space-separated token ids <-> id lists; eos -1 and pad V are never produced."""

  def __init__(self, vocab_size: int):
    self.vocab_size = vocab_size

  def encode(self, text, **unused):
    return [int(t) for t in text.split()]

  def decode(self, ids, **unused):
    return " ".join(str(int(i)) for i in ids)

  def bos_id(self):
    return None

  def eos_id(self):
    return -1

  def pad_id(self):
    return self.vocab_size


def random_prompts(rows: int, length: int, vocab: int):
  import numpy as np

  return np.random.default_rng(0).integers(3, vocab, size=(rows, length), dtype=np.int64)


def as_strings(ids):
  return [" ".join(str(int(t)) for t in row) for row in ids]


def write_logits(model, prompt: str, path: str) -> None:
  import jax.numpy as jnp
  import numpy as np

  tokens = jnp.asarray([[int(t) for t in prompt.split(",")]], jnp.int32)
  t = tokens.shape[1]
  positions = jnp.arange(t, dtype=jnp.int32)[None]
  mask = jnp.tril(jnp.ones((t, t), bool))[None]
  logits, _ = model(tokens, positions, None, mask)
  np.save(path, np.asarray(logits, np.float32))


# ---------------------------------------------------------------------------------------------
# Sampler.


def bench_sampler(model, config, batches, prompt_len, new_tokens, repeats, temperature,
                  time_call=False):
  import jax
  from tunix.generate import sampler as sampler_lib

  cache = sampler_lib.CacheConfig(
      cache_size=prompt_len + new_tokens, num_layers=config.num_layers,
      num_kv_heads=config.num_kv_heads, head_dim=config.head_dim)
  sampler = sampler_lib.Sampler(model, IdTokenizer(config.vocab_size), cache)
  top_p = 1.0 if temperature > 0 else None
  call_kw = dict(max_generation_steps=new_tokens, max_prompt_length=prompt_len, echo=False,
                 temperature=temperature, top_p=top_p, eos_tokens=[-1], seed=0,
                 pad_output=False)
  results = {}
  for b in batches:
    ids = random_prompts(b, prompt_len, config.vocab_size)
    strings = as_strings(ids)

    t0 = time.perf_counter()
    out = sampler(strings, **call_kw)
    warm_s = time.perf_counter() - t0
    lengths = {len(t) for t in out.tokens}
    if lengths != {new_tokens}:
      raise RuntimeError(f"sampler made rows of lengths {sorted(lengths)}, want {new_tokens}")

    prefill, decode, prefill_cpu, decode_cpu = [], [], [], []
    for _ in range(repeats):
      # The body of Sampler.__call__ between tokenising and post-processing.
      state = sampler.init_sample_state(
          jax.numpy.asarray(ids, jax.numpy.int32), total_sampling_steps=prompt_len + new_tokens,
          include_logits=False, forbidden_token_ids=None, temperature=temperature, top_p=top_p,
          top_k=None, seed=jax.random.PRNGKey(0), beam_size=None, include_logprobs=False)
      jax.block_until_ready(state)
      t0, c0 = time.perf_counter(), time.process_time()
      state = sampler._compiled_prefill_fn(sampler._flattened_transformer_state, state, None,
                                           echo=False)
      jax.block_until_ready(state.token_buffer)
      t1, c1 = time.perf_counter(), time.process_time()
      state = sampler._compiled_decode_fn(sampler._flattened_transformer_state, state)
      jax.block_until_ready(state.token_buffer)
      t2, c2 = time.perf_counter(), time.process_time()
      if int(state.decoding_step) != prompt_len + new_tokens:
        raise RuntimeError(f"decode stopped at step {int(state.decoding_step)}")
      prefill.append(t1 - t0)
      decode.append(t2 - t1)
      prefill_cpu.append(c1 - c0)
      decode_cpu.append(c2 - c1)
    pre_s, dec_s = statistics.median(prefill), statistics.median(decode)

    call_s = None
    if time_call:
      t0 = time.perf_counter()
      sampler(strings, **call_kw)
      call_s = time.perf_counter() - t0

    results[str(b)] = {
        "prefill_tok_s": b * prompt_len / pre_s,
        "decode_tok_s": b * (new_tokens - 1) / dec_s,
        "new_tok_s": b * new_tokens / (pre_s + dec_s),
        "seconds": pre_s + dec_s,
        "prefill_s": pre_s,
        "decode_s": dec_s,
        **({"call_s": call_s} if time_call else {}),
        "compile_s": max(warm_s - (pre_s + dec_s), 0.0),
        "prefill_cpu_s": statistics.median(prefill_cpu),
        "decode_cpu_s": statistics.median(decode_cpu),
        "prefill_s_all": prefill,
        "decode_s_all": decode,
    }
    print(f"sampler B={b}: {results[str(b)]}", file=sys.stderr, flush=True)
  return results


# ---------------------------------------------------------------------------------------------
# GRPO learner.


def completion_reward(prompts, completions, **unused):
  """A cheap deterministic reward: the fraction of even ids in each completion."""
  rewards = []
  for text in completions:
    ids = [int(t) for t in text.split()]
    rewards.append(sum(1 for t in ids if t % 2 == 0) / max(len(ids), 1))
  return rewards


def bench_learn(model, config, prompts, group, prompt_len, new_tokens, repeats, temperature,
                learning_rate):
  import jax
  import numpy as np
  import optax
  from tunix.rl import rl_cluster as rl_cluster_lib
  from tunix.rl.grpo import grpo_learner
  from tunix.rl.rollout import base_rollout

  # Auto axes: with jax's default Explicit axes the sharded embedding gather does not trace.
  mesh = jax.make_mesh((1, 1), ("fsdp", "tp"),
                       axis_types=(jax.sharding.AxisType.Auto,) * 2)
  steps = 1 + repeats
  training = rl_cluster_lib.RLTrainingConfig(
      actor_optimizer=optax.adamw(learning_rate),
      eval_every_n_steps=10**9,
      max_steps=steps,
  )
  rollout = base_rollout.RolloutConfig(
      max_tokens_to_generate=new_tokens,
      max_prompt_length=prompt_len,
      kv_cache_size=prompt_len + new_tokens,
      temperature=temperature if temperature > 0 else 1.0,
      top_p=1.0 if temperature > 0 else None,
      top_k=None,
  )
  cluster_config = rl_cluster_lib.ClusterConfig(
      role_to_mesh={rl_cluster_lib.Role.ACTOR: mesh, rl_cluster_lib.Role.REFERENCE: mesh,
                    rl_cluster_lib.Role.ROLLOUT: mesh},
      rollout_engine="vanilla",
      offload_to_cpu=False,
      training_config=training,
      rollout_config=rollout,
  )
  with jax.set_mesh(mesh):
    cluster = rl_cluster_lib.RLCluster(actor=model, reference=None,
                                       tokenizer=IdTokenizer(config.vocab_size),
                                       cluster_config=cluster_config)
    algo = grpo_learner.GRPOConfig(num_generations=group, num_iterations=1, beta=0.0,
                                   epsilon=0.2)
    learner = grpo_learner.GRPOLearner(rl_cluster=cluster, algo_config=algo,
                                       reward_fns=completion_reward)

    step_times, update_times, update_cpu = [], [], []

    def params():
      return jax.tree.leaves(cluster.actor_trainer.model)

    run_global_step = learner._run_global_step
    update_actor = cluster.update_actor

    def timed_global_step(*args, **kwargs):
      t0 = time.perf_counter()
      out = run_global_step(*args, **kwargs)
      jax.block_until_ready(params())
      step_times.append(time.perf_counter() - t0)
      update = update_times[-1] if len(update_times) == len(step_times) else float("nan")
      print(f"learn step {len(step_times)}: {step_times[-1]:.3f} s, update {update:.3f} s",
            file=sys.stderr, flush=True)
      return out

    def timed_update_actor(*args, **kwargs):
      jax.block_until_ready(params())
      t0, c0 = time.perf_counter(), time.process_time()
      out = update_actor(*args, **kwargs)
      jax.block_until_ready(params())
      update_times.append(time.perf_counter() - t0)
      update_cpu.append(time.process_time() - c0)
      return out

    learner._run_global_step = timed_global_step
    cluster.update_actor = timed_update_actor

    # A numpy array of strings, as Tunix's data pipelines give: the learner repeats each
    # prompt G times with jax.tree.map(np.repeat), which would split a list into leaves.
    ids = random_prompts(prompts, prompt_len, config.vocab_size)
    batch = {"prompts": np.array(as_strings(ids))}
    learner.train([dict(batch) for _ in range(steps)])

  if len(step_times) != steps or len(update_times) != steps:
    raise RuntimeError(f"expected {steps} learner steps, timed {len(step_times)} global steps "
                       f"and {len(update_times)} updates")
  step_s = statistics.median(step_times[1:])
  update_s = statistics.median(update_times[1:])
  tokens = prompts * group * (prompt_len + new_tokens)
  return {
      "tok_s": tokens / update_s,
      "seconds": update_s,
      "tokens": tokens,
      "update_s": update_s,
      "step_s": step_s,
      "step_tok_s": tokens / step_s,
      "compile_s": max(step_times[0] - step_s, 0.0),
      "update_cpu_s": statistics.median(update_cpu[1:]),
      "step_s_all": step_times[1:],
      "update_s_all": update_times[1:],
      "mode": "full",
      "what": (
          f"tunix GRPOLearner, one global step on {prompts} prompts x {group} completions of "
          f"{prompt_len}+{new_tokens} tokens (full fine-tuning, optax.adamw "
          f"lr={learning_rate}, beta=0: no reference model, num_iterations=1, vanilla rollout "
          f"at temperature {rollout.temperature}, top_p={rollout.top_p}). "
          "seconds/update_s/tok_s: RLCluster.update_actor only (Tunix trainer loop around one "
          "jitted value_and_grad of the GRPO loss over all positions + adamw update), "
          "blocked on the parameters. step_s/step_tok_s: the learner's whole global step "
          "(rollout, rewards, advantages, update). Medians over the steps after the first.")
  }


# ---------------------------------------------------------------------------------------------


def main(argv=None):
  args = parse_args(argv)
  import jax

  if args.logits_out:
    model, _ = load_model(args.model_dir, rope_fix=not args.no_rope_fix)
    write_logits(model, args.logits_prompt, args.logits_out)
    print(f"wrote {args.logits_out}", file=sys.stderr)
    return 0

  affinity = sorted(os.sched_getaffinity(0))
  t0 = time.perf_counter()
  model, config = load_model(args.model_dir)
  load_s = time.perf_counter() - t0
  sampling = ("greedy" if args.temperature <= 0 else
              f"temperature {args.temperature}, categorical over the full vocabulary "
              "(Tunix top_p=1.0 path)")
  result = {
      "implementation": "tunix 0.1.7",
      "jax": jax.__version__,
      "threads": len(affinity),
      "affinity": affinity,
      "xla_flags": os.environ.get("XLA_FLAGS", ""),
      "model_dir": os.path.abspath(args.model_dir),
      "load_s": load_s,
      "prompt_len": args.prompt_len,
      "new_tokens": args.new_tokens,
      "repeats": args.repeats,
      "sampling": sampling,
      "rope_fix": ("tunix 0.1.7 Llama3 attention ignores ModelConfig.rope_theta (uses 1e6); "
                   f"apply_rope is wrapped with rope_theta={config.rope_theta}"),
  }
  batches = [int(b) for b in args.batches.split(",") if b]
  result["sampler"] = bench_sampler(model, config, batches, args.prompt_len, args.new_tokens,
                                    args.repeats, args.temperature, args.time_call)
  if args.learn_prompts > 0:
    try:
      result["learn"] = bench_learn(model, config, args.learn_prompts, args.learn_group,
                                    args.prompt_len, args.new_tokens, args.repeats,
                                    args.temperature, args.learning_rate)
    except Exception as e:  # recorded, not raised: the sampler numbers stay usable
      traceback.print_exc()
      result["learn"] = {"error": f"{type(e).__name__}: {e}"}
  text = json.dumps(result, indent=2)
  if args.out:
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
      f.write(text + "\n")
  print(text)
  return 0


if __name__ == "__main__":
  sys.exit(main())
