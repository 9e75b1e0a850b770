"""The learn program: a scored batch in, new train and curriculum states out, one jit.

  rl_step    `learn` in phases (feedback, view, objective, updates, rollback, metrics) and
             `make_learn`, which jits it
  view       the trained rows and the constant forward passes (phase 2)
  objective  the loss of a minibatch and the optimizer steps (phases 3-4)
  forward    forward passes over completions: chunked head, row blocks, features
  rl_types   Batch, LearnConfig, GroupScores, TrainView
  relora     LoRA adapters merged into the base and restarted
  examples   example batches of given shapes (benchmarks, tests)

Nothing here imports from the run's rollout, setup, durability or reporting rooms.
"""
