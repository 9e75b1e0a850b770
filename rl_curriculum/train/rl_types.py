"""The learn step's inputs, static configuration and intermediate views (`rl_step`).

  Batch         a scored rollout of S prompts x G completions, P groups of which are trained on
  LearnConfig   static hyperparameters (part of the jit cache key; `validation.validate` checks the
                config they come from)
  GroupScores   phase 1's rewards, advantages and curriculum feedback of every sampled group
  TrainView     phase 2's trained rows: tokens, masks, per-token advantages, constant log-probs
"""

import dataclasses
from typing import NamedTuple, Optional

import jax

from rl_curriculum.rl import advantages as adv_lib
from rl_curriculum.rl import stability
from rl_curriculum.types import Feedback

# What `rl.algorithm` may name: a group estimator (`advantages.ESTIMATORS`), or PPO with a critic.
ALGORITHMS = tuple(sorted(adv_lib.ESTIMATORS)) + ("ppo",)
CURRICULUM_FEEDBACK = ("correct", "reward")
# Dr. GRPO divides every completion's token sum by one constant, not by its length: Liu et al.
# (2025), "Understanding R1-Zero-Like Training: A Critical Perspective", arXiv:2503.20783.
DR_GRPO_AGGREGATION = "seq_mean_token_sum_norm"
# KL estimators that may serve as a loss term: the gradient of k1 = logp - logp_ref on tokens
# sampled from the policy is grad logp, whose expectation is 0 (see losses.kl_divergence).
KL_LOSS_ESTIMATORS = ("k2", "k3")
# What the step does with completions cut at the length cap (`rewards.overlong_penalty`,
# `view.train_view`).
OVERLONG = ("none", "exclude", "penalty")
# Where the old (proximal) policy's log-probs come from (`view.train_view`).
PROXIMAL = ("recompute", "loglinear")


class Batch(NamedTuple):
  """A scored rollout of S sampled prompts x G completions (rows R = S * G), of which P groups
  (S = P without a post-rollout filter) are trained on. The G rows of a group repeat its prompt
  (the learn step runs each group's prompt once, from the group's first row)."""
  prompt_tokens: jax.Array     # i32[R, Tp] left-padded prompts
  prompt_mask: jax.Array       # bool[R, Tp] True on real prompt tokens
  tokens: jax.Array            # i32[R, T] completion tokens
  mask: jax.Array              # f32[R, T] 1 on completion tokens that count
  sampler_logprobs: jax.Array  # f32[R, T] log-probs the sampler reported
  prompt_ids: jax.Array        # i32[S] pool indices
  arms: jax.Array              # i32[S] curriculum arms
  rewards: jax.Array           # f32[S, G] shaped rewards
  correct: jax.Array           # bool[S, G] raw correctness
  valid: jax.Array             # bool[S, G] completions sampled (`budget.slot_mask`: all True
                               # unless allocated or skipped before rollout)
  train_groups: jax.Array      # i32[P] groups (indices into S) the policy trains on
  train_valid: jax.Array       # bool[P] False on padding slots a filter could not fill
  baseline: Optional[jax.Array] = None  # f32[S] per-prompt baseline of the counterfactual
                                        # estimator (else None)
  truncated: Optional[jax.Array] = None  # bool[S, G] cut at T tokens without a stop token
                                         # (`rewards.truncated_completions`); None: unknown
  versions: Optional[jax.Array] = None  # i32[R, T] policy version (the train state's update
                                        # counter) that sampled each token; None: the version
                                        # the learn step starts from (synchronous)


@dataclasses.dataclass(frozen=True)
class LearnConfig:
  """Static hyperparameters of `learn` (hashable: part of the jit cache key).

  No field has a default: `builders.learn_config` fills every one from `config.rl` and
  `config.curriculum`, the one place the defaults live (configs/scratch.py documents each).
  """
  algorithm: str              # rloo | grpo | dr_grpo | reinforce_pp | counterfactual | ppo
  epochs: int                 # passes over the batch
  minibatches: int            # optimizer steps per pass (whole groups each)
  microbatches: int           # gradient accumulation: forward/backward passes per optimizer step
  logits_chunk: int           # completion positions per chunk of the output head (0: all at once)
  eps_low: float              # PPO clip below 1
  eps_high: float             # PPO clip above 1 (Clip-Higher)
  level: str                  # token (PPO) | sequence (GSPO)
  aggregation: str            # losses.AGGREGATIONS, for the policy loss and the KL term
  max_tokens: int             # constant normaliser of seq_mean_token_sum_norm (tokens)
  temperature: float          # sampling temperature; log-probs are those of logits / temperature
                              # (the controller's start, with temperature_target > 0)
  kl_coef: float              # weight of the KL-to-reference loss term (0: no reference pass)
  kl_estimator: str           # k2 | k3 as a loss (KL_LOSS_ESTIMATORS)
  ratio_guard: float          # drop tokens with |logp_old - logp_sampler| above this (0: off)
  max_kl: Optional[float]     # roll back an update whose KL(pi_old || pi_new) exceeds this
  whiten_rewards: bool        # running mean/std reward whitening before the advantages
  curriculum_feedback: str    # correct | reward: what the curriculum's advantages come from
  gamma: float                # PPO: discount per token
  lam: float                  # PPO: GAE lambda
  vf_coef: float              # PPO: value-loss weight
  vf_clip: float              # PPO: value clipping range
  value_detach: bool          # PPO: the value loss trains the head only, not the policy trunk
  dual_clip: float            # dual-clip PPO bound c > 1 on negative-advantage tokens (0: off)
  entropy_coef: float         # weight of the entropy bonus subtracted from the loss (0: off)
  tis_cap: float              # truncated importance weights vs the sampler, capped here (0: off)
  proximal: str               # recompute | loglinear: the old (proximal) policy's log-probs from a
                              # forward pass, or interpolated by version (no forward pass)
  capo_positive_steps: int    # CAPO: updates that learn from positive advantages only
  capo_ramp_steps: int        # CAPO: updates that then phase the negative ones in (both 0: off)
  grpo_std: str               # grpo: population | sample standard deviation of the group
  kl_reward_coef: float       # weight of the k1 KL-to-reference penalty in the reward (0: off)
  high_variance_only: bool    # VCRL: train only on the groups its update marks high_variance
  overlong: str               # none | exclude (truncated completions leave the loss) | penalty
  overlong_cache: int         # penalty: lengths in the last this many tokens up to T lose
                              # up to 1 reward (DAPO's L_cache)
  temperature_target: float   # adaptive temperature: entropy per token to hold (nats; 0: off)
  temperature_rate: float     # adaptive temperature: gain of the controller (1/nats)
  temperature_min: float      # adaptive temperature: lowest temperature
  temperature_max: float      # adaptive temperature: highest temperature


def adaptive_temperature(config: LearnConfig) -> bool:
  """True when the sampling temperature follows the entropy controller (`temperature_target` >
  0): the rollouts and the learn step then read it from `TrainState.temperature`."""
  return config.temperature_target > 0


class GroupScores(NamedTuple):
  """Phase 1's output: what every sampled group's rewards mean for training and the curriculum."""
  whitening: stability.WhiteningState  # running reward statistics after this batch
  rewards: jax.Array                   # f32[S, G] rewards the policy trains on (with the overlong
                                       # penalty, whitened if either is on)
  advantages: jax.Array                # f32[S, G] the estimator's advantages of `rewards`
  feedback: Feedback                   # what `Curriculum.update` reads (every sampled group)


class TrainView(NamedTuple):
  """The P trained groups as B = P * G rows: everything the policy objective reads.

  Optional fields are None when the configuration does not need them (a None leaf is an empty
  pytree, so `jax.tree.map(lambda x: x[rows], view)` takes a minibatch of every present field).
  """
  prompt_tokens: jax.Array     # i32[B, Tp] left-padded prompts
  prompt_mask: jax.Array       # bool[B, Tp]
  tokens: jax.Array            # i32[B, T] completion tokens
  mask: jax.Array              # f32[B, T] completion tokens that count; 0 on padding groups
  advantages: jax.Array        # f32[B, T] per-token advantages (0 where mask is 0)
  sampler_logprobs: jax.Array  # f32[B, T] the sampler's log-probs of the tokens
  logp_old: Optional[jax.Array] = None    # f32[B, T] old policy; None: on-policy (one step)
  logp_ref: Optional[jax.Array] = None    # f32[B, T] reference policy; None: no KL term
  values_old: Optional[jax.Array] = None  # f32[B, T] PPO: value head at sampling time
  returns: Optional[jax.Array] = None     # f32[B, T] PPO: GAE lambda-returns (value targets)
  staleness: Optional[jax.Array] = None   # f32[B, T] proximal="loglinear": policy versions
                                          # between each token's sampler and the update's start
