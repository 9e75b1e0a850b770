"""Evaluate a run's newest checkpoint (or its starting policy) per difficulty bin.

  python -m experiments.evaluate --config configs/quickstart.py --workdir workdirs/quickstart
  python -m experiments.evaluate --config configs/quickstart.py --workdir /tmp/base --k 4

Prints greedy accuracy and pass@k (k of `--samples` sampled completions at the config's RL
temperature) for every evaluation bin of the config, and writes them to WORKDIR/eval.json. A
workdir without RL checkpoints evaluates the starting policy: the pretrained checkpoint, or the
SFT warm start (trained and cached there on first use). Greedy accuracy is the share of held-out
episodes solved, played as the training run plays them (a single-turn completion is an episode of
one turn); pass@k, a measure of one-turn episodes, is not computed (nan) for episodes of several
turns (environments, docs/environments.md).
"""

import json
import os

from absl import app
from absl import flags
from absl import logging
import jax
from ml_collections import config_flags

from experiments import cli
from rl_curriculum.train import loop
from rl_curriculum.train.report import evaluation, summary
from rl_curriculum.train.rollout import episode_steps
from rl_curriculum.train.setup import prepare

FLAGS = flags.FLAGS


def define_flags() -> None:
  """The command's flags; defined when it runs, so that importing this module defines none."""
  config_flags.DEFINE_config_file("config", None, "Experiment config file.",
                                  lock_config=True)
  flags.DEFINE_string("workdir", None, "Run folder (checkpoints are read from it).")
  flags.DEFINE_integer("k", 4, "k of pass@k.")
  flags.DEFINE_integer("samples", 8, "Sampled completions per prompt for pass@k.")
  flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  logging.set_verbosity(logging.WARNING)
  config, workdir = FLAGS.config, FLAGS.workdir
  if FLAGS.k > FLAGS.samples:
    raise app.UsageError(f"--k={FLAGS.k} needs --samples >= k")
  run = prepare.prepare(config, workdir)
  step, params = loop.restore_params(config, run, workdir)
  tok = run.tokenizer
  kwargs = dict(batch_size=config.eval.batch_size, max_new_tokens=config.rl.max_new_tokens,
                eos_id=tok.eos_id, pad_id=tok.pad_id, stop_ids=run.stop_ids)
  key = jax.random.PRNGKey(config.seed + 7)
  greedy = summary.evaluate(config, run, params)
  if episode_steps.turn_width(config, run.task) > 1:  # pass@k is of one-turn episodes
    passk = {name: float("nan") for name in run.eval_sets}
  else:
    passk = {name: evaluation.sampled_pass_at_k(
        run.model.graphdef, params, pool, run.task, tok.decode, k=FLAGS.k,
        samples=FLAGS.samples, temperature=config.rl.temperature,
        key=jax.random.fold_in(key, i), **kwargs)
             for i, (name, pool) in enumerate(run.eval_sets.items())}
  print(f"\ncheckpoint step {step} ({'RL' if step else 'starting policy'})")
  print(f"{'bin':<12} {'greedy':>7} {f'pass@{FLAGS.k}':>8}")
  for name in run.eval_sets:
    tag = "  (ood)" if name in run.ood else ""
    print(f"{name:<12} {100 * greedy[name]:7.1f} {100 * passk[name]:8.1f}{tag}")
  result = {"step": step, "greedy": greedy, f"pass@{FLAGS.k}": passk, "ood": run.ood,
            "samples": FLAGS.samples}
  with open(os.path.join(workdir, "eval.json"), "w") as f:
    json.dump(result, f, indent=1)


if __name__ == "__main__":
  define_flags()
  app.run(main, flags_parser=cli.parse_flags)
