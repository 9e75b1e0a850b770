"""Tests of episodes on the continuous engine (rl_curriculum/sampling/turns.py).

A row's turns and observations are one buffer; the engine must (1) leave each observation id
where it was written, with mask 0, (2) draw every other token from the logits of the whole
sequence before it, so the recorded log-probs equal a full forward pass over prompt, turns and
observations (1e-4, a whole model's tolerance), and (3) draw the same tokens whatever the number
of slots (the rows of a turn leave their slots for others while they wait) or the page size.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl_curriculum.model import transformer
from rl_curriculum.sampling import continuous
from rl_curriculum.sampling import inflight
from rl_curriculum.sampling import turns
from rl_curriculum.train.learn import forward
import test_util

V, P, G, TP, N = 64, 3, 2, 7, 24
R = P * G
EOS, PAD, TEMPERATURE = 5, 0, 1.3
TURN = 6  # tokens a turn may draw
DRAW = dict(stop_ids=(EOS,), pad_id=PAD, group=G)


@pytest.fixture(scope="module")
def model():
  return transformer.init_model(test_util.engine_model_config(False), seed=0)


def _prompts():
  rng = np.random.default_rng(0)
  tokens = np.repeat(rng.integers(6, V, size=(P, TP)).astype(np.int32), G, axis=0)
  mask = np.ones((R, TP), bool)
  mask[:G, :3] = False
  return tokens, mask


def _observation(row: int, turn: int) -> list[int]:
  """A made-up observation of a few ids (the EOS among them: an observation may hold a stop
  id, which ends nothing)."""
  return [EOS, 10 + row, 20 + turn][: 1 + (row + turn) % 3]


def _play(model, slots: int, page_size: int = 4, max_turns: int = 3):
  """Every row through up to `max_turns` turns; returns the final harvest and the observation
  positions {row: [(start, ids), ...]}."""
  graphdef, params = model
  tokens, mask = _prompts()
  state = inflight.init(graphdef, params, jax.random.PRNGKey(0), rows=R, generations=1,
                        prompt_len=TP, slots=slots, max_new_tokens=N, pad_id=PAD, group=G,
                        page_size=page_size,
                        kv_pages=turns.episode_pages(R, N, page_size))
  state = turns.episodic(state)
  state = inflight.admit(graphdef, params, state, jnp.asarray(tokens), jnp.asarray(mask),
                         jax.random.PRNGKey(3), jnp.int32(0), jnp.float32(TEMPERATURE),
                         jnp.int32(0), None, jnp.full((R,), TURN, jnp.int32), max_new_tokens=N,
                         **DRAW)
  written = {r: [] for r in range(R)}
  turn = np.ones(R, int)
  going = np.ones(R, bool)
  while True:
    state = continuous.run(graphdef, params, state, jnp.float32(TEMPERATURE), **DRAW)
    rows = jax.device_get(inflight.harvest(state, jnp.int32(0)))
    again = np.zeros(R, bool)
    obs = np.zeros((R, 3), np.int32)
    lengths, start, limit = (np.zeros(R, np.int32) for _ in range(3))
    for r in np.flatnonzero(going):
      end = int(np.flatnonzero(rows.mask[r])[-1]) + 1
      ids = _observation(r, int(turn[r]))
      if turn[r] >= max_turns or end + len(ids) >= N:
        going[r] = False
        continue
      again[r], obs[r, :len(ids)], lengths[r], start[r] = True, ids, len(ids), end
      limit[r] = min(end + len(ids) + TURN, N)
      written[r].append((end, ids))
      turn[r] += 1
    if not again.any():
      return rows, written, state
    state = turns.requeue(state, jnp.asarray(again), jnp.asarray(obs), jnp.asarray(lengths),
                          jnp.asarray(start), jnp.asarray(limit))


@pytest.fixture(scope="module")
def played(model):
  """Every row's episode on 3 slots and pages of 4, played once for the tests that read it."""
  return _play(model, slots=3)


def test_observations_stay_where_written_with_mask_zero(played):
  rows, written, _ = played
  assert sum(len(w) for w in written.values()) >= R  # every row saw an observation
  for r, parts in written.items():
    for start, ids in parts:
      np.testing.assert_array_equal(rows.tokens[r, start:start + len(ids)], ids)
      np.testing.assert_array_equal(rows.mask[r, start:start + len(ids)], 0)
      assert rows.mask[r, start - 1] == 1  # the turn's last token is the policy's


def test_drawn_log_probs_equal_one_forward_pass_over_the_episode(model, played):
  rows, _, _ = played
  tokens, mask = _prompts()
  want = forward.completion_logprobs(*model, jnp.asarray(tokens), jnp.asarray(mask),
                                     jnp.asarray(rows.tokens), temperature=TEMPERATURE)
  drawn = rows.mask > 0
  # A whole model's decode against its forward pass: the module tolerance.
  np.testing.assert_allclose(rows.logprobs[drawn], np.asarray(want)[drawn], atol=1e-4, rtol=0)


@pytest.mark.parametrize("slots,page_size", [(R, 4), (2, 2)])
def test_tokens_do_not_depend_on_slots_or_pages(model, played, slots, page_size):
  want, _, _ = played
  got, _, _ = _play(model, slots=slots, page_size=page_size)
  np.testing.assert_array_equal(got.tokens, want.tokens)
  np.testing.assert_array_equal(got.mask, want.mask)
  np.testing.assert_allclose(got.logprobs, want.logprobs, atol=1e-5, rtol=0)


def test_a_turn_frees_its_slot_for_queued_rows(model):
  _, _, state = _play(model, slots=2)
  # Two slots served six rows' turns: the engine fed far more slot-steps than two rows hold.
  assert int(state.fed) > 2 * N


@pytest.mark.parametrize("page_size", [2, 4])
def test_release_gives_back_every_page_the_episodes_kept(model, page_size):
  """After the episodes, the rows hold pages for what they wrote; `release` (before a new batch
  takes the generation) puts every one of them back on the free stack, each once."""
  _, _, state = _play(model, slots=3, page_size=page_size)
  cache = state.cache
  total = cache.free.shape[1]
  assert int(cache.count[0]) < total  # the rows kept their pages
  cache = turns.release(state, jnp.int32(0), group=G).cache
  assert int(cache.count[0]) == total
  prompt_pages = cache.prompts.shape[1] * cache.prompts.shape[2]
  np.testing.assert_array_equal(np.sort(np.asarray(cache.free[0])),
                                prompt_pages + np.arange(total))
