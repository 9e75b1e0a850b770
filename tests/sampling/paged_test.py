"""Tests of the continuous engine on a paged KV cache (rl_curriculum/sampling/pages.py,
rl_curriculum/model/paged_cache.py).

The engine on pages must give every row the dense continuous engine's tokens and mask and its
log-probs to float rounding (1e-5: the paged attention reads the prompt and the completion as one
run of pages, the dense one as two parts), whatever the page size; with too few pages, rows
restart and draw the same tokens again; every page a row took is back on the free stack once it
stops.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl_curriculum.model import kv_cache
from rl_curriculum.model import transformer
from rl_curriculum.sampling import continuous
from rl_curriculum.sampling import inflight
from rl_curriculum.sampling import pages
import test_util

V, P, G, TP, N = 64, 3, 4, 7, 10
R = P * G
EOS = 5
DRAW = dict(max_new_tokens=N, group=G, eos_id=EOS)


@pytest.fixture(scope="module", params=[False, True], ids=["unrolled", "scanned"])
def model(request):
  return transformer.init_model(test_util.engine_model_config(request.param), seed=0)


def _prompts(seed=0):
  rng = np.random.default_rng(seed)
  tokens = np.repeat(rng.integers(1, V, size=(P, TP)).astype(np.int32), G, axis=0)
  mask = np.ones((R, TP), bool)
  mask[:G, :3] = False   # the first group's prompt is shorter (4 real tokens)
  mask[G:2 * G, :1] = False
  return tokens, mask


def _sample(model, slots, **kwargs):
  tokens, mask = _prompts()
  return jax.device_get(continuous.sample(*model, tokens, mask, jax.random.PRNGKey(3),
                                          slots=slots, temperature=1.3, **DRAW, **kwargs))


def _final_state(model, slots, **kwargs):
  tokens, mask = _prompts()
  state = continuous.start(*model, jnp.asarray(tokens), jnp.asarray(mask), jax.random.PRNGKey(3),
                           jnp.float32(1.3), slots=slots, max_new_tokens=N, group=G,
                           stop_ids=(EOS,), **kwargs)
  return continuous.run(model[0], model[1], state, jnp.float32(1.3), stop_ids=(EOS,), group=G)


def _assert_same(got, want):
  np.testing.assert_array_equal(got.tokens, want.tokens)
  np.testing.assert_array_equal(got.mask, want.mask)
  np.testing.assert_allclose(got.logprobs, want.logprobs, atol=1e-5, rtol=0)


def _assert_every_page_free(cache: pages.PagedCache):
  """The free stacks hold each shard's completion pages, each once, and no more."""
  free = np.asarray(cache.free)
  count = np.asarray(cache.count)
  assert (count == free.shape[1]).all()
  prompt_pages = cache.prompts.shape[1] * cache.prompts.shape[2]
  for shard in free:
    np.testing.assert_array_equal(np.sort(shard), prompt_pages + np.arange(free.shape[1]))


@pytest.mark.parametrize("page_size,slots,shrink", [(4, 5, 0), (2, 8, 2), (16, R, 0)])
def test_paged_engine_equals_dense_engine(model, page_size, slots, shrink):
  dense = _sample(model, slots, shrink=shrink)
  paged = _sample(model, slots, shrink=shrink, page_size=page_size)
  _assert_same(paged.rollout, dense.rollout)
  assert int(paged.slot_steps) == int(dense.slot_steps)
  assert (dense.rollout.mask.sum(axis=1) < N).any()  # some rows stop early: pages come back


def test_too_few_pages_restart_rows_that_draw_the_same_tokens(model):
  """The fewest pages a shard may have: rows run out, the youngest restart (more slot-steps),
  and with the same weights they draw the same tokens again; every page comes back."""
  dense = _sample(model, 5)
  least = -(-N // 4) + 1 + 5 - 1
  paged = _sample(model, 5, page_size=4, kv_pages=least)
  _assert_same(paged.rollout, dense.rollout)
  assert int(paged.slot_steps) > int(dense.slot_steps)
  _assert_every_page_free(_final_state(model, 5, page_size=4, kv_pages=least).cache)
  with pytest.raises(ValueError, match="longest row can always finish"):
    _sample(model, 5, page_size=4, kv_pages=least - 1)


def test_every_page_comes_back_when_the_rows_stop(model):
  state = _final_state(model, 5, page_size=4)
  assert not (np.asarray(state.row) < R).any()
  _assert_every_page_free(state.cache)


def _cache(lengths, slots=3, size=4, completion_pages=0):
  """A one-shard paged cache of len(lengths) prompts of width 7, the prompts' keys a ramp."""
  config = test_util.engine_model_config(False)
  width = 7
  cache = pages.init(config, prompts=len(lengths), width=width, slots=slots, max_new_tokens=N,
                     page_size=size, pages=completion_pages, shards=1)
  mask = np.arange(width)[None, :] >= width - np.asarray(lengths)[:, None]
  shape = (config.num_layers, len(lengths), width, config.num_kv_heads, config.head_dim)
  keys = jnp.arange(np.prod(shape), dtype=jnp.float32).reshape(shape)
  prompts = kv_cache.KVCache(k=keys, v=-keys)  # the scanned layout
  return pages.write_prompts(cache, prompts, jnp.asarray(mask), 0), keys


def test_prompt_pages_hold_each_prompts_real_tokens_from_the_first_slot():
  lengths = [4, 7]
  cache, keys = _cache(lengths)
  pool = np.asarray(cache.pool)
  for p, length in enumerate(lengths):
    for j in range(length):
      page = int(cache.prompts[0, p, j // 4])
      np.testing.assert_array_equal(pool[:, page, j % 4, 0::2], keys[:, p, 7 - length + j])
      np.testing.assert_array_equal(pool[:, page, j % 4, 1::2], -keys[:, p, 7 - length + j])


def test_seated_rows_share_full_prompt_pages_and_copy_the_partial_one():
  cache, _ = _cache([4, 7])
  prompt = jnp.asarray([[0, 1, 1]], jnp.int32)
  length = jnp.asarray([4, 7, 7], jnp.int32)
  seated = pages.seat(cache, jnp.asarray([True, True, True]), prompt, length)
  table = np.asarray(seated.table)
  prompts = np.asarray(cache.prompts[0])
  # Prompt 0 (4 tokens) fills its page 0: shared; each row's own page is its page 1.
  assert table[0, 0] == prompts[0, 0]
  # Prompt 1 (7 tokens): page 0 shared by rows 1 and 2, page 1 (3 tokens) copied into each.
  assert table[1, 0] == table[2, 0] == prompts[1, 0]
  own = [table[0, 1], table[1, 1], table[2, 1]]
  assert len(set(own)) == 3 and not set(own) & set(prompts.reshape(-1))
  pool = np.asarray(seated.pool)
  np.testing.assert_array_equal(pool[:, table[1, 1], :3], pool[:, prompts[1, 1], :3])
  np.testing.assert_array_equal(pool[:, table[2, 1], :3], pool[:, prompts[1, 1], :3])
  assert int(seated.count[0]) == int(cache.count[0]) - 3
  back = pages.stop(seated, jnp.asarray([True, True, True]), length, length)
  _assert_every_page_free(back)


def test_make_room_restarts_the_youngest_row_that_frees_a_page_and_spares_the_oldest():
  """Four rows of a 4-token prompt (page size 4, 7 completion pages) that have fed 8, 4, 4 and
  2 tokens: the first three's next token starts a page (3 needed), 2 are free. The youngest row
  (2 tokens) needs nothing and holds one page, so restarting it frees nothing; the next youngest
  (4 tokens, the later slot) restarts, and the two others get their pages."""
  cache, _ = _cache([4], slots=4, completion_pages=7)
  length = jnp.full((4,), 4, jnp.int32)
  live = jnp.ones((4,), bool)
  cache = pages.seat(cache, live, jnp.zeros((1, 4), jnp.int32), length)
  cache = pages._pop(cache, jnp.asarray([True, False, False, False]),  # pylint: disable=protected-access
                     jnp.full((4,), 2, jnp.int32))
  fed = jnp.asarray([8, 4, 4, 2], jnp.int32)
  np.testing.assert_array_equal(pages.held(length, length + fed, 4), [2, 1, 1, 1])
  assert int(cache.count[0]) == 2
  room, restart = pages.make_room(cache, live, length, fed)
  np.testing.assert_array_equal(restart, [False, False, True, False])
  assert int(room.count[0]) == 0
  table = np.asarray(room.table)
  listed = [table[0, 0], table[0, 1], table[0, 2], table[0, 3], table[1, 1], table[1, 2],
            table[2, 1], table[3, 1]]
  assert len(set(listed[1:])) == 7  # every own page listed once; page 0 is the prompt's
  # With the pages to spare nobody restarts.
  _, restart = pages.make_room(cache._replace(count=cache.count + 1), live, length, fed)
  assert not np.asarray(restart).any()


def test_rows_in_flight_on_pages_equal_each_batch_alone(model):
  """Two generations on one paged engine, decoded in slices of 2 iterations, the first evicted
  midway: the second equals its batch alone on the dense engine, the evicted rows' pages come
  back, and the engine ends with every page free."""
  tokens, mask = _prompts()
  keys = [jax.random.PRNGKey(10), jax.random.PRNGKey(11)]
  state = inflight.init(*model, jax.random.PRNGKey(0), rows=R, generations=2, prompt_len=TP,
                        slots=5, max_new_tokens=N, group=G, page_size=4)
  for w in range(2):
    state = inflight.admit(*model, state, jnp.asarray(tokens), jnp.asarray(mask), keys[w],
                           jnp.int32(w), jnp.float32(1.3), jnp.int32(0), max_new_tokens=N,
                           group=G, stop_ids=(EOS,))
  run = lambda s, **kw: continuous.run(model[0], model[1], s, jnp.float32(1.3), jnp.int32(0),
                                       stop_ids=(EOS,), group=G, **kw)
  state = run(state, budget=jnp.int32(2))
  state = inflight.evict(state, jnp.int32(0), group=G)
  state = run(state)
  alone = jax.device_get(continuous.sample(*model, tokens, mask, keys[1], slots=5,
                                           temperature=1.3, **DRAW))
  _assert_same(jax.device_get(inflight.harvest(state, jnp.int32(1))), alone.rollout)
  _assert_every_page_free(state.cache)


def test_the_cache_is_in_the_compute_dtype_unless_a_float32_one_is_asked_for():
  """A bfloat16 model's dense cache and pages are bfloat16; with kv_dtype float32 both are
  float32, and the paged engine decodes from them."""
  config = test_util.engine_model_config(False)
  bf16 = dataclasses.replace(config, dtype="bfloat16", param_dtype="bfloat16")
  assert pages.init(bf16, prompts=2, width=4, slots=2, max_new_tokens=4, page_size=2, pages=0,
                    shards=1).pool.dtype == jnp.bfloat16
  assert kv_cache.init_cache(bf16, 2, 4).k[0].dtype == jnp.bfloat16
  wide = dataclasses.replace(bf16, kv_dtype="float32")
  assert kv_cache.init_cache(wide, 2, 4).k[0].dtype == jnp.float32
  model = transformer.init_model(wide, seed=0)
  state = _final_state(model, 5, page_size=4)
  assert state.cache.pool.dtype == jnp.float32
  assert int(state.drawn) > R
