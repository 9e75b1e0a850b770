"""Both rollout engines on the same rows, at equal cache memory: slot use, speed, decode rate.

  python -m benchmarks.rollout            # tiny model and SmolLM2-135M, ~15 min
  python -m benchmarks.rollout --quick    # tiny model, small sizes, seconds

For each model and workload it rolls out R = P x G rows with the static engine (`sampler`, a
decode row per rollout row until the longest completion of its call ends, as many rows per call
as fit in the cache memory) and with the continuous engine (`sampling.continuous`, `--slots`
decode slots refilled from a queue, halved up to `--shrink` times as the rows run out, each
prompt's keys and values stored once; `continuous_fixed`: the same on fixed slots), all given the
same cache memory: the static engine's rows per call are the most whole groups whose caches
(Tp + N slots each) fit in the continuous engine's P x Tp prompt slots plus S x N completion
slots. Workloads:

  long_tail  random prompts whose completions are cut at lengths drawn from a log-normal with
             sigma 1.2 (p90 about 4.7x the median; a benchmark-only stop rule, `stop_after`)
  tasks      the RL task's own prompts (arithmetic, the chat template) sampled at temperature
             0.7 until the model's EOS (SmolLM2); the tiny model, whose random weights never
             stop, is cut at the length of each problem's answer plus EOS

and, on the long-tailed rows, a skip pass: 40% of the groups inactive, as GRESO skips
candidates before rollout, to show whether the saved rollouts save decode slot-steps.

Measured per engine: `slot_utilisation` (slot-steps that fed an occupied slot's token / slot-steps
computed, a slot-step being one decode slot through one loop iteration; the static engine's rows
occupy their slots until the call's longest row ends), `tokens_per_s` (tokens kept / wall seconds, compiled
programs, prefill included), `decode_over_prefill` (slot-steps per second of the decode loop over
prompt tokens per second of the same call's prefill), and `speedup` = continuous / static
tokens_per_s. Writes benchmarks/results/rollout_engine.json and .md (`--out_dir`).
"""

import math
import statistics
import time

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.speed import peak
from benchmarks.speed import timing
from rl_curriculum.model import pretrained
from rl_curriculum.model import transformer
from rl_curriculum.model.config import ModelConfig
from rl_curriculum.sampling import continuous
from rl_curriculum.sampling import sampler
from rl_curriculum.tasks import arithmetic
from rl_curriculum.train.learn import examples

FLAGS = flags.FLAGS


GROUP = 8
SKIP_SHARE = 0.4


class Workload:
  """Rows of one benchmark case: prompts i32[R, Tp] (G equal rows each), mask, the lengths the
  rows are cut at (or None), eos, temperature."""

  def __init__(self, tokens, mask, stop_after, eos_id, stop_ids, temperature, max_new_tokens):
    self.tokens, self.mask, self.stop_after = tokens, mask, stop_after
    self.eos_id, self.stop_ids = eos_id, tuple(stop_ids)
    self.temperature, self.max_new_tokens = temperature, max_new_tokens


def long_tail_lengths(rows: int, n: int, seed: int = 0) -> np.ndarray:
  """i32[R] completion lengths in [1, n]: log-normal, sigma 1.2, median n / 10."""
  draws = np.random.default_rng(seed).lognormal(math.log(n / 10), 1.2, rows)
  return np.clip(np.round(draws), 1, n).astype(np.int32)


def _repeat(prompts, mask):
  return np.repeat(prompts, GROUP, axis=0), np.repeat(mask, GROUP, axis=0)


def long_tail(policy, prompts: int, tp: int, n: int) -> Workload:
  tokens = examples.random_prompts(prompts, tp, policy.config.vocab_size)
  tokens, mask = _repeat(tokens, np.ones(tokens.shape, bool))
  never = policy.config.vocab_size  # an id no model emits: the lengths alone end rows
  return Workload(tokens, mask, long_tail_lengths(len(tokens), n), never, (), 1.0, n)


def task_rows(policy, prompts: int, n: int) -> Workload:
  """The arithmetic task's prompts over its difficulty bins (chat template with SmolLM2's
  tokenizer; answer lengths as stop rule for the tiny model)."""
  task = arithmetic.ArithmeticTask(template="chat_short")
  problems = [task.generate(seed, seed % task.num_difficulties) for seed in range(prompts)]
  tok = policy.tokenizer
  if tok is None:  # tiny model: random prompt ids, cut at each answer's length + EOS
    tp = 24
    tokens = examples.random_prompts(prompts, tp, policy.config.vocab_size)
    tokens, mask = _repeat(tokens, np.ones(tokens.shape, bool))
    lengths = np.repeat([min(len(p.answer) + 1, n) for p in problems], GROUP).astype(np.int32)
    return Workload(tokens, mask, lengths, policy.config.vocab_size, (), 1.0, n)
  ids = [tok.encode_chat(task.prompt_messages(p)) for p in problems]
  tp = max(map(len, ids))
  tokens = np.full((prompts, tp), tok.pad_id, np.int32)
  mask = np.zeros((prompts, tp), bool)
  for i, row in enumerate(ids):
    tokens[i, tp - len(row):], mask[i, tp - len(row):] = row, True
  tokens, mask = _repeat(tokens, mask)
  return Workload(tokens, mask, None, tok.eos_id, getattr(tok, "stop_ids", ()), 0.7, n)


def static_rows_per_call(prompts: int, tp: int, n: int, slots: int) -> int:
  """The most whole groups whose Tp + N cache slots fit in the continuous engine's P x Tp +
  S x N (equal cache memory)."""
  budget = prompts * tp + slots * n
  return max(GROUP, (budget // (tp + n)) // GROUP * GROUP)


def _static(policy, w: Workload, rows_per_call: int, key, active):
  """The static engine over the rows in calls of rows_per_call: (tokens kept, slot-steps,
  prefill s, decode s, prompt tokens prefilled)."""
  kept = steps = pre_s = dec_s = prefilled = 0
  stop = tuple(sorted({w.eos_id, *w.stop_ids}))
  for start in range(0, len(w.tokens), rows_per_call):
    part = slice(start, start + rows_per_call)
    cut = None if w.stop_after is None else jnp.asarray(w.stop_after[part])
    t0 = time.perf_counter()
    state = jax.block_until_ready(sampler.prefill(
        policy.graphdef, policy.params, jnp.asarray(w.tokens[part]), jnp.asarray(w.mask[part]),
        jax.random.fold_in(key, start), jnp.asarray(active[part]), cut,
        max_new_tokens=w.max_new_tokens, group=GROUP))
    t1 = time.perf_counter()
    state = jax.block_until_ready(sampler.decode(policy.graphdef, policy.params, state,
                                                 jnp.float32(w.temperature), stop_ids=stop))
    t2 = time.perf_counter()
    pre_s, dec_s = pre_s + t1 - t0, dec_s + t2 - t1
    kept += float(state.mask.sum())
    steps += int(state.step) * len(w.tokens[part])
    prefilled += len(w.tokens[part]) // GROUP * w.tokens.shape[1]
  return kept, steps, pre_s, dec_s, prefilled, kept


def _continuous(policy, w: Workload, slots: int, shrink: int, key, active, sink=None,
                **paging):
  """The continuous engine over all rows (`paging`: its KV pages, `continuous.start`); the rows'
  (tokens, log-probs, mask) appended to `sink` when given."""
  stop = tuple(sorted({w.eos_id, *w.stop_ids}))
  cut = None if w.stop_after is None else jnp.asarray(w.stop_after)
  t0 = time.perf_counter()
  state = jax.block_until_ready(continuous.start(
      policy.graphdef, policy.params, jnp.asarray(w.tokens), jnp.asarray(w.mask), key,
      jnp.float32(w.temperature), jnp.asarray(active), cut, max_new_tokens=w.max_new_tokens,
      slots=slots, stop_ids=stop, group=GROUP, **paging))
  t1 = time.perf_counter()
  state = jax.block_until_ready(continuous.run(policy.graphdef, policy.params, state,
                                               jnp.float32(w.temperature), stop_ids=stop,
                                               group=GROUP, shrink=shrink))
  t2 = time.perf_counter()
  if sink is not None:
    sink.append((np.asarray(state.tokens), np.asarray(state.logprobs), np.asarray(state.mask)))
  return (float(state.mask.sum()), int(state.slot_steps), t1 - t0, t2 - t1,
          len(w.tokens) // GROUP * w.tokens.shape[1], int(state.fed))


def measure(engine, active: np.ndarray, repeats: int) -> dict:
  """An engine's call (`engine(active)`) compiled on a warm-up call in which only the first
  group is active (the same shapes, little decoding), then timed; numbers of the median call."""
  warm = np.zeros_like(active)
  warm[:GROUP] = True
  engine(warm)
  runs = [engine(active) for _ in range(repeats)]
  kept, steps, _, _, prefilled, occupied = runs[-1]
  pre_s = statistics.median(r[2] for r in runs)
  dec_s = statistics.median(r[3] for r in runs)
  return {"tokens_kept": kept, "slot_steps": steps,
          "slot_utilisation": occupied / max(steps, 1),
          "tokens_per_s": kept / (pre_s + dec_s), "prefill_s": pre_s, "decode_s": dec_s,
          "decode_over_prefill": (steps / dec_s) / (prefilled / pre_s)}


def compare(policy, w: Workload, slots: int, shrink: int, repeats: int, active=None,
            fixed: bool = True) -> dict:
  """Both engines on the workload's rows (the continuous one also on fixed slots when `fixed`
  and shrink > 0); the static engine at equal cache memory."""
  active = np.ones(len(w.tokens), bool) if active is None else active
  prompts, tp = len(w.tokens) // GROUP, w.tokens.shape[1]
  per_call = static_rows_per_call(prompts, tp, w.max_new_tokens, slots)
  key = jax.random.PRNGKey(0)
  engines = {"static": lambda a: _static(policy, w, per_call, key, a),
             "continuous": lambda a: _continuous(policy, w, slots, shrink, key, a)}
  if fixed and shrink:
    engines["continuous_fixed"] = lambda a: _continuous(policy, w, slots, 0, key, a)
  out = {name: measure(engine, active, repeats) for name, engine in engines.items()}
  out["static"]["rows_per_call"] = per_call
  out["continuous"].update(slots=slots, shrink=shrink,
                           stage_slots=list(continuous.stage_slots(slots, 1, shrink)))
  cache_slots = prompts * tp + slots * w.max_new_tokens
  out["cache_slot_budget"] = cache_slots
  out["speedup"] = out["continuous"]["tokens_per_s"] / out["static"]["tokens_per_s"]
  lengths = w.stop_after
  if lengths is not None:
    out["lengths"] = {"median": float(np.median(lengths)), "p90": float(np.percentile(lengths, 90)),
                      "max": int(lengths.max())}
  out["rows"], out["prompt_len"], out["max_new_tokens"] = len(w.tokens), tp, w.max_new_tokens
  return out


def skip_pass(policy, w: Workload, slots: int, shrink: int, full: dict) -> dict:
  """The long-tailed rows with 40% of the groups inactive: saved rollouts against saved
  slot-steps, per engine (`full`: the same rows' `compare` with every group active)."""
  rng = np.random.default_rng(1)
  groups = len(w.tokens) // GROUP
  skipped = rng.permutation(groups)[:int(SKIP_SHARE * groups)]
  active = np.ones(groups, bool)
  active[skipped] = False
  active = np.repeat(active, GROUP)
  part = compare(policy, w, slots, shrink, 1, active, fixed=False)
  out = {"rollouts_saved_frac": 1 - active.mean()}
  for engine in ("static", "continuous"):
    saved = 1 - part[engine]["slot_steps"] / full[engine]["slot_steps"]
    out[engine] = {"slot_steps_saved_frac": saved,
                   "of_rollouts_saved": saved / out["rollouts_saved_frac"]}
  return out


def load(name: str):
  if name == "tiny":
    config = ModelConfig.tiny(vocab_size=512)
    graphdef, params = transformer.init_model(config, seed=0)
    return pretrained.Policy(config=config, graphdef=graphdef, params=params, tokenizer=None,
                             context_length=1024)
  return pretrained.load_pretrained("smollm2-135m-instruct", dtype="float32")


def run_model(name: str, quick: bool, slots: int, shrink: int, repeats: int) -> dict:
  policy = load(name)
  # Rows per slot decide how much of a call the longest row alone occupies: 16 here (8 for
  # SmolLM2, to keep its run to minutes on 2 cores).
  if quick:
    prompts, tp, n = 4, 16, 32
  elif name == "tiny":
    prompts, tp, n = 128, 32, 128
  else:
    prompts, tp, n = 64, 32, 96
  timing.log(f"{name}: long tail, {prompts * GROUP} rows, {slots} slots")
  tail = long_tail(policy, prompts, tp, n)
  out = {"long_tail": compare(policy, tail, slots, shrink, repeats)}
  timing.log(f"{name}: tasks")
  out["tasks"] = compare(policy, task_rows(policy, prompts, 24 if name != "tiny" else n // 4),
                         slots, shrink, repeats)
  timing.log(f"{name}: skipped groups")
  out["skipped"] = skip_pass(policy, tail, slots, shrink, out["long_tail"])
  return out


def markdown(results: dict) -> str:
  lines = ["# Rollout engines: static vs continuous at equal cache memory", "",
           f"{results['environment'].get('cpu_model', 'this machine')}; "
           f"{results['slots']} decode slots for the continuous engine, halved up to "
           f"{results.get('shrink', 0)} times as the rows run out (`continuous_fixed`: never). "
           "Written by `python -m benchmarks.rollout`.", "",
           "| model | workload | engine | slot utilisation | tokens/s | decode/prefill | "
           "speedup |", "|---|---|---|---|---|---|---|"]
  for model, per in results["models"].items():
    for workload in ("long_tail", "tasks"):
      r = per[workload]
      for engine in ("static", "continuous_fixed", "continuous"):
        if engine not in r:
          continue
        e = r[engine]
        speed = (f"{e['tokens_per_s'] / r['static']['tokens_per_s']:.2f}x"
                 if engine != "static" else "")
        lines.append(f"| {model} | {workload} | {engine} | {e['slot_utilisation']:.3f} | "
                     f"{e['tokens_per_s']:.1f} | {e['decode_over_prefill']:.2f} | {speed} |")
  lines += ["", "Skipped groups (40% of the long-tailed rows' groups inactive): share of decode "
            "slot-steps saved, against the share of rollouts saved.", "",
            "| model | engine | slot-steps saved | of rollouts saved |", "|---|---|---|---|"]
  for model, per in results["models"].items():
    for engine in ("static", "continuous"):
      s = per["skipped"][engine]
      lines.append(f"| {model} | {engine} | {s['slot_steps_saved_frac']:.3f} | "
                   f"{s['of_rollouts_saved']:.2f} |")
  return "\n".join(lines) + "\n"


def define_flags() -> None:
  """The command's flags; defined when it runs, so that importing this module defines none."""
  flags.DEFINE_bool("quick", False, "tiny model only, small sizes (a smoke test)")
  flags.DEFINE_string("out_dir", "benchmarks/results", "where the results go")
  flags.DEFINE_integer("slots", 64, "decode slots of the continuous engine")
  flags.DEFINE_integer("shrink", 3, "halvings of the continuous engine's slots as rows run out")
  flags.DEFINE_integer("repeats", 1, "timed calls per engine after the compiling one")


def main(argv):
  del argv
  models = ("tiny",) if FLAGS.quick else ("tiny", "smollm2")
  slots = 8 if FLAGS.quick else FLAGS.slots
  results = {"environment": peak.environment(), "slots": slots, "shrink": FLAGS.shrink,
             "group": GROUP,
             "quick": FLAGS.quick, "models": {}}
  for name in models:
    results["models"][name] = run_model(name, FLAGS.quick, slots, FLAGS.shrink, FLAGS.repeats)
  timing.write_results(FLAGS.out_dir, "rollout_engine", results, markdown(results))


if __name__ == "__main__":
  define_flags()
  app.run(main)
