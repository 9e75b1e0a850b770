"""The whole benchmark, stage by stage: peak, then per model our sampler, the peers' sampler, our
learn and RL steps, TRL and Tunix; then the end-to-end run and the curriculum overhead."""

import os
from typing import NamedTuple

from benchmarks.speed import ours
from benchmarks.speed import peak
from benchmarks.speed import peers as peers_lib
from benchmarks.speed import report
from benchmarks.speed import timing


class Settings(NamedTuple):
  """What one run measures and where it writes (sizes after --quick's overrides)."""
  quick: bool             # smoke-test sizes; recorded in the results
  repeats: int            # timed calls per measurement (median)
  batches: list           # sampler batch sizes B
  prompt_len: int         # Tp
  new_tokens: int         # N new tokens (no early stop); T of the learn and RL steps
  learn_prompts: int      # P of the learn and RL steps
  learn_group: int        # G of the learn and RL steps
  models: list            # "tiny" and/or "smollm2"
  peers: list             # any of "transformers", "trl", "tunix"
  e2e_steps: int          # RL steps of the end-to-end run (0: skipped)
  weights_dir: str        # HF folders shared by every implementation
  out_dir: str            # where name.json and name.md go
  name: str               # base name of the result files
  tunix_python: str       # python of the Tunix venv
  tunix_peer: str         # the Tunix peer script
  tunix_timeout: int      # seconds before the Tunix peer is killed


def measure_model(name: str, s: Settings, peak_gflops: float) -> dict:
  """Every measurement of one model: ours and the peers'."""
  tp, n, p, g = s.prompt_len, s.new_tokens, s.learn_prompts, s.learn_group
  policy, folder = ours.load_model(name, s.weights_dir)
  c = policy.config
  model = {"folder": folder, "params": c.num_params, "config": {
      "d_model": c.d_model, "layers": c.num_layers, "heads": c.num_heads,
      "kv_heads": c.num_kv_heads, "mlp": c.mlp_dim, "vocab": c.vocab_size}}
  model["sampler"] = {"ours": ours.sampler_ours(policy, s.batches, tp, n, s.repeats)}
  if "transformers" in s.peers:
    model["sampler"]["transformers"] = peers_lib.sampler_transformers(
        folder, c.vocab_size, s.batches, tp, n, s.repeats)
    peak.release_memory()
  model["learn"] = {mode: ours.learn_ours(policy, mode, p, g, tp, n, s.repeats, peak_gflops)
                    for mode in ("full", "lora")}
  model["rl_step"] = ours.rl_step_ours(policy, p, g, tp, n, s.repeats)
  peak.release_memory()
  if "trl" in s.peers:
    if policy.tokenizer is None:
      model["trl"] = {"skipped": "no tokenizer: GRPOTrainer needs text prompts"}
    else:
      try:
        model["trl"] = peers_lib.trl_step(folder, p, g, tp, n)
      except Exception as e:  # pylint: disable=broad-except
        model["trl"] = {"skipped": f"TRL failed: {type(e).__name__}: {e}"[:2000]}
  peak.release_memory()
  if "tunix" in s.peers:
    timing.log("  tunix peer")
    model["tunix"] = peers_lib.tunix_peer(os.path.abspath(folder), s.batches, tp, n, p, g,
                                          s.repeats, s.tunix_python, s.tunix_peer,
                                          s.tunix_timeout)
  return model


def curriculum_rows(results: dict, s: Settings) -> list:
  """SEC overhead at the scratch config's sizes (and K = 64, P = 256, G = 16 unless quick), each as a
  fraction of an RL step measured earlier in the run."""
  sizes = [(6, 32, 8, 12_000)] + ([] if s.quick else [(64, 256, 16, 100_000)])
  rows = []
  for k, cp, cg, pool in sizes:
    row = ours.curriculum_overhead(k, cp, cg, pool, s.repeats)
    ref = None
    if "end_to_end" in results and (k, cp, cg) == (6, 32, 8):
      ref = (f"{results['end_to_end']['config']} RL", results["end_to_end"]["step_s"])
    elif results["models"]:
      last = list(results["models"])[-1]
      ref = (f"{last} P={s.learn_prompts} G={s.learn_group} RL",
             results["models"][last]["rl_step"]["seconds"])
    if ref:
      row["step_ref"], row["step_s"] = ref
      row["fraction_of_step"] = row["total_s"] / ref[1]
    rows.append(row)
  return rows


def run(command: str, s: Settings) -> dict:
  """The whole benchmark; returns the results dict, also written after each model and at the
  end (report.write)."""
  results = {"command": command, "environment": peak.environment(), "quick": s.quick,
             "settings": {"repeats": s.repeats, "batches": s.batches,
                          "prompt_len": s.prompt_len, "new_tokens": s.new_tokens,
                          "learn_prompts": s.learn_prompts, "learn_group": s.learn_group,
                          "sampling": "greedy, no early stop", "peers": s.peers}}
  if "transformers" in s.peers or "trl" in s.peers:
    results["torch_threads"] = peers_lib.torch_threads()
  timing.log("matmul peak")
  results["matmul_peak_gflops"] = peak.matmul_peak(
      [256, 512] if s.quick else [512, 1024, 2048], s.repeats)
  peak_gflops = results["matmul_peak_gflops"]["jax_best"]
  results["models"] = {}
  for name in s.models:
    timing.log(f"model {name}")
    results["models"][name] = measure_model(name, s, peak_gflops)
    report.write(results, s.out_dir, s.name)
  if s.e2e_steps:
    timing.log("end to end")
    results["end_to_end"] = ours.end_to_end(s.e2e_steps, s.quick)
  timing.log("curriculum overhead")
  results["curriculum"] = curriculum_rows(results, s)
  report.finalize(results)
  report.write(results, s.out_dir, s.name)
  return results
