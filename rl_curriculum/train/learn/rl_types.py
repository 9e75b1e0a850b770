"""The learn step's inputs, static configuration and intermediate views (`rl_step`).

  Batch         a scored rollout of S prompts x G completions, P groups of which are trained on
  LearnConfig   the learn program's settings from the config: static switches and shapes, traced
                coefficients (`validation.validate` checks the config they come from)
  GroupScores   phase 1's rewards, advantages and curriculum feedback of every sampled group
  TrainView     phase 2's trained rows: tokens, masks, per-token advantages, constant log-probs
"""

import dataclasses
from typing import NamedTuple, Optional

from flax import struct
import jax
import ml_collections

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
  truncated: Optional[jax.Array] = None  # bool[S, G] cut by a limit: the last drawn token is
                                         # no stop id (`rewards.truncated_completions`), or the
                                         # episode ran out of turns or positions; None: unknown
  versions: Optional[jax.Array] = None  # i32[R, T] policy version (the train state's update
                                        # counter) that sampled each token; None: the version
                                        # the learn step starts from (synchronous)
  turn_rewards: Optional[jax.Array] = None  # f32[S, G, H] each turn's reward (an episode's
                                        # `rewards` is their sum; a single-turn completion has
                                        # H = 1); None: all of a row's reward on its last turn


def _static(source: Optional[str] = None):
  """A setting that shapes the compiled program (a string, a count, a flag): static."""
  return struct.field(pytree_node=False, metadata={"kind": "static", "source": source})


def _traced(cast: type = float, source: Optional[str] = None):
  """A numeric coefficient: a leaf, traced by the compiled program."""
  return struct.field(metadata={"kind": "traced", "cast": cast, "source": source})


def _switch(cast: type = float, source: Optional[str] = None):
  """A coefficient that 0 switches off: None when off (an empty subtree, so on and off are two
  programs), else a traced leaf."""
  return struct.field(metadata={"kind": "switch", "cast": cast, "source": source})


@struct.dataclass
class LearnConfig:
  """The learn program's settings, every one read from a run's config (`from_config`).

  A pytree passed to the jitted learn step: the settings that shape the program (the algorithm,
  the batch's split, the aggregation, flags) are static, part of its compile key; the numeric
  coefficients are leaves the program traces, so two configs that differ only in their values
  run one compiled program (a sweep over them, or a resumed run with another value, compiles
  nothing new). A coefficient the config switches off with 0 is None here. Each field reads
  `config.rl.<name>` unless its `source` names another path; `from_config` lists nothing by
  hand. `validation.validate` checks the values; configs/scratch.py documents each.
  """
  # The program's shape and switches (static).
  algorithm: str = _static()            # rloo | grpo | dr_grpo | reinforce_pp | counterfactual
                                        # | ppo
  epochs: int = _static()               # passes over the batch
  minibatches: int = _static()          # optimizer steps per pass (whole groups each)
  microbatches: int = _static()         # gradient accumulation: forward/backward passes per
                                        # optimizer step
  logits_chunk: int = _static()         # completion positions per chunk of the output head
                                        # (0: all at once)
  level: str = _static()                # token (PPO) | sequence (GSPO)
  aggregation: str = _static()          # losses.AGGREGATIONS, for the policy loss and the KL
  max_tokens: int = _static("rl.max_new_tokens")  # constant normaliser of
                                        # seq_mean_token_sum_norm (tokens)
  kl_estimator: str = _static()         # k2 | k3 as a loss (KL_LOSS_ESTIMATORS)
  whiten_rewards: bool = _static()      # running mean/std reward whitening
  curriculum_feedback: str = _static("curriculum.feedback")  # correct | reward: what the
                                        # curriculum's advantages come from
  value_detach: bool = _static()        # PPO: the value loss trains the head only
  proximal: str = _static()             # recompute | loglinear: the old (proximal) policy's
                                        # log-probs from a forward pass, or interpolated by
                                        # version (no forward pass)
  grpo_std: str = _static()             # grpo: population | sample standard deviation
  high_variance_only: bool = _static("curriculum.high_variance_only")  # VCRL: train only on
                                        # the groups its update marks high_variance
  overlong: str = _static()             # none | exclude (truncated completions leave the loss) |
                                        # penalty
  credit: str = _static()               # episode | turn: what an episode's drawn tokens carry
                                        # (`rl.credit`, `credit.CREDITS`)
  rollback: str = _static()             # step | minibatch: what a non-finite update discards
                                        # (`rl_step.learn`)
  # Coefficients (traced).
  learning_rate: float = _traced()      # the optimizer's step size
  eps_low: float = _traced()            # PPO clip below 1
  eps_high: float = _traced()           # PPO clip above 1 (Clip-Higher)
  temperature: float = _traced()        # sampling temperature; log-probs are those of
                                        # logits / temperature (the controller's start, with
                                        # temperature_target on)
  gamma: float = _traced()              # PPO: discount per token
  turn_discount: float = _traced()      # credit = turn: discount per turn of returns to go
  lam: float = _traced()                # PPO: GAE lambda
  vf_coef: float = _traced()            # PPO: value-loss weight
  vf_clip: float = _traced()            # PPO: value clipping range
  temperature_rate: float = _traced()   # adaptive temperature: gain of the controller (1/nats)
  temperature_min: float = _traced()    # adaptive temperature: lowest temperature
  temperature_max: float = _traced()    # adaptive temperature: highest temperature
  # Coefficients that 0 switches off (None: off; traced when on).
  max_grad_norm: Optional[float] = _switch()   # global-norm gradient clipping
  kl_coef: Optional[float] = _switch()         # weight of the KL-to-reference loss term
  ratio_guard: Optional[float] = _switch()     # drop tokens with |logp_old - logp_sampler| above
  max_kl: Optional[float] = _switch()          # roll back an update whose KL(pi_old || pi_new)
                                               # exceeds this
  dual_clip: Optional[float] = _switch()       # dual-clip PPO bound c > 1 on negative-advantage
                                               # tokens
  entropy_coef: Optional[float] = _switch()    # weight of the entropy bonus
  tis_cap: Optional[float] = _switch()         # truncated importance weights vs the sampler
  kl_reward_coef: Optional[float] = _switch()  # weight of the k1 KL penalty in the reward
  capo_positive_steps: Optional[int] = _switch(int)  # CAPO: updates that learn from positive
                                               # advantages only
  capo_ramp_steps: Optional[int] = _switch(int)  # CAPO: updates that then phase the negative
                                               # ones in
  overlong_cache: Optional[int] = _switch(int)  # penalty: lengths in the last this many tokens
                                               # up to T lose up to 1 reward (DAPO's L_cache)
  temperature_target: Optional[float] = _switch()  # adaptive temperature: entropy per token to
                                               # hold (nats)
  # The curriculum's traced options {name: value} (`builders.TRACED_OPTIONS`).
  curriculum: dict = struct.field(default_factory=dict, metadata={"kind": "options"})

  def __post_init__(self):
    # A switch given as a number 0 (`dataclasses.replace(config, kl_coef=0.0)`) is off. Only
    # Python numbers are looked at: inside the program the leaves are traced.
    for f in dataclasses.fields(self):
      value = getattr(self, f.name)
      if (f.metadata["kind"] == "switch" and isinstance(value, (int, float))
          and not isinstance(value, bool) and value == 0):
        object.__setattr__(self, f.name, None)

  @classmethod
  def from_config(cls, config: ml_collections.ConfigDict,
                  curriculum: Optional[dict] = None) -> "LearnConfig":
    """Every field from the run's config: `config.rl.<name>`, or the field's `source` path;
    coefficients as Python numbers of their type (a switch's 0 becomes None in
    `__post_init__`); `curriculum` the curriculum's traced options."""
    values = {"curriculum": dict(curriculum or {})}
    for f in dataclasses.fields(cls):
      if f.metadata["kind"] == "options":
        continue
      section, name = (f.metadata["source"] or f"rl.{f.name}").split(".")
      value = config[section][name]
      values[f.name] = value if f.metadata["kind"] == "static" else f.metadata["cast"](value)
    return cls(**values)

  def coefficients(self) -> dict:
    """{name: value} of the traced coefficients that are on (the program's numeric inputs)."""
    return {**{f.name: getattr(self, f.name) for f in dataclasses.fields(self)
               if f.metadata["kind"] in ("traced", "switch") and getattr(self, f.name) is not None},
            **{f"curriculum.{k}": v for k, v in self.curriculum.items()}}


def adaptive_temperature(config: LearnConfig) -> bool:
  """True when the sampling temperature follows the entropy controller (`temperature_target`
  on): the rollouts and the learn step then read it from `TrainState.temperature`."""
  return config.temperature_target is not None


class GroupScores(NamedTuple):
  """Phase 1's output: what every sampled group's rewards mean for training and the curriculum."""
  whitening: stability.WhiteningState  # running reward statistics after this batch
  rewards: jax.Array                   # f32[S, G] rewards the policy trains on (with the overlong
                                       # penalty, whitened if either is on)
  advantages: jax.Array                # f32[S, G] the estimator's advantages of `rewards`
  feedback: Feedback                   # what `Curriculum.update` reads (every sampled group)
  turn_advantages: Optional[jax.Array] = None  # f32[S, G, H] credit = turn: each turn's
                                       # advantage of its return to go (`credit.turn_advantages`)


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
