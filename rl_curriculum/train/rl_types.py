"""The learn step's inputs, static configuration and intermediate views (`rl_step`).

  Batch         a scored rollout of S prompts x G completions, P groups of which are trained on
  TrainState    what the optimizer owns (saved in every checkpoint)
  LearnConfig   static hyperparameters (part of the jit cache key); `check_config` rejects bad ones
  GroupScores   phase 1's rewards, advantages and curriculum feedback of every sampled group
  TrainView     phase 2's trained rows: tokens, masks, per-token advantages, constant log-probs
"""

import dataclasses
from typing import Any, NamedTuple, Optional

import jax

from rl_curriculum.rl import advantages as adv_lib
from rl_curriculum.rl import stability
from rl_curriculum.types import Feedback

ADVANTAGES = {
    "rloo": adv_lib.rloo,
    "grpo": adv_lib.grpo,
    "dr_grpo": adv_lib.dr_grpo,
    "reinforce_pp": adv_lib.reinforce_pp,
    "counterfactual": adv_lib.counterfactual,  # A = r - b[p]: needs `Batch.baseline`
}
CURRICULUM_FEEDBACK = ("correct", "reward")
GRPO_STDS = ("population", "sample")
# Dr. GRPO divides every completion's token sum by one constant, not by its length: Liu et al.
# (2025), "Understanding R1-Zero-Like Training: A Critical Perspective", arXiv:2503.20783.
DR_GRPO_AGGREGATION = "seq_mean_token_sum_norm"
# KL estimators that may serve as a loss term: k1's gradient has zero mean (see `check_config`).
KL_LOSS_ESTIMATORS = ("k2", "k3")
# What the step does with completions cut at the length cap (`rl_step.overlong_penalty`,
# `rl_step.train_view`).
OVERLONG = ("none", "exclude", "penalty")


class TrainState(NamedTuple):
  """Everything the optimizer owns; saved in every checkpoint."""
  step: jax.Array                        # i32[] RL updates attempted
  params: Any                            # trainable parameters (full model or LoRA adapters)
  opt_state: Any                         # optax state of `params` (of (params, value) with PPO)
  whitening: stability.WhiteningState    # running reward statistics
  skipped: jax.Array                     # i32[] updates discarded by the stability checks
  value: Any = None                      # PPO value head {"w": f32[D], "b": f32[]}, else None
  temperature: Any = None                # f32[] the next rollout's sampling temperature
                                         # (`init_train_state` sets rl.temperature; it moves
                                         # only under the adaptive controller), or None


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
                                         # (`rl_step.truncated_completions`); None: unknown


@dataclasses.dataclass(frozen=True)
class LearnConfig:
  """Static hyperparameters of `learn` (hashable: part of the jit cache key).

  No field has a default: `builders.learn_config` fills every one from `config.rl` and
  `config.curriculum`, the one place the defaults live (configs/quickstart.py documents each).
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
  kl_estimator: str           # k2 | k3 as a loss (k1 is rejected, see `check_config`)
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


def check_config(config: LearnConfig) -> None:
  """Raises ValueError for a LearnConfig `learn` cannot run (called at trace time)."""
  if config.algorithm not in tuple(ADVANTAGES) + ("ppo",):
    raise ValueError(f"unknown RL algorithm {config.algorithm!r}; choose from "
                     f"{sorted(ADVANTAGES) + ['ppo']}")
  if config.curriculum_feedback not in CURRICULUM_FEEDBACK:
    raise ValueError(f"curriculum_feedback must be one of {CURRICULUM_FEEDBACK}, got "
                     f"{config.curriculum_feedback!r}")
  if config.kl_coef != 0 and config.kl_estimator not in KL_LOSS_ESTIMATORS:
    raise ValueError(
        f"kl_estimator {config.kl_estimator!r} cannot be a loss term: the gradient of "
        "k1 = logp - logp_ref on tokens sampled from the policy is grad logp, whose expectation "
        f"is 0; use one of {KL_LOSS_ESTIMATORS} (see losses.kl_divergence)")
  if config.temperature <= 0:
    raise ValueError(f"temperature must be > 0, got {config.temperature}")
  if config.minibatches < 1 or config.microbatches < 1:
    raise ValueError(f"minibatches ({config.minibatches}) and microbatches "
                     f"({config.microbatches}) must be >= 1")
  if config.logits_chunk < 0:
    raise ValueError(f"logits_chunk must be >= 0 (0: no chunking), got {config.logits_chunk}")
  if config.algorithm == "dr_grpo" and config.aggregation != DR_GRPO_AGGREGATION:
    raise ValueError(f"dr_grpo needs aggregation {DR_GRPO_AGGREGATION!r} (no per-completion "
                     f"length normalisation), got {config.aggregation!r}")
  if config.dual_clip != 0 and not config.dual_clip > 1:
    raise ValueError(f"dual_clip must be 0 (off) or > 1, got {config.dual_clip}")
  for name in ("entropy_coef", "tis_cap", "kl_reward_coef"):
    if getattr(config, name) < 0:
      raise ValueError(f"{name} must be >= 0 (0: off), got {getattr(config, name)}")
  if config.capo_positive_steps < 0 or config.capo_ramp_steps < 0:
    raise ValueError(f"capo_positive_steps ({config.capo_positive_steps}) and capo_ramp_steps "
                     f"({config.capo_ramp_steps}) must be >= 0")
  if config.grpo_std not in GRPO_STDS:
    raise ValueError(f"grpo_std must be one of {GRPO_STDS}, got {config.grpo_std!r}")
  if config.overlong not in OVERLONG:
    raise ValueError(f"overlong must be one of {OVERLONG}, got {config.overlong!r}")
  if config.overlong == "penalty" and config.overlong_cache < 1:
    raise ValueError(f"overlong='penalty' needs overlong_cache >= 1 tokens, got "
                     f"{config.overlong_cache}")
  if config.temperature_target < 0:
    raise ValueError(f"temperature_target must be >= 0 (0: off), got {config.temperature_target}")
  if adaptive_temperature(config):
    if not config.temperature_rate > 0:
      raise ValueError(f"temperature_rate must be > 0, got {config.temperature_rate}")
    if not 0 < config.temperature_min <= config.temperature <= config.temperature_max:
      raise ValueError(f"need 0 < temperature_min <= temperature <= temperature_max, got "
                       f"{config.temperature_min}, {config.temperature}, "
                       f"{config.temperature_max}")


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
