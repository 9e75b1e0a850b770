"""The learn half of an RL step: one jitted program from a scored rollout to new parameters.

  train_state, cur_state, metrics = learn(train_state, cur_state, batch, key, ...)

`learn` runs six phases, each a module-level function that can be tested alone:

  1. feedback   `score_groups`: rewards -> (whitening) -> advantages f32[S, G] of every sampled
                group, and the curriculum's `Feedback` (whose advantages come from correctness by
                default, see `LearnConfig.curriculum_feedback`); then `Curriculum.update`.
  2. view       `train_view`: the P trained groups as B = P * G rows (`TrainView`): per-token
                advantages, mask, the old policy's and the reference's log-probs, values and
                returns (PPO).
  3. objective  `policy_objective`: loss and metrics of one minibatch of rows (the only function
                that differentiates the policy).
  4. updates    `minibatch_updates`: `epochs` passes of `minibatches` optimizer steps under
                `lax.scan` (whole groups per minibatch); a minibatch made only of padding groups
                leaves the parameters and the optimizer state as they were.
  5. rollback   `roll_back_if`: an update with a non-finite loss, parameter, curriculum state or
                whitening, or whose KL(pi_old || pi_new) exceeds `max_kl`, is discarded: the
                parameters, optimizer state, curriculum state and reward whitening all return to
                their values before the step (`skipped` counts it).
  6. metrics    `batch_metrics`: statistics of every sampled group and of the trained rows.

Forward passes per step (the configuration is static, so the choice is made at trace time); each
runs a group's prompt once and its G completions on the prompt's shared keys and values
(`transformer.shared_prefix_hidden`: P Tp + B T token-passes instead of B (Tp + T)):
  old policy   only when there is more than one optimizer step per batch (epochs x minibatches
               > 1) or a critic (PPO); with one step the old policy is the policy being
               differentiated, and logp_old = stop_gradient(logp) inside the loss (the same
               values, one forward pass fewer).
  reference    only when kl_coef != 0; otherwise there is no "kl" metric (not measured).
  policy       forward and backward, once per minibatch (per microbatch with gradient
               accumulation, `accumulated_gradients`).
  new policy   only when max_kl is set: one forward pass with the updated parameters, for the
               rollback's KL(pi_old || pi_new) (`update_kl`).

Every log-prob is that of the sampling distribution softmax(logits / temperature), the
distribution the rollout drew its tokens from (`forward`).

Memory: the output head runs `logits_chunk` positions at a time (`forward.head_logprobs`), and
the passes without gradient (old policy, reference, new policy) run one microbatch of rows at a
time (`row_blocks`), so neither the [rows, T, V] logits nor the activations of all rows exist at
once. With a mesh, every minibatch, microbatch and row block keeps its rows over the batch axes.

Rows are prompt-major: row b = p * G + g holds completion g of prompt p. A batch may hold more
groups (S) than the policy trains on (P; S > P with a post-rollout filter): the curriculum sees
every sampled group, the policy loss only the `train_groups`.
"""

import dataclasses
import functools
from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import optax

from rl_curriculum.model import lora as lora_lib
from rl_curriculum.parallel import mesh as mesh_lib
from rl_curriculum.rl import advantages as adv_lib
from rl_curriculum.rl import losses
from rl_curriculum.rl import stability
from rl_curriculum.train import forward
from rl_curriculum.types import Feedback

ADVANTAGES = {
    "rloo": adv_lib.rloo,
    "grpo": adv_lib.grpo,
    "dr_grpo": adv_lib.dr_grpo,
    "reinforce_pp": adv_lib.reinforce_pp,
}
CURRICULUM_FEEDBACK = ("correct", "reward")
# KL estimators that may serve as a loss term: k1's gradient has zero mean (see `check_config`).
KL_LOSS_ESTIMATORS = ("k2", "k3")


class TrainState(NamedTuple):
  """Everything the optimizer owns; saved in every checkpoint."""
  step: jax.Array                        # i32[] RL updates attempted
  params: Any                            # trainable parameters (full model or LoRA adapters)
  opt_state: Any                         # optax state of `params` (of (params, value) with PPO)
  whitening: stability.WhiteningState    # running reward statistics
  skipped: jax.Array                     # i32[] updates discarded by the stability checks
  value: Any = None                      # PPO value head {"w": f32[D], "b": f32[]}, else None


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
  valid: jax.Array             # bool[S, G] completions that exist (all True unless allocated)
  train_groups: jax.Array      # i32[P] groups (indices into S) the policy trains on
  train_valid: jax.Array       # bool[P] False on padding slots a filter could not fill


@dataclasses.dataclass(frozen=True)
class LearnConfig:
  """Static hyperparameters of `learn` (hashable: part of the jit cache key).

  No field has a default: `builders.learn_config` fills every one from `config.rl` and
  `config.curriculum`, the one place the defaults live (configs/quickstart.py documents each).
  """
  algorithm: str              # rloo | grpo | dr_grpo | reinforce_pp | ppo
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


def _chunk(config: LearnConfig) -> Optional[int]:
  return config.logits_chunk or None


def _row_layout(mesh: Any) -> Optional[Callable]:
  """`constrain(tree, axis=0)` for the forward helpers, or None without a mesh."""
  if mesh is None:
    return None
  return lambda tree, axis=0: mesh_lib.constrain_rows(tree, mesh, axis)


def row_blocks(config: LearnConfig) -> int:
  """Blocks of rows the constant passes (old policy, reference, new policy) run in: one per
  microbatch, the largest set of rows a step ever runs through the model at once."""
  return config.minibatches * config.microbatches


def constant_logprobs(graphdef, params: Any, rows: tuple, *, group: int, config: LearnConfig,
                      value: Any = None, mesh: Any = None) -> tuple[jax.Array, Optional[jax.Array]]:
  """Log-probs f32[B, T] (and with a value head its estimates f32[B, T]) of the completions in
  `rows` = (prompt_tokens, prompt_mask, tokens), without gradient, `row_blocks(config)` blocks
  of whole groups at a time (each block's rows over `mesh`'s batch axes) and the head chunked
  (`forward.head_logprobs`)."""

  def one_block(block):
    prompt_tokens, prompt_mask, tokens = mesh_lib.constrain_rows(block, mesh)
    hidden = forward.completion_hidden(graphdef, params, prompt_tokens, prompt_mask, tokens,
                                       group, constrain=_row_layout(mesh))
    logp, _ = forward.head_logprobs(graphdef, params, hidden, tokens,
                                    temperature=config.temperature, chunk_size=_chunk(config),
                                    constrain=_row_layout(mesh))
    values = None if value is None else forward.values_from_hidden(value, hidden)
    return jax.lax.stop_gradient((logp, values))

  return forward.in_row_blocks(one_block, rows, group=group, num_blocks=row_blocks(config))


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


def outcome_token_rewards(rewards: jax.Array, mask: jax.Array) -> jax.Array:
  """f32[B, T]: each completion's scalar reward f32[B] on its last counted token, 0 elsewhere."""
  last = jnp.maximum(jnp.sum(mask > 0, axis=1) - 1, 0)
  on_last = jnp.arange(mask.shape[1])[None, :] == last[:, None]
  return jnp.where(on_last & (mask > 0), rewards[:, None], 0.0)


def group_advantages(rewards: jax.Array, valid: jax.Array, algorithm: str) -> jax.Array:
  """f32[S, G] advantages of the configured estimator; zero on invalid slots.

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


# --- 1. Rewards, advantages and the curriculum's feedback ---------------------------------------


class GroupScores(NamedTuple):
  """Phase 1's output: what every sampled group's rewards mean for training and the curriculum."""
  whitening: stability.WhiteningState  # running reward statistics after this batch
  rewards: jax.Array                   # f32[S, G] rewards the policy trains on (whitened if on)
  advantages: jax.Array                # f32[S, G] the estimator's advantages of `rewards`
  feedback: Feedback                   # what `Curriculum.update` reads (every sampled group)


def score_groups(batch: Batch, whitening: stability.WhiteningState,
                 config: LearnConfig) -> GroupScores:
  """Phase 1: rewards -> (whitening) -> group advantages, and the curriculum's feedback.

  The curriculum's `Feedback.advantages` are the estimator's advantages of the raw correctness
  (`curriculum_feedback="correct"`) or of the trained rewards ("reward"). With a format bonus the
  two differ: an all-wrong group whose completions differ only in format has nonzero reward
  advantages (under GRPO exactly as large as a group with one right answer) but zero correctness
  advantages, so a curriculum fed rewards chases formatting. `Feedback.rewards` are always the
  shaped rewards, `Feedback.correct` the raw correctness.
  """
  valid = batch.valid.astype(bool)
  rewards = batch.rewards
  if config.whiten_rewards:
    whitening = stability.whitening_update(whitening, rewards, valid)
    rewards = stability.whiten(whitening, rewards)
  advantages = group_advantages(rewards, valid, config.algorithm)
  if config.curriculum_feedback == "correct":
    cur_advantages = group_advantages(batch.correct.astype(jnp.float32), valid, config.algorithm)
  else:
    cur_advantages = advantages
  feedback = Feedback(prompt_ids=batch.prompt_ids, arms=batch.arms, rewards=batch.rewards,
                      correct=batch.correct, advantages=cur_advantages, valid=valid)
  return GroupScores(whitening=whitening, rewards=rewards, advantages=advantages,
                     feedback=feedback)


# --- 2. The trained rows ------------------------------------------------------------------------


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


def on_policy(config: LearnConfig) -> bool:
  """True when one optimizer step uses the batch and there is no critic: the old policy is the
  policy being differentiated, and its forward pass is skipped."""
  return config.epochs * config.minibatches == 1 and config.algorithm != "ppo"


def trained_rows(train_groups: jax.Array, group: int) -> jax.Array:
  """i32[P * G] rows of the trained groups i32[P] (prompt-major)."""
  return (train_groups[:, None] * group + jnp.arange(group)[None, :]).reshape(-1)


def train_view(batch: Batch, scores: GroupScores, params: Any, *, graphdef, ref_params: Any,
               config: LearnConfig, use_lora: bool, value: Any = None,
               mesh: Any = None) -> TrainView:
  """Phase 2: the trained groups' rows, their per-token advantages and the constant forward
  passes (old policy, reference, values), all without gradient.

  PPO: the outcome reward on each completion's last counted token, GAE(gamma, lambda) on the value
  head's estimates at sampling time, advantages whitened over the batch's tokens. With an
  untrained critic (V = 0) the advantage of token t is lambda^(L - 1 - t) r for a completion of L
  tokens, so lambda < 1 shrinks the early tokens' advantages of long completions towards 0;
  lambda = 1 gives every token r - V(t).
  """
  _, g = batch.rewards.shape
  rows = trained_rows(batch.train_groups, g)
  valid = batch.valid.astype(bool)[batch.train_groups] & batch.train_valid[:, None]
  row_valid = valid.reshape(-1).astype(jnp.float32)
  mask = batch.mask[rows] * row_valid[:, None]
  prompt_tokens, prompt_mask = batch.prompt_tokens[rows], batch.prompt_mask[rows]
  tokens = batch.tokens[rows]
  advantages = scores.advantages[batch.train_groups] * valid
  adv_tokens = adv_lib.broadcast_to_tokens(advantages.reshape(-1), mask)

  logprobs = functools.partial(constant_logprobs, graphdef, rows=(prompt_tokens, prompt_mask,
                                                                   tokens), group=g, config=config,
                               mesh=mesh)
  logp_old = values_old = returns = logp_ref = None
  if not on_policy(config):
    ppo = config.algorithm == "ppo"
    logp_old, values_old = logprobs(params, value=value if ppo else None)
    if ppo:
      values_old = values_old * mask
      rewards = (scores.rewards[batch.train_groups] * valid).reshape(-1)
      adv_tokens, returns = adv_lib.gae(outcome_token_rewards(rewards, mask), values_old, mask,
                                        gamma=config.gamma, lam=config.lam)
      mean = losses.masked_mean(adv_tokens, mask)
      std = jnp.sqrt(losses.masked_mean(jnp.square(adv_tokens - mean), mask))
      adv_tokens = jnp.where(mask > 0, (adv_tokens - mean) / (std + 1e-6), 0.0)
  if config.kl_coef != 0:
    ref = lora_lib.disable(params) if use_lora else ref_params
    logp_ref, _ = logprobs(ref)
  return TrainView(prompt_tokens=prompt_tokens, prompt_mask=prompt_mask, tokens=tokens, mask=mask,
                   advantages=adv_tokens, sampler_logprobs=batch.sampler_logprobs[rows],
                   logp_old=logp_old, logp_ref=logp_ref, values_old=values_old, returns=returns)


# --- 3. The objective of one minibatch ----------------------------------------------------------


def policy_objective(trained: Any, view: TrainView, *, graphdef, frozen: Any, group: int,
                     config: LearnConfig, normaliser: Optional[dict] = None,
                     mesh: Any = None) -> tuple[jax.Array, dict]:
  """Phase 3: loss f32[] and metrics of one minibatch `view` (whole groups of `group` rows).

  loss = policy_loss + kl_coef * KL + vf_coef * value_loss (each term present only when
  configured). The KL term is aggregated over tokens like the policy loss (`config.aggregation`).
  Tokens whose old and sampler log-probs differ by more than `ratio_guard` nats are dropped from
  every term. The output head runs `config.logits_chunk` positions at a time.

  With `normaliser` = {"policy": f32[], "tokens": f32[]} (a microbatch of a larger minibatch, see
  `accumulated_gradients`) the policy and KL terms divide by the minibatch's aggregation
  normaliser and the value loss by the minibatch's token count, so the microbatches' losses sum to
  the minibatch's (exactly when no ratio guard drops tokens; the guard's dropped tokens still count
  in the minibatch's normaliser).

  Args:
    trained: the trainable parameters, or (parameters, value head) with PPO.
    view: the minibatch's rows (`TrainView`).
    graphdef, frozen: the model's graph and its untrained parameters (None: full fine-tuning).
    group: rows per prompt (G).
    config: static hyperparameters.

  Returns:
    (loss, metrics): metrics are scalars; "logp_old" f32[b, T] (the old log-probs the loss used)
    is returned too, for the rollback's KL after the step.
  """
  trainable, value = trained if config.algorithm == "ppo" else (trained, None)
  params = forward.model_params(trainable, frozen)
  hidden = forward.completion_hidden(graphdef, params, view.prompt_tokens, view.prompt_mask,
                                     view.tokens, group, constrain=_row_layout(mesh))
  logp, entropy = forward.head_logprobs(graphdef, params, hidden, view.tokens,
                                        temperature=config.temperature, chunk_size=_chunk(config),
                                        constrain=_row_layout(mesh))
  old = jax.lax.stop_gradient(logp) if view.logp_old is None else view.logp_old
  norm = normaliser or {"policy": None, "tokens": None}
  m, guard_frac = view.mask, jnp.zeros(())
  if config.ratio_guard > 0:
    # Tokens where the sampler and the trainer disagree wildly (numerics, stale weights) are dropped.
    m, guard_frac = stability.ratio_guard(old, view.sampler_logprobs, m,
                                          max_log_ratio=config.ratio_guard)
  pg_loss, metrics = losses.policy_loss(
      logp, old, view.advantages, m, eps_low=config.eps_low, eps_high=config.eps_high,
      level=config.level, aggregation=config.aggregation, max_tokens=config.max_tokens,
      normaliser=norm["policy"])
  loss = pg_loss
  metrics = {**metrics, "pg_loss": pg_loss, "ratio_guard_frac": guard_frac,
             "sampler_logp_gap": losses.masked_mean(jnp.abs(old - view.sampler_logprobs), m),
             "entropy": losses.masked_mean(entropy, m)}
  if view.logp_ref is not None:  # (kl_coef = 0: no reference pass, and no "kl" metric)
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


# --- 4. Optimizer steps over minibatches --------------------------------------------------------


def minibatch_rows(key: jax.Array, num_prompts: int, group: int, minibatches: int) -> jax.Array:
  """i32[M, (P / M) * G] row indices: prompts shuffled, each minibatch holds whole groups."""
  prompts = jax.random.permutation(key, num_prompts)
  return trained_rows(prompts, group).reshape(minibatches, -1)


# Objective terms that microbatches add up (each already divided by the minibatch's normaliser);
# metrics named *_max take the maximum; every other metric is a token-weighted mean.
_SUMMED_TERMS = ("pg_loss", "kl", "value_loss")


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
      of whole groups (`forward.split_row_blocks`).
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
                      config: LearnConfig, mesh: Any = None) -> tuple[Any, Any, dict, jax.Array]:
  """Phase 4: `epochs` x `minibatches` optimizer steps over the view, under `lax.scan`.

  Each epoch shuffles the groups (`fold_in(key, epoch)`). A minibatch whose mask is all zero
  (padding groups only, e.g. a filter that could not fill the batch) takes no step: Adam's
  momentum would otherwise move the parameters on a zero gradient. With `config.microbatches` > 1
  each step's gradient is accumulated over that many microbatches (`accumulated_gradients`).

  Returns:
    (trained, opt_state, metrics, logp_old): metrics f32[] are means over the minibatches that
    stepped (including "loss" and "grad_norm"; 0 when none did), and "steps_taken", the number
    of minibatches that stepped; logp_old f32[B, T] are the old log-probs the losses used (those
    of the view, or on-policy the loss's own stop-gradient log-probs).
  """
  num_rows = view.tokens.shape[0]
  p = num_rows // group
  rows = jnp.concatenate([minibatch_rows(jax.random.fold_in(key, e), p, group, config.minibatches)
                          for e in range(config.epochs)])
  objective = functools.partial(policy_objective, graphdef=graphdef, frozen=frozen, group=group,
                                config=config, mesh=mesh)

  def step(carry, mb_rows):
    trained, opt_state = carry
    mb = mesh_lib.constrain_rows(jax.tree.map(lambda x: x[mb_rows], view), mesh)
    if config.microbatches == 1:
      (loss, metrics), grads = jax.value_and_grad(objective, has_aux=True)(trained, mb)
      logp_old = metrics.pop("logp_old")
    else:
      loss, metrics, grads, logp_old = accumulated_gradients(
          objective, trained, mb, group=group, microbatches=config.microbatches,
          aggregation=config.aggregation, mesh=mesh)
    updates, new_opt_state = optimizer.update(grads, opt_state, trained)
    new_trained = optax.apply_updates(trained, updates)
    has_tokens = jnp.sum(mb.mask) > 0
    trained, opt_state = stability.select_tree(has_tokens, (new_trained, new_opt_state),
                                               (trained, opt_state))
    metrics = {**metrics, "loss": loss, "grad_norm": optax.tree.norm(grads),
               "steps_taken": has_tokens.astype(jnp.float32)}
    return (trained, opt_state), (metrics, logp_old)

  (trained, opt_state), (per_mb, old_mb) = jax.lax.scan(step, (trained, opt_state), rows)
  # Means over the minibatches that stepped: padding-only ones would dilute every average.
  stepped = per_mb["steps_taken"]
  metrics = jax.tree.map(
      lambda x: jnp.sum(jnp.where(stepped > 0, x, 0.0)) / jnp.maximum(jnp.sum(stepped), 1.0),
      per_mb)
  metrics["steps_taken"] = jnp.sum(stepped)
  logp_old = view.logp_old
  if logp_old is None:  # on-policy: one minibatch of every row, in its shuffled order
    logp_old = jnp.zeros(view.tokens.shape, jnp.float32).at[rows[0]].set(old_mb[0])
  return trained, opt_state, metrics, logp_old


# --- 5. Rollback --------------------------------------------------------------------------------


def update_kl(new_params: Any, view: TrainView, logp_old: jax.Array, *, graphdef,
              group: int, config: LearnConfig, mesh: Any = None) -> jax.Array:
  """f32[] KL(pi_old || pi_new) estimated on the sampled tokens: the masked mean of
  logp_old - logp_new (the k1 estimator; the samples come from pi_old), after the step's last
  update. One forward pass with the new parameters."""
  logp_new, _ = constant_logprobs(graphdef, new_params,
                                  (view.prompt_tokens, view.prompt_mask, view.tokens),
                                  group=group, config=config, mesh=mesh)
  return losses.masked_mean(logp_old - logp_new, view.mask)


def roll_back_if(skip: jax.Array, before: Any, after: Any) -> Any:
  """`before` where skip is True, else `after` (pytrees of one structure)."""
  return stability.select_tree(skip, before, after)


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
  }


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

  # 1. Feedback: advantages of every sampled group; the curriculum learns from them.
  scores = score_groups(batch, train_state.whitening, config)
  new_cur_state, cur_metrics = curriculum_update(cur_state, scores.feedback)

  # 2. View: the trained rows and the constant forward passes.
  params = forward.model_params(train_state.params, frozen)
  view = train_view(batch, scores, params, graphdef=graphdef, ref_params=ref_params,
                    config=config, use_lora=use_lora, value=train_state.value, mesh=mesh)

  # 3-4. Optimizer steps.
  trained = (train_state.params, train_state.value) if ppo else train_state.params
  new_trained, new_opt_state, metrics, logp_old = minibatch_updates(
      trained, train_state.opt_state, view, key, graphdef=graphdef, frozen=frozen, group=g,
      optimizer=optimizer, config=config, mesh=mesh)

  # 5. Rollback of a non-finite or runaway update: nothing of this step is kept.
  skip = ~jnp.isfinite(metrics["loss"]) | ~stability.all_finite(new_trained)
  skip = skip | ~stability.all_finite((new_cur_state, scores.whitening))
  if config.max_kl is not None:
    new_policy = new_trained[0] if ppo else new_trained
    kl = update_kl(forward.model_params(new_policy, frozen), view, logp_old, graphdef=graphdef,
                   group=g, config=config, mesh=mesh)
    metrics["update_kl"] = kl
    skip = skip | stability.should_skip(metrics["loss"], kl, max_kl=config.max_kl)
  before = (trained, train_state.opt_state, cur_state, train_state.whitening)
  after = (new_trained, new_opt_state, new_cur_state, scores.whitening)
  new_trained, new_opt_state, cur_state, whitening = roll_back_if(skip, before, after)
  new_params, new_value = new_trained if ppo else (new_trained, None)
  skipped = train_state.skipped + skip.astype(jnp.int32)
  train_state = TrainState(step=train_state.step + 1, params=new_params, opt_state=new_opt_state,
                           whitening=whitening, skipped=skipped, value=new_value)

  # 6. Batch statistics.
  metrics.update(batch_metrics(batch, scores, view))
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
