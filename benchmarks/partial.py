"""Partial rollouts against waiting for each batch's longest completion: a step's sampling time.

  python -m benchmarks.partial            # tiny model and SmolLM2-135M, ~10 min
  python -m benchmarks.partial --quick    # tiny model, small sizes, seconds

Every step samples one batch of R = P x G rows of the rollout benchmark's long-tailed workload
(random prompts whose completions are cut at log-normal lengths, sigma 1.2, median N / 10:
`benchmarks.rollout.long_tail_lengths`), a new batch with new lengths each step, on S decode
slots, in two ways:

  whole    each batch decoded to its end in its own step (`continuous.sample`, the slots halving
           as the rows run out): the step waits for the batch's longest completion
  partial  the batches of k + 1 steps in flight (`sampling.inflight`), as the training loop keeps
           them with rl.max_staleness = k and rl.decode_budget (`train.rollout.pipeline`): each step
           queues the batch k steps ahead, decodes until the batch due now has stopped (wait
           admission; usually done already), then while every slot has a row (the budget, N
           iterations, never binds): a long row goes on over the next steps beside newer rows
  fixed    as `whole` on fixed slots (no halving): the step waits for its longest completion
           with every slot

Measured over the steps after the pipeline filled (the same batches in every way): the mean
step's seconds (all of them over the steps: a partial step's time varies with what it finishes),
tokens per second, slot utilisation (tokens / slot-steps computed), decode loop iterations per
step (what a step's time is proportional to where an iteration costs the same whatever its
occupied slots, as on accelerators, whose decode reads every weight each iteration), and the
tokens' staleness in steps (the step that takes a batch out, less the step that drew each of its
tokens). `speedup` = whole / partial mean step seconds (and over `fixed`). Writes
benchmarks/results/partial_rollouts.{json,md} (`--out_dir`).
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
from rl_curriculum.sampling import inflight
from rl_curriculum.train.learn import examples

FLAGS = flags.FLAGS

GROUP = rollout.GROUP


def batch(policy, j: int, prompts: int, tp: int, n: int):
  """Step j's batch: (prompts i32[R, Tp], lengths i32[R]), drawn with seed j."""
  tokens = np.repeat(examples.random_prompts(prompts, tp, policy.config.vocab_size, seed=j),
                     GROUP, axis=0)
  return tokens, rollout.long_tail_lengths(len(tokens), n, seed=j)


def _stop(policy):
  return (policy.config.vocab_size,)  # an id no model emits: the lengths alone end rows


def whole(policy, batches, slots: int, shrink: int, n: int) -> list[dict]:
  """Each batch decoded to its end in its own step; per step: seconds, tokens, slot-steps,
  iterations."""
  steps = []
  for j, (tokens, lengths) in enumerate(batches):
    t0 = time.perf_counter()
    state = continuous.start(policy.graphdef, policy.params, jnp.asarray(tokens),
                             jnp.ones(tokens.shape, bool), jax.random.PRNGKey(j),
                             jnp.float32(1.0), None, jnp.asarray(lengths), max_new_tokens=n,
                             slots=slots, stop_ids=_stop(policy), group=GROUP)
    state = jax.block_until_ready(continuous.run(
        policy.graphdef, policy.params, state, jnp.float32(1.0), stop_ids=_stop(policy),
        group=GROUP, shrink=shrink))
    steps.append({"seconds": time.perf_counter() - t0, "tokens": int(state.drawn),
                  "fed": int(state.fed), "slot_steps": int(state.slot_steps),
                  "iterations": int(state.iterations),
                  "staleness": [0.0, 0.0]})
  return steps


def partial(policy, batches, slots: int, k: int, budget: int, n: int) -> list[dict]:
  """The batches in flight, k ahead, `budget` iterations a step; per step (from the first step
  that takes a batch out): seconds, tokens, slot-steps, iterations, staleness (mean, max)."""
  w, rows, tp = k + 1, batches[0][0].shape[0], batches[0][0].shape[1]
  engine = inflight.init(policy.graphdef, policy.params, jax.random.PRNGKey(0), rows=rows,
                         generations=w, prompt_len=tp, slots=slots, max_new_tokens=n,
                         group=GROUP)
  run = lambda state, version, budget_arg, due, fed=False: continuous.run(
      policy.graphdef, policy.params, state, jnp.float32(1.0), jnp.int32(version), budget_arg,
      due, stop_ids=_stop(policy), group=GROUP, fed=fed)
  steps = []
  for t in range(len(batches)):
    t0 = time.perf_counter()
    before = (int(engine.drawn), int(engine.slot_steps), int(engine.iterations),
              int(engine.fed))
    tokens, lengths = batches[t]  # queued k steps before the step that takes it out
    engine = inflight.admit(policy.graphdef, policy.params, engine, jnp.asarray(tokens),
                            jnp.ones(tokens.shape, bool), jax.random.PRNGKey(t),
                            jnp.int32(t % w), jnp.float32(1.0), jnp.int32(t), None,
                            jnp.asarray(lengths), max_new_tokens=n, stop_ids=_stop(policy),
                            group=GROUP)
    due = t - k
    if due >= 0:
      engine = run(engine, t, None, jnp.int32(due % w))
      rows_out = jax.device_get(inflight.harvest(engine, jnp.int32(due % w)))
    # Then while every slot has a row, at most `budget` iterations (the pipeline's decode).
    engine = jax.block_until_ready(run(engine, t, jnp.int32(budget), None, fed=True))
    seconds = time.perf_counter() - t0
    if due < 0:
      continue
    counted = rows_out.mask > 0
    stale = t - rows_out.versions[counted]
    after = (int(engine.drawn), int(engine.slot_steps), int(engine.iterations),
             int(engine.fed))
    steps.append({"seconds": seconds, "tokens": after[0] - before[0], "fed": after[3] - before[3],
                  "slot_steps": after[1] - before[1], "iterations": after[2] - before[2],
                  "staleness": [float(stale.mean()), float(stale.max())]})
  return steps


def summarise(steps: list[dict]) -> dict:
  seconds = sum(s["seconds"] for s in steps)
  tokens = sum(s["tokens"] for s in steps)
  return {"step_s": seconds / len(steps), "steps": len(steps), "tokens_per_s": tokens / seconds,
          "slot_utilisation": (sum(s["fed"] for s in steps)
                               / max(sum(s["slot_steps"] for s in steps), 1)),
          "iterations_per_step": float(np.mean([s["iterations"] for s in steps])),
          "staleness_mean": float(np.mean([s["staleness"][0] for s in steps])),
          "staleness_max": float(max(s["staleness"][1] for s in steps))}


def run_model(name: str, quick: bool, slots: int, shrink: int, ks, steps: int) -> dict:
  policy = rollout.load(name)
  if quick:
    prompts, tp, n = 4, 16, 32
  elif name == "tiny":
    prompts, tp, n = 16, 32, 128
  else:
    prompts, tp, n = 8, 32, 96
  all_batches = [batch(policy, j, prompts, tp, n) for j in range(steps + 2 * max(ks) + 1)]
  lengths = np.concatenate([b[1] for b in all_batches])
  rows = prompts * GROUP
  out = {"rows": rows, "slots": slots, "prompt_len": tp, "max_new_tokens": n,
         "lengths": {"median": float(np.median(lengths)), "p90": float(np.percentile(lengths, 90)),
                     "mean": float(lengths.mean()), "max": int(lengths.max())},
         "budget": n}
  timing.log(f"{name}: {rows} rows a step, {slots} slots")
  measured_batches = all_batches[max(ks):max(ks) + steps]
  for mode, halvings in (("whole", shrink), ("fixed", 0)):
    whole(policy, all_batches[:1], slots, halvings, n)  # compile
    out[mode] = summarise(whole(policy, measured_batches, slots, halvings, n))
  for k in ks:
    partial(policy, all_batches[:k + 2], slots, k, n, n)  # compile
    # The batches the whole runs measured, taken out after k steps of filling, while the k
    # after them are queued as a run would queue them.
    measured = partial(policy, all_batches[max(ks):max(ks) + steps + k], slots, k, n, n)
    out[f"partial_k{k}"] = summarise(measured)
    for mode in ("whole", "fixed"):
      out[f"partial_k{k}"][f"speedup_over_{mode}"] = (out[mode]["step_s"]
                                                      / out[f"partial_k{k}"]["step_s"])
    timing.log(f"{name}: k = {k}: {out[f'partial_k{k}']['speedup_over_whole']:.2f}x")
  return out


def markdown(results: dict) -> str:
  lines = ["# Partial rollouts: a step's sampling time on the long-tailed workload", "",
           f"{results['environment'].get('cpu_model', 'this machine')}; written by "
           "`python -m benchmarks.partial`. Each step samples one batch; `whole` "
           "decodes it to its end (slots halving), `fixed` the same on fixed slots, `partial_k` "
           "keeps k + 1 steps' batches in flight and decodes until the next step's batch has "
           "stopped. Step s: mean over the steps. Staleness in steps (the step that takes a "
           "batch out, less the step that drew the token).", "",
           "| model | rows x slots | lengths median / p90 / max | mode | step s | tokens/s | "
           "slot utilisation | iterations a step | staleness mean / max | speedup over "
           "whole / fixed |",
           "|---|---|---|---|---|---|---|---|---|---|"]
  for model, r in results["models"].items():
    lengths = r["lengths"]
    shape = f"{r['rows']} x {r['slots']}"
    spread = f"{lengths['median']:.0f} / {lengths['p90']:.0f} / {lengths['max']}"
    for mode in [m for m in r if m in ("whole", "fixed") or m.startswith("partial")]:
      e = r[mode]
      speed = (f"{e['speedup_over_whole']:.2f}x / {e['speedup_over_fixed']:.2f}x"
               if "speedup_over_whole" in e else "")
      lines.append(f"| {model} | {shape} | {spread} | {mode} | {e['step_s']:.3f} | "
                   f"{e['tokens_per_s']:.0f} | {e['slot_utilisation']:.3f} | "
                   f"{e['iterations_per_step']:.0f} | {e['staleness_mean']:.2f} / "
                   f"{e['staleness_max']:.0f} | {speed} |")
  return "\n".join(lines) + "\n"


def define_flags() -> None:
  """The command's flags; defined when it runs, so that importing this module defines none."""
  flags.DEFINE_bool("quick", False, "tiny model only, small sizes (a smoke test)")
  flags.DEFINE_string("out_dir", "benchmarks/results", "where the results go")
  flags.DEFINE_integer("slots", 64, "decode slots")
  flags.DEFINE_integer("shrink", 3, "halvings of the slots as the rows run out (whole batches)")
  flags.DEFINE_list("staleness", ["1", "2", "4"], "k: steps the batches are queued ahead")
  flags.DEFINE_list("models", ["tiny", "smollm2"], "models to run (tiny, smollm2)")
  flags.DEFINE_integer("steps", 12, "steps measured per mode")


def main(argv):
  del argv
  models = ("tiny",) if FLAGS.quick else tuple(FLAGS.models)
  slots = 8 if FLAGS.quick else FLAGS.slots
  steps = 3 if FLAGS.quick else FLAGS.steps
  ks = [int(k) for k in FLAGS.staleness]
  results = {"environment": peak.environment(), "quick": FLAGS.quick, "group": GROUP,
             "models": {name: run_model(name, FLAGS.quick, slots, FLAGS.shrink, ks, steps)
                        for name in models}}
  timing.write_results(FLAGS.out_dir, "partial_rollouts", results, markdown(results))


if __name__ == "__main__":
  define_flags()
  app.run(main)
