"""The continuous engine on a paged KV cache against the dense one and the static sampler.

  python -m benchmarks.paged              # SmolLM2-135M at 64 and 256 slots, then v5e-8 plans
  python -m benchmarks.paged --quick      # tiny model, small sizes, no plans: seconds

On CPU, for each slot count S, SmolLM2-135M-Instruct rolls out the same long-tailed rows
(`benchmarks.rollout.long_tail`: completions cut at log-normal lengths, median N / 10) with

  static        the static sampler at the dense engine's cache memory (`rollout.static_rows_per_call`)
  dense         the continuous engine, S slots of N completion slots each (`prefix_cache`)
  paged         the continuous engine on pages of `--page_size` tokens, S slots, a pool of the
                dense engine's completion memory (S ceil(N / page_size) pages)
  paged_2x      the same pool shared by 2 S slots: twice the slots in the same memory; rows that
                find no page restart (`sampling.pages`), which costs slot-steps, not tokens

and reports tokens kept per second (prefill included), slot utilisation, slot-steps, the
decode/prefill per-token ratio (slot-steps per decode second over prompt tokens per prefill
second), and that every engine's tokens equal the dense engine's (the same rows and keys).

Then, unless --quick, the planner compiles the SEC paper setting's rollout programs
(configs/sec_paper_countdown_qwen3b.py) for a v5e-8 slice by XLA:TPU (`plans`): the most slots the
dense engine holds in a chip's 15.75 GiB, and the paged engine (JAX's ragged paged attention
kernel) at twice as many on a pool of the same tokens; per plan the programs' peak memory per
chip and the decode iteration's bytes accessed over the bytes it must read (weights and the KV
cache; the kernel's own reads are not counted: the planner reads no custom call's cost).
Writes benchmarks/results/paged_engine.json and .md (`--out_dir`).
"""

import time

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import rollout
from benchmarks.speed import peak
from benchmarks.speed import timing
from rl_curriculum.sampling import continuous

FLAGS = flags.FLAGS


def _engine(policy, w, slots: int, key, active, **paging):
  """The continuous engine over all rows (`rollout._continuous`'s tuple, plus the tokens)."""
  stop = tuple(sorted({w.eos_id, *w.stop_ids}))
  cut = None if w.stop_after is None else jnp.asarray(w.stop_after)
  t0 = time.perf_counter()
  state = jax.block_until_ready(continuous.start(
      policy.graphdef, policy.params, jnp.asarray(w.tokens), jnp.asarray(w.mask), key,
      jnp.float32(w.temperature), jnp.asarray(active), cut, max_new_tokens=w.max_new_tokens,
      slots=slots, stop_ids=stop, group=rollout.GROUP, **paging))
  t1 = time.perf_counter()
  state = jax.block_until_ready(continuous.run(policy.graphdef, policy.params, state,
                                               jnp.float32(w.temperature), stop_ids=stop,
                                               group=rollout.GROUP))
  t2 = time.perf_counter()
  _engine.tokens = np.asarray(state.tokens)
  return (float(state.mask.sum()), int(state.slot_steps), t1 - t0, t2 - t1,
          len(w.tokens) // rollout.GROUP * w.tokens.shape[1], int(state.fed))


def compare(policy, w, slots: int, page_size: int, repeats: int) -> dict:
  """The four engines of the module docstring on the workload's rows."""
  active = np.ones(len(w.tokens), bool)
  prompts, tp, n = len(w.tokens) // rollout.GROUP, w.tokens.shape[1], w.max_new_tokens
  key = jax.random.PRNGKey(0)
  pool = slots * -(-n // page_size)  # the dense engine's S x N completion slots, in pages
  # Twice the slots on that pool, or on the fewest pages that many slots may have (tiny sizes).
  pool_2x = max(pool, -(-n // page_size) + 2 * slots)
  engines = {
      "static": lambda a: rollout._static(  # pylint: disable=protected-access
          policy, w, rollout.static_rows_per_call(prompts, tp, n, slots), key, a),
      "dense": lambda a: _engine(policy, w, slots, key, a),
      "paged": lambda a: _engine(policy, w, slots, key, a, page_size=page_size, kv_pages=pool),
      "paged_2x": lambda a: _engine(policy, w, 2 * slots, key, a, page_size=page_size,
                                    kv_pages=pool_2x),
  }
  out, tokens = {}, {}
  for name, engine in engines.items():
    timing.log(f"  {name}")
    out[name] = rollout.measure(engine, active, repeats)
    tokens[name] = getattr(_engine, "tokens", None) if name != "static" else None
  for name in ("paged", "paged_2x"):
    out[name]["tokens_equal_dense"] = bool(np.array_equal(tokens[name], tokens["dense"]))
  out["slots"], out["page_size"], out["kv_pages"] = slots, page_size, pool
  out["paged_2x"]["kv_pages"] = pool_2x
  out["rows"], out["prompt_len"], out["max_new_tokens"] = len(w.tokens), tp, n
  lengths = w.stop_after
  out["lengths"] = {"mean": float(lengths.mean()), "median": float(np.median(lengths)),
                    "p90": float(np.percentile(lengths, 90)), "max": int(lengths.max())}
  return out


def _plan_decode(paper, planner, targets, slots: int, paging: dict) -> dict:
  """The paper setting's rollout programs on v5e-8 with `slots` decode slots, dense or paged."""
  config = paper.get_config()
  with config.unlocked():
    config.rl.decode_slots = slots
    config.rl.page_size = paging.get("page_size", 0)
    config.rl.kv_pages = paging.get("kv_pages", 0)
  plan = planner.plan(config, target=targets.parse("v5e-8"), programs=("sampler",))
  decode = plan["programs"]["decode"]
  return {"slots": slots, **paging, "decode_peak_gib": decode["peak_gib"],
          "prefill_peak_gib": plan["programs"]["prefill"]["peak_gib"],
          "fits": bool(plan["fits"]), "cache_gib": plan["cache_gib"],
          "decode_bytes_ratio": plan["roofline"].get("decode_bytes_ratio"),
          "hbm_gib": plan["hbm_gib"]}


def plans(page_size: int) -> dict:
  """The paper setting's rollout programs on a v5e-8 by XLA:TPU (configs/sec_paper_countdown_
  qwen3b.py, its attention "auto": the TPU kernels): the dense engine at 512 and 1024 slots, the
  most slots it holds in a chip's memory (linear in the slots between those two, rounded down to
  64, then planned), and the paged engine at twice those slots on a pool of the dense engine's
  completion memory at them (S ceil(N / page_size) pages)."""
  from configs import sec_paper_countdown_qwen3b as paper  # pylint: disable=import-outside-toplevel
  from rl_curriculum.plan import planner  # pylint: disable=import-outside-toplevel
  from rl_curriculum.plan import targets  # pylint: disable=import-outside-toplevel
  n = paper.get_config().rl.max_new_tokens
  run = lambda name, slots, **paging: (timing.log(f"  plan {name}: {slots} slots {paging}"),
                                       _plan_decode(paper, planner, targets, slots, paging))[1]
  out = {"dense_512": run("dense", 512), "dense_1024": run("dense", 1024)}
  low, high = out["dense_512"], out["dense_1024"]
  per_slot = (high["decode_peak_gib"] - low["decode_peak_gib"]) / 512
  most = 512 + int((low["hbm_gib"] - low["decode_peak_gib"]) / per_slot) // 64 * 64
  out["dense_most"] = run("dense", most)
  for slots, key in ((512, "paged_1024"), (most, "paged_twice_most")):
    out[key] = run("paged", 2 * slots, page_size=page_size,
                   kv_pages=slots * -(-n // page_size))
  out["dense_most_slots"] = most
  return out


def markdown(results: dict) -> str:
  lines = ["# Paged KV cache: the continuous engine on pages against the dense engine", "",
           f"{results['environment'].get('cpu_model', 'this machine')}; {results['model']}, "
           f"pages of {results['page_size']} tokens. Written by `python -m benchmarks.paged`.", "",
           "| slots | engine | tokens/s | slot utilisation | slot-steps | decode/prefill | "
           "tokens = dense |", "|---|---|---|---|---|---|---|"]
  for slots, r in results["cpu"].items():
    for engine in ("static", "dense", "paged", "paged_2x"):
      e = r[engine]
      same = {True: "yes", False: "no"}.get(e.get("tokens_equal_dense"), "")
      count = 2 * int(slots) if engine == "paged_2x" else int(slots)
      lines.append(f"| {count} | {engine} | {e['tokens_per_s']:.1f} | "
                   f"{e['slot_utilisation']:.3f} | {e['slot_steps']} | "
                   f"{e['decode_over_prefill']:.2f} | {same} |")
  if results.get("v5e8"):
    p = results["v5e8"]
    lines += ["", f"SEC paper setting on v5e-8 by XLA:TPU ({p['dense_512']['hbm_gib']:.2f} GiB a "
              "chip), the rollout programs (decode: a step's run; the paged engine with JAX's "
              f"ragged paged attention kernel). The dense engine holds at most "
              f"{p['dense_most_slots']} slots (linear in the slots from 512 to 1024, planned "
              "there).", "",
              "| engine | slots | KV pages | prefill peak GiB | decode peak GiB | fits | cache GiB "
              "| decode bytes / must read |", "|---|---|---|---|---|---|---|---|"]
    for name, e in p.items():
      if not isinstance(e, dict):
        continue
      ratio = e["decode_bytes_ratio"]
      lines.append(f"| {name} | {e['slots']} | {e.get('kv_pages', '')} | "
                   f"{e['prefill_peak_gib']:.2f} | {e['decode_peak_gib']:.2f} | "
                   f"{'yes' if e['fits'] else 'no'} | {e['cache_gib']:.2f} | "
                   f"{'' if ratio is None else f'{ratio:.1f}x'} |")
  return "\n".join(lines) + "\n"


def define_flags() -> None:
  """The command's flags; defined when it runs, so that importing this module defines none."""
  flags.DEFINE_bool("quick", False, "tiny model, small sizes, no plans (a smoke test)")
  flags.DEFINE_string("out_dir", "benchmarks/results", "where the results go")
  flags.DEFINE_list("slots", ["64", "256"], "decode slot counts of the dense engine")
  flags.DEFINE_integer("page_size", 16, "tokens a KV page")
  flags.DEFINE_integer("repeats", 1, "timed calls per engine after the compiling one")


def main(argv):
  del argv
  name = "tiny" if FLAGS.quick else "smollm2"
  policy = rollout.load(name)
  prompts, tp, n = (4, 16, 32) if FLAGS.quick else (64, 32, 96)
  workload = rollout.long_tail(policy, prompts, tp, n)
  slot_counts = [4] if FLAGS.quick else [int(s) for s in FLAGS.slots]
  page_size = 4 if FLAGS.quick else FLAGS.page_size
  results = {"environment": peak.environment(), "model": name, "page_size": page_size,
             "cpu": {}}
  for slots in slot_counts:
    timing.log(f"{name}: {len(workload.tokens)} long-tailed rows, {slots} slots")
    results["cpu"][str(slots)] = compare(policy, workload, slots, page_size, FLAGS.repeats)
  if not FLAGS.quick:
    results["v5e8"] = plans(FLAGS.page_size)
  timing.write_results(FLAGS.out_dir, "paged_engine", results, markdown(results))


if __name__ == "__main__":
  define_flags()
  app.run(main)
