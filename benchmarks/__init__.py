"""Benchmarks: how fast the sampler, the learner and the verifiers run, each from the repository
root as `python -m benchmarks.NAME`. Each writes its JSON (every number) and markdown (a table)
to benchmarks/results/ unless told otherwise (`--out_dir`, `--out`):

  speed           our sampler and learn step against transformers, TRL and Tunix on one CPU (a
                  package; `python -m benchmarks.speed`): speed_cpu.{json,md} (`--name`)
  rollout         both rollout engines on the same rows at equal cache memory:
                  rollout_engine.{json,md}
  partial         partial rollouts against waiting for each batch's longest completion:
                  partial_rollouts.{json,md}
  overlap         sampling and learning on two processes against the synchronous loop:
                  overlap.{json,md}
  compile         compile time per block-stack layout and depth: compile_<preset>.{json,md}
  profile_decode  where a decode step's time goes, against prefill: decode_profile.{json,md}
  scaling         the sharded learn step and sampler on 1 to 8 fake CPU devices:
                  scaling_cpu.json (`--out`)
  verifiers       `Task.score` time per task on fuzzed completions: JSON lines on stdout, no file

Beside them, scripts that are not modules of this package: peers/ (the Tunix peer of `speed`, run
in its own .venv-tunix, and a logits check against transformers) and gpu/ (`bash
benchmarks/gpu/run.sh`: one GPU, gpu_<device>.json). results/ also holds the studies' results
(experiments/studies/).
"""
