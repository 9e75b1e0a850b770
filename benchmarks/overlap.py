"""Sampling and learning overlapped on two processes, against the synchronous loop, on 2 cores.

  python -m benchmarks.overlap            # tiny model, then SmolLM2-135M with LoRA
  python -m benchmarks.overlap --quick    # toy sizes, a smoke test (minutes)

Two ways to train the same config for the same steps (equal rollouts), from one warm start:

  sync     the training loop (`train_and_evaluate`, rl.max_staleness = 0) in one process whose
           programs use both cores: each step samples, scores, then learns
  overlap  two processes under `jax.distributed` on CPU, one core each: a learner (process 0)
           and a sampler (process 1), one device each. Each step the learner selects the batch of
           the next step and sends its prompts and the current weights (LoRA: the adapters; the
           sampler loads the frozen base itself) to the sampler, then learns from this step's
           batch while the sampler decodes and scores the next one and sends it back
           (`jax.device_put` between the processes' devices, cross-host transfers on): k = 1,
           each batch sampled by the weights one update older than those that learn from it,
           the schedule `rl.max_staleness = 1` runs in one process

Measured: each way's median step seconds over the steps after the first two (compiling) and
held-out greedy accuracy after the last step, evaluated in this process from each way's final
weights on the same problems (the difference paired per problem: `train.report.paired`). Two cores
shared by both phases leave little idle time to reclaim: the synchronous loop already runs each
phase on both cores, and splitting them one core each halves each phase's speed, so what the
overlap can buy here is the host work (decoding, scoring, Python) and the phases' imperfect
scaling to two cores. Writes benchmarks/results/overlap.{json,md} (`--out_dir`).
"""

import json
import os
import socket
import statistics
import subprocess
import sys
import time

from absl import app
from absl import flags
from absl import logging
import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.speed import peak
from benchmarks.speed import timing

FLAGS = flags.FLAGS

LEARNER, SAMPLER = 0, 1  # process ids
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def model_config(name: str, steps: int):
  """The config of one benchmark model: "toy", "tiny" (configs/scratch.py, 16 prompts x 8) or
  "smollm2" (configs/quickstart.py: LoRA, 8 x 4), `steps` RL steps, the continuous engine,
  evaluated and saved after the last step only."""
  from configs import quickstart, scratch, toy  # pylint: disable=import-outside-toplevel
  c = {"toy": toy, "tiny": scratch, "smollm2": quickstart}[name].get_config()
  if name == "tiny":
    c.rl.prompts_per_step = 16
  c.rl.steps = steps
  c.rl.engine = "continuous"
  c.eval.every = steps
  c.checkpoint.every = steps
  return c


def _mesh(device):
  from rl_curriculum.parallel import mesh as mesh_lib  # pylint: disable=import-outside-toplevel
  return mesh_lib.make_mesh((1, 1, 1), [device])


def send(tree, like, src, dst):
  """`tree` (arrays laid out as `src` on the processes holding its devices; None elsewhere) laid
  out as `dst`, between processes: every process calls it with the same `like` (shapes and
  dtypes) and shardings, and the processes holding `dst`'s devices get the arrays."""
  leaves, treedef = jax.tree.flatten(like)
  values = [None] * len(leaves) if tree is None else jax.tree.leaves(tree)
  srcs, dsts = jax.tree.leaves(src), jax.tree.leaves(dst)
  out = []
  for value, shape, s, d in zip(values, leaves, srcs, dsts, strict=True):
    if value is None:  # a process without the source: an array of no local shard
      value = jax.make_array_from_single_device_arrays(shape.shape, s, [], dtype=shape.dtype)
    out.append(jax.device_put(value, d))
  return jax.tree.unflatten(treedef, out)


def _shapes(tree):
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree)


def worker(name: str, steps: int, workdir: str, role: int, port: int) -> None:
  """One process of the overlapped run (module docstring); the learner writes the final
  trainable weights and its step times to workdir/overlap_result.npz."""
  # pylint: disable=import-outside-toplevel
  from rl_curriculum.parallel import distributed
  from rl_curriculum.train import programs as programs_lib
  from rl_curriculum.train.rollout import budget
  from rl_curriculum.train.rollout import batches
  from rl_curriculum.train.rollout import episode_steps, episodes
  from rl_curriculum.train.setup import features, prepare
  jax.config.update("jax_cross_host_transfer_socket_address", f"127.0.0.1:{port + 1 + role}")
  distributed.initialize(f"127.0.0.1:{port}", 2, role)
  config = model_config(name, steps)
  learner_dev, sampler_dev = jax.devices()
  meshes = _mesh(learner_dev), _mesh(sampler_dev)
  mine = meshes[role]
  run = prepare.prepare(config, workdir, log=lambda _: None, mesh=mine)
  pool = features.curriculum_pool(config, run)
  programs = programs_lib.build(config, run.model, meshes[LEARNER], pool, prepare.token_ids(run),
                                meshes[SAMPLER])
  root, g = prepare.rl_root_key(config), budget.group_slots(config)
  s = config.rl.prompts_per_step
  rows, n = s * g, config.rl.max_new_tokens
  rep = [programs_lib.mesh_lib.replicated(m) for m in meshes]
  row_shardings = [programs_lib.mesh_lib.batch_sharding(m, 2) for m in meshes]
  layout = batches.row_layout(config, meshes[LEARNER])
  lora = run.model.frozen is not None
  trainable_shardings = (programs.train_shardings.params,
                         programs.rollout_shardings[0] if lora else programs.rollout_shardings)
  request_like = (jax.ShapeDtypeStruct((s,), jnp.int32), jax.ShapeDtypeStruct((s, g), bool),
                  _shapes(run.model.trainable))
  request_src = (rep[LEARNER], rep[LEARNER], trainable_shardings[0])
  request_dst = (rep[SAMPLER], rep[SAMPLER], trainable_shardings[1])
  reply_like = tuple(jax.ShapeDtypeStruct(shape, dtype) for shape, dtype in (
      ((rows, n), jnp.int32), ((rows, n), jnp.float32), ((rows, n), jnp.float32),
      ((s, g), jnp.float32), ((s, g), bool), ((), jnp.float32)))
  reply_src = tuple([row_shardings[SAMPLER]] * 3 + [rep[SAMPLER]] * 3)
  reply_dst = tuple([row_shardings[LEARNER]] * 3 + [rep[LEARNER]] * 3)
  state = base = None
  if role == LEARNER:
    state = programs_lib.place(programs, programs_lib.init_run_state(
        config, programs, run.model, pool, jax.random.fold_in(root, 0)))
  elif lora:
    base = jax.device_put(run.model.frozen, programs.rollout_shardings[1])

  def request(batch_step):
    """Learner: the selection of batch `batch_step` and the weights that sample it."""
    nonlocal state
    if role != LEARNER:
      return None
    k_select = prepare.step_keys(root, batch_step)[0]
    selection, curriculum = programs.select(state.curriculum, k_select)
    state = state._replace(curriculum=curriculum)
    valid = budget.slot_mask(config, selection, state.prompts)
    # A copy of the weights goes out: the transfer to the other process reads its source after
    # device_put returns, and the next learn step donates the weights it would be reading.
    weights = jax.tree.map(jnp.copy, state.train.params)
    return (selection.prompt_ids, jax.device_put(valid, rep[LEARNER]), weights)

  def sample(batch_step, received):
    """Sampler: the batch's completions, scored."""
    if role != SAMPLER:
      return None
    prompt_ids, valid, trainable = received
    t0 = time.perf_counter()
    prompt_rows = np.repeat(np.asarray(prompt_ids), g)
    valid = np.asarray(valid)
    params = (trainable, base) if lora else trainable
    generation = programs_lib.sample(
        programs, params, jax.device_put(run.pool.tokens[prompt_rows], row_shardings[SAMPLER]),
        jax.device_put(run.pool.mask[prompt_rows], row_shardings[SAMPLER]),
        prepare.step_keys(root, batch_step)[1], config.rl.temperature,
        jax.device_put(valid.reshape(-1), programs_lib.mesh_lib.batch_sharding(meshes[SAMPLER],
                                                                               1)))
    rollout = generation.rollout
    sampled = valid.reshape(-1)
    _, played, _ = episodes.step_turns(  # one-turn episodes, each scored by its task
        episodes.finished_rows(rollout.tokens, rollout.mask), 0, read_only=True,
        problems=[run.pool.problems[i] if v else None for i, v in zip(prompt_rows, sampled)],
        task=run.task, seeds=list(range(len(prompt_rows))), tokenizer=run.tokenizer,
        framing=run.framing, limits=episode_steps.limits(config, 1),
        rows_of=lambda rows, _: rows)
    reward, correct = played.rewards, played.correct
    seconds = np.float32(time.perf_counter() - t0)
    return (rollout.tokens, rollout.logprobs, rollout.mask,
            *(jax.device_put(x, rep[SAMPLER]) for x in (reward.reshape(s, g),
                                                         correct.reshape(s, g), seconds)))

  def learn(step, selection, reply, version):
    """Learner: one update on batch `step`; returns its metrics (on the device)."""
    nonlocal state
    prompt_ids, valid, _ = selection
    tokens, logprobs, mask, reward, correct, _ = reply
    prompt_ids = np.asarray(prompt_ids)
    _, _, k_learn, k_filter = prepare.step_keys(root, step)
    scored = batches.Scored(prompt_ids=prompt_ids, arms=np.asarray(pool.arms)[prompt_ids],
                             valid=np.asarray(valid), rewards=np.asarray(reward),
                             correct=np.asarray(correct))
    batch = batches.build_batch(config, run, layout, scored, (tokens, logprobs, mask), k_filter,
                                 state.prompts, jnp.full(tokens.shape, version, jnp.int32))
    state = state._replace(prompts=budget.observe(state.prompts, batch, step))
    train, curriculum, metrics = programs.learn(
        *programs_lib.learn_inputs(programs, state, batch, k_learn, None))
    state = state._replace(train=train, curriculum=curriculum)
    return metrics

  # Batch 1, sampled before the first update; then each step learns batch t while batch t + 1
  # is sampled by the weights before that update.
  selections = {1: request(1)}
  ours = sample(1, send(selections[1], request_like, request_src, request_dst))
  reply = send(ours, reply_like, reply_src, reply_dst)
  times, sample_s = [], []
  for step in range(1, steps + 1):
    t0 = time.perf_counter()
    received = None
    if step < steps:
      selections[step + 1] = request(step + 1)
      received = send(selections[step + 1], request_like, request_src, request_dst)
    metrics = learn(step, selections.pop(step), reply, max(step - 2, 0)) if role == LEARNER \
        else None
    # `ours` (what this process sent) stays referenced for a step, as the weights' copy does.
    ours = sample(step + 1, received) if step < steps else None
    nxt = send(ours, reply_like, reply_src, reply_dst) if step < steps else None
    if role == LEARNER:
      jax.block_until_ready(metrics)
      times.append(time.perf_counter() - t0)
      sample_s.append(float(np.asarray(reply[5])))
    reply = nxt
  if role == LEARNER:
    leaves = [np.asarray(x) for x in jax.tree.leaves(state.train.params)]
    np.savez(os.path.join(workdir, "overlap_result.npz"), step_s=np.asarray(times),
             sample_s=np.asarray(sample_s), **{f"leaf_{i}": x for i, x in enumerate(leaves)})
  distributed.sync("overlap done")


def sync_worker(name: str, steps: int, workdir: str) -> None:
  """The synchronous loop on the same config (its step times are in metrics.jsonl)."""
  from rl_curriculum.train import loop  # pylint: disable=import-outside-toplevel
  loop.train_and_evaluate(model_config(name, steps), workdir)


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _command(*args) -> list:
  return [sys.executable, "-m", "benchmarks.overlap", *args]


def _env(devices: int = 1) -> dict:
  env = {k: v for k, v in os.environ.items()
         if k not in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID")}
  flags_ = env.get("XLA_FLAGS", "")
  env["XLA_FLAGS"] = f"{flags_} --xla_force_host_platform_device_count={devices}".strip()
  env["JAX_PLATFORMS"] = "cpu"
  return env


def _check(procs, what: str) -> None:
  for proc in procs:
    proc.wait()
  failed = [p for p in procs if p.returncode]
  if failed:
    raise RuntimeError(f"{what} failed (exit {failed[0].returncode}); see its log")


def run_sync(name: str, steps: int, folder: str) -> dict:
  """Runs the synchronous loop in a fresh process (both cores); its step times."""
  from rl_curriculum.train.report.metrics import read_jsonl  # pylint: disable=import-outside-toplevel
  folder = os.path.abspath(folder)
  with open(os.path.join(folder, "benchmark.log"), "w") as log:
    _check([subprocess.Popen(_command("--worker=sync", f"--model={name}", f"--steps={steps}",
                                      f"--workdir={folder}"), stdout=log, cwd=ROOT,
                             stderr=subprocess.STDOUT, env=_env())], "the synchronous run")
  rows = [r for r in read_jsonl(os.path.join(folder, "metrics.jsonl")) if r["step"] >= 1]
  return {"step_s": [r["time/step_s"] for r in rows],
          "sample_s": [r["time/sample_s"] + r["time/score_s"] for r in rows],
          "learn_s": [r["time/learn_s"] for r in rows]}


def run_overlap(name: str, steps: int, folder: str) -> dict:
  """Runs the two processes, one core each, in `folder` (which holds the warm start); the
  learner's step times and the sampler's (its final weights: `final_policy`)."""
  port, folder = _free_port(), os.path.abspath(folder)
  logs = [open(os.path.join(folder, f"benchmark_{role}.log"), "w") for role in (0, 1)]
  procs = [subprocess.Popen(["taskset", "-c", str(role)] + _command(
      f"--worker={role}", f"--model={name}", f"--steps={steps}", f"--workdir={folder}",
      f"--port={port}"), stdout=logs[role], stderr=subprocess.STDOUT, env=_env(), cwd=ROOT)
           for role in (LEARNER, SAMPLER)]
  try:
    _check(procs, "the overlapped run")
  finally:
    for log in logs:
      log.close()
  with np.load(os.path.join(folder, "overlap_result.npz")) as f:
    return {"step_s": f["step_s"].tolist(), "sample_s": f["sample_s"].tolist()}


def final_policy(config, run, folder: str, overlapped: bool):
  """The run's final weights as the forward passes take them."""
  # pylint: disable=import-outside-toplevel
  from rl_curriculum.train import loop
  from rl_curriculum.train.learn import forward
  if not overlapped:
    return loop.restore_params(config, run, folder)[1]
  with np.load(os.path.join(folder, "overlap_result.npz")) as f:
    leaves = [jnp.asarray(f[f"leaf_{i}"]) for i in range(len(jax.tree.leaves(
        run.model.trainable)))]
  trainable = jax.tree.unflatten(jax.tree.structure(run.model.trainable), leaves)
  return forward.model_params(trainable, run.model.frozen)


def _steady(seconds: list) -> float:
  """Median step seconds after the first two steps (which compile)."""
  return statistics.median(seconds[2:] if len(seconds) > 3 else seconds)


def run_model(name: str, steps: int, root: str) -> dict:
  """Both ways for one model: step times, held-out accuracy and its paired difference."""
  # pylint: disable=import-outside-toplevel
  from rl_curriculum.train.report import paired, summary
  from rl_curriculum.train.setup import prepare, warm_start
  config = model_config(name, steps)
  base = os.path.join(root, name, "base")
  timing.log(f"{name}: warm start in {base}")
  run = prepare.prepare(config, base, log=lambda _: None)
  out = {"steps": steps, "rollouts": steps * config.rl.prompts_per_step * config.rl.group_size}
  outcomes = {}
  for way in ("sync", "overlap"):
    folder = warm_start.link_caches(base, os.path.join(root, name, way))
    timing.log(f"{name}: {way}")
    times = (run_sync if way == "sync" else run_overlap)(name, steps, folder)
    record = os.path.join(folder, "heldout_final.npz")
    accuracy = summary.evaluate(config, run, final_policy(config, run, folder, way == "overlap"),
                                record=record)
    outcomes[way] = summary.read_outcomes(record)
    out[way] = {"step_s": _steady(times["step_s"]), "steps_per_s": 1 / _steady(times["step_s"]),
                "sample_s": _steady(times["sample_s"]), "times": times,
                "heldout": float(np.mean([accuracy[b] for b in outcomes[way]]))}
    if "learn_s" in times:
      out[way]["learn_s"] = _steady(times["learn_s"])
  names = sorted(outcomes["sync"])
  cat = lambda way: np.concatenate([outcomes[way][b][0] for b in names])
  bins = np.concatenate([np.full(len(outcomes["sync"][b][0]), i) for i, b in enumerate(names)])
  out["heldout_difference"] = paired.paired_difference(cat("overlap"), cat("sync"), bins)
  out["speedup"] = out["sync"]["step_s"] / out["overlap"]["step_s"]
  timing.log(f"{name}: {out['speedup']:.2f}x")
  return out


# The pod-scale estimate's assumptions (`pod_estimate`): a TPU v5e chip's peak bfloat16 rate and
# HBM bandwidth and size (Google's published figures); the share of peak a tuned learn step
# reaches (maxtext-class model FLOPs utilisation) and a decode iteration reaches (batched, 64
# rows a chip), each a guess; the completions' mean length, a guess for Countdown traces.
POD_CHIP = dict(tflops=197.0, hbm_gbps=819.0, hbm_gib=16.0)
POD_CASES = ({"learn_mfu": 0.4, "decode_mfu": 0.25, "mean_new_tokens": 512},
             {"learn_mfu": 0.4, "decode_mfu": 0.1, "mean_new_tokens": 1024})


def pod_estimate(plan: dict, chips: int, slots: int, *, learn_mfu: float, decode_mfu: float,
                 mean_new_tokens: int) -> dict:
  """Step seconds of the planned config on `chips` chips (`POD_CHIP`), sampling then learning on
  all of them against the two at once on a split, from the planner's report `plan` (its model,
  workload, the learn step's peak memory and the continuous engine's cache on its devices):

    learn      passes x N x (R L + P Tp) FLOPs, passes = 6 (forward and backward) + 2 (each
               block recomputed, remat) + 2 (the old policy's forward, more than one minibatch)
    sample     R L / S decode iterations (the slots kept busy), each max(2 N S FLOPs at
               decode_mfu, the bfloat16 weights and half the cache read from HBM), plus the
               prompts' prefill
    split      the learner gets the fewest chips its memory fits (the planner's peak scaled by
               devices / chips: every array is sharded over FSDP), the sampler the rest

  N parameters, R rows, P prompts, Tp prompt tokens, L the completions' mean length, S slots.
  An estimate, not a measurement: the assumptions are the arguments and `POD_CHIP`."""
  n, w, devices = plan["model"]["params"], plan["workload"], plan["devices"]
  peak = POD_CHIP["tflops"] * 1e12
  passes = 6 + (2 if plan["model"]["remat"] != "none" else 0) + (2 if w["minibatches"] > 1
                                                                   else 0)
  tokens = w["rows"] * mean_new_tokens + w["prompts"] * w["prompt_len"]
  learn = lambda c: passes * n * tokens / (c * peak * learn_mfu)
  cache = plan["sampler_engines"]["continuous"]["cache_gib"] * 2 ** 30 * devices
  per_iteration = lambda c: max(2 * n * slots / (c * peak * decode_mfu),
                                (2 * n + cache / 2) / (c * POD_CHIP["hbm_gbps"] * 1e9))
  prefill = lambda c: 2 * n * w["prompts"] * w["prompt_len"] / (c * peak * learn_mfu)
  sample = lambda c: w["rows"] * mean_new_tokens / slots * per_iteration(c) + prefill(c)
  need = plan["programs"]["learn"]["peak_gib"] * devices / POD_CHIP["hbm_gib"]
  learner = max(1, -(-int(need * 1000) // 1000))
  sync = sample(chips) + learn(chips)
  split = max(sample(chips - learner), learn(learner)) if learner < chips else None
  return {"chips": chips, "learner_chips": learner, "sample_s": sample(chips),
          "learn_s": learn(chips), "sync_s": sync, "split_s": split,
          "split_sample_s": sample(chips - learner) if split else None,
          "split_learn_s": learn(learner) if split else None,
          "speedup": sync / split if split else None,
          "assumptions": {"learn_mfu": learn_mfu, "decode_mfu": decode_mfu,
                          "mean_new_tokens": mean_new_tokens, "slots": slots, **POD_CHIP}}


def markdown(results: dict) -> str:
  lines = ["# Sampling and learning overlapped on two processes, against the synchronous loop",
           "", f"{results['environment'].get('cpu_model', 'this machine')}, 2 cores; written by "
           "`python -m benchmarks.overlap`. `sync`: one process, both cores, sample "
           "then learn; `overlap`: a learner and a sampler process, one core each, the next "
           "batch sampled while this one is learned from (k = 1). Step seconds: medians after "
           "the two compiling steps. Held-out: greedy accuracy (%) over every evaluated bin "
           "after the last step; the difference paired per problem.", "",
           "| model | rollouts | way | step s | steps/s | sampling s | learn s | held-out % |",
           "|---|---|---|---|---|---|---|---|"]
  for model, r in results["models"].items():
    for way in ("sync", "overlap"):
      e = r[way]
      learn = f"{e['learn_s']:.3f}" if "learn_s" in e else "(overlapped)"
      lines.append(f"| {model} | {r['rollouts']:,} | {way} | {e['step_s']:.3f} | "
                   f"{e['steps_per_s']:.2f} | {e['sample_s']:.3f} | {learn} | "
                   f"{100 * e['heldout']:.1f} |")
  lines += ["", "| model | overlap / sync steps per second | held-out overlap - sync, points "
            "[95%] |", "|---|---|---|"]
  for model, r in results["models"].items():
    d = r["heldout_difference"]
    lines.append(f"| {model} | {r['speedup']:.2f}x | {100 * d['mean']:+.1f} "
                 f"[{100 * d['lo']:+.1f}, {100 * d['hi']:+.1f}] |")
  if results.get("pod"):
    lines += ["", f"Pod-scale estimate (`pod_estimate`, not measured) from the planner's report "
              f"`{results['pod_plan']}`: step seconds on TPU v5e chips ({POD_CHIP['tflops']:.0f} "
              f"TFLOP/s bfloat16, {POD_CHIP['hbm_gbps']:.0f} GB/s, {POD_CHIP['hbm_gib']:.0f} GiB), "
              "sampling then learning on every chip against the two at once on a split whose "
              "learner has the chips its memory needs.", "",
              "| chips | learn MFU | decode share of peak | mean completion | sample s | learn s | "
              "sync s | split (learner chips) | split s | split / sync speed |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for e in results["pod"]:
      a = e["assumptions"]
      lines.append(f"| {e['chips']} | {a['learn_mfu']} | {a['decode_mfu']} | "
                   f"{a['mean_new_tokens']} | {e['sample_s']:.1f} | {e['learn_s']:.1f} | "
                   f"{e['sync_s']:.1f} | {e['learner_chips']} | {e['split_s']:.1f} | "
                   f"{e['speedup']:.2f}x |")
  return "\n".join(lines) + "\n"


def define_flags() -> None:
  """The command's flags; defined when it runs, so that importing this module defines none."""
  flags.DEFINE_bool("quick", False, "the toy config, a few steps (a smoke test)")
  flags.DEFINE_list("models", ["tiny", "smollm2"], "models to run (tiny, smollm2)")
  flags.DEFINE_integer("steps", 30, "RL steps of each run")
  flags.DEFINE_string("workdir", "workdirs/overlap", "where the runs' folders go")
  flags.DEFINE_string("out_dir", "benchmarks/results", "where the results go")
  flags.DEFINE_string("plan", "benchmarks/results/plan_sec_paper_qwen2_5_3b_8dev_continuous.json",
                      "a planner report (python -m experiments.plan) for the pod-scale estimate")
  flags.DEFINE_integer("pod_chips", 16, "chips of the pod-scale estimate")
  flags.DEFINE_integer("pod_slots", 512, "decode slots of the planned config")
  flags.DEFINE_string("worker", "", "internal: run one process of a run (sync, 0 or 1)")
  flags.DEFINE_string("model", "", "internal: the worker's model")
  flags.DEFINE_integer("port", 0, "internal: the coordinator's port")


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  if FLAGS.worker == "sync":
    return sync_worker(FLAGS.model, FLAGS.steps, FLAGS.workdir)
  if FLAGS.worker:
    return worker(FLAGS.model, FLAGS.steps, FLAGS.workdir, int(FLAGS.worker), FLAGS.port)
  models = ["toy"] if FLAGS.quick else FLAGS.models
  steps = 4 if FLAGS.quick else FLAGS.steps
  results = {"environment": peak.environment(), "quick": FLAGS.quick,
             "models": {name: run_model(name, steps, FLAGS.workdir) for name in models}}
  with open(FLAGS.plan) as f:
    plan = json.load(f)
  results["pod_plan"] = FLAGS.plan
  results["pod"] = [pod_estimate(plan, FLAGS.pod_chips, FLAGS.pod_slots, **case)
                    for case in POD_CASES]
  timing.write_results(FLAGS.out_dir, "overlap", results, markdown(results))


if __name__ == "__main__":
  define_flags()
  app.run(main)
