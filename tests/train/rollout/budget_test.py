"""Which completion slots a step samples (`budget`) and what the rest of the step does with the
slots it does not: rollout allocation, pre-rollout skips (GRESO), the counterfactual baseline and
VCRL's training mask."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import scratch
from rl_curriculum import curriculum as cur
from rl_curriculum import tasks
from rl_curriculum.curriculum import allocation, prompt_stats
from rl_curriculum.rl import advantages as adv_lib
from rl_curriculum.sampling import sampler
from rl_curriculum.train.learn import examples
from rl_curriculum.train.rollout import budget, episodes
from rl_curriculum.train.setup import builders, validation
from rl_curriculum.train.state import init_train_state
from rl_curriculum.types import Selection
import test_util

S, G, TP, T, V = test_util.P, test_util.G, test_util.TP, test_util.T, test_util.V


def _config(**rl):
  c = scratch.get_config()
  c.rl.prompts_per_step, c.rl.group_size = S, G
  for name, value in rl.items():
    c.rl[name] = value
  return c


def _stats():
  """A store of 6 prompts whose Beta posteriors differ: wide (0), sure wins (1, 4), even (2),
  sure losses (3), unseen (5)."""
  stats = prompt_stats.init(6)
  return stats._replace(beta_a=jnp.array([1.0, 20.0, 10.0, 1.0, 30.0, 1.0]),
                        beta_b=jnp.array([1.0, 1.0, 10.0, 20.0, 1.0, 1.0]))


def _selection(ids, active=None):
  ids = jnp.asarray(ids, jnp.int32)
  return Selection(prompt_ids=ids, arms=jnp.zeros_like(ids),
                   active=None if active is None else jnp.asarray(active))


@pytest.mark.parametrize("method", ["uniform", "variance", "difficulty"])
def test_allocated_slots_sum_to_the_budget_within_the_bounds(method):
  config = _config(allocation=method, allocation_max=8, allocation_min=2)
  ids = [3, 0, 2, 1]
  mask = budget.slot_mask(config, _selection(ids), _stats())
  counts = mask.sum(axis=1)
  assert mask.shape == (S, 8) and counts.sum() == S * G
  assert np.all((counts >= 2) & (counts <= 8))
  # Each prompt's count is the allocator's for that prompt's own posterior (ids in this order).
  a, b = np.asarray(_stats().beta_a)[ids], np.asarray(_stats().beta_b)[ids]
  bounds = dict(budget=S * G, max_per_prompt=8, min_per_prompt=2)
  expected = {"uniform": lambda: allocation.allocate_uniform(S, **bounds),
              "variance": lambda: allocation.allocate_by_variance(a, b, **bounds),
              "difficulty": lambda: allocation.allocate_by_difficulty(a / (a + b), **bounds)}
  np.testing.assert_array_equal(counts, np.asarray(expected[method]().counts))
  # The slots are each prompt's first ones.
  np.testing.assert_array_equal(mask, np.arange(8)[None, :] < counts[:, None])
  if method == "variance":   # the widest posterior (prompt 0, in slot 1) gets the most
    assert counts[1] == counts.max() > counts[3]
  if method == "difficulty":  # the surest loss (prompt 3, in slot 0) gets the most
    assert counts[0] == counts.max() > counts[3]


def test_without_allocation_every_active_prompt_gets_its_group():
  config = _config()
  assert budget.group_slots(config) == G and not budget.needs_prompt_stats(config)
  assert budget.init_prompt_stats(config, 10) is None
  assert budget.slot_mask(config, _selection([0, 1, 2, 3]), None).all()
  mask = budget.slot_mask(config, _selection([0, 1, 2, 3], [True, False, True, False]), None)
  np.testing.assert_array_equal(mask.all(axis=1), [True, False, True, False])
  np.testing.assert_array_equal(mask.any(axis=1), [True, False, True, False])


def test_a_skipped_prompt_loses_its_allocated_slots():
  config = _config(allocation="difficulty", allocation_max=8)
  full = budget.slot_mask(config, _selection([3, 0, 2, 1]), _stats())
  skipped = budget.slot_mask(config, _selection([3, 0, 2, 1], [True, True, False, True]), _stats())
  np.testing.assert_array_equal(skipped[[0, 1, 3]], full[[0, 1, 3]])
  assert not skipped[2].any()


def test_prompt_statistics_count_only_sampled_completions():
  config = _config(algorithm="counterfactual")
  stats = budget.init_prompt_stats(config, 6)
  np.testing.assert_allclose(budget.success_mean(stats, [0, 5]), [0.5, 0.5])
  correct = np.array([[1, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0], [1, 0, 1, 0]], bool)
  valid = np.array([[1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]], bool)
  batch = examples.make_batch(jnp.zeros((S * G, TP), jnp.int32), jnp.zeros((S * G, T), jnp.int32),
                              correct.astype(np.float32), correct=correct)
  batch = batch._replace(prompt_ids=jnp.array([4, 1, 2, 0]), valid=jnp.asarray(valid))
  stats = budget.observe(stats, batch, step=1)
  # Beta(1, 1) + (successes, failures) among the valid completions; prompt 0 was not sampled.
  np.testing.assert_allclose(np.asarray(stats.beta_a)[[4, 1, 2, 0]], [3, 3, 1, 1])
  np.testing.assert_allclose(np.asarray(stats.beta_b)[[4, 1, 2, 0]], [3, 1, 5, 1])
  np.testing.assert_allclose(budget.success_mean(stats, [4, 1, 2]), [0.5, 0.75, 1 / 6],
                             rtol=1e-6)
  assert budget.observe(None, batch, step=1) is None


def test_sampler_leaves_inactive_rows_empty_and_active_rows_unchanged():
  graphdef, params = test_util.tiny_model()
  prompts = jnp.repeat(jax.random.randint(jax.random.key(0), (S, TP), 3, V), G, axis=0)
  mask = jnp.ones(prompts.shape, bool)
  active = jnp.repeat(jnp.array([True, False, True, False]), G)
  kwargs = dict(max_new_tokens=6, eos_id=1, pad_id=0, group=G)
  full = sampler.sample(graphdef, params, prompts, mask, jax.random.key(1), **kwargs)
  part = sampler.sample(graphdef, params, prompts, mask, jax.random.key(1), active=active,
                        **kwargs)
  on = np.asarray(active)
  for field in ("tokens", "logprobs", "mask"):
    np.testing.assert_array_equal(np.asarray(getattr(part, field))[on],
                                  np.asarray(getattr(full, field))[on])
  assert np.all(np.asarray(part.mask)[~on] == 0) and np.all(np.asarray(part.tokens)[~on] == 0)
  assert np.all(np.asarray(part.logprobs)[~on] == 0) and np.asarray(full.mask)[~on].sum() > 0


class _RecordingTask(type(tasks.get_task("arithmetic"))):
  """The arithmetic task, recording every completion its verifier is shown."""

  def __init__(self):
    super().__init__()
    self.seen = []

  def score(self, problem, completion):
    self.seen.append(completion)
    return super().score(problem, completion)


class _Texts:
  """A tokenizer whose completion i32[1] decodes to texts[id]."""

  def __init__(self, texts):
    self.texts = texts

  def decode(self, ids):
    return self.texts[int(ids[0])]


def test_unsampled_rows_are_never_scored():
  recorder = _RecordingTask()
  problems = tuple(recorder.generate_many([0, 1], difficulty=0))
  texts = {0: problems[0].target, 1: "12345", 2: problems[1].target, 3: problems[1].target}
  sampled = np.array([True, True, False, True])
  rows = episodes.finished_rows(jnp.arange(4, dtype=jnp.int32)[:, None], jnp.ones((4, 1)))
  _, played, _ = episodes.step_turns(
      rows, 0, problems=[problems[i // 2] if v else None for i, v in enumerate(sampled)],
      task=recorder, seeds=list(range(4)), tokenizer=_Texts(texts), framing=None,
      limits=episodes.Limits(max_turns=1, turn_tokens=1, observation_tokens=8,
                             max_new_tokens=1), read_only=True, rows_of=lambda r, _: r)
  assert recorder.seen == [texts[0], texts[1], texts[3]]
  np.testing.assert_array_equal(played.correct, [True, False, False, True])
  assert played.rewards[2] == 0.0 and played.rewards[0] > 0.5 and played.rewards[3] > 0.5
  np.testing.assert_array_equal(played.turns, [1, 1, 0, 1])


def _learn_setup(curriculum=None, **overrides):
  graphdef, params = test_util.tiny_model()
  optimizer = builders.build_optimizer(1e-2, max_grad_norm=1.0)
  curriculum = curriculum or cur.sec(2, batch_size=S, alpha=1.0)
  base = builders.learn_config(scratch.get_config())
  config = dataclasses.replace(base, **{**dict(minibatches=1, max_kl=None, ratio_guard=0.0,
                                               max_tokens=T), **overrides})
  learn = test_util.make_learn(graphdef, optimizer, curriculum, config)
  state = init_train_state(params, optimizer)
  cur_state = curriculum.init(cur.PromptPool.from_arms([0, 1, 0, 1, 0, 1]), jax.random.key(0))
  return params, state, cur_state, learn


def _batch(rewards, valid=None, token_seed=1, baseline=None):
  key = jax.random.key(1)
  prompts = jnp.repeat(jax.random.randint(key, (S, TP), 3, V), G, axis=0)
  tokens = jax.random.randint(jax.random.fold_in(key, token_seed), (S * G, T), 3, V)
  batch = examples.make_batch(prompts, tokens, rewards, num_arms=2)
  if valid is not None:
    batch = batch._replace(valid=jnp.asarray(valid))
  return batch._replace(baseline=baseline)


_REWARDS = np.array([[1, 0, 0, 1], [0, 0, 1, 0], [1, 1, 0, 1], [1, 0, 1, 1]], np.float32)
_VALID = np.array([[1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 0], [0, 0, 0, 0]], bool)


def _step(batch, curriculum=None, **overrides):
  params, state, cur_state, learn = _learn_setup(curriculum, **overrides)
  return learn(state, cur_state, batch, jax.random.key(2), None, params)


def _leaves(tree):
  return [np.asarray(x) for x in jax.tree.leaves(tree)]


def test_masked_rows_carry_no_gradient_and_no_reward():
  state, cur_state, metrics = _step(_batch(_REWARDS, _VALID))
  # Other tokens and rewards in the slots that were not sampled change nothing.
  other = np.where(_VALID, _REWARDS, 1.0 - _REWARDS)
  state2, cur_state2, metrics2 = _step(_batch(other, _VALID, token_seed=7)._replace(
      tokens=jnp.where(jnp.asarray(_VALID).reshape(-1, 1), _batch(_REWARDS).tokens,
                       _batch(_REWARDS, token_seed=7).tokens)))
  for a, b in zip(_leaves((state.params, cur_state)), _leaves((state2.params, cur_state2))):
    np.testing.assert_array_equal(a, b)
  np.testing.assert_allclose(float(metrics["reward_mean"]), _REWARDS[_VALID].mean(), rtol=1e-6)
  assert float(metrics["groups_trained"]) == 3.0 and float(metrics2["loss"]) == float(
      metrics["loss"])
  # The same batch with every slot sampled trains differently.
  state3, _, _ = _step(_batch(other))
  assert any(not np.array_equal(a, b) for a, b in zip(_leaves(state.params),
                                                       _leaves(state3.params)))


@pytest.mark.slow
def test_counterfactual_advantages_subtract_the_prompts_baseline():
  baseline = jnp.array([0.5, 0.25, 1.0, 0.0])
  adv = adv_lib.group_advantages(jnp.asarray(_REWARDS), jnp.asarray(_VALID), "counterfactual",
                                 grpo_std="population", baseline=baseline)
  np.testing.assert_allclose(np.asarray(adv), (_REWARDS - baseline[:, None]) * _VALID, atol=1e-6)
  with pytest.raises(ValueError, match="baseline"):
    adv_lib.group_advantages(jnp.asarray(_REWARDS), jnp.asarray(_VALID), "counterfactual",
                             grpo_std="population")
  # The learn step trains on them: an all-right group above its baseline has signal (RLOO: none).
  rewards = np.array([[1, 1, 1, 1], [0, 0, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]], np.float32)
  _, _, metrics = _step(_batch(rewards, baseline=baseline), algorithm="counterfactual")
  assert float(metrics["nonzero_adv_frac"]) == 0.5  # groups 2 and 3 equal their baselines
  np.testing.assert_allclose(float(metrics["abs_adv_mean"]), (0.5 + 0.25 + 0.0 + 0.0) / 4,
                             rtol=1e-6)
  _, _, rloo = _step(_batch(rewards))
  assert float(rloo["nonzero_adv_frac"]) == 0.0


@pytest.mark.slow
def test_vcrl_mask_trains_only_the_high_variance_groups():
  vcrl = cur.vcrl(2, batch_size=S, threshold=0.5)
  # Variance scores 4 s/n (1 - s/n): 1.0, 0.75, 0, 0 -> groups 0 and 1 are high-variance.
  rewards = np.array([[1, 0, 0, 1], [0, 0, 1, 0], [1, 1, 1, 1], [1, 1, 1, 1]], np.float32)
  masked_state, _, metrics = _step(_batch(rewards), vcrl, high_variance_only=True)
  np.testing.assert_array_equal(np.asarray(metrics["curriculum"]["high_variance"]),
                                [True, True, False, False])
  assert float(metrics["groups_trained"]) == 2.0
  # The same update as training on groups 0 and 1 alone (padding slots for the others).
  alone = _batch(rewards)._replace(train_valid=jnp.array([True, True, False, False]))
  alone_state, _, alone_metrics = _step(alone, vcrl)
  # Two programs that differ in their padding slots: the kernel tolerance (the sums may be
  # ordered differently; 1.4e-6 seen on one CPU).
  for a, b in zip(_leaves(masked_state.params), _leaves(alone_state.params)):
    np.testing.assert_allclose(a, b, atol=1e-5)
  everything, _, _ = _step(_batch(rewards), vcrl)
  assert any(not np.allclose(a, b) for a, b in zip(_leaves(masked_state.params),
                                                    _leaves(everything.params)))
  assert float(alone_metrics["groups_trained"]) == 2.0


def test_greso_marks_the_slots_it_could_not_fill_inactive():
  pool = cur.PromptPool.from_arms(np.zeros(12, int))
  greso = cur.greso(pool, batch_size=4, oversample=3.0, min_keep=0.0)
  state = greso.init(pool, jax.random.key(0))
  # Prompts 2-11 are on a long all-wrong streak (keep probability 0.5^60 ~ 0): only 0-1 survive.
  streak = jnp.where(jnp.arange(12) < 2, 0, 60).astype(jnp.int32)
  stats = state.stats._replace(streak=streak, streak_kind=jnp.where(streak > 0, 2, 0))
  state = state._replace(stats=stats)
  for seed in range(5):
    selection, new = jax.jit(greso.select)(state, jax.random.key(seed))
    kept = int(new.last_kept)
    np.testing.assert_array_equal(np.asarray(selection.active), np.arange(4) < kept)
    assert set(np.asarray(selection.prompt_ids)[np.asarray(selection.active)]) <= {0, 1}
  refill = cur.greso(pool, batch_size=4, oversample=3.0, min_keep=0.0, refill=True)
  selection, _ = refill.select(state, jax.random.key(0))
  assert selection.active is None


@pytest.mark.parametrize("fields,message", [
    (dict(rl__allocation="greedy"), "config.rl.allocation: must be one of"),
    (dict(rl__allocation="variance", rl__allocation_max=4), "config.rl.allocation_max: must be "
     "a whole number >= rl.group_size=8"),
    (dict(rl__allocation="variance", rl__allocation_min=1), "config.rl.allocation_min: must be a "
     "whole number in [2, rl.group_size=8]"),
    (dict(rl__algorithm="counterfactual", rl__whiten_rewards=True), "config.rl.whiten_rewards"),
    (dict(curriculum__high_variance_only=True), "config.curriculum.high_variance_only: needs "
     "curriculum.name='vcrl'"),
    (dict(curriculum__name="greso", curriculum__options=dict(refill=1)),
     "config.curriculum.options: greso: refill must be True or False"),
])
def test_bad_fields_are_named(fields, message):
  c = test_util.set_fields(scratch.get_config(), **fields)
  with pytest.raises(validation.ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")
                     .replace("[", r"\[").replace("]", r"\]")):
    validation.validate(c)
