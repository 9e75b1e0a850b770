"""Where a decode step's time goes, against the same model's prefill (SmolLM2-135M, float32).

  python -m benchmarks.profile_decode            # SmolLM2-135M-Instruct, 64 slots, ~2 min
  python -m benchmarks.profile_decode --quick    # the tiny model, seconds

The rollout benchmark measures decode at 0.23-0.57 of prefill's per-token rate. This profile
times, on `--slots` decode slots with every slot busy, one iteration of the continuous engine's
decode loop and its parts, each as its own jitted program (median of `--repeats` calls):

  loop_iteration  continuous.run over rows = slots, every row to max_new_tokens, / iterations
  forward         decoding.decode_slots: the blocks, the output head, the cache write (16
                  in a loop carrying the cache, as the decode loop does, / 16), at three
                  completion lengths: its growth with the key positions read is the attention
                  over the cache
  head            the tied output head alone (hidden [S, D] . embedding [V, D]^T)
  draw            strategies.draw_tokens on [S, V] logits (temperature 1: softmax, cumsum, draw)
  prefill         prompt_prefill.prefill_prompts of P prompts x Tp tokens (one pass)

and derives attention = its cost per key position x the keys read, blocks = forward - head -
attention (the blocks' weights, norms and rotations) and bookkeeping = loop_iteration - forward -
draw (writing tokens, seating rows, per-row keys, the loop). FLOPs per token follow the parameter count (2 per
weight a token passes; prefill computes the head for each prompt's last position only); matmul
rates of the blocks' widest matmul at M = S and M = P x Tp rows show how the CPU's efficiency
depends on M. Writes benchmarks/results/decode_profile.json and .md (`--out_dir`).
"""


from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import rollout
from benchmarks.speed import peak
from benchmarks.speed import timing
from rl_curriculum.model import decoding
from rl_curriculum.model import prefix_cache
from rl_curriculum.model import transformer
from rl_curriculum.sampling import continuous
from rl_curriculum.sampling import prompt_prefill
from rl_curriculum.sampling import strategies
from rl_curriculum.train.learn import examples

FLAGS = flags.FLAGS


def _median(fn, repeats: int) -> float:
  seconds, _, _ = timing.timed(lambda: jax.block_until_ready(fn()), repeats)
  return seconds


def matmul_rate(m: int, k: int, n: int, repeats: int) -> float:
  """GFLOP/s of x f32[m, k] . w f32[k, n]."""
  x = jax.random.normal(jax.random.PRNGKey(0), (m, k), jnp.float32)
  w = jax.random.normal(jax.random.PRNGKey(1), (k, n), jnp.float32)
  dot = jax.jit(jnp.dot)
  return 2 * m * k * n / _median(lambda: dot(x, w), repeats) / 1e9


def flops_per_token(config) -> dict:
  """Multiply-adds x 2 per token: the blocks' weights, and the output head (V x D)."""
  d, hd = config.d_model, config.head_dim
  attn = d * hd * (2 * config.num_heads + 2 * config.num_kv_heads)
  mlp = 3 * d * config.mlp_dim
  return {"blocks": 2 * config.num_layers * (attn + mlp), "head": 2 * config.vocab_size * d}


def profile(policy, slots: int, prompts: int, tp: int, n: int, repeats: int) -> dict:
  graphdef, params, config = policy.graphdef, policy.params, policy.config
  group = rollout.GROUP
  tokens = examples.random_prompts(prompts, tp, config.vocab_size)
  mask = np.ones(tokens.shape, bool)
  never = config.vocab_size
  out = {"slots": slots, "prompts": prompts, "prompt_len": tp, "max_new_tokens": n}

  # The whole loop: `slots` rows (slots / G prompts), each to n tokens, every slot busy.
  rows_t = np.repeat(tokens[:slots // group], group, axis=0)
  rows_m = np.ones(rows_t.shape, bool)
  key = jax.random.PRNGKey(0)

  def whole():
    state = continuous.start(graphdef, params, jnp.asarray(rows_t), jnp.asarray(rows_m), key,
                             jnp.float32(1.0), max_new_tokens=n, slots=slots,
                             stop_ids=(never,), group=group)
    return continuous.run(graphdef, params, state, jnp.float32(1.0), stop_ids=(never,),
                          group=group)
  state = jax.block_until_ready(whole())
  iterations = int(state.iterations)
  start_s = _median(lambda: continuous.start(graphdef, params, jnp.asarray(rows_t),
                                             jnp.asarray(rows_m), key, jnp.float32(1.0),
                                             max_new_tokens=n, slots=slots, stop_ids=(never,),
                                             group=group), repeats)
  out["loop_iteration_s"] = (_median(whole, repeats) - start_s) / iterations

  # One forward of the slots, halfway through completions of m slots (tp + m // 2 + 1 keys).
  inner = 16  # forwards per call, the cache carried (in place) as in the decode loop

  def forward_seconds(m):
    fresh = continuous.start(graphdef, params, jnp.asarray(rows_t), jnp.asarray(rows_m), key,
                             jnp.float32(1.0), max_new_tokens=m, slots=slots,
                             stop_ids=(never,), group=group)
    step = jnp.full((slots,), m // 2, jnp.int32)
    prompt_of = (jnp.arange(slots, dtype=jnp.int32) // group)[None]
    index = prefix_cache.SlotIndex(prompt=prompt_of, step=step)
    positions = jnp.full((slots,), tp, jnp.int32) + step
    token = jnp.ones((slots,), jnp.int32)

    @jax.jit
    def forward(params, cache):
      def body(_, carry):
        cache, total = carry
        logits, cache = decoding.decode_slots(graphdef, params, token, positions,
                                              fresh.prompt_mask, cache, index)
        return cache, total + logits[0, 0]
      return jax.lax.fori_loop(0, inner, body, (cache, jnp.float32(0)))[1]
    return _median(lambda: forward(params, fresh.cache), repeats) / inner

  keys_read = lambda m: tp + m // 2 + 1
  sweep = {keys_read(m): forward_seconds(m) for m in (2, n, 4 * n)}
  out["forward_s_by_keys"] = {str(k): v for k, v in sweep.items()}
  # The attention's cost per key position read (least squares over the sweep), and its part of
  # the forward at this profile's keys.
  xs, ys = np.array(list(sweep)), np.array(list(sweep.values()))
  out["attention_s_per_key"] = float(np.polyfit(xs, ys, 1)[0])
  out["forward_s"] = sweep[keys_read(n)]
  out["attention_s"] = out["attention_s_per_key"] * keys_read(n)
  step = jnp.full((slots,), n // 2, jnp.int32)
  hidden = jax.random.normal(jax.random.PRNGKey(2), (slots, config.d_model), jnp.float32)
  head = jax.jit(lambda p, h: transformer.merge_params(graphdef, p).logits(h))
  out["head_s"] = _median(lambda: head(params, hidden), repeats)
  logits = head(params, hidden)
  keys = strategies.row_keys(key, jnp.arange(slots, dtype=jnp.int32), step)
  draw = jax.jit(lambda l, k: strategies.draw_tokens(l, k, temperature=jnp.float32(1.0)))
  out["draw_s"] = _median(lambda: draw(logits, keys), repeats)
  out["blocks_s"] = out["forward_s"] - out["head_s"] - out["attention_s"]
  out["bookkeeping_s"] = out["loop_iteration_s"] - out["forward_s"] - out["draw_s"]

  # Prefill of the prompts, one pass.
  prefill = jax.jit(prompt_prefill.prefill_prompts, static_argnums=0)
  out["prefill_s"] = _median(lambda: prefill(graphdef, params, jnp.asarray(tokens),
                                             jnp.asarray(mask)), repeats)
  prefill_tok_s = prompts * tp / out["prefill_s"]
  decode_tok_s = slots / out["loop_iteration_s"]
  flops = flops_per_token(config)
  out["flops_per_token"] = flops
  out["prefill_tok_s"], out["decode_tok_s"] = prefill_tok_s, decode_tok_s
  out["decode_over_prefill"] = decode_tok_s / prefill_tok_s
  # Prefill computes the head once per prompt, decode once per token.
  prefill_flops = prompts * tp * flops["blocks"] + prompts * flops["head"]
  out["prefill_gflop_s"] = prefill_flops / out["prefill_s"] / 1e9
  out["blocks_gflop_s"] = slots * flops["blocks"] / out["blocks_s"] / 1e9  # weights only
  out["head_gflop_s"] = slots * flops["head"] / out["head_s"] / 1e9
  out["decode_gflop_s"] = slots * (flops["blocks"] + flops["head"]) / out["loop_iteration_s"] / 1e9
  # decode/prefill if decode's FLOPs ran at prefill's rate: the head alone costs this much.
  out["decode_over_prefill_at_equal_flop_rate"] = (
      (prefill_flops / (prompts * tp)) / (flops["blocks"] + flops["head"]))
  out["shares"] = {part: out[part + "_s"] / out["loop_iteration_s"]
                   for part in ("blocks", "attention", "head", "draw", "bookkeeping")}
  widest = config.mlp_dim
  out["matmul_gflop_s"] = {
      f"M={slots}": matmul_rate(slots, config.d_model, widest, repeats),
      f"M={prompts * tp}": matmul_rate(prompts * tp, config.d_model, widest, repeats),
      "shape": f"[M, {config.d_model}] x [{config.d_model}, {widest}]"}
  return out


def markdown(result: dict) -> str:
  r = result["profile"]
  it = r["loop_iteration_s"] * 1e3
  lines = [f"# One decode iteration of {result['model']} on {r['slots']} slots, against prefill",
           "", f"{result['environment'].get('cpu_model', 'CPU')}, "
           f"{result['environment'].get('cpu_count')} cores, float32, "
           f"{result['environment'].get('date', '')}. Written by "
           "`python -m benchmarks.profile_decode`.", "",
           "| part | ms | share of the iteration | GFLOP/s |", "|---|---|---|---|"]
  for part in ("blocks", "attention", "head", "draw", "bookkeeping"):
    rate = r.get(part + "_gflop_s")
    lines.append(f"| {part} | {r[part + '_s'] * 1e3:.1f} | {r['shares'][part]:.2f} | "
                 f"{'' if rate is None else f'{rate:.1f}'} |")
  lines += [f"| **iteration** | {it:.1f} | 1.00 | {r['decode_gflop_s']:.1f} |", "",
            f"Prefill of {r['prompts']} x {r['prompt_len']} tokens: {r['prefill_s'] * 1e3:.1f} "
            f"ms, {r['prefill_gflop_s']:.1f} GFLOP/s.", "",
            f"- decode {r['decode_tok_s']:.0f} tokens/s over prefill {r['prefill_tok_s']:.0f} "
            f"tokens/s = **{r['decode_over_prefill']:.2f}**",
            f"- at prefill's FLOP rate decode would reach "
            f"{r['decode_over_prefill_at_equal_flop_rate']:.2f} (the head's "
            f"{r['flops_per_token']['head'] / 1e6:.0f} MFLOP a token, which prefill computes "
            "once per prompt)",
            f"- the attention over the cache: {r['attention_s_per_key'] * 1e3:.2f} ms per key "
            "position read (forward ms by keys: " + ", ".join(
                f"{k}: {v * 1e3:.0f}" for k, v in r["forward_s_by_keys"].items()) + ")",
            f"- matmul {r['matmul_gflop_s']['shape']}: "
            + ", ".join(f"{k}: {v:.1f} GFLOP/s" for k, v in r["matmul_gflop_s"].items()
                        if k != "shape")]
  return "\n".join(lines) + "\n"


def define_flags() -> None:
  flags.DEFINE_bool("quick", False, "the tiny model, small sizes (a smoke test)")
  flags.DEFINE_string("out_dir", "benchmarks/results", "where the results go")
  flags.DEFINE_integer("slots", 64, "decode slots")
  flags.DEFINE_integer("repeats", 5, "timed calls per part after the compiling one")


def main(argv):
  del argv
  name = "tiny" if FLAGS.quick else "smollm2"
  policy = rollout.load(name)
  slots = 8 if FLAGS.quick else FLAGS.slots
  sizes = (4, 16, 16) if FLAGS.quick else (64, 32, 96)
  timing.log(f"{name}: {slots} slots")
  result = {"environment": peak.environment(), "model": name,
            "profile": profile(policy, slots, *sizes, FLAGS.repeats)}
  timing.write_results(FLAGS.out_dir, "decode_profile", result, markdown(result))


if __name__ == "__main__":
  define_flags()
  app.run(main)
