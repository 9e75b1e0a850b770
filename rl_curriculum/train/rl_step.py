"""The learn half of an RL step: one jitted program from a scored rollout to new parameters.

  train_state, cur_state, metrics = learn(train_state, cur_state, batch, key, ...)

`learn` runs six phases, each a module-level function that can be tested alone:

  1. feedback   `score_groups`: rewards -> (overlong penalty) -> (whitening) -> advantages
                f32[S, G] of every sampled group, and the curriculum's `Feedback` (whose
                advantages come from correctness by default, see
                `LearnConfig.curriculum_feedback`); then `Curriculum.update` (with
                `high_variance_only`, VCRL's update also decides which groups are trained on).
                Completion slots that were not sampled (`Batch.valid` False: an allocation's
                unused slots, a prompt skipped before rollout) count nowhere.
  2. view       `train_view`: the P trained groups as B = P * G rows (`TrainView`): per-token
                advantages, mask, the old policy's and the reference's log-probs, values and
                returns (PPO); the KL penalty in the reward (`kl_reward_coef`), truncated
                completions out of the loss (`overlong="exclude"`), and CAPO's weights on
                negative advantages (`advantage_curriculum`).
  3. objective  `objective.policy_objective`: loss and metrics of one minibatch of rows (the only
                function that differentiates the policy).
  4. updates    `objective.minibatch_updates`: `epochs` passes of `minibatches` optimizer steps
                under `lax.scan` (whole groups per minibatch); a minibatch made only of padding
                groups leaves the parameters and the optimizer state as they were. Under LoRA
                each optimizer step reports the adapters' health (`stability.adapter_health`).
  5. rollback   `roll_back_if`: an update with a non-finite loss, parameter, curriculum state or
                whitening, or whose KL(pi_old || pi_new) exceeds `max_kl`, is discarded: the
                parameters, optimizer state, curriculum state, reward whitening and sampling
                temperature all return to their values before the step (`skipped` counts it).
                Before it, the adaptive controller (`temperature_target` > 0) moves the next
                rollout's temperature from the entropy this batch measured
                (`adapt_temperature`).
  6. metrics    `batch_metrics`: statistics of every sampled group and of the trained rows.

Forward passes per step (the configuration is static, so the choice is made at trace time); each
runs a group's prompt once and its G completions on the prompt's shared keys and values
(`transformer.shared_prefix_hidden`: P Tp + B T token-passes instead of B (Tp + T)):
  old policy   only when there is more than one optimizer step per batch (epochs x minibatches
               > 1) or a critic (PPO); with one step the old policy is the policy being
               differentiated, and logp_old = stop_gradient(logp) inside the loss (the same
               values, one forward pass fewer); a KL in the reward (kl_reward_coef) needs it
               too.
  reference    only when kl_coef != 0 or kl_reward_coef != 0; without kl_coef there is no
               "kl" metric (not measured).
  policy       forward and backward, once per minibatch (per microbatch with gradient
               accumulation, `objective.accumulated_gradients`).
  new policy   only when max_kl is set: one forward pass with the updated parameters, for the
               rollback's KL(pi_old || pi_new) (`update_kl`).

Every log-prob is that of the sampling distribution softmax(logits / temperature), the
distribution the rollout drew its tokens from (`forward`): temperature is the static
`config.temperature`, or with the adaptive controller the train state's traced f32[]
(`rollout_temperature`), the one the rollout read from the same state.

Memory: the output head runs `logits_chunk` positions at a time (`forward.head_logprobs`), and
the passes without gradient (old policy, reference, new policy) run one microbatch of rows at a
time (`row_blocks`), so neither the [rows, T, V] logits nor the activations of all rows exist at
once. With a mesh, every minibatch, microbatch and row block keeps its rows over the batch axes.

Rows are prompt-major: row b = p * G + g holds completion g of prompt p. A batch may hold more
groups (S) than the policy trains on (P; S > P with a post-rollout filter): the curriculum sees
every sampled group, the policy loss only the `train_groups`.
"""

import functools
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import optax

from rl_curriculum.model import lora as lora_lib
from rl_curriculum.parallel import mesh as mesh_lib
from rl_curriculum.rl import advantages as adv_lib
from rl_curriculum.rl import losses
from rl_curriculum.rl import stability
from rl_curriculum.train import forward
from rl_curriculum.train.objective import minibatch_updates
from rl_curriculum.train.rl_types import (ADVANTAGES, CURRICULUM_FEEDBACK, DR_GRPO_AGGREGATION,
                                          GRPO_STDS, KL_LOSS_ESTIMATORS, OVERLONG, Batch,
                                          GroupScores, LearnConfig, TrainState, TrainView,
                                          adaptive_temperature, check_config)
from rl_curriculum.types import Feedback

# The step's types and constants live in rl_types; they are part of this module's interface.
__all__ = [
    "ADVANTAGES", "CURRICULUM_FEEDBACK", "DR_GRPO_AGGREGATION", "GRPO_STDS", "KL_LOSS_ESTIMATORS",
    "OVERLONG", "Batch", "GroupScores", "LearnConfig", "TrainState", "TrainView",
    "adaptive_temperature", "check_config", "row_blocks", "constant_logprobs", "init_value_head",
    "init_train_state", "outcome_token_rewards", "group_advantages", "truncated_completions",
    "overlong_penalty", "batch_overlong_penalty", "score_groups", "overlong_mask", "on_policy",
    "kl_penalty", "train_view", "advantage_curriculum", "update_kl", "roll_back_if",
    "rollout_temperature", "adapt_temperature", "batch_metrics", "overlong_metrics", "learn",
    "make_learn",
]

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

  def one_block(block):
    prompt_tokens, prompt_mask, tokens = mesh_lib.constrain_rows(block, mesh)
    hidden = forward.completion_hidden(graphdef, params, prompt_tokens, prompt_mask, tokens,
                                       group, constrain=forward.row_constraint(mesh))
    logp, _ = forward.head_logprobs(graphdef, params, hidden, tokens,
                                    temperature=(config.temperature if temperature is None
                                                 else temperature),
                                    chunk_size=config.logits_chunk or None,
                                    constrain=forward.row_constraint(mesh))
    values = None if value is None else forward.values_from_hidden(value, hidden)
    return jax.lax.stop_gradient((logp, values))

  return forward.in_row_blocks(one_block, rows, group=group, num_blocks=row_blocks(config))


def init_value_head(width: int) -> dict:
  """PPO's value head on the policy's final hidden states: v = h . w + b, starting at 0."""
  return {"w": jnp.zeros((width,), jnp.float32), "b": jnp.zeros((), jnp.float32)}


def init_train_state(params: Any, optimizer: optax.GradientTransformation,
                     value: Any = None, temperature: float = 1.0) -> TrainState:
  """A fresh train state (`value`: a value head for PPO; `temperature`: the first rollout's
  sampling temperature, rl.temperature). Every leaf is a private copy: the learn step donates the
  whole state, so it must share no buffer with anything else (the KL reference is often the same
  weights)."""
  trained = params if value is None else (params, value)
  state = TrainState(step=jnp.zeros((), jnp.int32), params=params,
                     opt_state=optimizer.init(trained), whitening=stability.whitening_init(),
                     skipped=jnp.zeros((), jnp.int32), value=value,
                     temperature=stability.temperature_init(temperature).temperature)
  return jax.tree.map(lambda x: jnp.array(x, copy=True), state)


def outcome_token_rewards(rewards: jax.Array, mask: jax.Array) -> jax.Array:
  """f32[B, T]: each completion's scalar reward f32[B] on its last counted token, 0 elsewhere."""
  last = jnp.maximum(jnp.sum(mask > 0, axis=1) - 1, 0)
  on_last = jnp.arange(mask.shape[1])[None, :] == last[:, None]
  return jnp.where(on_last & (mask > 0), rewards[:, None], 0.0)


def group_advantages(rewards: jax.Array, valid: jax.Array, algorithm: str, *, grpo_std: str,
                     baseline: Optional[jax.Array] = None) -> jax.Array:
  """f32[S, G] advantages of the configured estimator; zero on invalid slots.

  PPO's own advantages are per token (GAE on a value head); for the curriculum's feedback PPO
  uses the group-relative RLOO advantage of the outcome rewards, which does not depend on how
  well the critic has learned yet. `grpo_std` ("population" | "sample") is the group standard
  deviation GRPO divides by (divide the variance by n or by n - 1); other estimators ignore it.
  The counterfactual estimator subtracts `baseline` f32[S] (one value per prompt, from outside
  the group) instead of a statistic of the group.
  """
  if algorithm == "ppo":
    algorithm = "rloo"
  if algorithm not in ADVANTAGES:
    raise ValueError(f"unknown RL algorithm {algorithm!r}; choose from "
                     f"{sorted(ADVANTAGES) + ['ppo']}")
  if algorithm == "grpo":
    return adv_lib.grpo(rewards, valid=valid, unbiased_std=grpo_std == "sample") * valid
  if algorithm == "counterfactual":
    if baseline is None:
      raise ValueError("the counterfactual estimator needs a per-prompt baseline "
                       "(Batch.baseline f32[S])")
    return adv_lib.counterfactual(rewards, baseline, valid=valid) * valid
  return ADVANTAGES[algorithm](rewards, valid=valid) * valid


def truncated_completions(tokens: jax.Array, mask: jax.Array, stop_ids) -> jax.Array:
  """bool[R]: which completions i32[R, T] (counted tokens f32[R, T]) the length cap T cut off,
  those whose last position counts and holds none of `stop_ids` (the sampler keeps and counts a
  stop token, so a completion that ends with one at position T - 1 finished)."""
  stop = jnp.asarray(tuple(stop_ids), jnp.int32)
  ended = jnp.any(tokens[:, -1:] == stop[None, :], axis=1)
  return (mask[:, -1] > 0) & ~ended


def overlong_penalty(lengths: jax.Array, max_tokens: int, cache: int) -> jax.Array:
  """DAPO's soft overlong punishment R_len of completions of `lengths` tokens (any shape, f32 of
  the same shape) under a length cap L_max = `max_tokens` and a cache of L_cache = `cache` tokens:

    R_len(y) = 0                                     if |y| <= L_max - L_cache
               ((L_max - L_cache) - |y|) / L_cache   if L_max - L_cache < |y| <= L_max
               -1                                    if L_max < |y|

  so a completion that reaches the cap loses 1. The penalty depends on the length alone: a
  completion that ends with a stop token inside the cache is punished too.

  Reference: Yu et al. (2025), "DAPO: An Open-Source LLM Reinforcement Learning System at Scale",
  arXiv:2503.14476.
  """
  start = max_tokens - cache
  lengths = jnp.asarray(lengths, jnp.float32)
  return jnp.where(lengths <= start, 0.0, jnp.maximum((start - lengths) / cache, -1.0))


def batch_overlong_penalty(batch: Batch, config: LearnConfig) -> jax.Array:
  """f32[S, G] `overlong_penalty` of every sampled completion (L_max = T, the completions'
  width; L_cache = `config.overlong_cache`), 0 on invalid slots.

  Raises:
    ValueError (at trace time): overlong_cache outside [1, T).
  """
  s, g = batch.rewards.shape
  t = batch.mask.shape[1]
  if not 1 <= config.overlong_cache < t:
    raise ValueError(f"overlong_cache must lie in [1, {t}) (the completions' length cap), got "
                     f"{config.overlong_cache}")
  lengths = jnp.sum(batch.mask > 0, axis=1).reshape(s, g)
  return jnp.where(batch.valid.astype(bool),
                   overlong_penalty(lengths, t, config.overlong_cache), 0.0)


# --- 1. Rewards, advantages and the curriculum's feedback ---------------------------------------


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
  """
  valid = batch.valid.astype(bool)
  rewards = batch.rewards
  if config.overlong == "penalty":
    rewards = rewards + batch_overlong_penalty(batch, config)
  if config.whiten_rewards:
    whitening = stability.whitening_update(whitening, rewards, valid)
    rewards = stability.whiten(whitening, rewards)
  estimator = functools.partial(group_advantages, algorithm=config.algorithm,
                                grpo_std=config.grpo_std, baseline=batch.baseline)
  advantages = estimator(rewards, valid)
  if config.curriculum_feedback == "correct":
    cur_advantages = estimator(batch.correct.astype(jnp.float32), valid)
  else:
    cur_advantages = advantages
  feedback = Feedback(prompt_ids=batch.prompt_ids, arms=batch.arms, rewards=batch.rewards,
                      correct=batch.correct, advantages=cur_advantages, valid=valid)
  return GroupScores(whitening=whitening, rewards=rewards, advantages=advantages,
                     feedback=feedback)


# --- 2. The trained rows ------------------------------------------------------------------------


def on_policy(config: LearnConfig) -> bool:
  """True when one optimizer step uses the batch, there is no critic and no KL in the reward (which
  needs the old log-probs before the loss): the old policy is the policy being differentiated,
  and its forward pass is skipped."""
  return (config.epochs * config.minibatches == 1 and config.algorithm != "ppo"
          and config.kl_reward_coef == 0)


def kl_penalty(logp_old: jax.Array, logp_ref: jax.Array, mask: jax.Array, *,
               per_token: bool = False) -> jax.Array:
  """The k1 estimate of KL(pi_old || ref) on the sampled tokens, k1 = logp_old - logp_ref (nats;
  unbiased, the tokens come from pi_old): f32[B, T] per counted token (0 elsewhere) with
  `per_token`, else its sum over each completion f32[B]. As a reward (`kl_reward_coef`) rather
  than a loss term, k1 is the usual choice: its gradient is not taken."""
  k1 = jnp.where(mask > 0, logp_old - logp_ref, 0.0)
  return k1 if per_token else jnp.sum(k1, axis=1)


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
                     "cut off; `truncated_completions`), got None")
  return 1.0 - batch.truncated.reshape(-1)[rows].astype(jnp.float32)


def train_view(batch: Batch, scores: GroupScores, params: Any, *, graphdef, ref_params: Any,
               config: LearnConfig, use_lora: bool, value: Any = None,
               mesh: Any = None, temperature: Optional[jax.Array] = None) -> TrainView:
  """Phase 2: the trained groups' rows, their per-token advantages and the constant forward
  passes (old policy, reference, values), all without gradient.

  PPO: the outcome reward on each completion's last counted token, GAE(gamma, lambda) on the value
  head's estimates at sampling time, advantages whitened over the batch's tokens. With an
  untrained critic (V = 0) the advantage of token t is lambda^(L - 1 - t) r for a completion of L
  tokens, so lambda < 1 shrinks the early tokens' advantages of long completions towards 0;
  lambda = 1 gives every token r - V(t).

  With `kl_reward_coef` = beta != 0 the KL to the reference enters the reward, as in RLHF's PPO
  (Ouyang et al. (2022), "Training language models to follow instructions with human feedback",
  arXiv:2203.02155): PPO's token rewards lose beta * k1 on every token (`kl_penalty`); the group
  estimators' completion rewards lose beta * sum_t k1 before the trained groups' advantages are
  recomputed from them.

  With `overlong="exclude"` the truncated completions get mask 0 (`overlong_mask`): no token of
  theirs enters the loss (nor PPO's GAE, value loss and advantage whitening). They keep their
  place in the group advantages: the others' baselines are computed from every sampled
  completion, as phase 1 computed them for the curriculum, so a group's truncations still lower
  its mean reward.

  The log-probs are those of the sampling temperature: `temperature` f32[] (the adaptive
  controller's), or the static `config.temperature` when None.
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
  if not on_policy(config):
    logp_old, values_old = logprobs(params, value=value if ppo else None)
  if config.kl_coef != 0 or config.kl_reward_coef != 0:
    ref = lora_lib.disable(params) if use_lora else ref_params
    logp_ref, _ = logprobs(ref)
  if config.kl_reward_coef != 0 and not ppo:
    # The KL penalty lowers each completion's reward before the group-relative advantages.
    penalty = config.kl_reward_coef * kl_penalty(logp_old, logp_ref, sampled)
    rewards = scores.rewards[batch.train_groups] - penalty.reshape(-1, g)
    baseline = None if batch.baseline is None else batch.baseline[batch.train_groups]
    advantages = group_advantages(rewards, valid, config.algorithm, grpo_std=config.grpo_std,
                                  baseline=baseline)
    adv_tokens = adv_lib.broadcast_to_tokens(advantages.reshape(-1), mask)
  if ppo:
    values_old = values_old * mask
    rewards = (scores.rewards[batch.train_groups] * valid).reshape(-1)
    token_rewards = outcome_token_rewards(rewards, mask)
    if config.kl_reward_coef != 0:
      token_rewards = token_rewards - config.kl_reward_coef * kl_penalty(
          logp_old, logp_ref, mask, per_token=True)
    adv_tokens, returns = adv_lib.gae(token_rewards, values_old, mask, gamma=config.gamma,
                                      lam=config.lam)
    mean = losses.masked_mean(adv_tokens, mask)
    std = jnp.sqrt(losses.masked_mean(jnp.square(adv_tokens - mean), mask))
    adv_tokens = jnp.where(mask > 0, (adv_tokens - mean) / (std + 1e-6), 0.0)
  return TrainView(prompt_tokens=prompt_tokens, prompt_mask=prompt_mask, tokens=tokens, mask=mask,
                   advantages=adv_tokens, sampler_logprobs=batch.sampler_logprobs[rows],
                   logp_old=logp_old, logp_ref=logp_ref, values_old=values_old, returns=returns)


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
    config: static hyperparameters.
  """
  if config.capo_positive_steps == 0 and config.capo_ramp_steps == 0:
    return view, {}
  weigh = functools.partial(losses.advantage_sign_mask, step=step,
                            positive_only_steps=config.capo_positive_steps,
                            ramp_steps=config.capo_ramp_steps)
  advantages = view.advantages * weigh(view.advantages)
  w_neg = weigh(-jnp.ones((), jnp.float32))
  return view._replace(advantages=advantages), {"capo_negative_weight": w_neg}


# --- 5. Rollback --------------------------------------------------------------------------------


def update_kl(new_params: Any, view: TrainView, logp_old: jax.Array, *, graphdef,
              group: int, config: LearnConfig, mesh: Any = None,
              temperature: Optional[jax.Array] = None) -> jax.Array:
  """f32[] KL(pi_old || pi_new) estimated on the sampled tokens: the masked mean of
  logp_old - logp_new (the k1 estimator; the samples come from pi_old), after the step's last
  update. One forward pass with the new parameters (at `temperature`, see `constant_logprobs`)."""
  logp_new, _ = constant_logprobs(graphdef, new_params,
                                  (view.prompt_tokens, view.prompt_mask, view.tokens),
                                  group=group, config=config, mesh=mesh, temperature=temperature)
  return losses.masked_mean(logp_old - logp_new, view.mask)


def roll_back_if(skip: jax.Array, before: Any, after: Any) -> Any:
  """`before` where skip is True, else `after` (pytrees of one structure)."""
  return stability.select_tree(skip, before, after)


# --- Adaptive sampling temperature --------------------------------------------------------------


def rollout_temperature(train_state: TrainState, config: LearnConfig) -> Optional[jax.Array]:
  """The temperature this batch was sampled at, as the learn step reads it: the train state's
  f32[] under the adaptive controller (`adaptive_temperature(config)`), else None (the static
  `config.temperature`, a constant of the compiled program).

  Raises:
    ValueError: the controller is on and the train state holds no temperature.
  """
  if not adaptive_temperature(config):
    return None
  if train_state.temperature is None:
    raise ValueError("temperature_target > 0 needs TrainState.temperature: build the state with "
                     "init_train_state(..., temperature=rl.temperature)")
  return train_state.temperature


def adapt_temperature(temperature: jax.Array, metrics: dict, config: LearnConfig) -> jax.Array:
  """f32[] the next rollout's temperature: the controller `stability.temperature_update`,
    tau <- clip(tau * exp(rate * (target - H)), temperature_min, temperature_max),
  fed H = metrics["entropy"], the policy's full-vocabulary entropy of softmax(logits / tau) per
  counted token of this batch's trained completions (nats; computed by the loss, no extra pass;
  with several optimizer steps it is the mean over the minibatches of each one's entropy before
  its step). A step in which no minibatch stepped measured nothing: tau stays.

  Reference: the stability pack of Haque, Islam and Karray (2026), "Towards Robust Reinforcement
  Learning for Small-Scale Language Model Agents", IEEE SMC 2026 (`rl.stability`).

  Args:
    temperature: f32[] the temperature this batch was sampled at.
    metrics: the objective's metrics averaged over the minibatches (`minibatch_updates`).
    config: static hyperparameters (`temperature_target`, `_rate`, `_min`, `_max`).
  """
  entropy = jnp.where(metrics["steps_taken"] > 0, metrics["entropy"], jnp.nan)
  state = stability.temperature_update(
      stability.TemperatureState(temperature=temperature), entropy,
      target=config.temperature_target, rate=config.temperature_rate,
      t_min=config.temperature_min, t_max=config.temperature_max)
  return state.temperature


# --- 6. Batch statistics ------------------------------------------------------------------------


def batch_metrics(batch: Batch, scores: GroupScores, view: TrainView) -> dict:
  """Phase 6: statistics of every sampled group (what the curriculum chose) and of the rows the
  policy trained on.

    reward_mean, correct_mean  over valid completions of every sampled group
    abs_adv_mean               mean |advantage| the policy trains on, over every sampled group
    nonzero_adv_frac           sampled groups with a nonzero advantage (what the loss can use)
    mixed_correct_frac         sampled groups with both right and wrong completions (a
                               correctness signal; below nonzero_adv_frac when a format bonus
                               separates all-wrong completions)
    completion_len             counted tokens per trained completion
    groups_trained             trained groups with at least one counted token
  """
  valid = batch.valid.astype(bool)
  count = jnp.maximum(valid.sum(), 1)
  groups = jnp.maximum(jnp.any(valid, axis=1).sum(), 1)
  right = jnp.any(batch.correct & valid, axis=1)
  wrong = jnp.any(~batch.correct & valid, axis=1)
  g = batch.rewards.shape[1]
  trained = jnp.any(view.mask.reshape(-1, g, view.mask.shape[1]) > 0, axis=2)  # bool[P, G]
  return {
      "reward_mean": jnp.sum(batch.rewards * valid) / count,
      "correct_mean": jnp.sum(batch.correct & valid) / count,
      "abs_adv_mean": jnp.sum(jnp.abs(scores.advantages)) / count,
      "nonzero_adv_frac": jnp.sum(jnp.any(jnp.abs(scores.advantages) > 0, axis=1)
                                  & jnp.any(valid, axis=1)) / groups,
      "mixed_correct_frac": jnp.sum(right & wrong) / groups,
      "completion_len": jnp.sum(view.mask) / jnp.maximum(jnp.sum(trained), 1),
      "groups_trained": jnp.sum(jnp.any(trained, axis=1)).astype(jnp.float32),
  }


def overlong_metrics(batch: Batch, config: LearnConfig) -> dict:
  """Statistics of the length cap (phase 6), over every sampled group:

    truncated_frac          valid completions cut at T without a stop token (whenever the batch
                            says which: `Batch.truncated`)
    overlong_penalty_mean   overlong="penalty": mean `batch_overlong_penalty` of the valid
                            completions (before whitening, the trained rewards' mean is
                            reward_mean plus this)
    overlong_excluded_frac  overlong="exclude": trained completions left out of the loss, of the
                            trained completions
  """
  valid = batch.valid.astype(bool)
  count = jnp.maximum(valid.sum(), 1)
  metrics = {}
  if batch.truncated is not None:
    metrics["truncated_frac"] = jnp.sum(batch.truncated & valid) / count
  if config.overlong == "penalty":
    metrics["overlong_penalty_mean"] = jnp.sum(batch_overlong_penalty(batch, config)) / count
  if config.overlong == "exclude":
    g = batch.rewards.shape[1]
    rows = forward.trained_rows(batch.train_groups, g)
    trained = (valid[batch.train_groups] & batch.train_valid[:, None]).reshape(-1)
    excluded = trained & (overlong_mask(batch, rows, config) == 0)
    metrics["overlong_excluded_frac"] = jnp.sum(excluded) / jnp.maximum(jnp.sum(trained), 1)
  return metrics


# --- The learn step -----------------------------------------------------------------------------


def learn(train_state: TrainState, cur_state: Any, batch: Batch, key: jax.Array, *,
          graphdef, frozen: Any, ref_params: Any, optimizer: optax.GradientTransformation,
          curriculum_update: Callable, config: LearnConfig, use_lora: bool, mesh: Any = None):
  """One RL update. Jit with everything after `key` static or closed over (see `make_learn`).

  Args:
    train_state: trainable parameters and optimizer state.
    cur_state: the curriculum's state; updated with this batch's feedback.
    batch: the scored rollout.
    key: this step's key (fold_in(root, step)); shuffles minibatches.
    graphdef: the model's graph definition.
    frozen: parameters that are inputs but never trained (the base model under LoRA), or None.
    ref_params: the KL reference's parameters for full fine-tuning; ignored under LoRA, where the
      reference is the same model with its adapters switched off.
    optimizer: optax transformation for `train_state.params`.
    curriculum_update: `Curriculum.update`.
    config: static hyperparameters.
    use_lora: whether `train_state.params` are LoRA adapters.
    mesh: the run's mesh, or None: minibatches, microbatches and row blocks keep their rows over
      its batch axes (`mesh_lib.constrain_rows`).

  Returns:
    (train_state, cur_state, metrics): metrics are scalars (and per-arm vectors from the
    curriculum under "curriculum"), the objective's averaged over minibatches.

  Raises:
    ValueError (at trace time): a batch whose shapes disagree, P not divisible into minibatches,
      or a configuration `check_config` rejects.
  """
  check_config(config)
  s, g = batch.rewards.shape
  if batch.tokens.shape[0] != s * g:
    raise ValueError(f"batch rows {batch.tokens.shape[0]} != prompts {s} x group {g}")
  p = batch.train_groups.shape[0]
  if p % row_blocks(config):
    raise ValueError(f"{p} prompts do not split into {config.minibatches} minibatches of "
                     f"{config.microbatches} microbatches")
  ppo = config.algorithm == "ppo"
  tau = rollout_temperature(train_state, config)  # None: the static config.temperature

  # 1. Feedback: advantages of every sampled group; the curriculum learns from them.
  scores = score_groups(batch, train_state.whitening, config)
  new_cur_state, cur_metrics = curriculum_update(cur_state, scores.feedback)
  if config.high_variance_only:  # VCRL's training mask: low-variance groups leave the loss
    batch = batch._replace(train_valid=batch.train_valid
                           & cur_metrics["high_variance"][batch.train_groups])

  # 2. View: the trained rows and the constant forward passes.
  params = forward.model_params(train_state.params, frozen)
  view = train_view(batch, scores, params, graphdef=graphdef, ref_params=ref_params,
                    config=config, use_lora=use_lora, value=train_state.value, mesh=mesh,
                    temperature=tau)
  view, capo_metrics = advantage_curriculum(view, train_state.step, config)

  # 3-4. Optimizer steps.
  trained = (train_state.params, train_state.value) if ppo else train_state.params
  new_trained, new_opt_state, metrics, logp_old = minibatch_updates(
      trained, train_state.opt_state, view, key, graphdef=graphdef, frozen=frozen, group=g,
      optimizer=optimizer, config=config, mesh=mesh, temperature=tau, adapters=use_lora)

  # 5. Rollback of a non-finite or runaway update: nothing of this step is kept.
  skip = ~jnp.isfinite(metrics["loss"]) | ~stability.all_finite(new_trained)
  skip = skip | ~stability.all_finite((new_cur_state, scores.whitening))
  if config.max_kl is not None:
    new_policy = new_trained[0] if ppo else new_trained
    kl = update_kl(forward.model_params(new_policy, frozen), view, logp_old, graphdef=graphdef,
                   group=g, config=config, mesh=mesh, temperature=tau)
    metrics["update_kl"] = kl
    skip = skip | stability.should_skip(metrics["loss"], kl, max_kl=config.max_kl)
  new_temperature = train_state.temperature
  if tau is not None:  # the controller moves the next rollout's temperature
    new_temperature = adapt_temperature(tau, metrics, config)
    metrics["temperature"] = tau
  before = (trained, train_state.opt_state, cur_state, train_state.whitening,
            train_state.temperature)
  after = (new_trained, new_opt_state, new_cur_state, scores.whitening, new_temperature)
  new_trained, new_opt_state, cur_state, whitening, temperature = roll_back_if(skip, before,
                                                                               after)
  new_params, new_value = new_trained if ppo else (new_trained, None)
  skipped = train_state.skipped + skip.astype(jnp.int32)
  train_state = TrainState(step=train_state.step + 1, params=new_params, opt_state=new_opt_state,
                           whitening=whitening, skipped=skipped, value=new_value,
                           temperature=temperature)

  # 6. Batch statistics.
  metrics.update(batch_metrics(batch, scores, view))
  metrics.update(capo_metrics)
  metrics.update(overlong_metrics(batch, config))
  if config.kl_reward_coef != 0:
    penalty = config.kl_reward_coef * kl_penalty(view.logp_old, view.logp_ref, view.mask)
    counted = (jnp.sum(view.mask, axis=1) > 0).astype(jnp.float32)
    metrics["kl_reward"] = jnp.sum(penalty * counted) / jnp.maximum(jnp.sum(counted), 1.0)
  metrics.update({"update_skipped": skip.astype(jnp.float32), "skipped_total": skipped})
  return train_state, cur_state, {**metrics, "curriculum": cur_metrics}


def make_learn(*, graphdef, optimizer, curriculum_update, config: LearnConfig, use_lora: bool,
               out_shardings: Any = None, mesh: Any = None):
  """`learn` jitted once, with the train state donated: fn(train_state, cur_state, batch, key,
  frozen, ref_params).

  Sharded runs place the inputs (`parallel.distributed.place`) and pass `out_shardings` =
  (train state shardings, curriculum state sharding, metrics sharding) (a prefix tree, e.g. one
  replicated NamedSharding for the last two), so the parameters keep their layout step after
  step and the donated buffers are reused; jit partitions the rest from the inputs (GSPMD), with
  the rows of every minibatch, microbatch and row block over `mesh`'s batch axes.

  Raises:
    ValueError: a configuration `check_config` rejects (at once, before anything compiles).
  """
  check_config(config)
  fn = functools.partial(learn, graphdef=graphdef, optimizer=optimizer,
                         curriculum_update=curriculum_update, config=config, use_lora=use_lora,
                         mesh=mesh)

  def step(train_state, cur_state, batch, key, frozen, ref_params):
    return fn(train_state, cur_state, batch, key, frozen=frozen, ref_params=ref_params)

  return jax.jit(step, donate_argnums=(0,), out_shardings=out_shardings)
