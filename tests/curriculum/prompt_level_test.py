"""Tests of rl_curriculum/curriculum/prompt_level.py, and checks shared by every prompt-level
curriculum (no retracing, determinism, distinct prompts, checkpoint round trip)."""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
from scipy import stats as sps

from rl_curriculum.curriculum import prompt_level
from rl_curriculum.curriculum.adarft import adarft
from rl_curriculum.curriculum.greso import greso
from rl_curriculum.curriculum.hard_focus import hard_focus
from rl_curriculum.curriculum.pcl import pcl
from rl_curriculum.curriculum.vade import vade
from rl_curriculum.curriculum.vcrl import vcrl
from rl_curriculum.curriculum.base import PromptPool
from rl_curriculum.types import Feedback

EMPTY = prompt_level.EMPTY


def _memory(ids, prio, age):
  return prompt_level.Memory(ids=jnp.asarray(ids, jnp.int32),
                             priority=jnp.asarray(prio, jnp.float32),
                             age=jnp.asarray(age, jnp.int32))


_update_memory = jax.jit(prompt_level.update_memory, static_argnames="max_age")


def test_update_memory_insert_refresh_evict():
  mem = _memory([5, 7, EMPTY], [0.9, 0.6, 0.0], [2, 0, 0])
  # 7 is observed but not inserted -> leaves; 9 twice -> one entry; 4 enters.
  out = _update_memory(mem, jnp.array([7, 9, 4, 9]), jnp.array([0.3, 1.0, 0.8, 1.0]),
                       jnp.array([True] * 4), jnp.array([False, True, True, True]))
  np.testing.assert_array_equal(out.ids, [9, 5, 4])
  np.testing.assert_allclose(out.priority, [1.0, 0.9, 0.8])
  np.testing.assert_array_equal(out.age, [0, 3, 0])
  # Full memory: 11 (0.85) evicts the lowest priority, 4 (0.8).
  out = _update_memory(out, jnp.array([11, 2]), jnp.array([0.85, 0.1]), jnp.array([True, True]),
                       jnp.array([True, False]))
  np.testing.assert_array_equal(out.ids, [9, 5, 11])
  np.testing.assert_array_equal(out.age, [1, 4, 0])
  # Re-observed entry is refreshed with its new priority and age 0.
  out = _update_memory(out, jnp.array([5]), jnp.array([0.95]), jnp.array([True]), jnp.array([True]))
  np.testing.assert_array_equal(out.ids, [9, 5, 11])
  np.testing.assert_allclose(out.priority, [1.0, 0.95, 0.85])
  np.testing.assert_array_equal(out.age, [2, 0, 1])


def test_update_memory_ties_go_to_the_younger_entry_and_max_age_expires():
  mem = _memory([1, 2], [0.5, 0.5], [3, 1])
  out = _update_memory(mem, jnp.array([3]), jnp.array([0.5]), jnp.array([True]), jnp.array([True]))
  np.testing.assert_array_equal(out.ids, [3, 2])  # 1 is the oldest of three equal priorities
  out = _update_memory(mem, jnp.array([3]), jnp.array([0.1]), jnp.array([False]),
                       jnp.array([False]), max_age=2)
  np.testing.assert_array_equal(out.ids, [2, EMPTY])  # 1 reached age 4 > 2; unobserved 3 ignored
  np.testing.assert_array_equal(out.age, [2, 0])


def test_mix_memory_and_pool_fills_from_pool_when_memory_is_short():
  mem = _memory([4, EMPTY, 9, EMPTY], [1.0, 0.0, 1.0, 0.0], [0, 0, 0, 0])
  fn = jax.jit(prompt_level.mix_memory_and_pool, static_argnums=(3, 4, 5))
  for t in range(5):
    ids, from_mem = fn(jax.random.key(t), mem, jnp.zeros(4), 3, 20, 6)
    ids, from_mem = np.asarray(ids), np.asarray(from_mem)
    np.testing.assert_array_equal(from_mem, [True, True, False, False, False, False])
    assert set(ids[:2]) == {4, 9}
    assert len(set(ids)) == 6 and np.all((ids >= 0) & (ids < 20))


def test_mix_memory_draws_proportional_to_weights():
  prio = np.array([1.0, 2.0, 3.0, 4.0])
  mem = _memory([10, 11, 12, 13], prio, [0] * 4)
  draw = lambda k: prompt_level.mix_memory_and_pool(k, mem, jnp.log(prio), 1, 30, 2)[0]
  fn = jax.jit(jax.vmap(draw))
  ids = np.asarray(fn(jax.random.split(jax.random.key(0), 4000)))
  counts = np.bincount(ids[:, 0] - 10, minlength=4)
  assert sps.chisquare(counts, 4000 * prio / prio.sum()).pvalue > 1e-3
  assert np.all(ids[:, 1] != ids[:, 0])


def test_rows_pooled_and_first_occurrence():
  ids = jnp.array([3, 1, 3, 2, 1])
  np.testing.assert_array_equal(prompt_level.rows_pooled(ids, jnp.array([1, 2, 3, 4, 5])),
                                [4, 7, 4, 4, 7])
  np.testing.assert_array_equal(prompt_level.first_occurrence(ids),
                                [True, True, False, True, False])


# ----- checks shared by the six curricula -----

N, P, G = 48, 6, 4
POOL = PromptPool.from_arms(np.arange(N) % 3, difficulty=np.linspace(0.0, 1.0, N))
FEATURES = np.random.default_rng(0).normal(size=(N, 3)).astype(np.float32)
BUILDERS = {
    "vcrl": lambda: vcrl(POOL, batch_size=P, replay_fraction=0.5),
    "vade": lambda: vade(POOL, batch_size=P, num_candidates=2 * P),
    "greso": lambda: greso(POOL, batch_size=P),
    "adarft": lambda: adarft(POOL, batch_size=P, no_repeat=True),
    "pcl": lambda: pcl(POOL.with_features(FEATURES), batch_size=P),
    "hard_focus": lambda: hard_focus(POOL, batch_size=P, retain_fraction=0.5),
}


@functools.cache
def _compiled(name):
  """The curriculum and its jitted select/update, built once per module (compilation dominates)."""
  cur = BUILDERS[name]()
  return (cur, jax.jit(chex.assert_max_traces(cur.select, n=1)),
          jax.jit(chex.assert_max_traces(cur.update, n=1)))


def _feedback_for(selection, t):
  rng = np.random.default_rng(t)
  correct = rng.random((P, G)) < rng.choice([0.0, 0.5, 1.0], size=(P, 1))
  return Feedback(prompt_ids=selection.prompt_ids, arms=selection.arms,
                  rewards=jnp.asarray(correct, jnp.float32) + 0.1, correct=jnp.asarray(correct),
                  advantages=jnp.zeros((P, G)), valid=jnp.asarray(rng.random((P, G)) < 0.9))


def _run(cur, state, select, update, steps, seed=1):
  picks = []
  for t in range(steps):
    sel, state = select(state, jax.random.fold_in(jax.random.key(seed), t))
    picks.append(np.asarray(sel.prompt_ids))
    state, metrics = update(state, _feedback_for(sel, t))
  return state, picks, metrics


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_select_update_jit_once_deterministic_distinct(name):
  cur, select, update = _compiled(name)
  state0 = cur.init(POOL, jax.random.key(0))
  assert all(isinstance(leaf, jax.Array) for leaf in jax.tree.leaves(state0))  # Orbax-saveable
  state, picks, metrics = _run(cur, state0, select, update, 4)
  for ids in picks:
    assert ids.shape == (P,) and ids.dtype == np.int32
    assert len(set(ids.tolist())) == P and np.all((ids >= 0) & (ids < N))
  sel, _ = select(state, jax.random.key(5))
  np.testing.assert_array_equal(sel.arms, np.asarray(POOL.arms)[np.asarray(sel.prompt_ids)])
  _, picks2, _ = _run(cur, state0, select, update, 4)  # same keys, same choices
  np.testing.assert_array_equal(np.stack(picks), np.stack(picks2))
  assert all(isinstance(v, jax.Array) for v in metrics.values())


def test_orbax_round_trip_then_identical_selections(tmp_path):
  cur, select, update = _compiled("vcrl")  # nested state: PromptStats and Memory
  state, _, _ = _run(cur, cur.init(POOL, jax.random.key(0)), select, update, 3)
  with ocp.StandardCheckpointer() as ckpt:
    ckpt.save(tmp_path / "state", state)
    ckpt.wait_until_finished()
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, state)
    restored = ckpt.restore(tmp_path / "state", abstract)
  assert type(restored) is type(state)
  jax.tree.map(np.testing.assert_array_equal, state, restored)
  _, picks_a, _ = _run(cur, state, select, update, 3, seed=9)
  _, picks_b, _ = _run(cur, restored, select, update, 3, seed=9)
  np.testing.assert_array_equal(np.stack(picks_a), np.stack(picks_b))
