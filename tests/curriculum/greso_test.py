"""Tests of rl_curriculum/curriculum/greso.py."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats as sps

from rl_curriculum.curriculum import prompt_stats
from rl_curriculum.curriculum.base import PromptPool
from rl_curriculum.curriculum.greso import adapt_probability, greso, keep_probability, skip_mask
import test_util

E, H, NONE = prompt_stats.KIND_EASY, prompt_stats.KIND_HARD, prompt_stats.KIND_NONE



@test_util.JIT
def test_keep_probability_hand_values(use_jit):
  fn = jax.jit(keep_probability) if use_jit else keep_probability
  streak = jnp.array([0, 2, 3, 10, 1])
  kind = jnp.array([NONE, E, H, H, E])
  q = fn(streak, kind, jnp.float32(0.5), jnp.float32(0.3))
  # 1, .5^2, .3^3, max(.3^10, .01), .5
  np.testing.assert_allclose(q, [1.0, 0.25, 0.027, 0.01, 0.5], rtol=1e-5)


def test_skip_frequency_matches_one_minus_keep_probability():
  # Five groups of 5000 candidates with keep probabilities .6, .216, .09, .01 and 1.
  n = 5000
  streak = np.repeat([1, 3, 2, 5, 0], n)
  kind = np.repeat([E, E, H, H, NONE], n)
  q = np.array([0.6, 0.6 ** 3, 0.09, 0.01])
  skip = np.asarray(jax.jit(skip_mask)(jax.random.key(0), jnp.asarray(streak), jnp.asarray(kind),
                                       jnp.float32(0.6), jnp.float32(0.3)))
  kept = np.array([(~skip[i * n:(i + 1) * n]).sum() for i in range(5)])
  assert kept[4] == n  # streak 0 is never skipped
  chi2 = (((kept[:4] - n * q) ** 2) / (n * q * (1 - q))).sum()
  assert sps.chi2.sf(chi2, df=4) > 1e-3, (kept, n * q)


def test_adapt_probability_hand_values():
  jitted = jax.jit(adapt_probability, static_argnums=(2, 3, 4, 5))
  f = lambda p, z: jitted(p, z, 0.25, 0.01, 0.05, 0.95)
  assert float(f(jnp.float32(0.5), jnp.float32(0.3))) == pytest.approx(0.49)
  assert float(f(jnp.float32(0.5), jnp.float32(0.1))) == pytest.approx(0.51)
  assert float(f(jnp.float32(0.5), jnp.float32(0.25))) == 0.5
  assert float(f(jnp.float32(0.95), jnp.float32(0.0))) == pytest.approx(0.95)
  assert float(f(jnp.float32(0.05), jnp.float32(1.0))) == pytest.approx(0.05)


def test_update_adapts_p_easy_and_p_hard():
  pool = PromptPool.from_arms(np.zeros(20, int))
  cur = greso(pool, batch_size=6)
  update = jax.jit(cur.update)
  state = cur.init(pool, jax.random.key(0))
  # 1 all-correct (1/6 > 1/12) and 3 all-wrong (1/2 > 1/6): both p go down by .01.
  fb = test_util.feedback([[1, 1]] + [[0, 0]] * 3 + [[1, 0]] * 2, ids=range(6))
  state, m = update(state, fb)
  np.testing.assert_allclose([m["zero_variance_easy"], m["zero_variance_hard"]], [1 / 6, 0.5],
                             rtol=1e-6)
  np.testing.assert_allclose([state.p_easy, state.p_hard], [0.49, 0.49], rtol=1e-6)
  assert int(state.stats.streak[0]) == 1 and int(state.stats.streak_kind[0]) == E
  assert int(state.stats.streak[1]) == 1 and int(state.stats.streak_kind[1]) == H
  # No zero-variance group: both go up.
  state, _ = update(state, test_util.feedback([[1, 0]] * 6, ids=range(6, 12)))
  np.testing.assert_allclose([state.p_easy, state.p_hard], [0.5, 0.5], rtol=1e-6)
  # Prompt 0 all correct again: its easy streak is 2.
  state, _ = update(state, test_util.feedback([[1, 1]] + [[1, 0]] * 5, ids=[0, 13, 14, 15, 16, 17]))
  assert int(state.stats.streak[0]) == 2


def test_update_holds_p_at_target_and_at_bounds():
  pool = PromptPool.from_arms(np.zeros(10, int))
  cur = greso(pool, batch_size=4, target_zero_variance=0.5, easy_share=0.5)
  state = cur.init(pool, jax.random.key(0))
  # Exactly 1/4 easy, 1/4 hard.
  fb = test_util.feedback([[1, 1], [0, 0], [1, 0], [0, 1]], ids=range(4))
  out, _ = jax.jit(cur.update)(state, fb)
  assert float(out.p_easy) == 0.5 and float(out.p_hard) == 0.5
  state = state._replace(p_easy=jnp.float32(0.95), p_hard=jnp.float32(0.05))
  fb = test_util.feedback([[0, 0]] * 4, ids=range(4))  # no easy group, all hard
  out, _ = jax.jit(cur.update)(state, fb)
  np.testing.assert_allclose([out.p_easy, out.p_hard], [0.95, 0.05], rtol=1e-6)


# One curriculum and one compiled batched select for the statistical tests: N = 40, P = 20,
# C = 40 candidates (the whole pool, in random order).
_POOL = PromptPool.from_arms(np.zeros(40, int))
_CUR = greso(_POOL, batch_size=20, oversample=2.0)
_STATE = _CUR.init(_POOL, jax.random.key(0))
_SELECT_MANY = jax.jit(jax.vmap(_CUR.select, in_axes=(None, 0)))


def _with_streaks(streak, kind):
  stats = _STATE.stats._replace(streak=jnp.asarray(streak, jnp.int32),
                                streak_kind=jnp.asarray(kind, jnp.int32))
  return _STATE._replace(stats=stats)


def test_select_keeps_candidates_at_the_stated_rate():
  # Every prompt has keep probability .5^2 = .25: last_kept ~ Binomial(40, .25) per select.
  state = _with_streaks(np.full(40, 2), np.full(40, E))
  sel, new = _SELECT_MANY(state, jax.random.split(jax.random.key(2), 300))
  kept = int(np.asarray(new.last_kept).sum())
  n, q = 300 * 40, 0.25
  assert abs(kept - n * q) < 4.5 * np.sqrt(n * q * (1 - q)), kept
  assert all(len(set(row)) == 20 for row in np.asarray(sel.prompt_ids).tolist())


def test_select_fills_slots_with_kept_candidates_first():
  # Prompts 0-19: long easy streak (keep probability .01); 20-39: no streak (always kept).
  # All 20 cold prompts are kept, so they fill the 20 slots unless a hot one (1%) is kept too.
  state = _with_streaks(np.where(np.arange(40) < 20, 50, 0), np.where(np.arange(40) < 20, E, NONE))
  sel, new = _SELECT_MANY(state, jax.random.split(jax.random.key(3), 300))
  cold = (np.asarray(sel.prompt_ids) >= 20).mean()
  assert cold > 0.97, cold  # uniform selection would give 0.5
  assert np.all(np.asarray(new.last_kept) >= 20)


def test_bad_arguments_raise():
  for kwargs, name in [({"batch_size": 0}, "batch_size"), ({"oversample": 0.5}, "oversample"),
                       ({"target_zero_variance": 1.5}, "target_zero_variance"),
                       ({"easy_share": -0.1}, "easy_share"), ({"step_size": -0.01}, "step_size"),
                       ({"p_min": 0.6, "p_max": 0.4}, "p_min"), ({"p_init": 0.99}, "p_init"),
                       ({"min_keep": 2.0}, "min_keep")]:
    with pytest.raises(ValueError, match=name):
      greso(1, **{"batch_size": 4, **kwargs})
  with pytest.raises(ValueError, match="pool"):
    pool = PromptPool.from_arms([0] * 7)
    greso(pool, batch_size=4).init(pool, jax.random.key(0))
