"""The learn half of an RL step: one jitted program from a scored rollout to new parameters.

  train_state, cur_state, metrics = learn(train_state, cur_state, batch, key, ...)

Inside one jit: rewards -> (whitening) -> group advantages -> curriculum update -> log-probs of
the old policy and the reference -> `epochs` passes of `minibatches` optimizer steps (minibatches
are whole groups) -> stability check (a non-finite or runaway update is discarded and the
parameters and optimizer state roll back; `skipped` counts it).

Forward passes per step (the configuration is static, so the choice is made at trace time); each
runs a group's prompt once and its G completions on the prompt's shared keys and values
(`transformer.shared_prefix_hidden`: P Tp + B T token-passes instead of B (Tp + T)):
  old policy   only when there is more than one optimizer step per batch (epochs x minibatches
               > 1) or a critic (PPO); with one step the old policy is the policy being
               differentiated, and logp_old = stop_gradient(logp) inside the loss (the same
               values, one forward pass fewer).
  reference    only when kl_coef != 0; otherwise there is no "kl" metric (not measured).
  policy       forward and backward, once per minibatch.

Rows are prompt-major: row b = p * G + g holds completion g of prompt p. A batch may hold more
groups than the policy trains on (over-sampling for a post-rollout filter): the curriculum sees
every sampled group, the policy loss only the `train_groups`.
"""

import dataclasses
import functools
from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import optax

from rl_curriculum.model import lora as lora_lib
from rl_curriculum.model import transformer
from rl_curriculum.rl import advantages as adv_lib
from rl_curriculum.rl import logprobs as logprobs_lib
from rl_curriculum.rl import losses
from rl_curriculum.rl import stability
from rl_curriculum.types import Feedback

ADVANTAGES = {
    "rloo": adv_lib.rloo,
    "grpo": adv_lib.grpo,
    "dr_grpo": adv_lib.dr_grpo,
    "reinforce_pp": adv_lib.reinforce_pp,
}


class TrainState(NamedTuple):
  """Everything the optimizer owns; saved in every checkpoint."""
  step: jax.Array                        # i32[] RL updates attempted
  params: Any                            # trainable parameters (full model or LoRA adapters)
  opt_state: Any                         # optax state of `params` (of (params, value) with PPO)
  whitening: stability.WhiteningState    # running reward statistics
  skipped: jax.Array                     # i32[] updates discarded by the stability checks
  value: Any = None                      # PPO value head {"w": f32[D], "b": f32[]}, else None


class Batch(NamedTuple):
  """A scored rollout of S sampled prompts x G completions (B = S * G rows), of which P groups
  (S = P without a filter) are trained on. The G rows of a group repeat its prompt (the learn
  step runs each group's prompt once, from the group's first row)."""
  prompt_tokens: jax.Array     # i32[B, Tp] left-padded prompts
  prompt_mask: jax.Array       # bool[B, Tp] True on real prompt tokens
  tokens: jax.Array            # i32[B, T] completion tokens
  mask: jax.Array              # f32[B, T] 1 on completion tokens that count
  sampler_logprobs: jax.Array  # f32[B, T] log-probs the sampler reported
  prompt_ids: jax.Array        # i32[P] pool indices
  arms: jax.Array              # i32[P] curriculum arms
  rewards: jax.Array           # f32[P, G] shaped rewards
  correct: jax.Array           # bool[P, G] raw correctness
  valid: jax.Array             # bool[S, G] completions that exist (all True unless allocated)
  train_groups: jax.Array      # i32[P] groups (indices into S) the policy trains on
  train_valid: jax.Array       # bool[P] False on padding slots a filter could not fill


@dataclasses.dataclass(frozen=True)
class LearnConfig:
  """Static hyperparameters of `learn` (hashable: part of the jit cache key)."""
  algorithm: str = "rloo"
  epochs: int = 1
  minibatches: int = 1
  eps_low: float = 0.2
  eps_high: float = 0.2
  level: str = "token"
  aggregation: str = "token_mean"
  max_tokens: Optional[int] = None
  kl_coef: float = 0.0
  kl_estimator: str = "k3"
  ratio_guard: float = 0.0
  max_kl: Optional[float] = None
  whiten_rewards: bool = False
  gamma: float = 1.0       # PPO: discount per token
  lam: float = 0.95        # PPO: GAE lambda
  vf_coef: float = 0.5     # PPO: value-loss weight
  vf_clip: float = 0.2     # PPO: value clipping range


def init_value_head(width: int) -> dict:
  """PPO's value head on the policy's final hidden states: v = h . w + b, starting at 0."""
  return {"w": jnp.zeros((width,), jnp.float32), "b": jnp.zeros((), jnp.float32)}


def init_train_state(params: Any, optimizer: optax.GradientTransformation,
                     value: Any = None) -> TrainState:
  """A fresh train state (`value`: a value head for PPO). Every leaf is a private copy: the learn
  step donates the whole state, so it must share no buffer with anything else (the KL reference
  is often the same weights)."""
  trained = params if value is None else (params, value)
  state = TrainState(step=jnp.zeros((), jnp.int32), params=params,
                     opt_state=optimizer.init(trained), whitening=stability.whitening_init(),
                     skipped=jnp.zeros((), jnp.int32), value=value)
  return jax.tree.map(lambda x: jnp.array(x, copy=True), state)


def model_params(trainable: Any, frozen: Any) -> Any:
  """The argument `transformer.forward` takes: the trainable state alone, or (trainable, frozen)."""
  return trainable if frozen is None else (trainable, frozen)


def completion_hidden(graphdef, params, prompt_tokens, prompt_mask, tokens,
                      group: int = 1) -> jax.Array:
  """Final hidden states [B, T, D] at the positions that predict each completion token.

  The sequence is prompt ++ completion; position Tp - 1 + t predicts completion token t. Tokens
  after a row's stop are padding but only ever attend backwards, so they change nothing that
  counts. With `group` > 1 the rows come in runs of `group` completions of one prompt (a rollout
  group; each run's prompt rows are equal and the first is used): the prompt runs once per group
  (`transformer.shared_prefix_hidden`), with the same result up to float rounding.
  """
  tp, t = prompt_tokens.shape[1], tokens.shape[1]
  if group > 1:
    first = lambda x: x.reshape((-1, group) + x.shape[1:])[:, 0]
    prompt_hidden, hidden = transformer.shared_prefix_hidden(
        graphdef, params, first(prompt_tokens), first(prompt_mask), tokens)
    last = jnp.repeat(prompt_hidden[:, -1:], group, axis=0)
    return jnp.concatenate([last, hidden[:, :t - 1]], axis=1)
  seq = jnp.concatenate([prompt_tokens, tokens], axis=1)
  seq_mask = jnp.concatenate([prompt_mask.astype(bool), jnp.ones(tokens.shape, bool)], axis=1)
  hidden = transformer.forward_hidden(graphdef, params, seq, seq_mask)
  return hidden[:, tp - 1:tp - 1 + t]


def completion_logits(graphdef, params, prompt_tokens, prompt_mask, tokens,
                      group: int = 1) -> jax.Array:
  """Logits f32[B, T, V] predicting each completion token (`group`: see `completion_hidden`)."""
  hidden = completion_hidden(graphdef, params, prompt_tokens, prompt_mask, tokens, group)
  return transformer.logits_from_hidden(graphdef, params, hidden)


def values_from_hidden(value: dict, hidden: jax.Array) -> jax.Array:
  """f32[B, T] value estimates of the value head on hidden states [B, T, D]."""
  return jnp.einsum("btd,d->bt", hidden.astype(jnp.float32), value["w"]) + value["b"]


def outcome_token_rewards(rewards: jax.Array, mask: jax.Array) -> jax.Array:
  """f32[B, T]: each completion's scalar reward f32[B] on its last counted token, 0 elsewhere."""
  last = jnp.maximum(jnp.sum(mask > 0, axis=1) - 1, 0)
  on_last = jnp.arange(mask.shape[1])[None, :] == last[:, None]
  return jnp.where(on_last & (mask > 0), rewards[:, None], 0.0)


def completion_logprobs(graphdef, params, prompt_tokens, prompt_mask, tokens,
                        group: int = 1) -> jax.Array:
  """f32[B, T] log-probs of the completion tokens (see `completion_logits`)."""
  logits = completion_logits(graphdef, params, prompt_tokens, prompt_mask, tokens, group)
  return logprobs_lib.token_logprobs(logits, tokens)


def group_advantages(rewards: jax.Array, valid: jax.Array, algorithm: str) -> jax.Array:
  """f32[P, G] advantages of the configured estimator; zero on invalid slots.

  PPO's own advantages are per token (GAE on a value head); for the curriculum's feedback PPO
  uses the group-relative RLOO advantage of the outcome rewards, which does not depend on how
  well the critic has learned yet.
  """
  if algorithm == "ppo":
    algorithm = "rloo"
  if algorithm not in ADVANTAGES:
    raise ValueError(f"unknown RL algorithm {algorithm!r}; choose from "
                     f"{sorted(ADVANTAGES) + ['ppo']}")
  return ADVANTAGES[algorithm](rewards, valid=valid) * valid


def _minibatch_rows(key: jax.Array, num_prompts: int, group: int, minibatches: int) -> jax.Array:
  """i32[M, (P / M) * G] row indices: prompts shuffled, each minibatch holds whole groups."""
  prompts = jax.random.permutation(key, num_prompts).reshape(minibatches, -1)
  return (prompts[:, :, None] * group + jnp.arange(group)[None, None, :]).reshape(minibatches, -1)


def learn(train_state: TrainState, cur_state: Any, batch: Batch, key: jax.Array, *,
          graphdef, frozen: Any, ref_params: Any, optimizer: optax.GradientTransformation,
          curriculum_update: Callable, config: LearnConfig, use_lora: bool):
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

  Returns:
    (train_state, cur_state, metrics): metrics are scalars (and per-arm vectors from the
    curriculum) averaged over minibatches.
  """
  s, g = batch.rewards.shape
  if batch.tokens.shape[0] != s * g:
    raise ValueError(f"batch rows {batch.tokens.shape[0]} != prompts {s} x group {g}")
  p = batch.train_groups.shape[0]
  b, t = p * g, batch.tokens.shape[1]
  if p % config.minibatches:
    raise ValueError(f"{p} prompts do not split into {config.minibatches} minibatches")
  valid = batch.valid.astype(bool)

  # Rewards and advantages (per completion), then the curriculum's feedback.
  whitening = train_state.whitening
  rewards = batch.rewards
  if config.whiten_rewards:
    whitening = stability.whitening_update(whitening, rewards, valid)
    rewards = stability.whiten(whitening, rewards)
  advantages = group_advantages(rewards, valid, config.algorithm)
  feedback = Feedback(prompt_ids=batch.prompt_ids, arms=batch.arms, rewards=batch.rewards,
                      correct=batch.correct, advantages=advantages, valid=valid)
  cur_state, cur_metrics = curriculum_update(cur_state, feedback)

  # The groups the policy trains on.
  rows = (batch.train_groups[:, None] * g + jnp.arange(g)[None, :]).reshape(b)
  batch_valid = valid
  valid = valid[batch.train_groups] & batch.train_valid[:, None]
  advantages_train = advantages[batch.train_groups] * valid
  batch = batch._replace(prompt_tokens=batch.prompt_tokens[rows],
                         prompt_mask=batch.prompt_mask[rows], tokens=batch.tokens[rows],
                         mask=batch.mask[rows], sampler_logprobs=batch.sampler_logprobs[rows])
  row_valid = valid.reshape(b).astype(jnp.float32)
  mask = batch.mask * row_valid[:, None]
  adv_tokens = adv_lib.broadcast_to_tokens(advantages_train.reshape(b), mask)

  # The old policy (this step's parameters) and the reference, without gradients. With a single
  # optimizer step over the batch and no critic (`on_policy`) the old policy IS the policy being
  # differentiated: logp_old = stop_gradient(logp) inside the loss, and its forward pass is
  # skipped. Without a KL term (kl_coef = 0) the reference's forward pass is skipped too.
  ppo = config.algorithm == "ppo"
  on_policy = config.epochs * config.minibatches == 1 and not ppo
  use_ref = config.kl_coef != 0
  params = model_params(train_state.params, frozen)
  hidden_old = logp_old = None
  if not on_policy:
    hidden_old = jax.lax.stop_gradient(completion_hidden(
        graphdef, params, batch.prompt_tokens, batch.prompt_mask, batch.tokens, g))
    logp_old = logprobs_lib.token_logprobs(
        transformer.logits_from_hidden(graphdef, params, hidden_old), batch.tokens)
  values_old = returns = None
  if ppo:
    # Outcome reward on the last token, GAE on the value head, advantages whitened over tokens.
    values_old = values_from_hidden(train_state.value, hidden_old) * mask
    rewards_train = (rewards[batch.train_groups] * valid).reshape(b)
    adv_tokens, returns = adv_lib.gae(outcome_token_rewards(rewards_train, mask), values_old,
                                      mask, gamma=config.gamma, lam=config.lam)
    mean = losses.masked_mean(adv_tokens, mask)
    std = jnp.sqrt(losses.masked_mean(jnp.square(adv_tokens - mean), mask))
    adv_tokens = jnp.where(mask > 0, (adv_tokens - mean) / (std + 1e-6), 0.0)
  logp_ref = None
  if use_ref:
    ref = lora_lib.disable(params) if use_lora else ref_params
    logp_ref = jax.lax.stop_gradient(completion_logprobs(
        graphdef, ref, batch.prompt_tokens, batch.prompt_mask, batch.tokens, g))
  guard_frac = jnp.zeros(())
  if config.ratio_guard > 0 and not on_policy:
    # Tokens where the sampler and the trainer disagree wildly (numerics, stale weights) are dropped.
    mask, guard_frac = stability.ratio_guard(logp_old, batch.sampler_logprobs, mask,
                                             max_log_ratio=config.ratio_guard)
  max_tokens = config.max_tokens or t

  def loss_fn(trained, rows):
    trainable, value = trained if ppo else (trained, None)
    hidden = completion_hidden(graphdef, model_params(trainable, frozen),
                               batch.prompt_tokens[rows], batch.prompt_mask[rows],
                               batch.tokens[rows], g)
    logits = transformer.logits_from_hidden(graphdef, model_params(trainable, frozen), hidden)
    logp = logprobs_lib.token_logprobs(logits, batch.tokens[rows])
    m = mask[rows]
    extra = {}
    if on_policy:
      old = jax.lax.stop_gradient(logp)
      guard = jnp.zeros(())
      if config.ratio_guard > 0:
        m, guard = stability.ratio_guard(old, batch.sampler_logprobs[rows], m,
                                         max_log_ratio=config.ratio_guard)
      extra = {"ratio_guard_frac": guard,
               "sampler_logp_gap": losses.masked_mean(
                   jnp.abs(old - batch.sampler_logprobs[rows]), m),
               "completion_len": jnp.sum(m) / jnp.maximum(row_valid.sum(), 1)}
    else:
      old = logp_old[rows]
    pg_loss, pg_metrics = losses.policy_loss(
        logp, old, adv_tokens[rows], m, eps_low=config.eps_low,
        eps_high=config.eps_high, level=config.level, aggregation=config.aggregation,
        max_tokens=max_tokens)
    loss = pg_loss
    if use_ref:  # (kl_coef = 0: no reference pass, and no "kl" metric)
      kl = losses.masked_mean(
          losses.kl_divergence(logp, logp_ref[rows], estimator=config.kl_estimator), m)
      loss = pg_loss + config.kl_coef * kl
      extra = {**extra, "kl": kl}
    entropy = losses.masked_mean(logprobs_lib.token_entropy(jax.lax.stop_gradient(logits)), m)
    if ppo:
      v_loss, v_metrics = losses.value_loss(values_from_hidden(value, hidden), values_old[rows],
                                            returns[rows], m, clip=config.vf_clip)
      loss = loss + config.vf_coef * v_loss
      extra = {**extra, **v_metrics, "value_loss": v_loss}
    return loss, {**pg_metrics, **extra, "pg_loss": pg_loss, "entropy": entropy}

  def minibatch_step(carry, rows):
    trainable, opt_state = carry
    (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(trainable, rows)
    updates, opt_state = optimizer.update(grads, opt_state, trainable)
    trainable = optax.apply_updates(trainable, updates)
    metrics = {**metrics, "loss": loss, "grad_norm": optax.tree.norm(grads)}
    return (trainable, opt_state), metrics

  minibatch_rows = jnp.concatenate([
      _minibatch_rows(jax.random.fold_in(key, e), p, g, config.minibatches)
      for e in range(config.epochs)])
  old_trained = (train_state.params, train_state.value) if ppo else train_state.params
  (new_trained, new_opt_state), per_mb = jax.lax.scan(
      minibatch_step, (old_trained, train_state.opt_state), minibatch_rows)
  metrics = jax.tree.map(jnp.mean, per_mb)

  skip = stability.should_skip(metrics["loss"], metrics["approx_kl"], max_kl=config.max_kl)
  skip = skip | ~stability.all_finite(new_trained)
  new_trained = stability.select_tree(skip, old_trained, new_trained)
  new_opt_state = stability.select_tree(skip, train_state.opt_state, new_opt_state)
  new_params, new_value = new_trained if ppo else (new_trained, None)
  train_state = TrainState(step=train_state.step + 1, params=new_params, opt_state=new_opt_state,
                           whitening=whitening,
                           skipped=train_state.skipped + skip.astype(jnp.int32), value=new_value)

  # Batch statistics over every sampled group (what the curriculum chose).
  count = jnp.maximum(batch_valid.sum(), 1)
  group_signal = jnp.any(jnp.abs(advantages) > 0, axis=1) & jnp.any(batch_valid, axis=1)
  if not on_policy:  # (on-policy, the loss reports these three from its own log-probs)
    metrics.update({
        "completion_len": jnp.sum(mask) / jnp.maximum(row_valid.sum(), 1),
        "ratio_guard_frac": guard_frac,
        "sampler_logp_gap": losses.masked_mean(jnp.abs(logp_old - batch.sampler_logprobs), mask),
    })
  metrics.update({
      "reward_mean": jnp.sum(batch.rewards * batch_valid) / count,
      "correct_mean": jnp.sum(batch.correct & batch_valid) / count,
      "abs_adv_mean": jnp.sum(jnp.abs(advantages)) / count,
      "nonzero_adv_frac": group_signal.sum() / jnp.maximum(jnp.any(batch_valid, axis=1).sum(), 1),
      "update_skipped": skip.astype(jnp.float32),
      "skipped_total": train_state.skipped,
  })
  return train_state, cur_state, {**metrics, "curriculum": cur_metrics}


def make_learn(*, graphdef, optimizer, curriculum_update, config: LearnConfig, use_lora: bool,
               out_shardings: Any = None):
  """`learn` jitted once, with the train state donated: fn(train_state, cur_state, batch, key,
  frozen, ref_params).

  Sharded runs place the inputs (`parallel.distributed.place`) and pass `out_shardings` =
  (train state shardings, curriculum state sharding, metrics sharding) (a prefix tree, e.g. one
  replicated NamedSharding for the last two), so the parameters keep their layout step after
  step and the donated buffers are reused; jit partitions the rest from the inputs (GSPMD).
  """
  fn = functools.partial(learn, graphdef=graphdef, optimizer=optimizer,
                         curriculum_update=curriculum_update, config=config, use_lora=use_lora)

  def step(train_state, cur_state, batch, key, frozen, ref_params):
    return fn(train_state, cur_state, batch, key, frozen=frozen, ref_params=ref_params)

  return jax.jit(step, donate_argnums=(0,), out_shardings=out_shardings)
