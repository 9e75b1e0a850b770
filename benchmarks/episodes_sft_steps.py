"""How many SFT steps on solved episodes SmolLM2-135M-Instruct needs to use its calculator.

  python -m benchmarks.episodes_sft_steps                   # lr 2e-5, held-out after 2, 4, 6, 8
  python -m benchmarks.episodes_sft_steps 2e-5 2,4,6,8

configs/episodes_smollm2.py's data and warm start (its SFT problems' solved episodes, batches of
8, the whole model fine-tuned at a constant learning rate, so that step k of this run is the warm
start of a config with sft.steps = k and no warm-up), evaluated after 0 steps and after each
step named: greedy held-out success and tool-call rate on calculator l0, l1 and guess l0, l1 (32
problems each), as the run evaluates them. Prints one line per evaluation; the record of the run
that chose the config's 4 steps is benchmarks/results/episodes_smollm2/sft_steps.log.
"""

import sys
import time

import numpy as np

from configs import episodes_smollm2
from rl_curriculum.model import pretrained
from rl_curriculum.train.report import evaluation, summary
from rl_curriculum.train.rollout import episodes
from rl_curriculum.train.setup import builders, data, prepare, sft, validation

BINS = ("calculator/l0", "calculator/l1", "guess/l0", "guess/l1")


class _Run:
  """The parts of a prepared run that `summary.held_out_options` reads."""

  def __init__(self, framing, tokenizer, task):
    self.framing, self.tokenizer, self.task = framing, tokenizer, task
    self.stop_ids = tuple(tokenizer.stop_ids)


def main(argv):
  lr = float(argv[1]) if len(argv) > 1 else 2e-5
  steps = [int(x) for x in argv[2].split(",")] if len(argv) > 2 else [2, 4, 6, 8]
  config = episodes_smollm2.get_config()
  task = validation.checked_task(config)
  policy = pretrained.load_pretrained(config.model.source, **builders.model_numerics(config))
  tok = policy.tokenizer
  framing = prepare._framing(config, task, tok)  # pylint: disable=protected-access
  arms = data.arms_of(task, tuple(config.task.train_bins), config.curriculum.arms)
  pools = data.make_pools(prepare._splits(config, task), task, tok,  # pylint: disable=protected-access
                          tuple(config.task.train_bins), template=config.task.template,
                          bin_arms=arms.of_bin, framing=framing,
                          observation_tokens=config.rl.observation_tokens)
  options = summary.held_out_options(config, _Run(framing, tok, task))
  sets = {name: pools.eval_sets[name] for name in BINS}

  def report(step, params):
    t0 = time.time()
    held = evaluation.held_out(policy.graphdef, params, sets, task, tok, **options)
    acc = {k: float(v[0].mean()) for k, v in held.outcomes.items()}
    calls = {k: episodes.episode_stats(p, np.ones(len(p.turns), bool))["episode/tool_call_rate"]
             for k, p in held.played.items()}
    print(f"step {step}: acc {acc} tool-call rate {calls} ({time.time() - t0:.0f}s)", flush=True)

  report(0, policy.params)
  targets, mask = pools.sft_targets
  params, curve = sft.run_sft(
      policy.params, policy.graphdef, pools.sft, targets, mask, steps=max(steps),
      batch_size=config.sft.batch_size, optimizer=builders.build_optimizer(lr, max_grad_norm=1.0),
      seed=config.seed, log=print, log_every=1, save_every=1,
      save=lambda step, params, *_: report(step, params) if step in steps else None)
  report(max(steps), params)
  print("curve", [round(c, 3) for c in curve])


if __name__ == "__main__":
  main(sys.argv)
