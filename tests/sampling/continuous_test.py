"""Tests of rl_curriculum/sampling/continuous.py (and the prefix cache it decodes from).

The engine must give every row the tokens and mask the static sampler gives it, whatever slot it
ran in, and its log-probs to float rounding (1e-5): XLA's CPU compiler picks kernels by batch
size (measured: the one-query attention's reductions at 1-3 rows, the tied output head at one
row, a 576-wide matmul below 48 rows), and the engine reads a prompt's and a completion's slots
as two parts, so the last bits of a log-prob may differ.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl_curriculum.model import decoding
from rl_curriculum.model import kv_cache
from rl_curriculum.model import prefix_cache
from rl_curriculum.model import transformer
from rl_curriculum.sampling import continuous
from rl_curriculum.sampling import prompt_prefill
from rl_curriculum.sampling import sampler
import test_util

V, P, G, TP, N = 64, 3, 4, 7, 10
R = P * G
NEVER = V  # an eos id the model cannot emit


@pytest.fixture(scope="module", params=[False, True], ids=["unrolled", "scanned"])
def model(request):
  return transformer.init_model(test_util.engine_model_config(request.param), seed=0)


def _prompts(seed=0):
  rng = np.random.default_rng(seed)
  tokens = np.repeat(rng.integers(1, V, size=(P, TP)).astype(np.int32), G, axis=0)
  mask = np.ones((R, TP), bool)
  mask[:G, :3] = False  # the first group's prompt is shorter
  return tokens, mask


def _both(model, slots, *, key=1, shrink=0, **kwargs):
  tokens, mask = _prompts()
  kwargs = dict(max_new_tokens=N, group=G, **{"eos_id": NEVER, **kwargs})
  static = sampler.sample(*model, tokens, mask, jax.random.PRNGKey(key), **kwargs)
  gen = continuous.sample(*model, tokens, mask, jax.random.PRNGKey(key), slots=slots,
                          shrink=shrink, **kwargs)
  return jax.device_get(static), jax.device_get(gen)


def _assert_same(static, rollout):
  """Equal tokens and mask, log-probs to 1e-5."""
  np.testing.assert_array_equal(rollout.tokens, static.tokens)
  np.testing.assert_array_equal(rollout.mask, static.mask)
  np.testing.assert_allclose(rollout.logprobs, static.logprobs, atol=1e-5, rtol=0)


@pytest.mark.parametrize("slots", [3, 5, R, R + 4])
def test_greedy_equals_static_engine(model, slots):
  static, gen = _both(model, slots, greedy=True)
  _assert_same(static, gen.rollout)
  assert static.mask.sum() == R * N  # every row ran to max_new_tokens


@pytest.mark.parametrize("slots", [2, 7, R + 1])
def test_sampled_with_per_row_keys_equals_static_engine(model, slots):
  static, gen = _both(model, slots, temperature=1.3, key=5)
  _assert_same(static, gen.rollout)
  # The rows of a group drew different completions (the keys are per row, not per slot).
  assert len({tuple(row) for row in static.tokens[:G]}) > 1


def test_stop_tokens_and_eos_as_first_token_equal_static_engine(model):
  free, _ = _both(model, R, greedy=True)
  # A stop id that some rows emit first and others later, and the most frequent token as EOS.
  first = int(free.tokens[0, 0])
  common = int(np.bincount(free.tokens.reshape(-1)).argmax())
  static, gen = _both(model, 4, greedy=True, eos_id=common, stop_ids=(first,))
  _assert_same(static, gen.rollout)
  lengths = static.mask.sum(axis=1)
  assert lengths[0] == 1 and lengths.max() > 1  # stopped at its first token; others went on


def test_one_slot_runs_every_row_in_turn(model):
  static, gen = _both(model, 1, temperature=1.1)
  _assert_same(static, gen.rollout)
  # One row after the other, no slot-step idle: a row of N tokens feeds N - 1 of them (its first
  # is drawn from its prompt's prefill logits, its last is never fed).
  assert gen.slot_steps == R * (N - 1)


def test_skipped_rows_take_no_slot_and_every_row_skipped_costs_nothing(model):
  active = np.ones(R, bool)
  active[G:2 * G] = False      # a skipped group
  active[[1, 2 * G + 3]] = False
  static, gen = _both(model, 3, greedy=True, active=active)
  _assert_same(static, gen.rollout)
  assert not gen.rollout.mask[~active].any()
  # 6 active rows of N tokens on 3 slots: no slot-step idle, none spent on a skipped row.
  assert gen.rollout.mask.sum() == active.sum() * N
  assert gen.slot_steps == active.sum() * (N - 1)
  none, gen = _both(model, 3, greedy=True, active=np.zeros(R, bool))
  assert gen.slot_steps == 0 and not gen.rollout.mask.any()
  np.testing.assert_array_equal(gen.rollout.tokens, 0)


def test_long_tail_lengths_keep_the_slots_busy(model):
  """Rows with very different lengths (stop_after): the static engine holds every row until the
  longest ends; the continuous one refills, so its slot-steps are about the tokens kept."""
  lengths = np.full(R, 1, np.int32)
  lengths[[0, 7]] = N
  static, gen = _both(model, 2, greedy=True, stop_after=lengths)
  _assert_same(static, gen.rollout)
  np.testing.assert_array_equal(gen.rollout.mask.sum(axis=1), lengths)
  kept = lengths.sum()
  assert gen.slot_steps <= kept - R + 2 * (N - 1)  # at worst one long row alone at the end
  # The static engine computed R rows x N steps for the same 30 tokens (utilisation 0.25).
  assert kept / gen.slot_steps >= 2 * kept / (R * N)


def test_stage_slots_halve_while_the_shards_split_evenly():
  assert continuous.stage_slots(64, 1, 3) == (64, 32, 16, 8)
  assert continuous.stage_slots(64, 1, 0) == (64,)
  assert continuous.stage_slots(12, 1, 3) == (12, 6, 3)  # 3 is odd: no fourth halving
  assert continuous.stage_slots(16, 8, 3) == (16, 8)     # one slot per shard
  assert continuous.stage_slots(48, 4, 5) == (48, 24, 12)     # 3 a shard: odd


@pytest.mark.parametrize("slots,shrink", [(8, 3), (6, 2)])
def test_shrinking_slots_equal_static_engine_at_fewer_slot_steps(model, slots, shrink):
  """Long-tailed lengths: the halved stages give every row the static engine's tokens, greedy
  and sampled, and compute fewer slot-steps than the fixed slots for the same rows."""
  lengths = np.random.default_rng(0).integers(1, N + 1, R).astype(np.int32)
  lengths[[1, 9]] = N
  for kwargs in (dict(greedy=True), dict(temperature=1.3, key=5)):
    static, fixed = _both(model, slots, stop_after=lengths, **kwargs)
    _, shrunk = _both(model, slots, stop_after=lengths, shrink=shrink, **kwargs)
    _assert_same(static, shrunk.rollout)
    np.testing.assert_array_equal(shrunk.rollout.mask.sum(axis=1), lengths)
    assert lengths.sum() - R <= shrunk.slot_steps < fixed.slot_steps  # first tokens are free


def test_chunked_prefill_matches_whole_prefill(model):
  tokens, mask = _prompts(seed=3)
  whole = prompt_prefill.prefill_prompts(*model, tokens[::G], mask[::G])
  for chunk in (2, 3, 4):
    logits, cache, cmask = prompt_prefill.prefill_prompts(*model, tokens[::G], mask[::G],
                                                          chunk=chunk)
    pad = prompt_prefill.padded_length(TP, chunk) - TP
    assert cmask.shape == (P, TP + pad) and not cmask[:, :pad].any()
    np.testing.assert_allclose(logits, whole[0], atol=1e-5, rtol=0)
    for got, want in zip(jax.tree.leaves(cache), jax.tree.leaves(whole[1])):
      axis = got.ndim - 3
      got = np.take(np.asarray(got), np.arange(pad, pad + TP), axis=axis)
      real = np.broadcast_to(mask[::G].reshape((1,) * (axis - 1) + (P, TP, 1, 1)), got.shape)
      np.testing.assert_allclose(got[real], np.asarray(want)[real], atol=1e-5, rtol=0)
  # Both engines prefill with the same chunks: their rows stay equal.
  static, gen = _both(model, 5, greedy=True, prefill_chunk=3)
  _assert_same(static, gen.rollout)


def test_prefix_shared_attention_equals_repeated_cache_attention():
  """decode_slots over a PrefixCache == decode_step over the KVCache that repeats each prompt's
  slots for its rows (random caches, rows at different completion slots)."""
  config = test_util.engine_model_config(False)
  graphdef, params = transformer.init_model(config, seed=1)
  rng = np.random.default_rng(0)
  shape = lambda *s: rng.standard_normal(s).astype(np.float32)
  layers, hkv, hd, slots = config.num_layers, config.num_kv_heads, config.head_dim, 5
  prompt = [(shape(P, TP, hkv, hd), shape(P, TP, hkv, hd)) for _ in range(layers)]
  comp = [(shape(slots, N, hkv, hd), shape(slots, N, hkv, hd)) for _ in range(layers)]
  prompt_mask = rng.random((P, TP)) < 0.7
  prompt_mask[:, -1] = True
  which = np.array([2, 0, 2, 1, 0], np.int32)
  step = np.array([0, 3, 9, 5, 1], np.int32)
  tokens = rng.integers(0, V, slots).astype(np.int32)
  positions = prompt_mask.sum(1)[which] + step
  cache = prefix_cache.PrefixCache(tuple(p[0] for p in prompt), tuple(p[1] for p in prompt),
                                   tuple(c[0] for c in comp), tuple(c[1] for c in comp))
  index = prefix_cache.SlotIndex(prompt=jnp.asarray(which)[None], step=jnp.asarray(step))
  logits, new = jax.jit(decoding.decode_slots, static_argnums=0)(
      graphdef, params, tokens, positions, prompt_mask, cache, index)
  out = []
  for s in range(slots):  # each slot alone, through a KVCache of Tp + N slots
    full = kv_cache.KVCache(
        tuple(np.concatenate([p[0][which[s]], c[0][s]])[None] for p, c in zip(prompt, comp)),
        tuple(np.concatenate([p[1][which[s]], c[1][s]])[None] for p, c in zip(prompt, comp)))
    key_mask = np.concatenate([prompt_mask[which[s]], np.ones(N, bool)])[None]
    row, full = decoding.decode_step(graphdef, params, tokens[s:s + 1], positions[s:s + 1],
                                     key_mask, full, TP + step[s])
    out.append(row[0])
    np.testing.assert_allclose(new.k[0][s], full.k[0][0, TP:], atol=1e-5, rtol=0)
  np.testing.assert_allclose(logits, np.stack(out), atol=1e-5, rtol=0)


def test_compiled_once_per_shape(model):
  _both(model, 5, temperature=0.9, key=1, active=np.ones(R, bool))
  before = test_util.compiled_programs(continuous.start, continuous.run)
  _both(model, 5, temperature=0.7, key=2, active=np.arange(R) % 3 == 0)
  _both(model, 5, temperature=0.7, key=3, active=np.arange(R) % 2 == 0)
  assert test_util.compiled_programs(continuous.start, continuous.run) == before


@pytest.mark.parametrize("kwargs,match", [
    (dict(slots=0), "slots must be a positive"),
    (dict(slots=2.5), "slots must be a positive"),
    (dict(slots=4, group=5), "groups of 5"),
    (dict(slots=4, max_new_tokens=0), "max_new_tokens"),
    (dict(slots=4, shrink=-1), "shrink must be"),
])
def test_bad_settings_raise(model, kwargs, match):
  tokens, mask = _prompts()
  kwargs = {"max_new_tokens": N, "group": G, **kwargs}
  with pytest.raises(ValueError, match=match):
    continuous.sample(*model, tokens, mask, jax.random.PRNGKey(0), eos_id=NEVER, **kwargs)
