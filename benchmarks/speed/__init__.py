"""Speed benchmark: our sampler and learn step against transformers, TRL and Tunix on one CPU.

Run it as `python -m benchmarks.speed` from the repository root (`__main__.py` documents the
flags and what is measured). Modules:

  timing  medians of timed calls, token rates, progress lines
  peak    the machine: environment, float32 matmul peak, releasing memory between stages
  ours    this project's sampler, learn step, RL step, curriculum overhead and end-to-end run
  peers   transformers' generate, TRL's GRPOTrainer and the Tunix peer (its own venv)
  report  ratios, targets, the markdown summary and the result files
  suite   the whole run, stage by stage
"""
