"""Tests for rl_curriculum.rl.losses: loop references, invariants, gradients, low precision."""

import doctest
import functools
import math

import hypothesis
from hypothesis import strategies as st
import jax
import jax.numpy as jnp
from jax.test_util import check_grads
import numpy as np
import pytest

from rl_curriculum.rl import losses
from rl_curriculum.rl import off_policy
import test_util

AGGS = pytest.mark.parametrize("aggregation", losses.AGGREGATIONS)
LEVELS = pytest.mark.parametrize("level", ["token", "sequence"])
MAX_TOKENS = 8


# --- NumPy references: explicit loops, float64 ---------------------------------------------------


def _clip(x, lo, hi):
  return min(max(x, lo), hi)


def ref_aggregate(per_token, mask, aggregation, max_tokens=None):
  b_count, t_count = mask.shape
  if aggregation == "token_mean":
    total, count = 0.0, 0.0
    for b in range(b_count):
      for t in range(t_count):
        if mask[b, t]:
          total += per_token[b, t] * mask[b, t]
          count += mask[b, t]
    return total / count if count else 0.0
  row_values = []
  for b in range(b_count):
    n = sum(mask[b, t] for t in range(t_count))
    if n == 0:
      continue
    s = sum(per_token[b, t] * mask[b, t] for t in range(t_count) if mask[b, t])
    row_values.append(s / n if aggregation == "seq_mean_token_mean" else s / max_tokens)
  return sum(row_values) / len(row_values) if row_values else 0.0


def ref_policy_loss(logp, logp_old, adv, mask, *, eps_low=0.2, eps_high=0.2, dual_clip=None,
                    level="token", aggregation="token_mean", max_tokens=None, clamp=20.0):
  logp, logp_old = np.asarray(logp, np.float64), np.asarray(logp_old, np.float64)
  adv, mask = np.asarray(adv, np.float64), np.asarray(mask, np.float64)
  b_count, t_count = mask.shape
  if adv.ndim == 1:
    adv = np.repeat(adv[:, None], t_count, axis=1)
  ratio = np.zeros((b_count, t_count))
  for b in range(b_count):
    if level == "sequence":
      n = sum(mask[b])
      s = sum(mask[b, t] * (logp[b, t] - logp_old[b, t]) for t in range(t_count) if mask[b, t])
      s = _clip(s / n if n else 0.0, -clamp, clamp)
      for t in range(t_count):
        ratio[b, t] = math.exp(s)
    else:
      for t in range(t_count):
        if mask[b, t]:
          ratio[b, t] = math.exp(_clip(logp[b, t] - logp_old[b, t], -clamp, clamp))
  per_token = np.zeros((b_count, t_count))
  stats = {"low": 0.0, "high": 0.0, "dual": 0.0, "kl": 0.0, "ratio": 0.0, "max": 0.0, "n": 0.0}
  for b in range(b_count):
    for t in range(t_count):
      if not mask[b, t]:
        continue
      a, r = adv[b, t], ratio[b, t]
      loss = max(-r * a, -_clip(r, 1 - eps_low, 1 + eps_high) * a)
      if dual_clip is not None and a < 0 and loss > -dual_clip * a:
        loss = -dual_clip * a
        stats["dual"] += mask[b, t]
      per_token[b, t] = loss
      stats["low"] += mask[b, t] * (a < 0 and r < 1 - eps_low)
      stats["high"] += mask[b, t] * (a > 0 and r > 1 + eps_high)
      x = -math.log(r)  # log(pi_old / pi) of this token
      stats["kl"] += mask[b, t] * (math.exp(x) - x - 1)
      stats["ratio"] += mask[b, t] * r
      stats["max"] = max(stats["max"], r)
      stats["n"] += mask[b, t]
  n = stats["n"] or 1.0
  metrics = {"clipfrac_low": stats["low"] / n, "clipfrac_high": stats["high"] / n,
             "dual_clipfrac": stats["dual"] / n, "approx_kl": stats["kl"] / n,
             "ratio_mean": stats["ratio"] / n, "ratio_max": stats["max"]}
  return ref_aggregate(per_token, mask, aggregation, max_tokens), metrics


def ref_kl(logp, logp_ref, estimator, clamp=20.0):
  out = np.zeros(logp.shape)
  for b in range(logp.shape[0]):
    for t in range(logp.shape[1]):
      x = _clip(float(logp_ref[b, t]) - float(logp[b, t]), -clamp, clamp)
      out[b, t] = {"k1": -x, "k2": 0.5 * x * x, "k3": math.exp(x) - x - 1}[estimator]
  return out


# --- masked_mean, aggregate, KL -----------------------------------------------------------------


@test_util.JIT
@AGGS
def test_aggregate_matches_reference(use_jit, aggregation):
  rng = np.random.default_rng(1)
  x = rng.normal(size=(4, 6)).astype(np.float32)
  _, _, _, mask = test_util.logprob_batch()
  out = test_util.maybe_jit(losses.aggregate, use_jit, aggregation=aggregation,
                            max_tokens=MAX_TOKENS)(x, mask)
  np.testing.assert_allclose(out, ref_aggregate(x, mask, aggregation, MAX_TOKENS), **test_util.TOL)
  zero = losses.aggregate(x, np.zeros_like(mask), aggregation, MAX_TOKENS)
  assert float(zero) == 0.0


def test_masked_mean_axes_and_empty():
  x = np.arange(6, dtype=np.float32).reshape(2, 3)
  m = np.array([[1, 0, 1], [0, 0, 0]], np.float32)
  np.testing.assert_allclose(losses.masked_mean(x, m), (0 + 2) / 2, **test_util.TOL)
  np.testing.assert_allclose(losses.masked_mean(x, m, axis=1), [1.0, 0.0], **test_util.TOL)
  x_bad = np.where(m > 0, x, np.nan)  # NaN under a zero mask does not leak in
  np.testing.assert_allclose(losses.masked_mean(x_bad, m), 1.0, **test_util.TOL)


@test_util.JIT
@pytest.mark.parametrize("estimator", losses.KL_ESTIMATORS)
def test_kl_matches_reference(use_jit, estimator):
  logp, logp_ref, _, _ = test_util.logprob_batch(spread=1.0)
  logp[0, 0] = logp_ref[0, 0] - 30.0  # beyond the clamp
  out = test_util.maybe_jit(losses.kl_divergence, use_jit, estimator=estimator)(logp, logp_ref)
  assert out.dtype == jnp.float32
  np.testing.assert_allclose(out, ref_kl(logp, logp_ref, estimator), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("estimator", losses.KL_ESTIMATORS)
def test_kl_zero_at_reference_and_gradient(estimator):
  logp, _, _, _ = test_util.logprob_batch()
  np.testing.assert_array_equal(losses.kl_divergence(logp, logp, estimator=estimator), 0.0)
  f = jax.jit(lambda x, y: jnp.sum(losses.kl_divergence(x, y, estimator=estimator)))
  g = jax.grad(f)(jnp.asarray(logp), jnp.asarray(logp))
  # d/dlogp: k1 -> 1, k2 -> 0, k3 -> 0 at logp == logp_ref.
  np.testing.assert_allclose(g, 1.0 if estimator == "k1" else 0.0, **test_util.TOL)
  logp2, logp_ref, _, _ = test_util.logprob_batch(spread=0.5, seed=3)
  check_grads(lambda x: losses.kl_divergence(x, logp_ref, estimator=estimator), (logp2,),
              order=1, modes=["rev"], eps=1e-3, atol=2e-3, rtol=2e-3)


@test_util.SETTINGS
@hypothesis.given(st.lists(st.tuples(st.floats(-60, 0, width=32), st.floats(-60, 0, width=32)),
                           min_size=1, max_size=16))
def test_property_k3_nonnegative(pairs):
  logp = np.array([[p for p, _ in pairs]], np.float32)
  logp_ref = np.array([[r for _, r in pairs]], np.float32)
  k3 = np.asarray(_KL3(logp, logp_ref))
  k2 = np.asarray(_KL2(logp, logp_ref))
  assert np.all(np.isfinite(k3)) and np.all(k3 >= 0.0) and np.all(k2 >= 0.0)
  np.testing.assert_allclose(k3, ref_kl(logp, logp_ref, "k3"), rtol=1e-5, atol=1e-6)


_KL3 = jax.jit(functools.partial(losses.kl_divergence, estimator="k3"))
_KL2 = jax.jit(functools.partial(losses.kl_divergence, estimator="k2"))


def test_k3_nonnegative_near_zero():
  # Tiny log-ratios where exp(x) - x - 1 evaluated naively in float32 rounds below zero.
  x = np.array([[1e-8, 4e-8, -3e-8, 6e-8, -1e-7, 2e-7, 1e-4, -1e-4]], np.float32)
  k3 = np.asarray(losses.kl_divergence(np.zeros_like(x), x))
  assert np.all(k3 >= 0.0)
  naive = np.exp(x) - x - np.float32(1)
  assert naive.dtype == np.float32 and np.any(naive < 0)


# --- Policy loss --------------------------------------------------------------------------------


POLICY_CONFIGS = [
    dict(),
    dict(eps_low=0.2, eps_high=0.28),
    dict(eps_low=0.1, eps_high=0.3, dual_clip=3.0),
]


@test_util.JIT
@AGGS
@LEVELS
@pytest.mark.parametrize("config", POLICY_CONFIGS, ids=["ppo", "clip_higher", "dual_clip"])
def test_policy_loss_matches_reference(use_jit, aggregation, level, config):
  logp, logp_old, adv, mask = test_util.logprob_batch(spread=0.6)
  if level == "sequence":
    adv = adv[:, 0]  # one advantage per completion
  kwargs = dict(config, level=level, aggregation=aggregation, max_tokens=MAX_TOKENS)
  loss, metrics = test_util.maybe_jit(losses.policy_loss, use_jit, **kwargs)(
      logp, logp_old, adv, mask)
  ref_loss, ref_metrics = ref_policy_loss(logp, logp_old, adv, mask, **kwargs)
  assert loss.dtype == jnp.float32 and loss.shape == ()
  np.testing.assert_allclose(loss, ref_loss, **test_util.TOL)
  for name, value in ref_metrics.items():
    np.testing.assert_allclose(metrics[name], value, err_msg=name, **test_util.TOL)


def test_policy_loss_clip_and_dual_clip_cases_by_hand():
  # One token each: ratio e^0.5 = 1.65 with A = +1 (clipped high), ratio e^-0.5 = 0.61 with A = -1
  # (clipped low), ratio e^2 = 7.39 with A = -1 (unclipped side, dual clip at c = 3 bounds it).
  logp_old = np.zeros((3, 1), np.float32)
  logp = np.array([[0.5], [-0.5], [2.0]], np.float32)
  adv = np.array([1.0, -1.0, -1.0], np.float32)
  mask = np.ones((3, 1), np.float32)
  loss, m = losses.policy_loss(logp, logp_old, adv, mask, aggregation="seq_mean_token_mean")
  np.testing.assert_allclose(loss, (-1.2 + 0.8 + math.exp(2.0)) / 3, **test_util.TOL)
  np.testing.assert_allclose([m["clipfrac_high"], m["clipfrac_low"]], [1 / 3, 1 / 3],
                             **test_util.TOL)
  loss_dc, m_dc = losses.policy_loss(logp, logp_old, adv, mask, dual_clip=3.0,
                                     aggregation="seq_mean_token_mean")
  np.testing.assert_allclose(loss_dc, (-1.2 + 0.8 + 3.0) / 3, **test_util.TOL)
  np.testing.assert_allclose(m_dc["dual_clipfrac"], 1 / 3, **test_util.TOL)
  np.testing.assert_allclose(m_dc["ratio_max"], math.exp(2.0), **test_util.TOL)


def _pg_weights(mask, aggregation):
  """d loss / d (A * logp) of vanilla PG for each token, by aggregation (loops)."""
  b_count, t_count = mask.shape
  w = np.zeros((b_count, t_count))
  rows = sum(1 for b in range(b_count) if mask[b].sum() > 0)
  total = mask.sum()
  for b in range(b_count):
    n = mask[b].sum()
    for t in range(t_count):
      if not mask[b, t]:
        continue
      if aggregation == "token_mean":
        w[b, t] = mask[b, t] / total
      elif aggregation == "seq_mean_token_mean":
        w[b, t] = mask[b, t] / (n * rows)
      else:
        w[b, t] = mask[b, t] / (MAX_TOKENS * rows)
  return w


@test_util.JIT
@AGGS
@LEVELS
def test_on_policy_gradient_is_vanilla_policy_gradient(use_jit, aggregation, level):
  logp, _, adv, mask = test_util.logprob_batch()
  if level == "sequence":
    adv = np.repeat(adv[:, :1], adv.shape[1], axis=1)  # GSPO: constant within a completion
  kwargs = dict(level=level, aggregation=aggregation, max_tokens=MAX_TOKENS, eps_high=0.28,
                dual_clip=3.0)
  grad_fn = jax.grad(lambda lp: losses.policy_loss(lp, logp, adv, mask, **kwargs)[0])
  grad_fn = jax.jit(grad_fn) if use_jit else grad_fn
  g = grad_fn(jnp.asarray(logp))
  np.testing.assert_allclose(g, -adv * _pg_weights(mask, aggregation), **test_util.TOL)


# Without jit only: 36 distinct programs here would each compile once and never be reused, while
# op-by-op dispatch shares its compiled primitives; jit agreement is covered above.
@AGGS
@pytest.mark.parametrize("config", POLICY_CONFIGS, ids=["ppo", "clip_higher", "dual_clip"])
def test_gspo_equals_token_ppo_for_one_token_completions(aggregation, config):
  logp, logp_old, adv, _ = test_util.logprob_batch(spread=1.0)
  # Single-token completions, either as T = 1 or as one unmasked token in a longer row.
  one_hot = np.zeros_like(logp)
  one_hot[np.arange(4), [0, 3, 5, 2]] = 1.0
  for lp, lo, a, m in [(logp[:, :1], logp_old[:, :1], adv[:, :1], np.ones((4, 1), np.float32)),
                       (logp, logp_old, adv, one_hot)]:
    kwargs = dict(config, aggregation=aggregation, max_tokens=MAX_TOKENS)

    def run(level, x, lo=lo, a=a, m=m, kwargs=kwargs):
      return losses.policy_loss(x, lo, a, m, level=level, **kwargs)

    vg = jax.value_and_grad(run, argnums=1, has_aux=True)
    (tok_loss, tok_metrics), tok_grad = vg("token", jnp.asarray(lp))
    (seq_loss, seq_metrics), seq_grad = vg("sequence", jnp.asarray(lp))
    np.testing.assert_allclose(seq_loss, tok_loss, **test_util.TOL)
    np.testing.assert_allclose(seq_grad, tok_grad, **test_util.TOL)
    for name in tok_metrics:
      np.testing.assert_allclose(seq_metrics[name], tok_metrics[name], err_msg=name,
                                 **test_util.TOL)


@AGGS
@LEVELS
def test_masked_tokens_change_neither_loss_nor_gradient(aggregation, level):
  logp, logp_old, adv, mask = test_util.logprob_batch(spread=0.6)
  off = mask == 0
  garbage = [np.where(off, v, x).astype(np.float32)
             for x, v in [(logp, np.nan), (logp_old, -np.inf), (adv, 1e30)]]
  kwargs = dict(level=level, aggregation=aggregation, max_tokens=MAX_TOKENS, dual_clip=3.0)
  vg = jax.jit(jax.value_and_grad(
      lambda lp, lo, a: losses.policy_loss(lp, lo, a, mask, **kwargs), has_aux=True))
  (loss, metrics), grad = vg(logp, logp_old, adv)
  (loss_g, metrics_g), grad_g = vg(*garbage)
  np.testing.assert_array_equal(loss_g, loss)
  np.testing.assert_array_equal(grad_g, grad)
  assert np.all(np.asarray(grad)[off] == 0.0)
  for name in metrics:
    np.testing.assert_array_equal(metrics_g[name], metrics[name], err_msg=name)


@AGGS
@LEVELS
def test_policy_loss_check_grads(aggregation, level):
  rng = np.random.default_rng(4)
  logp_old = -rng.random((3, 5)) * 2
  # Log-ratios inside the clip range or well outside it: finite differences never cross a kink.
  log_ratio = rng.choice([-0.6, -0.1, -0.05, 0.0, 0.05, 0.1, 0.6], size=(3, 5))
  logp = (logp_old + log_ratio).astype(np.float32)
  adv = rng.normal(size=(3, 5)).astype(np.float32)
  if level == "sequence":
    adv = np.repeat(adv[:, :1], 5, axis=1)
  mask = np.array([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [0, 0, 0, 0, 0]], np.float32)
  kwargs = dict(level=level, aggregation=aggregation, max_tokens=MAX_TOKENS, dual_clip=3.0)
  f = jax.jit(lambda lp: losses.policy_loss(lp, logp_old.astype(np.float32), adv, mask,
                                            **kwargs)[0])
  check_grads(f, (logp,), order=1, modes=["rev"], eps=1e-3, atol=2e-3, rtol=2e-3)


def test_policy_loss_all_masked_is_zero_with_zero_gradient():
  logp, logp_old, adv, mask = test_util.logprob_batch()
  for aggregation in losses.AGGREGATIONS:
    for level in ("token", "sequence"):
      vg = jax.value_and_grad(lambda lp: losses.policy_loss(
          lp, logp_old, adv, np.zeros_like(mask), level=level, aggregation=aggregation,
          max_tokens=MAX_TOKENS)[0])
      loss, grad = vg(jnp.asarray(logp))
      assert float(loss) == 0.0 and np.all(np.asarray(grad) == 0.0)


def test_policy_loss_argument_errors():
  logp, logp_old, adv, mask = test_util.logprob_batch()
  with pytest.raises(ValueError, match="max_tokens"):
    losses.policy_loss(logp, logp_old, adv, mask, aggregation="seq_mean_token_sum_norm")
  with pytest.raises(ValueError, match="max_tokens"):
    jax.jit(lambda *a: losses.policy_loss(*a, aggregation="seq_mean_token_sum_norm"))(
        logp, logp_old, adv, mask)
  with pytest.raises(ValueError, match="aggregation"):
    losses.policy_loss(logp, logp_old, adv, mask, aggregation="sum")
  with pytest.raises(ValueError, match="level"):
    losses.policy_loss(logp, logp_old, adv, mask, level="segment")
  with pytest.raises(ValueError, match="dual_clip"):
    losses.policy_loss(logp, logp_old, adv, mask, dual_clip=0.5)
  with pytest.raises(ValueError, match="estimator"):
    losses.kl_divergence(logp, logp_old, estimator="k4")
  with pytest.raises(AssertionError):
    losses.policy_loss(logp[0], logp_old[0], adv[0], mask[0])


# --- Low precision ------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
@LEVELS
def test_low_precision_ratios_never_overflow(dtype, level):
  # float16 overflows exp above ~11.1, bfloat16 (float32 range) above ~88.7.
  gap = 12.0 if dtype == jnp.float16 else 100.0
  logp_old = np.full((2, 3), -gap - 0.5, np.float32)
  logp = np.full((2, 3), -0.5, np.float32)
  logp[1] = logp_old[1] + np.array([0.25, -0.5, 0.125])
  adv = np.array([[-1.0, 2.0, -0.5], [1.0, -1.0, 0.5]], np.float32)
  mask = np.ones((2, 3), np.float32)
  lp, lo = jnp.asarray(logp, dtype), jnp.asarray(logp_old, dtype)
  naive = jnp.exp(lp - lo)
  assert naive.dtype == dtype and not np.all(np.isfinite(np.asarray(naive, np.float32)))

  widened = (lp.astype(jnp.float32), lo.astype(jnp.float32))
  kwargs = dict(level=level, aggregation="seq_mean_token_mean")
  vg = jax.jit(jax.value_and_grad(
      lambda x, y: losses.policy_loss(x, y, adv, mask, **kwargs), has_aux=True))
  (loss, metrics), grad = vg(lp, lo)
  (loss32, metrics32), grad32 = vg(*widened)
  assert loss.dtype == jnp.float32 and np.isfinite(float(loss))
  assert np.all(np.isfinite(np.asarray(grad, np.float32)))
  np.testing.assert_allclose(loss, loss32, **test_util.TOL)
  for name in metrics:
    assert np.isfinite(float(metrics[name])), name
    np.testing.assert_allclose(metrics[name], metrics32[name], err_msg=name, **test_util.TOL)
  ref_loss, _ = ref_policy_loss(*[np.asarray(w) for w in widened], adv, mask, **kwargs)
  np.testing.assert_allclose(loss, ref_loss, **test_util.TOL)

  for estimator in losses.KL_ESTIMATORS:
    kl = losses.kl_divergence(lo, lp, estimator=estimator)  # log-ratio of -gap: exp(gap) naively
    assert kl.dtype == jnp.float32 and np.all(np.isfinite(np.asarray(kl)))
    np.testing.assert_allclose(kl, losses.kl_divergence(*widened[::-1], estimator=estimator),
                               **test_util.TOL)
  w = off_policy.truncated_is_weights(lp, lo)
  assert np.all(np.isfinite(np.asarray(w)))
  np.testing.assert_allclose(w, off_policy.truncated_is_weights(*widened), **test_util.TOL)


# --- Property test ------------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def _jitted_policy_loss(level, aggregation, dual_clip):
  return jax.jit(functools.partial(losses.policy_loss, level=level, aggregation=aggregation,
                                   max_tokens=MAX_TOKENS, dual_clip=dual_clip, eps_high=0.28))


@st.composite
def policy_batches(draw):
  # A few shapes only: each new shape and configuration costs a compilation.
  b = draw(st.sampled_from([1, 3]))
  t = draw(st.sampled_from([1, 5]))
  n = b * t
  floats = lambda lo, hi: st.lists(st.floats(lo, hi, width=32), min_size=n, max_size=n)
  logp_old = np.array(draw(floats(-8, 0)), np.float32).reshape(b, t)
  log_ratio = np.array(draw(floats(-2, 2)), np.float32).reshape(b, t)
  adv = np.array(draw(floats(-3, 3)), np.float32).reshape(b, t)
  mask = np.array(draw(st.lists(st.booleans(), min_size=n, max_size=n)), np.float32)
  mask = mask.reshape(b, t)
  if draw(st.booleans()):
    mask[draw(st.integers(0, b - 1))] = 0.0  # an all-masked row
  config = (draw(st.sampled_from(["token", "sequence"])),
            draw(st.sampled_from(losses.AGGREGATIONS)),
            draw(st.sampled_from([None, 3.0])))
  return (logp_old + log_ratio).astype(np.float32), logp_old, adv, mask, config


@test_util.SETTINGS
@hypothesis.given(policy_batches())
def test_property_policy_loss_matches_reference(batch):
  logp, logp_old, adv, mask, (level, aggregation, dual_clip) = batch
  loss, metrics = _jitted_policy_loss(level, aggregation, dual_clip)(logp, logp_old, adv, mask)
  ref_loss, ref_metrics = ref_policy_loss(
      logp, logp_old, adv, mask, level=level, aggregation=aggregation, max_tokens=MAX_TOKENS,
      dual_clip=dual_clip, eps_high=0.28)
  np.testing.assert_allclose(loss, ref_loss, rtol=1e-5, atol=1e-5)
  if mask.sum() == 0:
    assert float(loss) == 0.0
  # Clip fractions are counts of threshold crossings: a ratio within float32 rounding of 1 +- eps
  # may land on either side, so they are compared with a one-token slack.
  for name, value in ref_metrics.items():
    atol = 1.0 / max(mask.sum(), 1.0) if name.endswith("clipfrac_low") or name.endswith(
        "clipfrac_high") or name == "dual_clipfrac" else 1e-5
    np.testing.assert_allclose(metrics[name], value, rtol=1e-5, atol=atol + 1e-6, err_msg=name)


# --- Value loss, truncated IS, CAPO, entropy ---------------------------------------------------


def ref_value_loss(values, values_old, returns, mask, clip):
  total, count = 0.0, 0.0
  for b in range(values.shape[0]):
    for t in range(values.shape[1]):
      if not mask[b, t]:
        continue
      v, vo, r = float(values[b, t]), float(values_old[b, t]), float(returns[b, t])
      err = (v - r) ** 2
      if clip is not None:
        err = max(err, (vo + _clip(v - vo, -clip, clip) - r) ** 2)
      total += 0.5 * err * mask[b, t]
      count += mask[b, t]
  return total / count if count else 0.0


@test_util.JIT
@pytest.mark.parametrize("clip", [None, 0.2, 1.0])
def test_value_loss_matches_reference(use_jit, clip):
  rng = np.random.default_rng(6)
  values = rng.normal(size=(4, 6)).astype(np.float32)
  values_old = (values + 0.5 * rng.normal(size=(4, 6))).astype(np.float32)
  returns = rng.normal(size=(4, 6)).astype(np.float32)
  _, _, _, mask = test_util.logprob_batch()
  loss, metrics = test_util.maybe_jit(losses.value_loss, use_jit, clip=clip)(
      values, values_old, returns, mask)
  np.testing.assert_allclose(loss, ref_value_loss(values, values_old, returns, mask, clip),
                             **test_util.TOL)
  assert 0.0 <= float(metrics["vf_clipfrac"]) <= 1.0
  # Masked entries matter to neither the loss nor its gradient.
  vg = jax.jit(jax.value_and_grad(lambda v, vo, r: losses.value_loss(v, vo, r, mask, clip=clip)[0]))
  off = mask == 0
  l1, g1 = vg(values, values_old, returns)
  l2, g2 = vg(*[np.where(off, np.nan, x).astype(np.float32)
                for x in (values, values_old, returns)])
  np.testing.assert_array_equal(l1, l2)
  np.testing.assert_array_equal(g1, g2)


@pytest.mark.parametrize("clip", [None, 0.2])
def test_value_loss_check_grads(clip):
  rng = np.random.default_rng(8)
  values_old = rng.normal(size=(4, 6)).astype(np.float32)
  returns = rng.normal(size=(4, 6)).astype(np.float32)
  _, _, _, mask = test_util.logprob_batch()
  # Away from the clip boundaries, finite differences agree with the gradient.
  delta = rng.choice([-0.5, -0.1, 0.1, 0.5], size=(4, 6))
  v = (values_old + delta).astype(np.float32)
  check_grads(jax.jit(lambda x: losses.value_loss(x, values_old, returns, mask, clip=clip)[0]),
              (v,), order=1, modes=["rev"], eps=1e-3, atol=2e-3, rtol=2e-3)


@test_util.JIT
@pytest.mark.parametrize("positive_only_steps,ramp_steps", [(0, 0), (3, 0), (3, 1), (2, 4)])
def test_advantage_sign_mask_schedule(use_jit, positive_only_steps, ramp_steps):
  adv = np.array([[1.0, -1.0, 0.0, -0.5]], np.float32)
  fn = test_util.maybe_jit(losses.advantage_sign_mask, use_jit,
                           positive_only_steps=positive_only_steps, ramp_steps=ramp_steps)
  for step in range(10):
    if step < positive_only_steps:
      w_neg = 0.0
    elif ramp_steps <= 1:
      w_neg = 1.0
    else:
      w_neg = min(1.0, (step - positive_only_steps + 1) / ramp_steps)
    expected = [[1.0 if a >= 0 else w_neg for a in adv[0]]]
    np.testing.assert_allclose(fn(adv, jnp.int32(step)), expected, err_msg=str(step),
                               **test_util.TOL)


def test_entropy_bonus_is_aggregated_entropy():
  rng = np.random.default_rng(7)
  entropy = rng.random((4, 6)).astype(np.float32)
  _, _, _, mask = test_util.logprob_batch()
  for aggregation in losses.AGGREGATIONS:
    np.testing.assert_allclose(
        losses.entropy_bonus(entropy, mask, aggregation=aggregation, max_tokens=MAX_TOKENS),
        ref_aggregate(entropy, mask, aggregation, MAX_TOKENS), **test_util.TOL)


def test_docstring_examples_run():
  result = doctest.testmod(losses)
  assert result.attempted > 0 and result.failed == 0
