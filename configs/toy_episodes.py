"""The toy setting on environments: episodes with tools, for tests and smoke runs (about a minute
on a 2-core CPU).

  python -m experiments.train --config configs/toy_episodes.py --workdir /tmp/toy_episodes

The tiny model of configs/toy.py (a SentencePiece tokenizer and transformer trained here, plain
template) plays the three environments as one mixture whose curriculum arms are (environment,
level) pairs: calculator l0 and l1, countdown_tool n3, guess l0 and l1. Each episode takes up to
three turns of at most 8 tokens, with observations of at most 16 ids, 48 positions in all, on the
continuous engine over a paged cache; the horizon rises from 1 to 3 turns over the 4 steps
(curriculum.horizon = linear). Nothing is learned at this size: it runs every phase of a run on
episodes (SFT on solved episodes, RL on episodes, held-out episodes per level, checkpoints,
report), which is what the end-to-end and resume tests need.
"""

from configs import toy


def get_config():
  c = toy.get_config()
  # The flags of docs/methods.md's environment rows, so that their test steps share this
  # config's warm start.
  c.task.name = "calculator+countdown_tool+guess"
  c.task.train_bins = (0, 1, 3, 6, 7)   # calculator l0 l1, countdown_tool n3, guess l0 l1
  c.task.eval_bins = (0, 6)
  c.tokenizer.vocab_size = 128          # the prompts' instructions hold 69 distinct characters
  c.rl.engine = "continuous"
  c.rl.page_size = 4
  c.rl.max_new_tokens = 48
  c.rl.turn_tokens = 8
  c.rl.observation_tokens = 16
  c.rl.max_turns = 3
  c.curriculum.horizon = "linear"
  return c
