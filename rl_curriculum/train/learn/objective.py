"""Phases 3 and 4 of the learn step (`rl_step`): the policy objective of a minibatch, and the
optimizer steps over minibatches (with gradient accumulation over microbatches).

  loss, metrics = policy_objective(trained, view, graphdef=..., frozen=..., group=G, config=...)
  trained, opt_state, metrics, logp_old = minibatch_updates(trained, opt_state, view, key, ...)

`policy_objective` is the only function of the learn step that differentiates the policy.
"""

import functools
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import optax

from rl_curriculum.parallel import mesh as mesh_lib
from rl_curriculum.rl import losses
from rl_curriculum.rl import off_policy
from rl_curriculum.rl import stability
from rl_curriculum.train.learn import forward
from rl_curriculum.train.learn.rl_types import LearnConfig, TrainView

def policy_objective(trained: Any, view: TrainView, *, graphdef, frozen: Any, group: int,
                     config: LearnConfig, normaliser: Optional[dict] = None,
                     mesh: Any = None, temperature: Optional[jax.Array] = None
                     ) -> tuple[jax.Array, dict]:
  """Phase 3: loss f32[] and metrics of one minibatch `view` (whole groups of `group` rows).

  loss = policy_loss + kl_coef * KL - entropy_coef * entropy + vf_coef * value_loss (each term
  present only when configured). The KL and entropy terms are aggregated over tokens like the
  policy loss (`config.aggregation`). The policy loss is dual-clipped with `dual_clip` > 1, and
  with `tis_cap` > 0 its per-token advantages are weighted by truncated importance weights
  against the sampler (`truncated_is`). The old log-probs are the view's (a forward pass at the
  update's start), or with the view's `staleness` (`proximal="loglinear"`) interpolated between
  the sampler's and the policy's (`off_policy.loglinear_proximal_logprobs`), or on-policy the
  policy's own without gradient. With the old policy as the proximal one, `tis_cap` > 0 makes
  this the decoupled PPO objective of Fu et al. (2025), "AReaL: A Large-Scale Asynchronous
  Reinforcement Learning System for Language Reasoning", arXiv:2505.24298: importance weight
  pi_prox / mu (truncated at the cap), clipping around pi_prox. Tokens whose old and sampler
  log-probs differ by more than `ratio_guard` nats are dropped from every term. The output head
  runs `config.logits_chunk` positions at a time, vocabulary-parallel on `mesh`.

  With `normaliser` = {"policy": f32[], "tokens": f32[]} (a microbatch of a larger minibatch, see
  `accumulated_gradients`) the policy, KL and entropy terms divide by the minibatch's aggregation
  normaliser and the value loss by the minibatch's token count, so the microbatches' losses sum to
  the minibatch's (exactly when no ratio guard drops tokens; the guard's dropped tokens still count
  in the minibatch's normaliser).

  Args:
    trained: the trainable parameters, or (parameters, value head) with PPO.
    view: the minibatch's rows (`TrainView`).
    graphdef, frozen: the model's graph and its untrained parameters (None: full fine-tuning).
    group: rows per prompt (G).
    config: the learn settings (`LearnConfig`).
    temperature: f32[] the rollout's sampling temperature (the adaptive controller's), or None
      for the static `config.temperature`.

  Returns:
    (loss, metrics): metrics are scalars; "logp_old" f32[b, T] (the old log-probs the loss used)
    is returned too, for the rollback's KL after the step.
  """
  trainable, value = trained if config.algorithm == "ppo" else (trained, None)
  params = forward.model_params(trainable, frozen)
  hidden = forward.completion_hidden(graphdef, params, view.prompt_tokens, view.prompt_mask,
                                     view.tokens, group, constrain=forward.row_constraint(mesh))
  logp, entropy = forward.head_logprobs(graphdef, params, hidden, view.tokens,
                                        temperature=(config.temperature if temperature is None
                                                     else temperature),
                                        chunk_size=config.logits_chunk or None,
                                        vocab_mesh=mesh,
                                        entropy_grad=config.entropy_coef is not None)
  if view.logp_old is not None:
    old = view.logp_old
  elif view.staleness is not None:  # proximal="loglinear": no forward pass of the old policy
    old = off_policy.loglinear_proximal_logprobs(view.sampler_logprobs, logp, view.staleness)
  else:
    old = jax.lax.stop_gradient(logp)
  norm = normaliser or {"policy": None, "tokens": None}
  m, guard_frac = view.mask, jnp.zeros(())
  if config.ratio_guard is not None:
    # Tokens where sampler and trainer disagree wildly (numerics, stale weights) are dropped.
    m, guard_frac = stability.ratio_guard(old, view.sampler_logprobs, m,
                                          max_log_ratio=config.ratio_guard)
  advantages, tis_metrics = view.advantages, {}
  if config.tis_cap is not None:
    advantages, tis_metrics = truncated_is(advantages, old, view.sampler_logprobs, m,
                                           cap=config.tis_cap)
  pg_loss, metrics = losses.policy_loss(
      logp, old, advantages, m, eps_low=config.eps_low, eps_high=config.eps_high,
      level=config.level, aggregation=config.aggregation, max_tokens=config.max_tokens,
      normaliser=norm["policy"], dual_clip=config.dual_clip)
  loss = pg_loss
  metrics = {**metrics, **tis_metrics, "pg_loss": pg_loss, "ratio_guard_frac": guard_frac,
             "sampler_logp_gap": losses.masked_mean(jnp.abs(old - view.sampler_logprobs), m),
             "entropy": losses.masked_mean(entropy, m)}
  if config.entropy_coef is not None:
    bonus = entropy_term(entropy, m, config, norm["policy"])
    loss = loss - config.entropy_coef * bonus
    metrics["entropy_bonus"] = bonus
  if config.kl_coef is not None:  # (no "kl" metric without the term)
    kl = losses.aggregate(
        losses.kl_divergence(logp, view.logp_ref, estimator=config.kl_estimator), m,
        config.aggregation, config.max_tokens, norm["policy"])
    loss = loss + config.kl_coef * kl
    metrics["kl"] = kl
  if value is not None:
    value_hidden = jax.lax.stop_gradient(hidden) if config.value_detach else hidden
    v_loss, v_metrics = losses.value_loss(forward.values_from_hidden(value, value_hidden),
                                          view.values_old, view.returns, m, clip=config.vf_clip)
    if norm["tokens"] is not None:  # a token mean over this microbatch -> share of the minibatch's
      v_loss = v_loss * jnp.maximum(jnp.sum(m), 1e-8) / norm["tokens"]
    loss = loss + config.vf_coef * v_loss
    metrics = {**metrics, **v_metrics, "value_loss": v_loss}
  return loss, {**metrics, "logp_old": old}


def truncated_is(advantages: jax.Array, logp_old: jax.Array, sampler_logprobs: jax.Array,
                 mask: jax.Array, *, cap: float) -> tuple[jax.Array, dict]:
  """Per-token advantages f32[B, T] times the truncated importance weights
  w = min(pi_old / pi_sampler, cap) of the sampled tokens (`off_policy.truncated_is_weights`), which
  correct the loss for the sampler's numerics differing from the trainer's; and the metrics
  "tis_weight_mean" (masked mean of w) and "tis_truncated_frac" (masked share of tokens whose
  weight the cap truncated).

  Reference: Yao et al. (2025), "Your Efficient RL Framework Secretly Brings You Off-Policy RL
  Training", https://fengyao.notion.site/off-policy-rl.
  """
  w = off_policy.truncated_is_weights(logp_old, sampler_logprobs, cap=cap)
  return advantages * w, {
      "tis_weight_mean": losses.masked_mean(w, mask),
      "tis_truncated_frac": losses.masked_mean((w >= cap).astype(jnp.float32), mask)}


def entropy_term(entropy: jax.Array, mask: jax.Array, config: LearnConfig,
                 normaliser: Optional[jax.Array]) -> jax.Array:
  """f32[] the entropy bonus `losses.entropy_bonus` aggregated like the policy loss; with the
  `normaliser` of a larger minibatch (`accumulated_gradients`), this microbatch's share of it."""
  bonus = losses.entropy_bonus(entropy, mask, aggregation=config.aggregation,
                               max_tokens=config.max_tokens)
  if normaliser is None:
    return bonus
  return bonus * losses.aggregation_normaliser(mask, config.aggregation) / normaliser


# --- 4. Optimizer steps over minibatches --------------------------------------------------------


def minibatch_rows(key: jax.Array, num_prompts: int, group: int, minibatches: int) -> jax.Array:
  """i32[M, (P / M) * G] row indices: prompts shuffled, each minibatch holds whole groups."""
  prompts = jax.random.permutation(key, num_prompts)
  return forward.trained_rows(prompts, group).reshape(minibatches, -1)


# Objective terms that microbatches add up (each already divided by the minibatch's normaliser);
# metrics named *_max take the maximum; every other metric is a token-weighted mean.
_SUMMED_TERMS = ("pg_loss", "kl", "value_loss", "entropy_bonus")


def accumulated_gradients(objective: Callable, trained: Any, minibatch: TrainView, *, group: int,
                          microbatches: int, aggregation: str, mesh: Any = None
                          ) -> tuple[jax.Array, dict, Any, jax.Array]:
  """Loss, metrics and gradients of one minibatch computed `microbatches` groups-blocks at a time
  (gradient accumulation under `lax.scan`; memory is that of one microbatch).

  Every microbatch's objective divides by the whole minibatch's normaliser
  (`losses.aggregation_normaliser` of its mask, and its token count), so the accumulated loss and
  gradients are those of the minibatch in one pass for every aggregation mode, not an average of
  per-microbatch means. Gradients accumulate in float32.

  Args:
    objective: `policy_objective` with everything but (trained, view, normaliser) bound.
    trained: the parameters being differentiated.
    minibatch: the minibatch's rows (whole groups of `group`), split into `microbatches` blocks
      of whole groups, or of equal parts of every group when there are fewer groups than
      microbatches (`forward.split_row_blocks`; `objective` then runs on the parts).
    mesh: each microbatch's rows are constrained over its batch axes (`mesh_lib.constrain_rows`).

  Returns:
    (loss f32[], metrics, grads, logp_old f32[b, T] in the minibatch's row order).
  """
  norm = {"policy": losses.aggregation_normaliser(minibatch.mask, aggregation),
          "tokens": jnp.maximum(jnp.sum(minibatch.mask), 1e-8)}
  blocks = forward.split_row_blocks(minibatch, group=group, num_blocks=microbatches)
  grad_fn = jax.value_and_grad(functools.partial(objective, normaliser=norm), has_aux=True)

  def body(acc, micro):
    micro = mesh_lib.constrain_rows(micro, mesh)
    (loss, metrics), grads = grad_fn(trained, micro)
    acc = jax.tree.map(lambda a, g: a + g.astype(jnp.float32), acc, grads)
    logp_old = metrics.pop("logp_old")
    return acc, (loss, metrics, jnp.sum(micro.mask) / norm["tokens"], logp_old)

  zeros = jax.tree.map(lambda x: jnp.zeros(x.shape, jnp.float32), trained)
  grads, (loss, per_micro, weight, logp_old) = jax.lax.scan(body, zeros, blocks)
  grads = jax.tree.map(lambda g, x: g.astype(x.dtype), grads, trained)

  def combine(name, x):
    if name in _SUMMED_TERMS:
      return jnp.sum(x)
    if name.endswith("_max"):
      return jnp.max(x)
    return jnp.sum(x * weight)

  metrics = {name: combine(name, x) for name, x in per_micro.items()}
  return jnp.sum(loss), metrics, grads, forward.merge_row_blocks(logp_old, group=group)


def minibatch_updates(trained: Any, opt_state: Any, view: TrainView, key: jax.Array, *,
                      graphdef, frozen: Any, group: int, optimizer: optax.GradientTransformation,
                      config: LearnConfig, mesh: Any = None,
                      temperature: Optional[jax.Array] = None, adapters: bool = False
                      ) -> tuple[Any, Any, dict, jax.Array]:
  """Phase 4: `epochs` x `minibatches` optimizer steps over the view, under `lax.scan`.

  Each epoch shuffles the groups (`fold_in(key, epoch)`). A minibatch whose mask is all zero
  (padding groups only, e.g. a filter that could not fill the batch) takes no step: Adam's
  momentum would otherwise move the parameters on a zero gradient. With `config.microbatches` > 1
  each step's gradient is accumulated over that many microbatches (`accumulated_gradients`).
  With `adapters` (the trained policy parameters are LoRA adapters) every optimizer step measures
  `stability.adapter_health` of the adapters: "adapter_grad_norm", "adapter_update_norm" (of that
  optimizer step) and "adapter_param_norm" (after it) are means over the steps like the other
  metrics; "adapter_frozen" is 1.0 when the gradient or the update was exactly 0 on every step
  (a minibatch whose groups all lack an advantage has a zero gradient; alone it does not make the
  update frozen).

  `temperature` (f32[] or None) is `policy_objective`'s.

  With `config.rollback` = "minibatch" an optimizer step whose loss or gradients are not finite
  is not applied (the parameters and optimizer state stay as they were; "steps_discarded"
  counts them).

  Returns:
    (trained, opt_state, metrics, logp_old): metrics f32[] are means over the minibatches that
    stepped (including "loss" and "grad_norm"; 0 when none did), "steps_taken", the number
    of minibatches that stepped, and "steps_discarded"; logp_old f32[B, T] are the old
    log-probs the losses used (those of the view, or else the losses' own, on-policy or
    interpolated, from the first epoch).
  """
  num_rows = view.tokens.shape[0]
  p = num_rows // group
  rows = jnp.concatenate([minibatch_rows(jax.random.fold_in(key, e), p, group, config.minibatches)
                          for e in range(config.epochs)])
  objective = functools.partial(policy_objective, graphdef=graphdef, frozen=frozen, group=group,
                                config=config, mesh=mesh, temperature=temperature)

  def step(carry, mb_rows):
    trained, opt_state = carry
    mb = mesh_lib.constrain_rows(jax.tree.map(lambda x: x[mb_rows], view), mesh)
    if config.microbatches == 1:
      (loss, metrics), grads = jax.value_and_grad(objective, has_aux=True)(trained, mb)
      logp_old = metrics.pop("logp_old")
    else:   # a microbatch may hold parts of groups (`forward.block_group`)
      part = forward.block_group(mb_rows.shape[0], group, config.microbatches)
      loss, metrics, grads, logp_old = accumulated_gradients(
          functools.partial(objective, group=part), trained, mb, group=group,
          microbatches=config.microbatches, aggregation=config.aggregation, mesh=mesh)
    updates, new_opt_state = optimizer.update(grads, opt_state, trained)
    new_trained = optax.apply_updates(trained, updates)
    has_tokens = jnp.sum(mb.mask) > 0
    steps = has_tokens
    if config.rollback == "minibatch":  # a non-finite step is not applied (no copy kept)
      steps = has_tokens & jnp.isfinite(loss) & stability.all_finite(grads)
    if adapters:  # PPO trains (adapters, value head): the adapters are the first
      policy = (lambda tree: tree[0]) if config.algorithm == "ppo" else (lambda tree: tree)
      health = stability.adapter_health(policy(grads), policy(trained), policy(new_trained))
      metrics = {**metrics, **{k: v.astype(jnp.float32) for k, v in health.items()}}
    trained, opt_state = stability.select_tree(steps, (new_trained, new_opt_state),
                                               (trained, opt_state))
    metrics = {**metrics, "loss": loss, "grad_norm": optax.tree.norm(grads),
               "steps_taken": steps.astype(jnp.float32),
               "steps_discarded": (has_tokens & ~steps).astype(jnp.float32)}
    return (trained, opt_state), (metrics, logp_old)

  (trained, opt_state), (per_mb, old_mb) = jax.lax.scan(step, (trained, opt_state), rows)
  # Means over the minibatches that stepped: padding-only ones would dilute every average.
  stepped = per_mb["steps_taken"]
  metrics = jax.tree.map(
      lambda x: jnp.sum(jnp.where(stepped > 0, x, 0.0)) / jnp.maximum(jnp.sum(stepped), 1.0),
      per_mb)
  metrics["steps_taken"] = jnp.sum(stepped)
  metrics["steps_discarded"] = jnp.sum(per_mb["steps_discarded"])
  if adapters:  # frozen for the whole update: on every optimizer step that ran
    metrics["adapter_frozen"] = jnp.min(jnp.where(stepped > 0, per_mb["adapter_frozen"], 1.0))
  logp_old = view.logp_old
  if logp_old is None:  # the losses' own old log-probs, from the first epoch's minibatches
    first = rows[:config.minibatches]
    logp_old = jnp.zeros(view.tokens.shape, jnp.float32).at[first.reshape(-1)].set(
        old_mb[:config.minibatches].reshape((-1,) + view.tokens.shape[1:]))
  return trained, opt_state, metrics, logp_old
