"""Completions cut at the length cap (`rl.overlong`): which ones were cut, DAPO's soft overlong
penalty in phase 1 and overlong filtering in phase 2, their metrics, the config checks, and both
methods end to end at toy size."""


import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import toy
from rl_curriculum import curriculum as cur
from rl_curriculum.rl import stability
from rl_curriculum.train.learn import examples, forward, rl_step
from rl_curriculum.train.learn import view as view_lib
from rl_curriculum.train.setup import builders, validation
from rl_curriculum.train.state import init_train_state, init_value_head
import test_util

P, G, TP, V = test_util.P, test_util.G, test_util.TP, test_util.V
T = 4  # completions of 4 tokens: room for stops before, at and after the last slot


def _learn_config(**overrides):
  """The shared learn config with one optimizer step per batch, at this file's T."""
  return test_util.learn_config(**{**dict(minibatches=1, max_tokens=T), **overrides})


STOP = (2, 3)  # the stop ids of the unit tests' batches (EOS and one more)


def _rewards():
  return np.array([[1, 0, 0, 1], [0, 0.1, 0, 0], [1, 1, 0, 1], [1, 1, 1, 0.1]], np.float32)


def _lengths():
  """Tokens per completion, i32[P, G]: every group but the second holds completions that reach
  the cap T."""
  return np.array([[4, 2, 4, 1], [1, 2, 3, 2], [4, 4, 3, 4], [3, 4, 1, 2]])


def _batch(truncated=True, mask=None):
  """A batch of P groups of `_lengths()` tokens: a shorter completion ends with a stop token (as
  the sampler records it); one of T tokens ends with a stop token in rows 8 and 13 (it finished)
  and with an ordinary token elsewhere (it was cut)."""
  key = jax.random.PRNGKey(1)
  prompts = jnp.repeat(jax.random.randint(key, (P, TP), 4, V), G, axis=0)
  tokens = np.array(jax.random.randint(jax.random.fold_in(key, 1), (P * G, T), 4, V))
  tokens[[8, 13], -1] = STOP
  lengths = _lengths().reshape(-1)
  short = np.flatnonzero(lengths < T)
  tokens[short, lengths[short] - 1] = STOP[0]
  counted = np.arange(T)[None, :] < lengths[:, None]
  tokens = np.where(counted, tokens, 0)
  batch = examples.make_batch(prompts, tokens, _rewards(), num_arms=2, stop_ids=STOP,
                              mask=counted.astype(np.float32) if mask is None else mask)
  return batch if truncated else batch._replace(truncated=None)


def _expected_truncated():
  cut = _lengths() == T
  cut.reshape(-1)[[8, 13]] = False
  return cut


def _rloo(rewards):
  r = np.asarray(rewards, np.float64)
  return r - (r.sum(1, keepdims=True) - r) / (r.shape[1] - 1)


def _setup(**overrides):
  graphdef, params = test_util.tiny_model()
  optimizer = builders.build_optimizer(1e-2, max_grad_norm=1.0)
  curriculum = cur.sec(2, batch_size=P, alpha=1.0)
  config = _learn_config(**overrides)
  learn = test_util.make_learn(graphdef, optimizer, curriculum, config)
  value = init_value_head(32) if config.algorithm == "ppo" else None
  state = init_train_state(params, optimizer, value)
  cur_state = curriculum.init(cur.PromptPool.from_arms([0, 0, 1, 1, 0, 1]), jax.random.PRNGKey(0))
  return params, state, cur_state, learn


def _view(config, batch, ref_params=None):
  graphdef, params = test_util.tiny_model()
  scores = rl_step.score_groups(batch, stability.whitening_init(), config)
  value = init_value_head(32) if config.algorithm == "ppo" else None
  return view_lib.train_view(batch, scores, params, graphdef=graphdef, ref_params=ref_params,
                            config=config, use_lora=False, value=value)


# --- Which completions the cap cut off ----------------------------------------------------------


def test_example_batches_mark_completions_cut_at_the_cap():
  np.testing.assert_array_equal(np.asarray(_batch().truncated), _expected_truncated())


# --- The soft overlong penalty (phase 1) --------------------------------------------------------


def _penalty(cache):
  start = T - cache
  return np.where(_lengths() <= start, 0.0, (start - _lengths()) / cache)


def test_penalty_joins_the_rewards_before_whitening_and_the_advantages():
  batch = _batch()
  config = _learn_config(overlong="penalty", overlong_cache=2)
  penalised = _rewards() + _penalty(2)  # lengths 3 lose 1/2, lengths 4 lose 1
  assert np.abs(_penalty(2)).max() == 1.0 and np.abs(_penalty(2)).min() == 0.0
  scores = rl_step.score_groups(batch, stability.whitening_init(), config)
  np.testing.assert_allclose(np.asarray(scores.rewards), penalised, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(np.asarray(scores.advantages), _rloo(penalised), rtol=1e-5,
                             atol=1e-6)
  # The curriculum's feedback: the task's rewards, advantages of the raw correctness.
  plain = rl_step.score_groups(batch, stability.whitening_init(), _learn_config())
  np.testing.assert_array_equal(np.asarray(scores.feedback.rewards), _rewards())
  np.testing.assert_array_equal(np.asarray(scores.feedback.advantages),
                                np.asarray(plain.feedback.advantages))
  # Whitening standardises the penalised rewards.
  whitened = rl_step.score_groups(batch, stability.whitening_init(),
                                  _learn_config(overlong="penalty", overlong_cache=2,
                                                whiten_rewards=True))
  valid = jnp.ones((P, G), bool)
  state = stability.whitening_update(stability.whitening_init(), jnp.asarray(penalised,
                                                                             jnp.float32), valid)
  np.testing.assert_allclose(np.asarray(whitened.rewards),
                             np.asarray(stability.whiten(state, jnp.asarray(penalised,
                                                                            jnp.float32))),
                             rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(float(whitened.whitening.mean), float(state.mean), rtol=1e-5)


@pytest.mark.slow
def test_penalty_metric_and_a_cache_outside_the_cap_is_refused():
  params, state, cur_state, learn = _setup(overlong="penalty", overlong_cache=1)
  _, _, metrics = learn(state, cur_state, _batch(), jax.random.PRNGKey(2), None, params)
  # L_cache = 1: each of the 6 completions of T tokens loses 1, cut or not.
  np.testing.assert_allclose(float(metrics["overlong_penalty_mean"]), -6 / 16, rtol=1e-6)
  np.testing.assert_allclose(float(metrics["truncated_frac"]), 4 / 16, rtol=1e-6)
  assert "overlong_excluded_frac" not in metrics
  with pytest.raises(ValueError, match="overlong_cache must lie in"):
    rl_step.score_groups(_batch(), stability.whitening_init(),
                         _learn_config(overlong="penalty", overlong_cache=T))


# --- Overlong filtering (phase 2) ---------------------------------------------------------------


@pytest.mark.slow
def test_exclude_masks_truncated_completions_but_keeps_them_in_the_group_advantages():
  batch = _batch()
  keep = 1.0 - _expected_truncated().reshape(-1, 1)
  plain = _view(_learn_config(), batch)
  view = _view(_learn_config(overlong="exclude"), batch)
  np.testing.assert_array_equal(np.asarray(view.mask), np.asarray(plain.mask) * keep)
  np.testing.assert_array_equal(np.asarray(view.advantages), np.asarray(plain.advantages) * keep)
  # The kept completions' advantages are RLOO over the whole group, truncated members included.
  expected = np.repeat(_rloo(_rewards()).reshape(-1, 1), T, axis=1) * np.asarray(view.mask)
  np.testing.assert_allclose(np.asarray(view.advantages), expected, rtol=1e-5, atol=1e-6)
  # PPO: no token of a truncated completion reaches GAE, the value targets or the whitening.
  ppo = _view(_learn_config(overlong="exclude", algorithm="ppo"), batch)
  mask = np.asarray(ppo.mask)
  np.testing.assert_array_equal(mask, np.asarray(plain.mask) * keep)
  for name in ("advantages", "returns", "values_old"):
    assert np.all(np.asarray(getattr(ppo, name))[mask == 0] == 0), name
  adv = np.asarray(ppo.advantages, np.float64)[mask > 0]
  np.testing.assert_allclose([adv.mean(), adv.std()], [0.0, 1.0], atol=1e-4)


@pytest.mark.slow
def test_excluded_completions_keep_their_kl_penalty_in_the_group_baseline():
  """With a KL in the reward, a truncated completion's reward still loses beta * sum_t k1 over
  its tokens before the group advantages of the kept completions are computed."""
  graphdef, params = test_util.tiny_model()
  batch = _batch()
  ref = jax.tree.map(lambda x: x + 0.05 * jnp.sin(jnp.arange(x.size).reshape(x.shape)), params)
  view = _view(_learn_config(overlong="exclude", kl_reward_coef=0.5), batch, ref_params=ref)

  def logp_of(prm):
    return np.asarray(forward.completion_logprobs(graphdef, prm, batch.prompt_tokens,
                                                  batch.prompt_mask, batch.tokens), np.float64)

  kl_sum = ((logp_of(params) - logp_of(ref)) * np.asarray(batch.mask)).sum(1).reshape(P, G)
  assert np.abs(kl_sum[_expected_truncated()]).min() > 1e-3
  expected = np.repeat(_rloo(_rewards() - 0.5 * kl_sum).reshape(-1, 1), T, axis=1)
  np.testing.assert_allclose(np.asarray(view.advantages), expected * np.asarray(view.mask),
                             rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_exclude_is_the_update_of_the_batch_without_the_truncated_tokens():
  """Training with exclusion equals training without it on a batch whose truncated completions
  count no token (the group advantages come from the rewards alone)."""
  keep = 1.0 - _expected_truncated().reshape(-1, 1)
  params, state, cur_state, learn = _setup(overlong="exclude")
  new, _, metrics = learn(state, cur_state, _batch(), jax.random.PRNGKey(2), None, params)
  params, state, cur_state, learn = _setup()
  masked = _batch(mask=(np.arange(T)[None, :] < _lengths().reshape(-1, 1)) * keep)
  ref, _, ref_metrics = learn(state, cur_state, masked, jax.random.PRNGKey(2), None, params)
  for a, b in zip(jax.tree.leaves(new.params), jax.tree.leaves(ref.params)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(float(metrics["loss"]), float(ref_metrics["loss"]), rtol=1e-5)
  assert abs(float(metrics["loss"])) > 1e-3
  # 4 of the 16 completions were cut; the 12 others hold 44 - 4 T = 28 tokens.
  np.testing.assert_allclose(float(metrics["truncated_frac"]), 4 / 16, rtol=1e-6)
  np.testing.assert_allclose(float(metrics["overlong_excluded_frac"]), 4 / 16, rtol=1e-6)
  np.testing.assert_allclose(float(metrics["completion_len"]), 28 / 12, rtol=1e-6)
  assert "overlong_penalty_mean" not in metrics
  # A changed mask changes the update: exclusion is not a no-op on this batch.
  _, _, plain = learn(*_setup()[1:3], _batch(), jax.random.PRNGKey(2), None, params)
  assert abs(float(plain["loss"]) - float(metrics["loss"])) > 1e-4


def test_excluded_frac_counts_only_the_trained_groups():
  # Groups 0 and 2 are trained (2 + 2 truncated of 8 completions); the curriculum sees all four.
  batch = _batch()._replace(train_groups=jnp.array([0, 2, 0, 0], jnp.int32),
                            train_valid=jnp.array([True, True, False, False]))
  metrics = rl_step.overlong_metrics(batch, _learn_config(overlong="exclude"))
  np.testing.assert_allclose(float(metrics["overlong_excluded_frac"]), 4 / 8, rtol=1e-6)
  np.testing.assert_allclose(float(metrics["truncated_frac"]), 4 / 16, rtol=1e-6)
  assert rl_step.overlong_metrics(_batch(truncated=False), _learn_config()) == {}


def test_exclude_needs_to_know_which_completions_were_cut():
  with pytest.raises(ValueError, match="Batch.truncated"):
    _view(_learn_config(overlong="exclude"), _batch(truncated=False))


# --- Config checks ------------------------------------------------------------------------------


@pytest.mark.parametrize("overrides,field", [
    (dict(overlong="drop"), "rl.overlong"),
    (dict(overlong="penalty", overlong_cache=0), "rl.overlong_cache"),
    (dict(overlong="penalty", overlong_cache=4), "rl.overlong_cache"),  # toy max_new_tokens = 4
    (dict(overlong="none", overlong_cache=-1), "rl.overlong_cache"),
])
def test_validate_names_the_overlong_field(overrides, field):
  config = toy.get_config()
  for name, value in overrides.items():
    config.rl[name] = value
  with pytest.raises(validation.ConfigError, match=f"config.{field}: "):
    validation.validate(config)


def test_valid_overlong_settings_pass_and_reach_the_learn_config():
  for overlong, cache in (("none", 0), ("exclude", 0), ("penalty", 1), ("penalty", 3)):
    config = toy.get_config()
    config.rl.overlong, config.rl.overlong_cache = overlong, cache
    validation.validate(config)
    learn_config = builders.learn_config(config)
    assert (learn_config.overlong, learn_config.overlong_cache) == (overlong, cache or None)


# --- End to end at toy size ---------------------------------------------------------------------

STEPS = 3
MAX_NEW_TOKENS = 3  # toy completions are an answer and EOS: at 3 tokens some are cut
# The caches a workdir keeps for its tokenizer and SFT warm start (`warm_start`), not its RL run.


def _config(**rl):
  return test_util.toy_rl_config(STEPS, **{"max_new_tokens": MAX_NEW_TOKENS, **rl})


@pytest.fixture(scope="module")
def baseline(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("overlong") / "baseline")
  return workdir, test_util.run_rl(_config(), workdir)


def _sixteenths(x):
  """x * 16 (the toy batch's 4 x 4 completions) is a whole number."""
  return abs(x * 16 - round(x * 16)) < 1e-6


@pytest.mark.slow
def test_truncated_fraction_is_always_logged(baseline):
  _, rows = baseline
  for r in rows:
    assert 0.0 <= r["truncated_frac"] <= 1.0 and _sixteenths(r["truncated_frac"])
    assert "overlong_penalty_mean" not in r and "overlong_excluded_frac" not in r
  assert rows[0]["truncated_frac"] > 0  # the first rollout has completions cut at 3 tokens


@pytest.mark.slow
def test_exclude_leaves_the_truncated_completions_out_of_the_loss(baseline, tmp_path):
  _, plain = baseline
  rows = test_util.run_rl(_config(overlong="exclude"), str(tmp_path / "exclude"))
  first, f = rows[0], rows[0]["truncated_frac"]
  # The same first rollout as the baseline's.
  assert first["reward_mean"] == plain[0]["reward_mean"] and f == plain[0]["truncated_frac"] > 0
  for r in rows:  # no filter: every sampled completion is trained on, or excluded
    assert r["overlong_excluded_frac"] == r["truncated_frac"]
  # The 16 trained completions lose the 16 f cut ones, each of max_new_tokens tokens:
  # completion_len (tokens per trained completion) * 16 (1 - f) = baseline's * 16 - 3 * 16 f.
  np.testing.assert_allclose(first["completion_len"] * (1 - f),
                             plain[0]["completion_len"] - MAX_NEW_TOKENS * f, rtol=1e-6)
  assert first["completion_len"] < plain[0]["completion_len"]
  # The objective's token averages (here the policy's entropy) lose the cut completions' tokens.
  assert abs(first["entropy"] - plain[0]["entropy"]) > 1e-4


@pytest.mark.slow
def test_penalty_lowers_the_rewards_of_completions_at_the_cap(baseline, tmp_path):
  _, plain = baseline
  rows = test_util.run_rl(_config(overlong="penalty", overlong_cache=1), str(tmp_path / "penalty"))
  first = rows[0]
  # The same first rollout; reward_mean stays the task's reward.
  assert first["reward_mean"] == plain[0]["reward_mean"]
  assert first["truncated_frac"] == plain[0]["truncated_frac"] > 0
  for r in rows:
    # L_cache = 1: every completion of max_new_tokens tokens loses 1, those cut and those whose
    # EOS came last; the others nothing.
    pen = r["overlong_penalty_mean"]
    assert -1.0 <= pen <= -r["truncated_frac"] <= 0 and _sixteenths(pen)
  assert first["overlong_penalty_mean"] < 0
  # The penalty changes the advantages the policy trains on.
  assert abs(first["abs_adv_mean"] - plain[0]["abs_adv_mean"]) > 1e-3
  assert abs(first["loss"] - plain[0]["loss"]) > 1e-4
