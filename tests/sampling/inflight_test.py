"""Tests of rl_curriculum/sampling/inflight.py: several generations of rows in one engine.

Every generation's rows must be the rows `continuous.sample` gives its batch alone (tokens and
mask exactly, log-probs to 1e-5: the rows share decode batches with other generations' rows, and
XLA's CPU kernels depend on the batch), however the decoding is cut into calls, whichever slots
the rows run in and whatever the other generations do.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl_curriculum.model import transformer
from rl_curriculum.model.config import ModelConfig
from rl_curriculum.sampling import continuous
from rl_curriculum.sampling import inflight

V, P, G, TP, N = 64, 2, 4, 6, 9
R = P * G
W = 3            # generations
SLOTS = 5
NEVER = V        # an eos id the model cannot emit
STATIC = dict(max_new_tokens=N, group=G)


@pytest.fixture(scope="module", params=[False, True], ids=["unrolled", "scanned"])
def model(request):
  config = ModelConfig.tiny(vocab_size=V, d_model=64, num_layers=2, num_heads=4, num_kv_heads=2,
                            mlp_dim=128, init_std=0.3, scan_layers=request.param)
  return transformer.init_model(config, seed=0)


def _batch(seed):
  """Prompts i32[R, TP], mask, an active mask (one skipped row), per-row lengths, a key."""
  rng = np.random.default_rng(seed)
  tokens = np.repeat(rng.integers(1, V, size=(P, TP)).astype(np.int32), G, axis=0)
  mask = np.ones((R, TP), bool)
  mask[:G, :seed % 3] = False
  active = np.ones(R, bool)
  active[seed % R] = False
  lengths = rng.integers(1, N + 1, R).astype(np.int32)
  lengths[seed % 5] = N
  return tokens, mask, active, lengths, jax.random.PRNGKey(100 + seed)


def _alone(model, batch, temperature):
  tokens, mask, active, lengths, key = batch
  return jax.device_get(continuous.sample(
      *model, tokens, mask, key, slots=SLOTS, temperature=temperature, eos_id=NEVER,
      active=active, stop_after=lengths, **STATIC).rollout)


def _admit(model, state, batch, generation):
  tokens, mask, active, lengths, key = batch
  return inflight.admit(*model, state, jnp.asarray(tokens), jnp.asarray(mask), key,
                        jnp.int32(generation), jnp.asarray(active), jnp.asarray(lengths),
                        max_new_tokens=N, group=G)


def _run(model, state, temperature, version=0, budget=None, due=None):
  as_i32 = lambda x: None if x is None else jnp.int32(x)
  return continuous.run(model[0], model[1], state, jnp.float32(temperature), jnp.int32(version),
                        as_i32(budget), as_i32(due), stop_ids=(NEVER,), group=G)


def _init(model):
  return inflight.init(*model, jax.random.PRNGKey(0), rows=R, generations=W, prompt_len=TP,
                       slots=SLOTS, **STATIC)


def _assert_rows(got: inflight.Harvest, want):
  np.testing.assert_array_equal(got.tokens, want.tokens)
  np.testing.assert_array_equal(got.mask, want.mask)
  np.testing.assert_allclose(got.logprobs, want.logprobs, atol=1e-5, rtol=0)


def test_one_generation_is_the_single_call_engine(model):
  batch = _batch(1)
  tokens, mask, active, lengths, key = batch
  state = inflight.init(*model, jax.random.PRNGKey(0), rows=R, generations=1, prompt_len=TP,
                        slots=SLOTS, **STATIC)
  state = _run(model, _admit(model, state, batch, 0), 1.2)
  alone = continuous.run(model[0], model[1], continuous.start(
      *model, jnp.asarray(tokens), jnp.asarray(mask), key, jnp.asarray(active),
      jnp.asarray(lengths), slots=SLOTS, **STATIC), jnp.float32(1.2), stop_ids=(NEVER,), group=G)
  for field in ("tokens", "logprobs", "mask", "slot_steps", "iterations"):
    np.testing.assert_array_equal(getattr(state, field), getattr(alone, field))


def test_generations_decoded_in_slices_equal_each_batch_alone(model):
  """A ring of W generations fed a batch a step for 2W steps, each step decoding a budget of
  iterations and taking the oldest batch out once its rows stop (`due`), with a new version each
  step: every batch equals its own single call; its tokens' versions are those of the calls
  that drew them, never older than W - 1 calls before the one that took it out."""
  state = _init(model)
  batches = [_batch(seed) for seed in range(2 * W)]
  for w in range(W - 1):
    state = _admit(model, state, batches[w], w)
  for step in range(2 * W - W + 1):
    newest = step + W - 1
    if newest < len(batches):
      state = _admit(model, state, batches[newest], newest % W)
    state = _run(model, state, 0.9, version=step, budget=3)
    state = _run(model, state, 0.9, version=step, due=step % W)
    assert not inflight.pending(state, jnp.int32(step % W))
    rows = jax.device_get(inflight.harvest(state, jnp.int32(step % W)))
    _assert_rows(rows, _alone(model, batches[step], 0.9))
    counted = rows.mask > 0
    assert rows.done.all()
    assert rows.versions[counted].max() <= step
    assert rows.versions[counted].min() >= step - (W - 1)
  state = _run(model, state, 0.9, version=99)  # the rest, to the end
  for step in (2 * W - 2, 2 * W - 1):
    _assert_rows(jax.device_get(inflight.harvest(state, jnp.int32(step % W))),
                 _alone(model, batches[step], 0.9))
  assert int(state.drawn) == sum(int(_alone(model, b, 0.9).mask.sum()) for b in batches)


def test_versions_record_the_call_that_drew_each_token(model):
  state = _admit(model, _init(model), _batch(4), 0)
  state = _run(model, state, 1.0, version=7, budget=2)
  state = _run(model, state, 1.0, version=8)
  rows = jax.device_get(inflight.harvest(state, jnp.int32(0)))
  # Rows seated from the start (5 slots) drew their first two tokens in the first call.
  for r in np.flatnonzero(rows.mask.sum(axis=1) > 0)[:SLOTS]:
    length = int(rows.mask[r].sum())
    np.testing.assert_array_equal(rows.versions[r, :length],
                                  np.where(np.arange(length) < 2, 7, 8))


def test_evicted_rows_leave_and_the_next_generation_is_untouched(model):
  """Generation 0 is evicted after 2 iterations: its unfinished rows are not done, keep what
  they drew and take no more slot-steps; generation 1 then equals its batch alone."""
  first, second = _batch(2), _batch(3)
  state = _admit(model, _admit(model, _init(model), first, 0), second, 1)
  state = _run(model, state, 1.1, budget=2)
  state = inflight.evict(state, jnp.int32(0))
  cut = jax.device_get(inflight.harvest(state, jnp.int32(0)))
  lengths, active = first[3], first[2]
  np.testing.assert_array_equal(cut.done, ~active | (cut.mask.sum(axis=1) == lengths))
  assert not cut.done.all() and inflight.pending(state, jnp.int32(0))  # the cut rows never stop
  state = _run(model, state, 1.1)
  after = jax.device_get(inflight.harvest(state, jnp.int32(0)))
  np.testing.assert_array_equal(after.mask, cut.mask)  # nothing more was drawn for them
  _assert_rows(jax.device_get(inflight.harvest(state, jnp.int32(1))), _alone(model, second, 1.1))


def test_compiled_once_per_shape(model):
  state = _admit(model, _init(model), _batch(5), 1)
  _run(model, state, 1.0, budget=1, due=1)
  programs = (inflight._empty, inflight.admit, continuous.run)  # pylint: disable=protected-access
  before = [f._cache_size() for f in programs]  # pylint: disable=protected-access
  state = _admit(model, _init(model), _batch(6), 2)
  _run(model, state, 0.5, version=3, budget=2, due=0)
  after = [f._cache_size() for f in programs]  # pylint: disable=protected-access
  assert after == before
