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

from rl_curriculum.model import decoding
from rl_curriculum.model import transformer
from rl_curriculum.rl import off_policy
from rl_curriculum.rl import stability
from rl_curriculum.sampling import continuous
from rl_curriculum.sampling import inflight
from rl_curriculum.train.learn import forward, rl_step
from rl_curriculum.train.learn import view as view_lib
from rl_curriculum.train.learn.rl_types import Batch
import test_util

V, P, G, TP, N = 64, 2, 4, 6, 9
R = P * G
W = 3            # generations
SLOTS = 5
NEVER = V        # an eos id the model cannot emit
STATIC = dict(max_new_tokens=N, group=G)


@pytest.fixture(scope="module", params=[False, True], ids=["unrolled", "scanned"])
def model(request):
  return transformer.init_model(test_util.engine_model_config(request.param), seed=0)


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


def _admit(model, state, batch, generation, temperature, version=0):
  tokens, mask, active, lengths, key = batch
  return inflight.admit(*model, state, jnp.asarray(tokens), jnp.asarray(mask), key,
                        jnp.int32(generation), jnp.float32(temperature), jnp.int32(version),
                        jnp.asarray(active), jnp.asarray(lengths), max_new_tokens=N, group=G,
                        stop_ids=(NEVER,))


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
  state = _run(model, _admit(model, state, batch, 0, 1.2), 1.2)
  alone = continuous.run(model[0], model[1], continuous.start(
      *model, jnp.asarray(tokens), jnp.asarray(mask), key, jnp.float32(1.2), jnp.asarray(active),
      jnp.asarray(lengths), slots=SLOTS, stop_ids=(NEVER,), **STATIC), jnp.float32(1.2),
      stop_ids=(NEVER,), group=G)
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
    state = _admit(model, state, batches[w], w, 0.9)
  for step in range(2 * W - W + 1):
    newest = step + W - 1
    if newest < len(batches):
      state = _admit(model, state, batches[newest], newest % W, 0.9, version=step)
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


_prefill = jax.jit(decoding.prefill, static_argnums=(0, 4))
_decode_step = jax.jit(decoding.decode_step, static_argnums=0)


def _reference_logprobs(graphdef, weights, batch, rows, r, temperature):
  """f32[L] log-probs of row r's L recorded tokens, decoded again one token at a time through a
  plain `KVCache` (`decoding.prefill`, `decoding.decode_step`), each token drawn from the
  logits of the weights its version names (`weights[version]`): the prompt prefilled by the
  first token's, token j fed by the weights of token j + 1, which its logits drew."""
  logp = lambda logits, token: float(jax.nn.log_softmax(logits[0] / temperature)[token])
  tokens, mask = batch[0][r:r + 1], batch[1][r:r + 1]
  length, versions = int(rows.mask[r].sum()), rows.versions[r]
  logits, cache = _prefill(graphdef, weights[versions[0]], tokens, mask, TP + N)
  out = [logp(logits, rows.tokens[r, 0])]
  for j in range(length - 1):
    key_mask = np.concatenate([mask[0], np.arange(N) <= j])[None]
    logits, cache = _decode_step(graphdef, weights[versions[j + 1]], rows.tokens[r, j:j + 1],
                                 np.array([mask.sum() + j], np.int32), key_mask, cache,
                                 jnp.int32(TP + j))
    out.append(logp(logits, rows.tokens[r, j + 1]))
  return np.array(out, np.float32)


def test_each_token_carries_the_version_of_the_weights_that_drew_it(model):
  """A batch admitted and decoded 2 iterations with weights A (version 3), then to the end with
  other weights B (version 4). A token is drawn from the logits of the weights that fed the
  token before it (its keys and values kept from earlier weights): decoding each row again
  through a plain KV cache with the weights its tags name gives every recorded log-prob. The rows
  seated from the start drew their first token from A's prefill and two more in A's iterations
  (versions 3, 3, 3, then 4); with the call's version on every token, their third token would
  read 4 and its log-prob would be A's."""
  graphdef, params_a = model
  scanned = transformer.merge_params(graphdef, params_a).config.scan_layers
  params_b = transformer.init_model(test_util.engine_model_config(scanned), seed=1)[1]
  batch = _batch(4)
  state = _admit((graphdef, params_a), _init(model), batch, 0, 1.0, version=3)
  state = _run((graphdef, params_a), state, 1.0, version=3, budget=2)
  state = _run((graphdef, params_b), state, 1.0, version=4)
  rows = jax.device_get(inflight.harvest(state, jnp.int32(0)))
  assert set(np.unique(rows.versions[rows.mask > 0])) == {3, 4}
  for r in np.flatnonzero(batch[2]):  # the active rows
    length = int(rows.mask[r].sum())
    np.testing.assert_allclose(
        rows.logprobs[r, :length],
        _reference_logprobs(graphdef, {3: params_a, 4: params_b}, batch, rows, r, 1.0),
        atol=1e-5, rtol=0, err_msg=f"row {r}, versions {rows.versions[r, :length]}")
  seated = np.flatnonzero(batch[2])[:SLOTS]  # the first active rows took the SLOTS slots
  for r in seated:
    length = int(rows.mask[r].sum())
    np.testing.assert_array_equal(rows.versions[r, :length],
                                  np.where(np.arange(length) < 3, 3, 4))
  # The learn step from version 5 reads those tags: each counted token's staleness, the
  # largest and mean over them, and the loglinear proximal policy's weight s / (s + 1) between
  # the sampler's log-prob and the current one (2/3 for A's tokens, 1/2 for B's).
  learned = _learn_side(graphdef, params_b, batch, rows, version=5)
  counted = rows.mask > 0
  hand = np.where(counted, 5 - rows.versions, 0)
  np.testing.assert_array_equal(np.asarray(learned["staleness"])[counted], hand[counted])
  assert float(learned["staleness_max"]) == 2.0
  np.testing.assert_allclose(float(learned["staleness_mean"]), hand[counted].mean(), rtol=1e-6)
  s = hand[counted].astype(np.float32)
  mu, current = rows.logprobs[counted], np.asarray(learned["current"])[counted]
  np.testing.assert_allclose(np.asarray(learned["proximal"])[counted],
                             mu + s / (s + 1) * (current - mu), atol=1e-6, rtol=0)


def _learn_side(graphdef, params, batch, rows, version):
  """The learn step's view of the harvested rows as one trained batch (`view.train_view` with
  proximal="loglinear"): each token's staleness from `version`, the staleness metrics, the
  current policy's log-probs and the interpolated proximal ones."""
  tokens, mask, active = batch[0], batch[1], batch[2]
  rewards = np.arange(R, dtype=np.float32).reshape(P, G) % 2
  learn_batch = Batch(
      prompt_tokens=jnp.asarray(tokens), prompt_mask=jnp.asarray(mask),
      tokens=jnp.asarray(rows.tokens), mask=jnp.asarray(rows.mask),
      sampler_logprobs=jnp.asarray(rows.logprobs), prompt_ids=jnp.arange(P, dtype=jnp.int32),
      arms=jnp.zeros(P, jnp.int32), rewards=jnp.asarray(rewards),
      correct=jnp.asarray(rewards > 0), valid=jnp.asarray(active.reshape(P, G)),
      train_groups=jnp.arange(P, dtype=jnp.int32), train_valid=jnp.ones(P, bool),
      versions=jnp.asarray(rows.versions))
  config = test_util.learn_config(proximal="loglinear", minibatches=1, max_tokens=N)
  scores = rl_step.score_groups(learn_batch, stability.whitening_init(), config)
  view = view_lib.train_view(learn_batch, scores, params, graphdef=graphdef, ref_params=None,
                             config=config, use_lora=False, version=jnp.int32(version))
  current = forward.completion_logprobs(graphdef, params, view.prompt_tokens, view.prompt_mask,
                                        view.tokens, G)
  return {"staleness": view.staleness, "current": current,
          "proximal": off_policy.loglinear_proximal_logprobs(view.sampler_logprobs, current,
                                                             view.staleness),
          **rl_step.staleness_metrics(learn_batch, view, jnp.int32(version))}


def test_evicted_rows_leave_and_the_next_generation_is_untouched(model):
  """Generation 0 is evicted after 2 iterations: its unfinished rows are not done, keep what
  they drew and take no more slot-steps; generation 1 then equals its batch alone."""
  first, second = _batch(2), _batch(3)
  state = _admit(model, _admit(model, _init(model), first, 0, 1.1), second, 1, 1.1)
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


def test_rows_evicted_before_a_slot_takes_them_never_decode(model):
  """Generation 0 evicted right after both batches were queued, before any decoding: its rows
  keep their first token (drawn from the prefill) and are passed over in the queue, so the next
  call seats and decodes generation 1 only, as its batch alone."""
  first, second = _batch(2), _batch(3)
  state = _admit(model, _admit(model, _init(model), first, 0, 1.1), second, 1, 1.1)
  state = inflight.evict(state, jnp.int32(0))
  state = _run(model, state, 1.1)
  cut = jax.device_get(inflight.harvest(state, jnp.int32(0)))
  np.testing.assert_array_equal(cut.mask.sum(axis=1), first[2].astype(np.float32))
  _assert_rows(jax.device_get(inflight.harvest(state, jnp.int32(1))), _alone(model, second, 1.1))


def test_compiled_once_per_shape(model):
  state = _admit(model, _init(model), _batch(5), 1, 1.0)
  _run(model, state, 1.0, budget=1, due=1)
  programs = (inflight._empty, inflight.admit, continuous.run)  # pylint: disable=protected-access
  before = [f._cache_size() for f in programs]  # pylint: disable=protected-access
  state = _admit(model, _init(model), _batch(6), 2, 0.5, version=2)
  _run(model, state, 0.5, version=3, budget=2, due=0)
  after = [f._cache_size() for f in programs]  # pylint: disable=protected-access
  assert after == before
