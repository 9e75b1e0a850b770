"""Tests of rl_curriculum/curriculum/pcl.py."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl_curriculum.curriculum.base import PromptPool
from rl_curriculum.curriculum.pcl import pcl, sgd_step, value_loss
import test_util



def test_one_sgd_step_hand_computed():
  # w = 0, b = 0: every prediction is .5 and v (1 - v) = .25, so per row
  # dL/dw = 2 (.5 - y) .25 x / 3 over the three rows with valid completions.
  feats = np.array([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0], [5.0, 5.0]])
  pool = PromptPool.from_arms([0, 0, 0, 0], features=feats)
  cur = pcl(pool, batch_size=4, learning_rate=0.1, oversample=1.0)
  state = cur.init(pool, jax.random.key(0))
  fb = test_util.feedback([[1, 1, 1, 1], [0, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 1]],
                          ids=[0, 1, 2, 3], valid=[[1] * 4, [1] * 4, [1] * 4, [0] * 4])
  state, m = jax.jit(cur.update)(state, fb)
  # grad_w = ([-.25, 0] + [0, .5] + [0, 0]) / 3, grad_b = (-.25 + .25 + 0) / 3 = 0.
  np.testing.assert_allclose(state.weights, [0.1 * 0.25 / 3, -0.1 * 0.5 / 3], rtol=1e-6)
  assert abs(float(state.bias)) < 1e-8
  assert float(m["value_loss"]) == pytest.approx((0.25 + 0.25 + 0.0) / 3, rel=1e-6)
  np.testing.assert_allclose(m["predictions"], [0.5] * 4)


def test_gradient_matches_loop_reference():
  rng = np.random.default_rng(0)
  x = rng.normal(size=(5, 3)).astype(np.float32)
  y = rng.random(5).astype(np.float32)
  mask = np.array([1, 1, 0, 1, 1], bool)
  w, b = rng.normal(size=3).astype(np.float32), np.float32(0.3)
  gw_ref, gb_ref, loss_ref = np.zeros(3), 0.0, 0.0
  for p in range(5):
    if not mask[p]:
      continue
    v = 1.0 / (1.0 + math.exp(-(float(x[p] @ w) + float(b))))
    loss_ref += (v - y[p]) ** 2 / 4
    gw_ref += 2 * (v - y[p]) * v * (1 - v) * x[p] / 4
    gb_ref += 2 * (v - y[p]) * v * (1 - v) / 4
  new_w, new_b, loss = jax.jit(sgd_step, static_argnums=5)(w, b, x, y, mask, 0.5)
  assert float(loss) == pytest.approx(loss_ref, rel=1e-5)
  np.testing.assert_allclose(new_w, w - 0.5 * gw_ref, rtol=1e-5, atol=1e-6)
  assert float(new_b) == pytest.approx(b - 0.5 * gb_ref, rel=1e-5, abs=1e-6)
  assert float(value_loss((w, b), x, y, mask)) == pytest.approx(loss_ref, rel=1e-5)


def test_select_picks_predictions_nearest_one_half():
  x = np.array([[3.0], [-0.1], [2.0], [0.05], [-4.0], [0.5], [1.0], [-0.2]])
  pool = PromptPool.from_arms([0] * 8, features=x)
  cur = pcl(pool, batch_size=3, oversample=8 / 3)  # 8 candidates: the whole pool
  state = cur.init(pool, jax.random.key(0))
  state = state._replace(weights=jnp.array([1.0]))  # v = sigmoid(x)
  select = jax.jit(cur.select)
  for t in range(3):
    sel, _ = select(state, jax.random.key(t))
    assert set(np.asarray(sel.prompt_ids).tolist()) == {3, 1, 7}


def test_training_moves_predictions_toward_accuracies():
  x = np.eye(4, dtype=np.float32)
  pool = PromptPool.from_arms([0] * 4, features=x)
  cur = pcl(pool, batch_size=4, oversample=1.0, learning_rate=2.0, num_sgd_steps=5)
  state = cur.init(pool, jax.random.key(0))
  fb = test_util.feedback([[1] * 4, [0] * 4, [1, 1, 0, 0], [1, 1, 1, 0]], ids=[0, 1, 2, 3])
  update = jax.jit(cur.update)
  losses = []
  for _ in range(5):
    state, m = update(state, fb)
    losses.append(float(m["value_loss"]))
  assert all(b < a for a, b in zip(losses, losses[1:])), losses


def test_bad_arguments_raise():
  pool = PromptPool.from_arms([0] * 6, features=np.zeros((6, 2)))
  with pytest.raises(ValueError, match="features"):
    PromptPool.from_arms([0] * 6, features=np.zeros(6))
  with pytest.raises(ValueError, match="finite"):
    pcl(PromptPool.from_arms([0] * 6, features=np.full((6, 2), np.nan)), batch_size=2)
  for kwargs, name in [({"batch_size": 0}, "batch_size"), ({"oversample": 0.5}, "oversample"),
                       ({"learning_rate": 0.0}, "learning_rate"),
                       ({"num_sgd_steps": 0}, "num_sgd_steps")]:
    with pytest.raises(ValueError, match=name):
      pcl(pool, **{"batch_size": 2, **kwargs})
  with pytest.raises(ValueError, match="rows"):
    pcl(pool, batch_size=1).init(PromptPool.from_arms([0] * 5), jax.random.key(0))
  with pytest.raises(ValueError, match="candidates"):
    pcl(pool, batch_size=2).init(pool, jax.random.key(0))


def test_features_come_from_the_pool_given_to_init():
  """Built from a number of arms (a config check), PCL reads the features of the init pool."""
  x = np.eye(4, dtype=np.float32)
  cur = pcl(1, batch_size=2, oversample=1.0)
  with pytest.raises(ValueError, match="needs per-prompt features"):
    cur.init(PromptPool.from_arms([0] * 4), jax.random.key(0))
  state = cur.init(PromptPool.from_arms([0] * 4, features=x), jax.random.key(0))
  np.testing.assert_array_equal(state.features, x)
  assert state.features.dtype == jnp.float32
