"""Phase 1 of the learn step (`rl_step`): every sampled group's rewards, advantages and the
curriculum's feedback.

  scores = score_groups(batch, whitening, config)   # rewards -> (penalty) -> (whitening) -> A
"""

import functools

import jax
import jax.numpy as jnp

from rl_curriculum.rl import advantages as adv_lib
from rl_curriculum.rl import credit
from rl_curriculum.rl import rewards as rewards_lib
from rl_curriculum.rl import stability
from rl_curriculum.train.learn.rl_types import Batch, GroupScores, LearnConfig
from rl_curriculum.train.learn.view import estimator_of
from rl_curriculum.types import Feedback

__all__ = ["batch_overlong_penalty", "score_groups"]


def batch_overlong_penalty(batch: Batch, config: LearnConfig) -> jax.Array:
  """f32[S, G] `rewards.overlong_penalty` of every sampled row (L_max = T, the rows' width in
  positions; L_cache = `config.overlong_cache`), 0 on invalid slots. A row's length is in the
  cap's unit: the positions it used (`credit.used_positions`: a completion's tokens; an episode's
  turns and the observations between them).

  Raises:
    ValueError (at trace time): overlong_cache outside [1, T).
  """
  s, g = batch.rewards.shape
  t = batch.mask.shape[1]
  cache = config.overlong_cache
  if not isinstance(cache, jax.core.Tracer) and not (cache is not None and 1 <= cache < t):
    raise ValueError(f"overlong_cache must lie in [1, {t}) (the completions' length cap), got "
                     f"{cache}")
  lengths = credit.used_positions(batch.mask).reshape(s, g)
  return jnp.where(batch.valid.astype(bool),
                   rewards_lib.overlong_penalty(lengths, t, config.overlong_cache), 0.0)


def score_groups(batch: Batch, whitening: stability.WhiteningState,
                 config: LearnConfig) -> GroupScores:
  """Phase 1: rewards -> (overlong penalty) -> (whitening) -> group advantages, and the
  curriculum's feedback.

  The curriculum's `Feedback.advantages` are the estimator's advantages of the raw correctness
  (`curriculum_feedback="correct"`) or of the trained rewards ("reward"). With a format bonus the
  two differ: an all-wrong group whose completions differ only in format has nonzero reward
  advantages (under GRPO exactly as large as a group with one right answer) but zero correctness
  advantages, so a curriculum fed rewards chases formatting. `Feedback.rewards` are always the
  shaped rewards, `Feedback.correct` the raw correctness.

  With `overlong="penalty"` DAPO's soft overlong punishment (`batch_overlong_penalty`) joins the
  rewards the policy trains on, before whitening and the advantages; `Feedback.rewards` remain
  the task's.

  With `credit="turn"` the scores also hold each turn's advantage (`credit.turn_advantages` of
  `Batch.turn_rewards`, the last turn carrying the shaping: `credit.shaped_turn_rewards`); the
  curriculum's feedback stays that of whole episodes.

  Raises:
    ValueError (at trace time): credit="turn" with a batch without `turn_rewards`.
  """
  valid = batch.valid.astype(bool)
  rewards = batch.rewards
  if config.overlong == "penalty":
    rewards = rewards + batch_overlong_penalty(batch, config)
  if config.whiten_rewards:
    whitening = stability.whitening_update(whitening, rewards, valid)
    rewards = stability.whiten(whitening, rewards)
  estimator = functools.partial(adv_lib.group_advantages, estimator=estimator_of(config),
                                grpo_std=config.grpo_std, baseline=batch.baseline)
  advantages = estimator(rewards, valid)
  if config.curriculum_feedback == "correct":
    cur_advantages = estimator(batch.correct.astype(jnp.float32), valid)
  else:
    cur_advantages = advantages
  feedback = Feedback(prompt_ids=batch.prompt_ids, arms=batch.arms, rewards=batch.rewards,
                      correct=batch.correct, advantages=cur_advantages, valid=valid)
  turn_advantages = None
  if config.credit == "turn":
    if batch.turn_rewards is None:
      raise ValueError("credit='turn' needs Batch.turn_rewards (each turn's reward), got None")
    turns = credit.turn_count(batch.mask).reshape(rewards.shape)
    turn_advantages = credit.turn_advantages(
        credit.shaped_turn_rewards(batch.turn_rewards, turns, rewards), turns, valid,
        estimator_of(config), discount=config.turn_discount, grpo_std=config.grpo_std,
        baseline=batch.baseline)
  return GroupScores(whitening=whitening, rewards=rewards, advantages=advantages,
                     feedback=feedback, turn_advantages=turn_advantages)
