"""Tests for rl_curriculum/curriculum/arms.py and checks.py: what every category-level curriculum
shares (the builder `category_curriculum`, per-arm statistics, argument checks)."""

import collections
import os
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

from rl_curriculum import curriculum as C
from rl_curriculum.curriculum import arms
from rl_curriculum.curriculum import checks
from rl_curriculum.curriculum.arm_sampling import ArmSamplerState
from rl_curriculum.curriculum.base import PromptPool
from rl_curriculum.types import Feedback
import test_util

SIZES = (3, 5, 2, 6)
POOL = PromptPool.from_arms(np.repeat(np.arange(4), SIZES))


# ------------------------------------------------------------------------------------------------
# Every category-level curriculum: invariants, tracing, checkpoints, argument checks.
# ------------------------------------------------------------------------------------------------

CONSTRUCTORS = {
    "sec": lambda pool, p: C.sec(pool, batch_size=p),
    "sec_ucb_lp": lambda pool, p: C.sec(pool, batch_size=p, exploration="ucb",
                                        objective="learning_progress", unsampled="decay"),
    "uniform": lambda pool, p: C.uniform(pool, batch_size=p, by="arm"),
    "easy_to_hard": lambda pool, p: C.easy_to_hard(pool, batch_size=p, steps_per_arm=1,
                                                   accuracy_threshold=0.5),
    "linear_pacing": lambda pool, p: C.linear_pacing(pool, batch_size=p, steps_to_full=3),
    "cyclical": lambda pool, p: C.cyclical(pool, batch_size=p, period=3),
    "mixed_replay": lambda pool, p: C.mixed_replay(pool, batch_size=p, steps_per_arm=1),
    "dump": lambda pool, p: C.dump(pool, batch_size=p, window=8),
    "alp_teacher": lambda pool, p: C.alp_teacher(pool, batch_size=p, window=4),
    "mastering_rate": lambda pool, p: C.mastering_rate(pool, batch_size=p),
    "learnability": lambda pool, p: C.learnability(pool, batch_size=p),
}


def _random_feedback(sel, key, g=3):
  r = (jax.random.uniform(key, (sel.arms.shape[0], g)) < 0.5).astype(jnp.float32)
  return Feedback(prompt_ids=sel.prompt_ids, arms=sel.arms, rewards=r, correct=r > 0,
                  advantages=r - jnp.mean(r, axis=1, keepdims=True))


@pytest.mark.parametrize("name", sorted(CONSTRUCTORS))
def test_jit_without_retracing_and_invariants(name):
  # Curricula built by one factory share code objects, and chex counts traces per code object.
  chex.clear_trace_counter()
  cur = CONSTRUCTORS[name](POOL, 6)
  select = jax.jit(chex.assert_max_traces(cur.select, n=1))
  update = jax.jit(chex.assert_max_traces(cur.update, n=1))
  state = cur.init(POOL, jax.random.key(0))
  pool_arms = np.asarray(POOL.arms)
  for t in range(4):
    sel, state = select(state, jax.random.key(10 + t))
    assert sel.prompt_ids.shape == (6,) and sel.arms.shape == (6,)
    np.testing.assert_array_equal(pool_arms[np.asarray(sel.prompt_ids)], sel.arms)
    state, metrics = update(state, _random_feedback(sel, jax.random.key(100 + t)))
    probs = np.asarray(metrics["probs"])
    assert probs.shape == (4,) and np.all(probs >= 0)
    np.testing.assert_allclose(probs.sum(), 1.0, rtol=1e-6)
    np.testing.assert_array_equal(metrics["arm_counts"],
                                  np.bincount(np.asarray(sel.arms), minlength=4))


@pytest.mark.parametrize("name", ["sec", "dump", "learnability"])
def test_checkpoint_round_trip_then_identical_selections(name, tmp_path):
  cur = CONSTRUCTORS[name](POOL, 5)
  select, update = jax.jit(cur.select), jax.jit(cur.update)
  state = cur.init(POOL, jax.random.key(0))
  for t in range(3):
    sel, state = select(state, jax.random.key(t))
    state, _ = update(state, _random_feedback(sel, jax.random.key(50 + t)))
  ckpt = ocp.StandardCheckpointer()
  path = os.path.join(tmp_path, "curriculum")
  ckpt.save(path, state)
  ckpt.wait_until_finished()
  restored = ckpt.restore(path, state)
  assert type(restored) is type(state)
  chex.assert_trees_all_equal(restored, state)

  def continue_run(s):
    out = []
    for t in range(3, 7):
      sel, s = select(s, jax.random.key(t))
      s, _ = update(s, _random_feedback(sel, jax.random.key(50 + t)))
      out.append((np.asarray(sel.prompt_ids), np.asarray(sel.arms)))
    return out

  for (ia, aa), (ib, ab) in zip(continue_run(state), continue_run(restored)):
    np.testing.assert_array_equal(ia, ib)
    np.testing.assert_array_equal(aa, ab)


@pytest.mark.parametrize("build,match", [
    (lambda: C.sec(4, batch_size=2, objective="abs_adv"), "objective must be one of"),
    (lambda: C.sec(4, batch_size=2, unsampled="drop"), "unsampled must be one of"),
    (lambda: C.sec(4, batch_size=2, exploration="thompson"), "exploration must be one of"),
    (lambda: C.sec(4, batch_size=2, alpha=0.0), "alpha"),
    (lambda: C.sec(4, batch_size=2, temperature=0.0), "temperature"),
    (lambda: C.sec(4, batch_size=0), "batch_size"),
    (lambda: C.sec(0, batch_size=2), "pool must be a PromptPool"),
    (lambda: C.uniform(4, batch_size=2, by="task"), "by must be one of"),
    (lambda: C.easy_to_hard(3, batch_size=2, order=[0, 0, 1]), "order"),
    (lambda: C.easy_to_hard(3, batch_size=2, steps_per_arm=None), "steps_per_arm"),
    (lambda: C.mixed_replay(3, batch_size=2, replay_prob=1.5), "replay_prob"),
    (lambda: C.dump(3, batch_size=2, window=0), "window"),
    (lambda: C.alp_teacher(3, batch_size=2, epsilon=-0.1), "epsilon"),
    (lambda: C.mastering_rate(3, batch_size=2, prerequisites=[(0, 3)]), "prerequisites"),
])
def test_bad_arguments_raise(build, match):
  with pytest.raises(ValueError, match=match):
    build()


def test_init_rejects_a_pool_with_other_arm_count():
  with pytest.raises(ValueError, match="built for 3 arms"):
    C.sec(3, batch_size=2).init(POOL, jax.random.key(0))



# ------------------------------------------------------------------------------------------------
# The builder and the per-arm statistics.
# ------------------------------------------------------------------------------------------------

class _FixedState(NamedTuple):
  sampler: ArmSamplerState


def test_category_curriculum_adds_probs_and_arm_counts():
  """A fixed distribution through the builder: selections follow it, metrics gain the two keys."""
  probs = jnp.array([0.0, 1.0, 0.0, 0.0])
  cur = arms.category_curriculum(4, 3, _FixedState, lambda state: probs,
                                 lambda state, fb: (state, {"extra": jnp.float32(1.0)}))
  state = cur.init(POOL, jax.random.key(0))
  sel, state = jax.jit(cur.select)(state, jax.random.key(1))
  np.testing.assert_array_equal(sel.arms, [1, 1, 1])
  fb = test_util.feedback(rewards=[[1.0], [0.0], [1.0]], ids=sel.prompt_ids, arms=[1, 1, 3])
  _, metrics = cur.update(state, fb)
  assert sorted(metrics) == ["arm_counts", "extra", "probs"]
  np.testing.assert_array_equal(metrics["arm_counts"], [0, 2, 0, 1])
  np.testing.assert_array_equal(metrics["probs"], probs)
  with pytest.raises(ValueError, match="built for 4 arms"):
    cur.init(PromptPool.from_arms([0, 1, 2]), jax.random.key(0))


@test_util.JIT
def test_arm_mean_matches_loop_reference(use_jit):
  rng = np.random.default_rng(0)
  values = rng.normal(size=(7, 3)).astype(np.float32)
  weights = (rng.random((7, 3)) < 0.6).astype(np.float32)
  arm_of = np.array([0, 2, 2, 1, 0, 2, 0])  # arm 3 has no prompt
  fn = test_util.maybe_jit(arms.arm_mean, use_jit, num_arms=4)
  mean, n = fn(jnp.asarray(values), jnp.asarray(arm_of), jnp.asarray(weights))
  for k in range(4):
    w = weights[arm_of == k]
    want_n = w.sum()
    want = (values[arm_of == k] * w).sum() / want_n if want_n > 0 else 0.0
    assert float(n[k]) == want_n
    np.testing.assert_allclose(mean[k], want, **test_util.TOL)


@test_util.JIT
def test_ring_push_keeps_the_newest_values_of_each_arm(use_jit):
  """Against per-arm deques of length W, pushing in several batches (one larger than W)."""
  width, num_arms = 3, 2
  buffer = jnp.zeros((num_arms, width), jnp.float32)
  head = filled = jnp.zeros((num_arms,), jnp.int32)
  ref = [collections.deque(maxlen=width) for _ in range(num_arms)]
  push = jax.jit(arms.ring_push) if use_jit else arms.ring_push
  rng = np.random.default_rng(1)
  for size in (2, 5, 1, 4):
    values = rng.normal(size=size).astype(np.float32)
    arm_of = rng.integers(0, num_arms, size=size)
    keep = rng.random(size) < 0.8
    buffer, head, filled = push(buffer, head, filled, jnp.asarray(values), jnp.asarray(arm_of),
                                jnp.asarray(keep))
    for v, a, k in zip(values, arm_of, keep):
      if k:
        ref[a].append(v)
    ages = np.asarray(arms.ring_ages(head, width))
    for a in range(num_arms):
      assert int(filled[a]) == len(ref[a])
      newest_first = [float(buffer[a, j]) for j in np.argsort(ages[a])[:len(ref[a])]]
      np.testing.assert_array_equal(newest_first, list(reversed(ref[a])))


def test_ema_update_starts_from_the_first_observation():
  est, seen = jnp.array([0.0, 0.5, 0.5]), jnp.array([False, True, True])
  obs, sampled = jnp.array([0.8, 1.0, 0.0]), jnp.array([True, True, False])
  new, seen = arms.ema_update(est, seen, obs, sampled, 0.25)
  np.testing.assert_allclose(new, [0.8, 0.625, 0.5])
  np.testing.assert_array_equal(seen, [True, True, True])


def test_default_arm_order_sorts_arms_by_mean_difficulty():
  pool = PromptPool.from_arms([0, 0, 1, 2, 2], num_arms=4, difficulty=[3.0, 1.0, 0.5, 4.0, 4.0])
  np.testing.assert_array_equal(checks.arm_order(None, pool), [1, 0, 2, 3])  # empty arm 3 last
  np.testing.assert_array_equal(checks.arm_order(None, 3), [0, 1, 2])
  with pytest.raises(ValueError, match="pool must be a PromptPool"):
    checks.num_arms("four")
