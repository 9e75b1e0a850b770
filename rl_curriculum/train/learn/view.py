"""Phase 2 of the learn step (`rl_step`): the trained groups as rows, with everything the policy
objective reads and nothing it differentiates.

  view = train_view(batch, scores, params, graphdef=..., ref_params=..., config=..., ...)
  view, metrics = advantage_curriculum(view, step, config)

The constant forward passes (old policy, reference, values) run here, `row_blocks(config)` blocks
of whole groups at a time with the output head chunked (`forward.head_logprobs`), so neither the
[rows, T, V] logits nor the activations of all rows exist at once. Rows are prompt-major: row
b = p * G + g holds completion g of trained group p.
"""

import functools
from typing import Any, Optional

import jax
import jax.numpy as jnp

from rl_curriculum.model import lora as lora_lib
from rl_curriculum.parallel import mesh as mesh_lib
from rl_curriculum.rl import advantages as adv_lib
from rl_curriculum.rl import credit
from rl_curriculum.rl import losses
from rl_curriculum.rl import rewards as rewards_lib
from rl_curriculum.train.learn import forward
from rl_curriculum.train.learn.rl_types import Batch, GroupScores, LearnConfig, TrainView

__all__ = ["row_blocks", "constant_logprobs", "estimator_of", "on_policy", "overlong_mask",
           "turn_token_rewards", "train_view", "advantage_curriculum"]


def row_blocks(config: LearnConfig) -> int:
  """Blocks of rows the constant passes (old policy, reference, new policy) run in: one per
  microbatch, the largest set of rows a step ever runs through the model at once."""
  return config.minibatches * config.microbatches


def constant_logprobs(graphdef, params: Any, rows: tuple, *, group: int, config: LearnConfig,
                      value: Any = None, mesh: Any = None, temperature: Optional[jax.Array] = None
                      ) -> tuple[jax.Array, Optional[jax.Array]]:
  """Log-probs f32[B, T] (and with a value head its estimates f32[B, T]) of the completions in
  `rows` = (prompt_tokens, prompt_mask, tokens), without gradient, `row_blocks(config)` blocks
  of whole groups at a time (each block's rows over `mesh`'s batch axes) and the head chunked
  (`forward.head_logprobs`), at the sampling temperature: `temperature` f32[] (the adaptive
  controller's), or the static `config.temperature` when None."""

  num_blocks = row_blocks(config)
  part = forward.block_group(rows[2].shape[0], group, num_blocks)

  def one_block(block):
    prompt_tokens, prompt_mask, tokens = mesh_lib.constrain_rows(block, mesh)
    hidden = forward.completion_hidden(graphdef, params, prompt_tokens, prompt_mask, tokens,
                                       part, constrain=forward.row_constraint(mesh))
    # Rows layout, not vocabulary-parallel: no gradient to keep split, and inside this row-block
    # loop the vocabulary-parallel head's collectives can deadlock XLA:CPU's fake devices.
    logp, _ = forward.head_logprobs(graphdef, params, hidden, tokens,
                                    temperature=(config.temperature if temperature is None
                                                 else temperature),
                                    chunk_size=config.logits_chunk or None,
                                    constrain=forward.row_constraint(mesh))
    values = None if value is None else forward.values_from_hidden(value, hidden)
    return jax.lax.stop_gradient((logp, values))

  return forward.in_row_blocks(one_block, rows, group=group, num_blocks=num_blocks)


def estimator_of(config: LearnConfig) -> str:
  """The group estimator of `advantages.ESTIMATORS` behind the step's group advantages: the
  configured one, or RLOO for PPO, whose own advantages are per token (GAE on a value head) but
  whose curriculum feedback is the group-relative RLOO advantage of the outcome rewards, which
  does not depend on how well the critic has learned yet."""
  return "rloo" if config.algorithm == "ppo" else config.algorithm


def on_policy(config: LearnConfig) -> bool:
  """True when one optimizer step uses the batch, there is no critic and no KL in the reward (which
  needs the old log-probs before the loss): the old policy is the policy being differentiated,
  and its forward pass is skipped."""
  return (config.epochs * config.minibatches == 1 and config.algorithm != "ppo"
          and config.kl_reward_coef is None)


def overlong_mask(batch: Batch, rows: jax.Array, config: LearnConfig) -> jax.Array:
  """f32[B] of the rows i32[B]: 0 on the truncated completions `overlong="exclude"` leaves out of
  the loss (DAPO's overlong filtering), 1 elsewhere (everywhere under other settings).

  Reference: Yu et al. (2025), "DAPO: An Open-Source LLM Reinforcement Learning System at Scale",
  arXiv:2503.14476.

  Raises:
    ValueError (at trace time): "exclude" with a batch that does not say which completions were
      truncated (`Batch.truncated` is None).
  """
  if config.overlong != "exclude":
    return jnp.ones(rows.shape, jnp.float32)
  if batch.truncated is None:
    raise ValueError("overlong='exclude' needs Batch.truncated (which completions the length cap "
                     "cut off; `rewards.truncated_completions`), got None")
  return 1.0 - batch.truncated.reshape(-1)[rows].astype(jnp.float32)


def turn_token_rewards(batch: Batch, scores: GroupScores, rows: jax.Array, valid: jax.Array,
                       mask: jax.Array) -> jax.Array:
  """f32[B, T] PPO's rewards on the trained rows i32[B] (valid bool[P, G], drawn tokens mask
  f32[B, T]): each turn's reward on its last drawn token (`Batch.turn_rewards`; the shaping of the
  return on the last turn: `credit.shaped_turn_rewards`), or without them the shaped return on
  each row's last drawn token."""
  rewards = scores.rewards[batch.train_groups] * valid
  if batch.turn_rewards is None:
    return rewards_lib.outcome_token_rewards(rewards.reshape(-1), mask)
  turns = credit.turn_count(batch.mask[rows]).reshape(rewards.shape)
  shaped = credit.shaped_turn_rewards(batch.turn_rewards[batch.train_groups], turns, rewards)
  return credit.on_turn_ends(shaped.reshape(-1, shaped.shape[-1]), mask)


def train_view(batch: Batch, scores: GroupScores, params: Any, *, graphdef, ref_params: Any,
               config: LearnConfig, use_lora: bool, value: Any = None,
               mesh: Any = None, temperature: Optional[jax.Array] = None,
               version: Optional[jax.Array] = None) -> TrainView:
  """Phase 2: the trained groups' rows, their per-token advantages and the constant forward
  passes (old policy, reference, values), all without gradient.

  Rows may be episodes: turns of drawn tokens with observations between them (mask 0). Every
  drawn token of a row carries its episode's group advantage (`credit="episode"`), or with
  `credit="turn"` its turn's (`GroupScores.turn_advantages`); no observation position carries
  any.

  PPO: each turn's reward on its last drawn token (`turn_token_rewards`), GAE(gamma, lambda) on the value head's estimates at sampling time over the drawn
  tokens, passing over the observations between turns, advantages whitened over the batch's
  tokens. With an untrained critic (V = 0) the advantage of token t is lambda^(L - 1 - t) r for a
  completion of L tokens, so lambda < 1 shrinks the early tokens' advantages of long completions
  towards 0; lambda = 1 gives every token r - V(t).

  With `kl_reward_coef` = beta != 0 the KL to the reference enters the reward, as in RLHF's PPO
  (Ouyang et al. (2022), "Training language models to follow instructions with human feedback",
  arXiv:2203.02155): PPO's token rewards lose beta * k1 on every token (`rewards.kl_penalty`);
  the group estimators' completion rewards lose beta * sum_t k1 before the trained groups'
  advantages are recomputed from them.

  With `overlong="exclude"` the truncated completions get mask 0 (`overlong_mask`): no token of
  theirs enters the loss (nor PPO's GAE, value loss and advantage whitening). They keep their
  place in the group advantages: the others' baselines are computed from every sampled
  completion, as phase 1 computed them for the curriculum, so a group's truncations still lower
  its mean reward.

  The log-probs are those of the sampling temperature: `temperature` f32[] (the adaptive
  controller's), or the static `config.temperature` when None.

  With `proximal="loglinear"` no old-policy pass runs: the view carries each token's staleness,
  `version` (i32[], the train state's update counter) minus the version that sampled it
  (`Batch.versions`; 0 everywhere when None), and the objective interpolates the proximal
  log-probs (`off_policy.loglinear_proximal_logprobs`).
  """
  _, g = batch.rewards.shape
  rows = forward.trained_rows(batch.train_groups, g)
  valid = batch.valid.astype(bool)[batch.train_groups] & batch.train_valid[:, None]
  row_valid = valid.reshape(-1).astype(jnp.float32)
  sampled = batch.mask[rows] * row_valid[:, None]
  mask = sampled * overlong_mask(batch, rows, config)[:, None]
  prompt_tokens, prompt_mask = batch.prompt_tokens[rows], batch.prompt_mask[rows]
  tokens = batch.tokens[rows]
  advantages = scores.advantages[batch.train_groups] * valid
  adv_tokens = adv_lib.broadcast_to_tokens(advantages.reshape(-1), mask)

  logprobs = functools.partial(constant_logprobs, graphdef, rows=(prompt_tokens, prompt_mask,
                                                                   tokens), group=g, config=config,
                               mesh=mesh, temperature=temperature)
  ppo = config.algorithm == "ppo"
  logp_old = values_old = returns = logp_ref = None
  staleness = None
  if config.proximal == "loglinear":
    staleness = jnp.zeros(tokens.shape, jnp.float32)
    if batch.versions is not None:
      if version is None:
        raise ValueError("proximal='loglinear' with Batch.versions needs the learn step's version")
      staleness = (version - batch.versions[rows]).astype(jnp.float32)
  elif not on_policy(config):
    logp_old, values_old = logprobs(params, value=value if ppo else None)
  if config.kl_coef is not None or config.kl_reward_coef is not None:
    ref = lora_lib.disable(params) if use_lora else ref_params
    logp_ref, _ = logprobs(ref)
  if config.kl_reward_coef is not None and not ppo:
    # The KL penalty lowers each completion's reward before the group-relative advantages.
    penalty = config.kl_reward_coef * rewards_lib.kl_penalty(logp_old, logp_ref, sampled)
    rewards = scores.rewards[batch.train_groups] - penalty.reshape(-1, g)
    baseline = None if batch.baseline is None else batch.baseline[batch.train_groups]
    advantages = adv_lib.group_advantages(rewards, valid, estimator_of(config),
                                          grpo_std=config.grpo_std, baseline=baseline)
    adv_tokens = adv_lib.broadcast_to_tokens(advantages.reshape(-1), mask)
  if scores.turn_advantages is not None:
    if config.kl_reward_coef is not None:
      raise ValueError("credit='turn' takes its rewards from the turns: kl_reward_coef must be off")
    per_turn = scores.turn_advantages[batch.train_groups] * valid[..., None]
    adv_tokens = credit.on_turn_tokens(per_turn.reshape(-1, per_turn.shape[-1]), mask)
  if ppo:
    values_old = values_old * mask
    token_rewards = turn_token_rewards(batch, scores, rows, valid, mask)
    if config.kl_reward_coef is not None:
      token_rewards = token_rewards - config.kl_reward_coef * rewards_lib.kl_penalty(
          logp_old, logp_ref, mask, per_token=True)
    adv_tokens, returns = adv_lib.gae(token_rewards, values_old, mask, gamma=config.gamma,
                                      lam=config.lam)
    mean = losses.masked_mean(adv_tokens, mask)
    std = jnp.sqrt(losses.masked_mean(jnp.square(adv_tokens - mean), mask))
    adv_tokens = jnp.where(mask > 0, (adv_tokens - mean) / (std + 1e-6), 0.0)
  return TrainView(prompt_tokens=prompt_tokens, prompt_mask=prompt_mask, tokens=tokens, mask=mask,
                   advantages=adv_tokens, sampler_logprobs=batch.sampler_logprobs[rows],
                   logp_old=logp_old, logp_ref=logp_ref, values_old=values_old, returns=returns,
                   staleness=staleness)


def advantage_curriculum(view: TrainView, step: jax.Array,
                         config: LearnConfig) -> tuple[TrainView, dict]:
  """CAPO's advantage-sign curriculum on the trained rows: the view with its negative per-token
  advantages weighted by w_neg(step) (`losses.advantage_sign_mask`; 0 for the first
  `capo_positive_steps` updates, then ramped to 1 over `capo_ramp_steps`), and the metric
  "capo_negative_weight" = w_neg(step). Both counts 0 leave the view as it is, with no metric.

  Reference: Yang et al. (2025), "From Imitation to Discrimination: Toward A Generalized
  Curriculum Advantage Mechanism Enhancing Cross-Domain Reasoning Tasks", arXiv:2512.02580.

  Args:
    view: the trained rows (`train_view`).
    step: i32[] the train state's update counter (updates attempted before this one).
    config: the learn settings.
  """
  if config.capo_positive_steps is None and config.capo_ramp_steps is None:
    return view, {}
  count = lambda steps: 0 if steps is None else steps  # one of the two may be off
  weigh = functools.partial(losses.advantage_sign_mask, step=step,
                            positive_only_steps=count(config.capo_positive_steps),
                            ramp_steps=count(config.capo_ramp_steps))
  advantages = view.advantages * weigh(view.advantages)
  w_neg = weigh(-jnp.ones((), jnp.float32))
  return view._replace(advantages=advantages), {"capo_negative_weight": w_neg}
