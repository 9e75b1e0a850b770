"""Tests of rl_curriculum/sampling/sampler.py."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rl_curriculum.model import layer_stacking
from rl_curriculum.model import transformer
from rl_curriculum.model.config import ModelConfig
from rl_curriculum.sampling import sampler
from rl_curriculum.types import Rollout
import test_util

CONFIG = ModelConfig.tiny(vocab_size=48, d_model=32, num_layers=2, num_heads=4, num_kv_heads=2,
                          mlp_dim=48, init_std=0.3)
NEVER = CONFIG.vocab_size  # an eos id the model cannot emit: rows run to max_new_tokens
NUM_NEW = 8
_forward = jax.jit(transformer.forward, static_argnums=0)


@pytest.fixture(scope="module")
def model():
  return transformer.init_model(CONFIG, seed=0)


def _prompts(seed=0, lengths=(6, 2, 4, 1), width=6):
  rng = np.random.default_rng(seed)
  tokens = rng.integers(0, CONFIG.vocab_size, size=(len(lengths), width)).astype(np.int32)
  mask = np.zeros((len(lengths), width), bool)
  for b, n in enumerate(lengths):
    mask[b, width - n:] = True
  return tokens, mask


def _replay_logits(model, rollout, prompt_mask):
  """Full-forward logits f32[B, N, V] that predicted each completion token."""
  tp = rollout.prompt_tokens.shape[1]
  tokens = np.concatenate([rollout.prompt_tokens, rollout.tokens], axis=1)
  mask = np.concatenate([prompt_mask, np.ones(rollout.tokens.shape, bool)], axis=1)
  return np.asarray(_forward(*model, tokens, mask))[:, tp - 1:-1]


def _first_stop(tokens, stops):
  """Index of the first stop token of each row (NumPy loop), len(row) if none."""
  out = []
  for row in tokens:
    out.append(next((t for t, tok in enumerate(row) if tok in stops), len(row)))
  return out


def test_sampled_logprobs_equal_full_forward_and_draws_are_plain_sampling(model):
  prompts, mask = _prompts()
  key = jax.random.key(1)
  rollout = sampler.sample(*model, prompts, mask, key, max_new_tokens=NUM_NEW, eos_id=NEVER)
  assert isinstance(rollout, Rollout)
  assert rollout.tokens.shape == (4, NUM_NEW) and rollout.tokens.dtype == jnp.int32
  assert rollout.logprobs.dtype == jnp.float32 and rollout.mask.dtype == jnp.float32
  np.testing.assert_array_equal(rollout.prompt_tokens, prompts)
  np.testing.assert_array_equal(rollout.mask, 1.0)
  logits = _replay_logits(model, rollout, mask)
  logp = jax.nn.log_softmax(logits, axis=-1)
  expected = np.take_along_axis(np.asarray(logp), np.asarray(rollout.tokens)[:, :, None], -1)
  np.testing.assert_allclose(rollout.logprobs, expected[:, :, 0], atol=1e-4, rtol=0)
  # Row b's draw t is the inverse-CDF draw of the policy's distribution with the uniform of
  # fold_in(fold_in(key, b), t): top_p = 1 and top_k = 0 leave plain sampling untouched.
  probs = np.asarray(jax.nn.softmax(logits, axis=-1), np.float64)
  for b in range(4):
    for t in range(NUM_NEW):
      u = float(jax.random.uniform(jax.random.fold_in(jax.random.fold_in(key, b), t), ()))
      assert rollout.tokens[b, t] == np.searchsorted(np.cumsum(probs[b, t]), u, side="right")


def test_greedy_follows_forward_argmax_and_top_k_one_and_cold_temperature_equal_it(model):
  prompts, mask = _prompts(seed=2)
  greedy = sampler.sample(*model, prompts, mask, jax.random.key(0), max_new_tokens=NUM_NEW,
                          eos_id=NEVER, greedy=True)
  logits = _replay_logits(model, greedy, mask)
  np.testing.assert_array_equal(greedy.tokens, np.argmax(logits, axis=-1))
  for seed in (3, 4):
    top1 = sampler.sample(*model, prompts, mask, jax.random.key(seed), max_new_tokens=NUM_NEW,
                          eos_id=NEVER, top_k=1)
    cold = sampler.sample(*model, prompts, mask, jax.random.key(seed), max_new_tokens=NUM_NEW,
                          eos_id=NEVER, temperature=1e-6)
    for other in (top1, cold):
      np.testing.assert_array_equal(other.tokens, greedy.tokens)
    # Log-probs are those of the tempered policy that drew the token: at temperature 1 (top-k
    # does not renormalise them) the raw policy's, at 1e-6 those of a point mass, 0.
    np.testing.assert_allclose(top1.logprobs, greedy.logprobs, atol=1e-6, rtol=0)
    np.testing.assert_allclose(cold.logprobs, 0.0, atol=1e-6, rtol=0)


def test_top_p_draws_only_from_the_nucleus(model):
  prompts, mask = _prompts(seed=5)
  rollout = sampler.sample(*model, prompts, mask, jax.random.key(6), max_new_tokens=NUM_NEW,
                           eos_id=NEVER, top_p=0.5)
  logits = _replay_logits(model, rollout, mask).astype(np.float64)
  for b in range(4):
    for t in range(NUM_NEW):
      row = logits[b, t]
      probs = np.exp(row - row.max())
      probs /= probs.sum()
      mass_before = sum(probs[v] for v in range(len(row)) if row[v] > row[rollout.tokens[b, t]])
      assert mass_before < 0.5 + 1e-6, (b, t)


def test_stop_tokens_stop_rows_independently(model):
  prompts, mask = _prompts(seed=7)
  key = jax.random.key(8)
  free = sampler.sample(*model, prompts, mask, key, max_new_tokens=NUM_NEW, eos_id=NEVER)
  free_tokens = np.asarray(free.tokens)
  eos, extra = int(free_tokens[0, 2]), int(free_tokens[1, 4])
  stops = {eos, extra}
  stop_at = _first_stop(free_tokens, stops)
  assert len(set(stop_at)) > 1  # rows stop at different steps in this set-up

  pad = 47
  stopped = sampler.sample(*model, prompts, mask, key, max_new_tokens=NUM_NEW, eos_id=eos,
                           stop_ids=(extra,), pad_id=pad)
  for b in range(4):
    for t in range(NUM_NEW):
      if t <= stop_at[b]:  # up to and including the stop token: the free run, counted
        assert stopped.tokens[b, t] == free_tokens[b, t]
        assert stopped.mask[b, t] == 1.0
        np.testing.assert_allclose(stopped.logprobs[b, t], free.logprobs[b, t], atol=1e-5)
      else:
        assert stopped.tokens[b, t] == pad and stopped.mask[b, t] == 0.0
        assert stopped.logprobs[b, t] == 0.0


def test_loop_exits_early_once_every_row_stopped(model):
  prompts, mask = _prompts(seed=9)
  greedy = sampler.sample(*model, prompts, mask, jax.random.key(0), max_new_tokens=NUM_NEW,
                          eos_id=NEVER, greedy=True)
  stops = tuple(sorted(set(np.asarray(greedy.tokens[:, 1]).tolist())))
  state = sampler.prefill(*model, prompts, mask, jax.random.key(0), max_new_tokens=NUM_NEW)
  state = sampler.decode(*model, state, jnp.float32(1.0), greedy=True, stop_ids=stops)
  first = _first_stop(np.asarray(greedy.tokens), set(stops))
  assert int(state.step) == max(first) + 1 < NUM_NEW
  np.testing.assert_array_equal(np.asarray(state.mask).sum(axis=1), np.asarray(first) + 1)
  assert bool(jnp.all(state.done))


def test_sampler_compiles_once_per_shape(model):
  prompts, mask = _prompts(seed=10, lengths=(3, 1, 2, 3, 2), width=3)  # a shape no other test uses
  programs = lambda: test_util.compiled_programs(sampler.prefill, sampler.decode)
  before = programs()
  for seed, temperature in [(0, 1.0), (1, 0.7), (2, 1.3)]:
    sampler.sample(*model, np.roll(prompts, seed, axis=0), mask, jax.random.key(seed),
                   max_new_tokens=5, eos_id=0, temperature=temperature)
  assert programs() == (before[0] + 1, before[1] + 1)
  sampler.sample(*model, prompts, mask, jax.random.key(0), max_new_tokens=6, eos_id=0)
  assert programs() == (before[0] + 2, before[1] + 2)
  sampler.sample(*model, prompts, mask, jax.random.key(5), max_new_tokens=5, eos_id=0)
  assert programs() == (before[0] + 2, before[1] + 2)


def test_bfloat16_model_samples_finite_logprobs(model):
  config = dataclasses.replace(CONFIG, dtype="bfloat16", param_dtype="bfloat16")
  graphdef = nnx.split(nnx.eval_shape(lambda: transformer.Transformer(config,
                                                                      rngs=nnx.Rngs(0))))[0]
  params = jax.tree.map(lambda x: x.astype(jnp.bfloat16), model[1])  # the float32 weights, cast
  prompts, mask = _prompts(seed=11)
  rollout = sampler.sample(graphdef, params, prompts, mask, jax.random.key(0), max_new_tokens=3,
                           eos_id=NEVER)
  assert np.all(np.isfinite(rollout.logprobs)) and np.all(np.asarray(rollout.logprobs) < 0)
  np.testing.assert_array_equal(rollout.mask, 1.0)


def test_grouped_prompts_prefilled_once_sample_as_separate_rows(model):
  """Rows in runs of 3 equal prompts: prefilling each prompt once (group=3) gives the rollout of
  prefilling every row, and rows of a run still draw their own tokens."""
  prompts, mask = _prompts(seed=4)
  prompts, mask = np.repeat(prompts, 3, axis=0), np.repeat(mask, 3, axis=0)
  key = jax.random.key(5)
  settings = dict(max_new_tokens=NUM_NEW, eos_id=NEVER)
  grouped = sampler.sample(*model, prompts, mask, key, group=3, **settings)
  per_row = sampler.sample(*model, prompts, mask, key, **settings)
  np.testing.assert_array_equal(grouped.tokens, per_row.tokens)
  np.testing.assert_allclose(grouped.logprobs, per_row.logprobs, atol=1e-5, rtol=0)
  assert len({tuple(row) for row in np.asarray(grouped.tokens)}) > 4


@pytest.mark.parametrize("kwargs, match", [
    (dict(group=3), "group"),
    (dict(group=0), "group"),
    (dict(max_new_tokens=0), "max_new_tokens"),
    (dict(temperature=0.0), "temperature"),
    (dict(top_p=0.0), "top_p"),
    (dict(top_k=-1), "top_k"),
])
def test_bad_settings_raise(model, kwargs, match):
  prompts, mask = _prompts()
  settings = dict(max_new_tokens=4, eos_id=0)
  settings.update(kwargs)
  with pytest.raises(ValueError, match=match):
    sampler.sample(*model, prompts, mask, jax.random.key(0), **settings)


def test_mismatched_prompt_mask_raises(model):
  prompts, mask = _prompts()
  with pytest.raises(ValueError, match="prompt_mask"):
    sampler.sample(*model, prompts, mask[:, 1:], jax.random.key(0), max_new_tokens=2, eos_id=0)


@pytest.mark.parametrize("group", [1, 3])
def test_scanned_model_samples_what_the_unrolled_one_does(model, group):
  """The scanned layout (stacked weights, stacked [L, B, S, ...] cache) draws the same greedy
  tokens and log-probs, with and without grouped prefill; sampled draws too."""
  graphdef = transformer.init_model(dataclasses.replace(CONFIG, scan_layers=True))[0]
  scanned = (graphdef, layer_stacking.stack_layers(model[1]))
  prompts, mask = _prompts(seed=12)
  prompts, mask = np.repeat(prompts, group, axis=0), np.repeat(mask, group, axis=0)
  for settings in (dict(greedy=True), dict(temperature=0.8)):
    settings.update(max_new_tokens=NUM_NEW, eos_id=NEVER, group=group)
    ours = sampler.sample(*scanned, prompts, mask, jax.random.key(13), **settings)
    theirs = sampler.sample(*model, prompts, mask, jax.random.key(13), **settings)
    np.testing.assert_array_equal(ours.tokens, theirs.tokens)
    np.testing.assert_allclose(ours.logprobs, theirs.logprobs, atol=1e-5, rtol=0)
  state = sampler.prefill(*scanned, prompts, mask, jax.random.key(0), max_new_tokens=NUM_NEW,
                          group=group)
  assert state.cache.k.shape == (CONFIG.num_layers, 4 * group, 6 + NUM_NEW, 2, 8)
