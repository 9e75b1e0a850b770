"""The learn half of an RL step: one jitted program from a scored rollout to new parameters.

  train_state, cur_state, metrics = learn(train_state, cur_state, batch, key, ...)

`learn` runs six phases, each a module-level function that can be tested alone (phase 1 lives in
`scores`, phase 2 in `view`, phases 3 and 4 in `objective`):

  1. feedback   `score_groups`: rewards -> (overlong penalty) -> (whitening) -> advantages
                f32[S, G] of every sampled group, and the curriculum's `Feedback` (whose
                advantages come from correctness by default, see
                `LearnConfig.curriculum_feedback`); then `Curriculum.update` (with
                `high_variance_only`, VCRL's update also decides which groups are trained on).
                Completion slots that were not sampled (`Batch.valid` False: an allocation's
                unused slots, a prompt skipped before rollout) count nowhere.
  2. view       `view.train_view`: the P trained groups as B = P * G rows (`TrainView`): per-token
                advantages, mask, the old policy's and the reference's log-probs, values and
                returns (PPO); the KL penalty in the reward (`kl_reward_coef`), truncated
                completions out of the loss (`overlong="exclude"`), and CAPO's weights on
                negative advantages (`view.advantage_curriculum`).
  3. objective  `objective.policy_objective`: loss and metrics of one minibatch of rows (the only
                function that differentiates the policy).
  4. updates    `objective.minibatch_updates`: `epochs` passes of `minibatches` optimizer steps
                under `lax.scan` (whole groups per minibatch); a minibatch made only of padding
                groups leaves the parameters and the optimizer state as they were. Under LoRA
                each optimizer step reports the adapters' health (`stability.adapter_health`).
  5. rollback   `should_roll_back`, `commit`: an update with a non-finite loss, parameter,
                curriculum state or whitening, or whose KL(pi_old || pi_new) exceeds `max_kl`,
                is discarded: the parameters, optimizer state, curriculum state, reward
                whitening and sampling temperature all return to their values before the step
                (`skipped` counts it). With `rollback` = "minibatch" each optimizer step is
                kept only if finite instead, and no copy of the train state is held.
                Before it, the adaptive controller (`temperature_target` > 0) moves the next
                rollout's temperature from the entropy this batch measured
                (`adapt_temperature`).
  6. metrics    `batch_metrics`, `overlong_metrics`: statistics of every sampled group and of the
                trained rows.

Forward passes per step (the configuration's switches are static, so the choice is made at trace
time); each runs a group's prompt once and its G completions on the prompt's shared keys and
values (`transformer.shared_prefix_hidden`: P Tp + B T token-passes instead of B (Tp + T)):
  old policy   only when there is more than one optimizer step per batch (epochs x minibatches
               > 1), a critic (PPO) or a KL in the reward (kl_reward_coef); with one step the
               old policy is the policy being differentiated, and logp_old = stop_gradient(logp)
               inside the loss (the same values, one forward pass fewer).
  reference    only when kl_coef != 0 or kl_reward_coef != 0; without kl_coef there is no
               "kl" metric (not measured).
  policy       forward and backward, once per minibatch (per microbatch with gradient
               accumulation, `objective.accumulated_gradients`).
  new policy   only when max_kl is set: one forward pass with the updated parameters, for the
               rollback's KL(pi_old || pi_new) (`update_kl`).

Every log-prob is that of the sampling distribution softmax(logits / temperature), the
distribution the rollout drew its tokens from (`forward`): temperature is `config.temperature`,
or with the adaptive controller the train state's f32[] (`rollout_temperature`), the one the
rollout read from the same state.

Memory: the output head runs `logits_chunk` positions at a time (`forward.head_logprobs`), and
the passes without gradient (old policy, reference, new policy) one microbatch of rows at a
time (`view.row_blocks`): no [rows, T, V] logits, no activations of all rows at once. With a
mesh, every minibatch, microbatch and row block keeps its rows over the batch axes, and the
policy loss's head runs vocabulary-parallel (each device its share of the vocabulary).

Rows are prompt-major: row b = p * G + g holds completion g of prompt p. A batch may hold more
groups (S) than the policy trains on (P; S > P with a post-rollout filter): the curriculum sees
every sampled group, the policy loss only the `train_groups`.
"""

import functools
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import optax

from rl_curriculum.rl import losses
from rl_curriculum.rl import rewards as rewards_lib
from rl_curriculum.rl import stability
from rl_curriculum.train.learn import forward
from rl_curriculum.train.learn.objective import minibatch_updates
from rl_curriculum.train.learn.scores import batch_overlong_penalty, score_groups
from rl_curriculum.train.learn.rl_types import (Batch, GroupScores, LearnConfig, TrainView,
                                                adaptive_temperature)
from rl_curriculum.train.learn.view import (advantage_curriculum, constant_logprobs,
                                            overlong_mask, train_view)
from rl_curriculum.train.state import TrainState

__all__ = ["batch_overlong_penalty", "score_groups", "update_kl", "should_roll_back", "commit",
           "rollout_temperature", "adapt_temperature", "batch_metrics", "overlong_metrics",
           "staleness_metrics", "learn", "make_learn"]


# --- 5. Rollback ----------------------------------------------------------------------------------


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


def should_roll_back(new_trained: Any, new_cur_state: Any, scores: GroupScores, view: TrainView,
                     logp_old: jax.Array, metrics: dict, *, graphdef, frozen: Any, group: int,
                     config: LearnConfig, mesh: Any = None,
                     temperature: Optional[jax.Array] = None) -> tuple[jax.Array, dict]:
  """Phase 5's test: (bool[] discard this update, metrics). An update is discarded when its loss
  (`metrics`'), its parameters `new_trained`, the curriculum state or the reward whitening is not
  finite, or, with `max_kl` set, when KL(pi_old || pi_new) exceeds it (`update_kl`, logged
  "update_kl"). With `config.rollback` = "minibatch" each optimizer step was applied only if
  finite (`objective.minibatch_updates`): the update is discarded when every one was not."""
  skip = ~stability.all_finite((new_cur_state, scores.whitening))
  if config.rollback == "minibatch":
    return skip | ((metrics["steps_taken"] == 0) & (metrics["steps_discarded"] > 0)), {}
  loss = metrics["loss"]
  skip = skip | ~jnp.isfinite(loss) | ~stability.all_finite(new_trained)
  if config.max_kl is None:
    return skip, {}
  new_policy = new_trained[0] if config.algorithm == "ppo" else new_trained
  kl = update_kl(forward.model_params(new_policy, frozen), view, logp_old, graphdef=graphdef,
                 group=group, config=config, mesh=mesh, temperature=temperature)
  return skip | stability.should_skip(loss, kl, max_kl=config.max_kl), {"update_kl": kl}


def commit(train_state: TrainState, cur_state: Any, update: tuple, skip: jax.Array,
           config: LearnConfig) -> tuple[TrainState, Any]:
  """Phase 5's outcome: (train_state, cur_state) after the step. `update` = (trained, opt_state,
  cur_state, whitening, temperature) as the step computed them; where `skip` is True every one
  (but, with rollback "minibatch", the guarded parameters and optimizer state: no copy of them
  is held) returns to its value before the step (`stability.select_tree`). The step counter
  counts the update either way, `skipped` counts a discarded one."""
  ppo = config.algorithm == "ppo"
  trained = (train_state.params, train_state.value) if ppo else train_state.params
  before = (trained, train_state.opt_state, cur_state, train_state.whitening,
            train_state.temperature)
  if config.rollback == "minibatch":
    before = update[:2] + before[2:]
  trained, opt_state, cur_state, whitening, temperature = stability.select_tree(skip, before,
                                                                                update)
  params, value = trained if ppo else (trained, None)
  skipped = train_state.skipped + skip.astype(jnp.int32)
  train_state = TrainState(step=train_state.step + 1, params=params, opt_state=opt_state,
                           whitening=whitening, skipped=skipped, value=value,
                           temperature=temperature)
  return train_state, cur_state


# --- Adaptive sampling temperature ----------------------------------------------------------------


def rollout_temperature(train_state: TrainState, config: LearnConfig) -> Optional[jax.Array]:
  """The temperature this batch was sampled at, as the learn step reads it: the train state's
  f32[] under the adaptive controller (`adaptive_temperature(config)`), else None (then
  `config.temperature`).

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
  Learning for Small-Scale Language Model Agents", IEEE SMC 2026 (`rl.stability`). Args: the
  batch's temperature f32[], the objective's metrics averaged over the minibatches
  (`minibatch_updates`), the learn settings (`temperature_target`, `_rate`, `_min`, `_max`).
  """
  entropy = jnp.where(metrics["steps_taken"] > 0, metrics["entropy"], jnp.nan)
  state = stability.temperature_update(
      stability.TemperatureState(temperature=temperature), entropy,
      target=config.temperature_target, rate=config.temperature_rate,
      t_min=config.temperature_min, t_max=config.temperature_max)
  return state.temperature


# --- 6. Batch statistics --------------------------------------------------------------------------


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


def staleness_metrics(batch: Batch, view: TrainView, version: jax.Array) -> dict:
  """With version-tagged tokens (`Batch.versions`, rollouts in flight), the staleness of the
  trained tokens that count: "staleness_max" and "staleness_mean" of version - the version that
  drew each (`version`: i32[] the train state's update counter, the policy the update starts
  from); else nothing."""
  if batch.versions is None:
    return {}
  rows = forward.trained_rows(batch.train_groups, batch.rewards.shape[1])
  staleness = (version - batch.versions[rows]).astype(jnp.float32)
  counted = view.mask > 0
  return {"staleness_max": jnp.max(jnp.where(counted, staleness, 0.0)),
          "staleness_mean": losses.masked_mean(staleness, view.mask)}


def kl_reward_metrics(view: TrainView, config: LearnConfig) -> dict:
  """With a KL in the reward (`kl_reward_coef` = beta != 0), "kl_reward": the mean over trained
  completions with a counted token of beta * sum_t k1 (`rewards.kl_penalty`), what the reward lost
  to it; else nothing."""
  if config.kl_reward_coef is None:
    return {}
  penalty = config.kl_reward_coef * rewards_lib.kl_penalty(view.logp_old, view.logp_ref,
                                                           view.mask)
  counted = (jnp.sum(view.mask, axis=1) > 0).astype(jnp.float32)
  return {"kl_reward": jnp.sum(penalty * counted) / jnp.maximum(jnp.sum(counted), 1.0)}


# --- The learn step -------------------------------------------------------------------------------


def _check_batch(batch: Batch, config: LearnConfig) -> None:
  """Trace-time shape checks of a batch (ValueError naming the mismatch)."""
  s, g = batch.rewards.shape
  if batch.tokens.shape[0] != s * g:
    raise ValueError(f"batch rows {batch.tokens.shape[0]} != prompts {s} x group {g}")
  p = batch.train_groups.shape[0]
  if p % config.minibatches:
    raise ValueError(f"{p} prompts do not split into {config.minibatches} minibatches")
  forward.block_group(p // config.minibatches * g, g, config.microbatches)  # raises if not


def learn(train_state: TrainState, cur_state: Any, batch: Batch, key: jax.Array, frozen: Any,
          ref_params: Any, config: LearnConfig, *, graphdef,
          optimizer: Callable[[LearnConfig], optax.GradientTransformation],
          curriculum_update: Callable, use_lora: bool, mesh: Any = None):
  """One RL update. The positional arguments are traced (`make_learn` jits them; `config`'s
  static fields are part of the compiled program, its coefficients traced); the keyword
  arguments are static.

  Args:
    train_state: trainable parameters and optimizer state.
    cur_state: the curriculum's state; updated with this batch's feedback.
    batch: the scored rollout.
    key: this step's key (fold_in(root, step)); shuffles minibatches.
    frozen: parameters that are inputs but never trained (the base model under LoRA), or None.
    ref_params: the KL reference's parameters for full fine-tuning with a KL term (`kl_coef` or
      `kl_reward_coef`), else None; under LoRA the reference is the same model with its adapters
      switched off.
    config: the learn program's settings (`LearnConfig`).
    graphdef: the model's graph definition.
    optimizer: the optax transformation of `train_state.params` for `config` (its learning rate
      and gradient clipping), built inside the program: `optimizer(config)`.
    curriculum_update: (curriculum state, feedback, options) -> (curriculum state, metrics):
      `Curriculum.update` of the curriculum built with `config.curriculum`, its traced options.
    use_lora: whether `train_state.params` are LoRA adapters.
    mesh: the run's mesh, or None: minibatches, microbatches and row blocks keep their rows over
      its batch axes (`mesh_lib.constrain_rows`).

  Returns:
    (train_state, cur_state, metrics): metrics are scalars (and per-arm vectors from the
    curriculum under "curriculum"), the objective's averaged over minibatches.

  Raises:
    ValueError (at trace time): a batch whose shapes disagree, or P not divisible into
      minibatches of microbatches.
  """
  _check_batch(batch, config)
  g = batch.rewards.shape[1]
  tau = rollout_temperature(train_state, config)  # None: config.temperature
  passes = dict(graphdef=graphdef, group=g, config=config, mesh=mesh, temperature=tau)

  # 1. Feedback: advantages of every sampled group; the curriculum learns from them.
  scores = score_groups(batch, train_state.whitening, config)
  new_cur_state, cur_metrics = curriculum_update(cur_state, scores.feedback, config.curriculum)
  if config.high_variance_only:  # VCRL's training mask: low-variance groups leave the loss
    batch = batch._replace(train_valid=batch.train_valid
                           & cur_metrics["high_variance"][batch.train_groups])

  # 2. View: the trained rows and the constant forward passes.
  params = forward.model_params(train_state.params, frozen)
  view = train_view(batch, scores, params, graphdef=graphdef, ref_params=ref_params,
                    config=config, use_lora=use_lora, value=train_state.value, mesh=mesh,
                    temperature=tau, version=train_state.step)
  view, capo_metrics = advantage_curriculum(view, train_state.step, config)
  staleness = staleness_metrics(batch, view, train_state.step)

  # 3-4. Optimizer steps.
  ppo = config.algorithm == "ppo"
  trained = (train_state.params, train_state.value) if ppo else train_state.params
  new_trained, new_opt_state, metrics, logp_old = minibatch_updates(
      trained, train_state.opt_state, view, key, frozen=frozen, optimizer=optimizer(config),
      adapters=use_lora, **passes)

  # 5. Rollback of a non-finite or runaway update: nothing of this step is kept.
  skip, rollback_metrics = should_roll_back(new_trained, new_cur_state, scores, view, logp_old,
                                            metrics, frozen=frozen, **passes)
  new_temperature = train_state.temperature
  if tau is not None:  # the controller moves the next rollout's temperature
    new_temperature = adapt_temperature(tau, metrics, config)
    metrics["temperature"] = tau
  train_state, cur_state = commit(
      train_state, cur_state,
      (new_trained, new_opt_state, new_cur_state, scores.whitening, new_temperature), skip, config)

  # 6. Batch statistics.
  for more in (staleness, rollback_metrics, batch_metrics(batch, scores, view), capo_metrics,
               overlong_metrics(batch, config), kl_reward_metrics(view, config)):
    metrics.update(more)
  metrics.update({"update_skipped": skip.astype(jnp.float32),
                  "skipped_total": train_state.skipped})
  return train_state, cur_state, {**metrics, "curriculum": cur_metrics}


def make_learn(*, graphdef, optimizer: Callable[[LearnConfig], optax.GradientTransformation],
               curriculum_update, use_lora: bool, out_shardings: Any = None, mesh: Any = None):
  """`learn` jitted once, with the train state donated: fn(train_state, cur_state, batch, key,
  frozen, ref_params, config). One compiled program serves every `LearnConfig` of the same static
  fields and switches (its coefficients are traced). `programs.build` calls it for the loop, the
  planner and the benchmark.

  Sharded runs place the inputs (`parallel.distributed.place`) and pass `out_shardings` =
  (train state shardings, curriculum state sharding, metrics sharding) (a prefix tree, e.g. one
  replicated NamedSharding for the last two), so the parameters keep their layout step after
  step and the donated buffers are reused; jit partitions the rest from the inputs (GSPMD), with
  the rows of every minibatch, microbatch and row block over `mesh`'s batch axes.
  """
  fn = functools.partial(learn, graphdef=graphdef, optimizer=optimizer,
                         curriculum_update=curriculum_update, use_lora=use_lora, mesh=mesh)
  return jax.jit(fn, donate_argnums=(0,), out_shardings=out_shardings)
