"""The continuous engine on a paged KV cache against the dense one and the static sampler.

  python -m benchmarks.paged              # SmolLM2-135M at 64 and 256 slots, then v5e-8 plans
  python -m benchmarks.paged --quick      # tiny model, small sizes, no plans: seconds
  python -m benchmarks.paged --noplans    # the CPU comparison alone

On CPU, for each slot count S, SmolLM2-135M-Instruct rolls out the same long-tailed rows
(`benchmarks.rollout.long_tail`: completions cut at log-normal lengths, median N / 10) with

  static        the static sampler at the dense engine's cache memory
                (`rollout.static_rows_per_call`)
  dense         the continuous engine, S slots of N completion slots each (`prefix_cache`)
  paged         the continuous engine on pages of `--page_size` tokens, S slots, a pool of the
                dense engine's completion memory (S ceil(N / page_size) pages)
  paged_2x      the same pool shared by 2 S slots: twice the slots in the same memory; rows that
                find no page restart (`sampling.pages`), which costs slot-steps, not tokens

and reports tokens kept per second (prefill included), slot utilisation, slot-steps, the
decode/prefill per-token ratio (slot-steps per decode second over prompt tokens per prefill
second), and how the paged engine's rows agree with the dense engine's (the same rows and keys):
the share of rows with equal tokens, and the largest log-prob gap before a row's first
different token (float rounding: the two read the prompt and completion in different orders;
where the gap meets a draw at the edge between two tokens, the rows part there).

Then, unless --quick, the planner compiles the SEC paper setting's rollout programs
(configs/sec_paper_countdown_qwen3b.py) for a v5e-8 slice by XLA:TPU (`plans`): the most slots the
dense engine holds in a chip's 15.75 GiB, and the paged engine (JAX's ragged paged attention
kernel) at twice as many on a pool of the same tokens; per plan the programs' peak memory per
chip and the decode iteration's bytes accessed over the bytes it must read (weights and the KV
cache; the kernel's own reads counted from its shapes, `plan.kernels`).
Writes benchmarks/results/paged_engine.json and .md (`--out_dir`).
"""

from absl import app
from absl import flags
import jax
import numpy as np

from benchmarks import rollout
from benchmarks.speed import peak
from benchmarks.speed import timing

FLAGS = flags.FLAGS


def agreement(rows, dense) -> dict:
  """How an engine's rows (tokens, log-probs, mask) agree with the dense engine's: the share of
  rows with equal tokens, and the largest log-prob gap on the tokens before each row's first
  different one (float rounding; where it meets a draw at the edge of two tokens, the rows part)."""
  tokens, logprobs, mask = rows
  same = (tokens == dense[0]).all(axis=1)
  first = np.where(same, tokens.shape[1], np.argmax(tokens != dense[0], axis=1))
  before = (np.arange(tokens.shape[1])[None, :] < first[:, None]) & (mask > 0) & (dense[2] > 0)
  gap = np.abs(np.where(before, logprobs - dense[1], 0.0)).max()
  return {"rows_equal_dense": float(same.mean()), "logprob_gap_before_parting": float(gap)}


def compare(policy, w, slots: int, page_size: int, repeats: int) -> dict:
  """The four engines of the module docstring on the workload's rows."""
  active = np.ones(len(w.tokens), bool)
  prompts, tp, n = len(w.tokens) // rollout.GROUP, w.tokens.shape[1], w.max_new_tokens
  key = jax.random.PRNGKey(0)
  pool = slots * -(-n // page_size)  # the dense engine's S x N completion slots, in pages
  # Twice the slots on that pool, or on the fewest pages that many slots may have (tiny sizes).
  pool_2x = max(pool, -(-n // page_size) + 2 * slots)
  rows = {"dense": [], "paged": [], "paged_2x": []}  # each call's rows, the last one kept
  continuous = rollout._continuous  # pylint: disable=protected-access
  engine = lambda s, name, **paging: lambda a: continuous(policy, w, s, 0, key, a, rows[name],
                                                          **paging)
  engines = {
      "static": lambda a: rollout._static(  # pylint: disable=protected-access
          policy, w, rollout.static_rows_per_call(prompts, tp, n, slots), key, a),
      "dense": engine(slots, "dense"),
      "paged": engine(slots, "paged", page_size=page_size, kv_pages=pool),
      "paged_2x": engine(2 * slots, "paged_2x", page_size=page_size, kv_pages=pool_2x),
  }
  out = {}
  for name, run in engines.items():
    timing.log(f"  {name}")
    out[name] = rollout.measure(run, active, repeats)
  for name in ("paged", "paged_2x"):
    out[name].update(agreement(rows[name][-1], rows["dense"][-1]))
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
  completion memory at them (S ceil(N / page_size) pages), and on a pool of 0.4 N tokens a slot
  (twice the mean completion of the long-tailed rows: median N / 10, sigma 1.2)."""
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
  # Twice the slots on the dense engine's pool at 512 slots; twice its most on the pool of its
  # most (N / 2 a slot), and on 0.4 N a slot (twice the mean length of the long-tailed rows).
  for key, slots, pages_a_slot in (("paged_1024", 1024, -(-n // page_size) // 2),
                                   ("paged_twice_most", 2 * most, -(-n // page_size) // 2),
                                   ("paged_twice_most_0.4n", 2 * most,
                                    -(-int(0.4 * n) // page_size))):
    out[key] = run("paged", slots, page_size=page_size, kv_pages=slots * pages_a_slot)
  out["dense_most_slots"] = most
  return out


def markdown(results: dict) -> str:
  lines = ["# Paged KV cache: the continuous engine on pages against the dense engine", "",
           f"{results['environment'].get('cpu_model', 'this machine')}; {results['model']}, "
           f"pages of {results['page_size']} tokens. Written by `python -m benchmarks.paged`.", "",
           "| slots | engine | tokens/s | slot utilisation | slot-steps | decode/prefill | "
           "rows = dense | log-prob gap |", "|---|---|---|---|---|---|---|---|"]
  for slots, r in results["cpu"].items():
    for engine in ("static", "dense", "paged", "paged_2x"):
      e = r[engine]
      same = f"{e['rows_equal_dense']:.3f}" if "rows_equal_dense" in e else ""
      gap = (f"{e['logprob_gap_before_parting']:.1e}" if "logprob_gap_before_parting" in e
             else "")
      count = 2 * int(slots) if engine == "paged_2x" else int(slots)
      lines.append(f"| {count} | {engine} | {e['tokens_per_s']:.1f} | "
                   f"{e['slot_utilisation']:.3f} | {e['slot_steps']} | "
                   f"{e['decode_over_prefill']:.2f} | {same} | {gap} |")
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
  flags.DEFINE_bool("plans", True, "also plan the paper setting's rollout programs on a v5e-8")


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
  if FLAGS.plans and not FLAGS.quick:
    results["v5e8"] = plans(FLAGS.page_size)
  timing.write_results(FLAGS.out_dir, "paged_engine", results, markdown(results))


if __name__ == "__main__":
  define_flags()
  app.run(main)
