"""Speed benchmark: our sampler and learn step against transformers, TRL and Tunix on one CPU.

  taskset -c 1 python -m benchmarks.speed                    # tiny + SmolLM2-135M, all peers
  python -m benchmarks.speed --quick --peers= --out_dir=/tmp/bench  # tiny model, no peers

Run from the repository root. Writes benchmarks/results/speed_cpu.json (every number) and
speed_cpu.md (a table and the targets). Models: the tiny preset (ModelConfig.tiny(vocab_size=64),
seed-0 init) and SmolLM2-135M-Instruct (load_pretrained("smollm2-135m-instruct"), float32). Every
implementation loads the same weights: each model is written once as an HF folder
(save_pretrained) under --weights_dir, and the peers read that folder.

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
  learn                the learn program as the trainer builds it (programs.build; RLOO, one epoch, one
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
  curriculum           SEC select and update (each jitted) at K = 6, P = 32, G = 8 (scratch config)
                       and K = 64, P = 256, G = 16, as a fraction of an RL step.
  end_to_end           train_and_evaluate on the scratch config (no SFT warm start, few
                       steps): median time/sample_s, time/score_s, time/learn_s of metrics.jsonl.
  tunix                benchmarks/peers/tunix_peer.py in .venv-tunix (its own venv), as a
                       subprocess; skipped with the reason when it is missing or fails.

Ratios are ours / theirs (higher is better) under keys ending in _vs_transformers, _vs_trl,
_vs_tunix. The run records os.sched_getaffinity(0) and the thread counts: a run pinned to one
core (taskset -c 1) is a one-core measurement.
"""

import os
import sys

from absl import app
from absl import flags
from absl import logging

from benchmarks.speed import suite
from benchmarks.speed import timing

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


def settings_from_flags() -> suite.Settings:
  """The flags' settings; --quick replaces the sizes with a smoke test's."""
  quick = _QUICK.value
  return suite.Settings(
      quick=quick,
      repeats=1 if quick else _REPEATS.value,
      batches=[1, 4] if quick else [int(b) for b in _BATCHES.value],
      prompt_len=16 if quick else _PROMPT_LEN.value,
      new_tokens=8 if quick else _NEW_TOKENS.value,
      learn_prompts=2 if quick else _LEARN_PROMPTS.value,
      learn_group=2 if quick else _LEARN_GROUP.value,
      models=["tiny"] if quick else list(_MODELS.value),
      peers=[x for x in _PEERS.value if x],
      e2e_steps=(3 if quick else _E2E_STEPS.value) if _E2E_STEPS.value else 0,
      weights_dir=_WEIGHTS_DIR.value, out_dir=_OUT_DIR.value, name=_NAME.value,
      tunix_python=_TUNIX_PYTHON.value, tunix_peer=_TUNIX_PEER.value,
      tunix_timeout=_TUNIX_TIMEOUT.value)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  logging.set_verbosity(logging.WARNING)  # checkpoint chatter of the end-to-end run
  settings = settings_from_flags()
  suite.run(" ".join(["python", "-m", "benchmarks.speed", *sys.argv[1:]]), settings)
  timing.log(f"wrote {os.path.join(settings.out_dir, settings.name)}.json and .md")


if __name__ == "__main__":
  app.run(main)
